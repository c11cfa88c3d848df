//! The effective configuration, and the AgentCard extension entry built from it (spec §3.1).
//!
//! ```
//! use idem_runtime::config::{IdempotencyConfig, TTL_ENV};
//! let config = IdempotencyConfig::from_lookup(|name| (name == TTL_ENV).then(|| "60".into())).unwrap();
//! assert_eq!(config.ttl_seconds, 60);
//! assert_eq!(config.agent_card_extension()["params"]["ttl_seconds"], 60);
//! ```

pub use crate::guard::recording::MAX_RECORDED_STREAM_BYTES;

use crate::error::EXTENSION_URI;
use crate::message_id::MessageIdPolicy;
use serde_json::{json, Value};
use std::time::Duration;

/// Environment variable for the cache TTL in seconds (spec §9).
pub const TTL_ENV: &str = "AIWG_IDEMPOTENCY_TTL";
/// Environment variable for the LRU bound (spec §9).
pub const MAX_ENTRIES_ENV: &str = "AIWG_IDEMPOTENCY_MAX_ENTRIES";
/// Environment variable for [`IdempotencyConfig::claim_lease`], in milliseconds.
pub const CLAIM_LEASE_ENV: &str = "AIWG_IDEMPOTENCY_CLAIM_LEASE_MS";
/// Environment variable for [`IdempotencyConfig::sweep_interval`], in milliseconds.
pub const SWEEP_INTERVAL_ENV: &str = "AIWG_IDEMPOTENCY_SWEEP_INTERVAL_MS";
/// Environment variable for [`IdempotencyConfig::in_flight_wait`], in milliseconds.
pub const IN_FLIGHT_WAIT_ENV: &str = "AIWG_IDEMPOTENCY_IN_FLIGHT_WAIT_MS";
/// Environment variable for [`IdempotencyConfig::memory_tier_bytes`] (0 turns the tier off).
pub const MEMORY_TIER_BYTES_ENV: &str = "AIWG_IDEMPOTENCY_MEMORY_TIER_BYTES";
/// Environment variable for [`IdempotencyConfig::disk_timeout`], in milliseconds.
pub const DISK_TIMEOUT_ENV: &str = "AIWG_IDEMPOTENCY_DISK_TIMEOUT_MS";

/// How the extension behaves on a server.
///
/// ```
/// use idem_runtime::IdempotencyConfig;
/// let config = IdempotencyConfig::default();
/// assert_eq!(config.ttl_seconds, 86_400);
/// assert_eq!(config.agent_card_extension()["params"]["max_cache_entries"], 100_000);
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct IdempotencyConfig {
    /// Entries older than this are a miss and are swept (spec default 86400).
    pub ttl_seconds: u64,
    /// LRU bound on cached entries (spec default 100000).
    pub max_cache_entries: u64,
    /// `true` (spec-conformant): governed calls that do not activate the extension are refused
    /// with -32008. `false`: they run undeduplicated and carry no extension headers.
    pub required: bool,
    /// How long a duplicate waits for the in-flight original before it gets 409: in all,
    /// counted from its arrival, whichever call holds the key meanwhile.
    pub in_flight_wait: Duration,
    /// How strictly message ids are checked.
    pub message_id_policy: MessageIdPolicy,
    /// How often the background sweep deletes expired entries.
    pub sweep_interval: Duration,
    /// Bytes of stored entries kept in memory, so that replays need no disk read (0 turns
    /// the memory tier off). Each entry costs its response bytes plus about 470 bytes, and 170
    /// bytes for each spelling of the request it remembers (none until a retry, two for most
    /// retried entries).
    pub memory_tier_bytes: usize,
    /// How long a claim holds without renewal where several processes share the store
    /// (PostgreSQL): the executor renews it every third of this while it runs; a process
    /// that dies leaves a claim that the next retry takes over once this has passed. At
    /// least [`MIN_CLAIM_LEASE`](Self::MIN_CLAIM_LEASE).
    pub claim_lease: Duration,
    /// How long a call waits for the SQLite file's disk to answer a read or commit its writes
    /// (a hung disk, a frozen file system): past it the call answers
    /// `IDEMPOTENCY_STORE_UNAVAILABLE`, uncached, and a key whose writes may still commit stays
    /// held until they have landed or failed, so that no retry runs meanwhile. PostgreSQL
    /// bounds its operations by the lease instead.
    pub disk_timeout: Duration,
    /// Largest request body the HTTP layer takes: a larger one (by `Content-Length`) is read
    /// and dropped, and answered with HTTP 413 and `IDEMPOTENCY_REQUEST_TOO_LARGE`, never a
    /// reset connection. Set jsonrpsee's `max_request_body_size` to the same value (both
    /// default to 10 MiB). Streams have their own bound, `MAX_RECORDED_STREAM_BYTES`.
    pub max_request_body_bytes: u64,
    /// HTTP requests the HTTP layer reads and serves at once: past it, a request is answered
    /// HTTP 429 with `Retry-After: 1` as soon as its headers arrive, its body never read, so
    /// that what bodies take in memory is bounded (by this times `max_request_body_bytes`),
    /// where a request waiting for jsonrpsee's own limit had its whole body read first.
    /// [`Idempotency::server_config`](crate::Idempotency::server_config) gives jsonrpsee's
    /// `max_connections` the same value. A durable call stays in flight until its commit: a
    /// server under load wants more than the default (jsonrpsee's own default, 100).
    pub max_requests_in_flight: u32,
    /// Largest JSON-RPC response a governed call stores and answers. A larger one would be
    /// cut by jsonrpsee's own limit after it was stored, so the client's first answer and
    /// the cached one would differ: instead the call's outcome becomes
    /// `IDEMPOTENCY_RESPONSE_TOO_LARGE`, stored and replayed like any failure (its staged
    /// writes are discarded). Set jsonrpsee's `max_response_body_size` to the same value
    /// (both default to 10 MiB).
    pub max_response_body_bytes: u32,
    /// Scope keys by the authenticated principal the application puts in each request's
    /// extensions ([`crate::Caller`]): the same messageId from two principals is then two
    /// keys, and neither can replay, collide with or learn of the other's entry. Off, the
    /// spec's one global key space (callers marked [`crate::Caller::Unauthenticated`] always
    /// share it). On, a governed call that comes with no `Caller` at all is refused
    /// (`IDEMPOTENCY_LAYER_MISSING`). Turn it on where callers do not trust each other and
    /// their keys might meet. A store refuses to open a database that holds entries stored
    /// with the other setting ([`crate::store::StoreError::ScopingChanged`]): it would re-key
    /// every authenticated caller, and the retries of calls answered before would run again.
    pub scope_keys_by_principal: bool,
    /// Whether a replay to a caller the application marks [`crate::Caller::Unauthenticated`]
    /// carries `Idempotent-Replayed: true` (spec §7.4: the header confirms cache state, which
    /// an operator MAY hide from unauthenticated callers). The answer is the same bytes either way.
    pub mark_replays_to_unauthenticated: bool,
}

impl Default for IdempotencyConfig {
    fn default() -> Self {
        Self {
            ttl_seconds: 86_400,
            max_cache_entries: 100_000,
            required: true,
            in_flight_wait: Duration::from_secs(30),
            message_id_policy: MessageIdPolicy::Shape,
            sweep_interval: Duration::from_secs(60),
            memory_tier_bytes: 64 << 20,
            claim_lease: Duration::from_secs(10),
            disk_timeout: Duration::from_secs(30),
            max_request_body_bytes: 10 * 1024 * 1024,
            max_requests_in_flight: 100,
            max_response_body_bytes: 10 * 1024 * 1024,
            scope_keys_by_principal: false,
            mark_replays_to_unauthenticated: true,
        }
    }
}

/// A configuration value that could not be used; names the variable.
///
/// ```
/// use idem_runtime::config::{ConfigError, IdempotencyConfig, TTL_ENV};
/// let lookup = |name: &str| (name == TTL_ENV).then(|| "1d".to_owned());
/// let err: ConfigError = IdempotencyConfig::from_lookup(lookup).unwrap_err();
/// assert_eq!((err.variable, err.value.as_str()), (TTL_ENV, "1d"));
/// assert!(err.to_string().starts_with(r#"AIWG_IDEMPOTENCY_TTL="1d" is invalid"#));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{variable}={value:?} is invalid: {reason}")]
pub struct ConfigError {
    /// The environment variable.
    pub variable: &'static str,
    /// What it held.
    pub value: String,
    /// What was expected.
    pub reason: &'static str,
}

impl IdempotencyConfig {
    /// This config changed by `change`: the way to set fields, the struct being
    /// `#[non_exhaustive]` (a later field is not a breaking change).
    ///
    /// ```
    /// use idem_runtime::IdempotencyConfig;
    /// let config = IdempotencyConfig::default().with(|c| c.ttl_seconds = 60);
    /// assert_eq!(config.ttl_seconds, 60);
    /// ```
    pub fn with(mut self, change: impl FnOnce(&mut Self)) -> Self {
        change(&mut self);
        self
    }

    /// Defaults overridden by `AIWG_IDEMPOTENCY_TTL`, `AIWG_IDEMPOTENCY_MAX_ENTRIES`,
    /// `AIWG_IDEMPOTENCY_CLAIM_LEASE_MS`, `AIWG_IDEMPOTENCY_SWEEP_INTERVAL_MS`,
    /// `AIWG_IDEMPOTENCY_IN_FLIGHT_WAIT_MS`, `AIWG_IDEMPOTENCY_MEMORY_TIER_BYTES` and
    /// `AIWG_IDEMPOTENCY_DISK_TIMEOUT_MS`.
    /// A malformed value is an error, never a silent default.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(env_value)
    }

    /// Like [`from_env`](Self::from_env) with a custom variable lookup (for tests and embedding).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let mut config = Self::default();
        if let Some(value) = lookup(TTL_ENV) {
            config.ttl_seconds = positive_integer(TTL_ENV, &value)?;
        }
        if let Some(value) = lookup(MAX_ENTRIES_ENV) {
            config.max_cache_entries = positive_integer(MAX_ENTRIES_ENV, &value)?;
        }
        let millis = |variable| match lookup(variable) {
            Some(value) => {
                positive_integer(variable, &value).map(|ms| Some(Duration::from_millis(ms)))
            }
            None => Ok(None),
        };
        if let Some(value) = lookup(CLAIM_LEASE_ENV) {
            config.claim_lease = a_claim_lease(CLAIM_LEASE_ENV, &value)?;
        }
        if let Some(interval) = millis(SWEEP_INTERVAL_ENV)? {
            config.sweep_interval = interval;
        }
        if let Some(wait) = millis(IN_FLIGHT_WAIT_ENV)? {
            config.in_flight_wait = wait;
        }
        if let Some(timeout) = millis(DISK_TIMEOUT_ENV)? {
            config.disk_timeout = timeout;
        }
        if let Some(value) = lookup(MEMORY_TIER_BYTES_ENV) {
            config.memory_tier_bytes = byte_count(MEMORY_TIER_BYTES_ENV, &value)?;
        }
        Ok(config)
    }

    /// The shortest [`claim_lease`](Self::claim_lease). Its holder renews it every third of
    /// it, and tries a failed renewal again 50 ms later: a shorter lease ran out before its
    /// renewal could (one of 1 to 10 ms: a healthy call was taken over by another replica,
    /// its body run twice; helper-94). A lease must outlast the database's slowest round
    /// trip several times over; the default is ten seconds.
    pub const MIN_CLAIM_LEASE: Duration = Duration::from_millis(300);

    /// This config, if every value that must be more than zero is: what the environment
    /// variables refuse, refused when set in code too (a zero sweep interval panicked the
    /// sweeper, unseen, and expired entries were never swept again; found by helper-85).
    ///
    /// ```
    /// use idem_runtime::IdempotencyConfig;
    /// use std::time::Duration;
    /// let config = IdempotencyConfig::default().with(|c| c.sweep_interval = Duration::ZERO);
    /// let error = config.checked().unwrap_err();
    /// assert_eq!(error.variable, "IdempotencyConfig::sweep_interval");
    /// ```
    pub fn checked(&self) -> Result<&Self, ConfigError> {
        let zero = |variable: &'static str, value: &dyn std::fmt::Debug| ConfigError {
            variable,
            value: format!("{value:?}"),
            reason: "must be more than zero",
        };
        let durations = [
            ("IdempotencyConfig::in_flight_wait", self.in_flight_wait),
            ("IdempotencyConfig::sweep_interval", self.sweep_interval),
            ("IdempotencyConfig::claim_lease", self.claim_lease),
            ("IdempotencyConfig::disk_timeout", self.disk_timeout),
        ];
        if let Some((name, value)) = durations.iter().find(|(_, d)| d.is_zero()) {
            return Err(zero(name, value));
        }
        if self.claim_lease < Self::MIN_CLAIM_LEASE {
            return Err(ConfigError {
                variable: "IdempotencyConfig::claim_lease",
                value: format!("{:?}", self.claim_lease),
                reason: "must be at least IdempotencyConfig::MIN_CLAIM_LEASE (300 ms): a shorter \
                         lease runs out before a replica can renew it",
            });
        }
        let counts = [
            ("IdempotencyConfig::ttl_seconds", self.ttl_seconds),
            (
                "IdempotencyConfig::max_cache_entries",
                self.max_cache_entries,
            ),
            (
                "IdempotencyConfig::max_requests_in_flight",
                u64::from(self.max_requests_in_flight),
            ),
        ];
        match counts.iter().find(|(_, n)| *n == 0) {
            Some((name, value)) => Err(zero(name, value)),
            None => Ok(self),
        }
    }

    /// The `capabilities.extensions[]` entry of the AgentCard, from the effective values.
    pub fn agent_card_extension(&self) -> Value {
        // The spec's words (§2), with this server's TTL in them.
        let description = format!(
            "Server-side request deduplication keyed on Message.message_id with {} TTL and \
             payload-hash binding.",
            spoken_duration(self.ttl_seconds)
        );
        json!({
            "uri": EXTENSION_URI,
            "description": description,
            "required": self.required,
            "params": {
                "ttl_seconds": self.ttl_seconds,
                "canonicalization": "jcs-rfc8785",
                "hash_algorithm": "sha-256",
                "max_cache_entries": self.max_cache_entries,
            }
        })
    }
}

/// An environment variable's value, as [`IdempotencyConfig::from_env`] reads it (for a
/// [`from_lookup`](IdempotencyConfig::from_lookup) of some variables only): one that is not
/// UTF-8 comes back with U+FFFD where its bytes were not, so that it is refused as malformed,
/// naming the variable, instead of taken for unset.
///
/// ```
/// use idem_runtime::config::{env_value, IdempotencyConfig, TTL_ENV};
/// let ttl_only = |name: &str| env_value(name).filter(|_| name == TTL_ENV);
/// assert!(IdempotencyConfig::from_lookup(ttl_only).is_ok());
/// ```
pub fn env_value(name: &str) -> Option<String> {
    std::env::var_os(name).map(|value| text_of(&value))
}

/// `value` as text, with U+FFFD where it is not UTF-8 (which no setting's parse accepts).
fn text_of(value: &std::ffi::OsStr) -> String {
    value.to_string_lossy().into_owned()
}

/// `seconds` as the spec's description says a TTL ("24h").
fn spoken_duration(seconds: u64) -> String {
    match seconds {
        s if s % 3600 == 0 => format!("{}h", s / 3600),
        s if s % 60 == 0 => format!("{}min", s / 60),
        s => format!("{s}s"),
    }
}

fn positive_integer(variable: &'static str, value: &str) -> Result<u64, ConfigError> {
    let reason = "expected a whole number from 1 to 9223372036854775807 (2^63 - 1)";
    whole_number(variable, value, 1..=i64::MAX as u64, reason)
}

fn whole_number(
    variable: &'static str,
    value: &str,
    range: std::ops::RangeInclusive<u64>,
    reason: &'static str,
) -> Result<u64, ConfigError> {
    match value.trim().parse::<u64>() {
        Ok(n) if range.contains(&n) => Ok(n),
        _ => Err(ConfigError {
            variable,
            value: value.to_owned(),
            reason,
        }),
    }
}

/// The largest timeout PostgreSQL takes (a 32-bit count of milliseconds): the PostgreSQL
/// store bounds its sessions by the lease, so a longer one would not mean what it says
/// (the store clamps a longer one set in code; from the environment it is refused).
pub(crate) const MAX_POSTGRES_TIMEOUT_MS: u64 = i32::MAX as u64;

fn a_claim_lease(variable: &'static str, value: &str) -> Result<Duration, ConfigError> {
    let reason = "expected a whole number of milliseconds from 300 (the shortest lease a \
                  replica can renew in time) to 2147483647 (PostgreSQL's largest timeout)";
    let shortest = IdempotencyConfig::MIN_CLAIM_LEASE.as_millis() as u64;
    whole_number(variable, value, shortest..=MAX_POSTGRES_TIMEOUT_MS, reason)
        .map(Duration::from_millis)
}

fn byte_count(variable: &'static str, value: &str) -> Result<usize, ConfigError> {
    value.trim().parse::<usize>().map_err(|_| ConfigError {
        variable,
        value: value.to_owned(),
        reason: "expected a whole number of bytes (0 or more)",
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn from(vars: &[(&str, &str)]) -> Result<IdempotencyConfig, ConfigError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        IdempotencyConfig::from_lookup(|name| map.get(name).cloned())
    }

    /// What the environment refuses is refused set in code too, by every builder, naming the
    /// field: a zero sweep interval panicked the sweeper unseen (helper-85).
    #[test]
    fn a_zero_that_the_environment_refuses_is_refused_set_in_code() {
        type Zero = fn(&mut IdempotencyConfig);
        let zeroes: [(&str, Zero); 7] = [
            ("in_flight_wait", |c| c.in_flight_wait = Duration::ZERO),
            ("sweep_interval", |c| c.sweep_interval = Duration::ZERO),
            ("claim_lease", |c| c.claim_lease = Duration::ZERO),
            ("disk_timeout", |c| c.disk_timeout = Duration::ZERO),
            ("ttl_seconds", |c| c.ttl_seconds = 0),
            ("max_cache_entries", |c| c.max_cache_entries = 0),
            ("max_requests_in_flight", |c| c.max_requests_in_flight = 0),
        ];
        let dir = tempfile::tempdir().unwrap();
        for (field, zero) in zeroes {
            let config = IdempotencyConfig::default().with(zero);
            let error = config.checked().unwrap_err();
            assert_eq!(error.variable, format!("IdempotencyConfig::{field}"));
            let opened = crate::Idempotency::open(dir.path().join("a.db"), config.clone());
            let Err(crate::store::StoreError::Config(refused)) = opened else {
                panic!("{field} = 0 must be refused by the builder")
            };
            assert_eq!(refused, error);
            // And by a store opened on its own (it was not: helper-96).
            let store = crate::store::SqliteStore::open(dir.path().join("b.db"), &config);
            let Err(crate::store::StoreError::Config(refused)) = store else {
                panic!("{field} = 0 must be refused by the store")
            };
            assert_eq!(refused, error);
        }
        assert!(IdempotencyConfig::default().checked().is_ok());
    }

    #[test]
    fn the_agent_card_says_the_spec_s_words_with_the_ttl_in_effect() {
        let spec = "Server-side request deduplication keyed on Message.message_id with 24h TTL \
                    and payload-hash binding.";
        let card = IdempotencyConfig::default().agent_card_extension();
        assert_eq!(card["description"], spec);
        for (ttl, said) in [
            (3600, "with 1h TTL"),
            (90, "with 90s TTL"),
            (120, "with 2min TTL"),
        ] {
            let card = from(&[(TTL_ENV, &ttl.to_string())])
                .unwrap()
                .agent_card_extension();
            assert!(
                card["description"].as_str().unwrap().contains(said),
                "{card}"
            );
        }
    }

    #[test]
    fn a_value_that_is_not_utf8_is_malformed_not_unset() {
        use std::os::unix::ffi::OsStrExt;
        let text = text_of(std::ffi::OsStr::from_bytes(b"6\xff0"));
        let err = positive_integer(TTL_ENV, &text).unwrap_err();
        assert_eq!(err.variable, TTL_ENV);
    }

    #[test]
    fn defaults_without_variables() {
        assert_eq!(from(&[]).unwrap(), IdempotencyConfig::default());
    }

    #[test]
    fn reads_both_variables() {
        let config = from(&[(TTL_ENV, "2"), (MAX_ENTRIES_ENV, " 500 ")]).unwrap();
        assert_eq!((config.ttl_seconds, config.max_cache_entries), (2, 500));
        let card = config.agent_card_extension();
        assert_eq!(card["params"]["ttl_seconds"], 2);
        assert_eq!(card["params"]["max_cache_entries"], 500);
        assert_eq!(card["required"], true);
        assert_eq!(card["uri"], EXTENSION_URI);
    }

    #[test]
    fn malformed_values_name_the_variable() {
        for bad in ["", "abc", "-1", "0", "1.5", "99999999999999999999"] {
            let err = from(&[(TTL_ENV, bad)]).unwrap_err();
            assert_eq!(err.variable, TTL_ENV);
            assert!(
                err.to_string().starts_with("AIWG_IDEMPOTENCY_TTL="),
                "{err}"
            );
        }
        // One past the largest the stores keep (a signed 64-bit integer): the reason says so.
        let err = from(&[(TTL_ENV, "9223372036854775808")]).unwrap_err();
        assert!(err.to_string().contains("to 9223372036854775807"), "{err}");
        let err = from(&[(MAX_ENTRIES_ENV, "lots")]).unwrap_err();
        assert_eq!(err.variable, MAX_ENTRIES_ENV);
        let err = from(&[(SWEEP_INTERVAL_ENV, "0")]).unwrap_err();
        assert_eq!(err.variable, SWEEP_INTERVAL_ENV);
        // A lease PostgreSQL could not take as a timeout is refused here, by name.
        // Any bad lease is told the lease's bounds (found by helper-45: 0 and a number past
        // 2^64 were told the TTL's).
        for bad in [
            "2147483648",
            "0",
            "99999999999999999999",
            "soon",
            "10",
            "299",
        ] {
            let err = from(&[(CLAIM_LEASE_ENV, bad)]).unwrap_err();
            assert_eq!(err.variable, CLAIM_LEASE_ENV);
            assert!(err.to_string().contains("from 300 "), "{err}");
            assert!(err.to_string().contains("to 2147483647"), "{err}");
        }
        let shortest = from(&[(CLAIM_LEASE_ENV, "300")]).unwrap();
        assert_eq!(shortest.claim_lease, IdempotencyConfig::MIN_CLAIM_LEASE);
        // Set in code, a lease under the floor is refused by every builder too.
        let short =
            IdempotencyConfig::default().with(|c| c.claim_lease = Duration::from_millis(10));
        let err = short.checked().unwrap_err();
        assert_eq!(err.variable, "IdempotencyConfig::claim_lease");
        let longest = from(&[(CLAIM_LEASE_ENV, "2147483647")]).unwrap();
        assert_eq!(longest.claim_lease, Duration::from_millis(2_147_483_647));
        for bad in ["", "-1", "64MiB", "1e6"] {
            let err = from(&[(MEMORY_TIER_BYTES_ENV, bad)]).unwrap_err();
            assert_eq!(err.variable, MEMORY_TIER_BYTES_ENV, "{bad:?}");
        }
    }

    #[test]
    fn reads_the_memory_tier_s_bound_in_bytes_zero_included() {
        let config = from(&[(MEMORY_TIER_BYTES_ENV, "1048576")]).unwrap();
        assert_eq!(config.memory_tier_bytes, 1 << 20);
        let off = from(&[(MEMORY_TIER_BYTES_ENV, "0")]).unwrap();
        assert_eq!(off.memory_tier_bytes, 0);
    }

    #[test]
    fn reads_the_durations_in_milliseconds() {
        let config = from(&[
            (SWEEP_INTERVAL_ENV, "250"),
            (IN_FLIGHT_WAIT_ENV, "1500"),
            (DISK_TIMEOUT_ENV, "2000"),
        ])
        .unwrap();
        assert_eq!(config.sweep_interval, Duration::from_millis(250));
        assert_eq!(config.in_flight_wait, Duration::from_millis(1500));
        assert_eq!(config.disk_timeout, Duration::from_secs(2));
        let err = from(&[(DISK_TIMEOUT_ENV, "0")]).unwrap_err();
        assert_eq!(err.variable, DISK_TIMEOUT_ENV);
    }
}
