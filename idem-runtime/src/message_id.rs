//! `Message.messageId`: the idempotency key (spec §4.2, §7.1, §7.2).
//!
//! The spec allows UUIDv7, UUIDv4, or any 128-bit random value rendered UUID-shaped. Such a value can
//! carry any version and variant digits, so the default check is on shape and entropy only; ids whose
//! version marks a non-random scheme are logged as anomalies (§7.2), and refused only in strict mode.
//!
//! ```
//! use idem_runtime::message_id::MessageId;
//! assert!(MessageId::parse_str("9b2e7c1a-3f4d-4e5a-8b6c-7d8e9f0a1b2c").is_ok());
//! assert!(MessageId::parse_str("not-a-uuid").is_err());
//! ```

use crate::caller::KeyScope;
use crate::hash::canonical_pass::FoundId;
use serde_json::Value;
use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// The `tracing` target of key anomalies (spec §7.2): a non-random UUID version, a messageId
/// reused with a different payload. A filter such as `idem::key_anomaly=warn` keeps them.
///
/// ```
/// use idem_runtime::message_id::KEY_ANOMALY;
/// // A directive for `tracing_subscriber::EnvFilter`: key anomalies at WARN, the rest at INFO.
/// let directives = format!("info,{KEY_ANOMALY}=warn");
/// assert_eq!(directives, "info,idem::key_anomaly=warn");
/// ```
pub const KEY_ANOMALY: &str = "idem::key_anomaly";

/// Logs a refused messageId on [`KEY_ANOMALY`] (spec §7.2: servers SHOULD log non-UUID
/// values); its first 64 characters, quoted and escaped, so no value can forge a log line.
fn refused(found: &FoundId, error: &MessageIdError) {
    let shown = match found {
        FoundId::Text(text) => format!("{:?}", text.chars().take(64).collect::<String>()),
        _ => "-".to_owned(),
    };
    tracing::warn!(
        target: KEY_ANOMALY,
        message_id = %shown,
        reason = %error,
        "messageId refused (400): clients send a UUIDv4 or UUIDv7 (spec 7.2)"
    );
}

/// How strictly message ids are checked.
///
/// ```
/// use idem_runtime::message_id::{MessageId, MessageIdError, MessageIdPolicy};
/// use idem_runtime::IdempotencyConfig;
/// let v1 = "6ba7b810-9dad-11d1-80b4-00c04fd430c8"; // time-based: not random
/// assert!(MessageId::parse_with(v1, MessageIdPolicy::Shape).is_ok()); // logged as an anomaly
/// assert_eq!(
///     MessageId::parse_with(v1, MessageIdPolicy::StrictV4V7),
///     Err(MessageIdError::NotV4OrV7)
/// );
/// let strict = MessageIdPolicy::StrictV4V7;
/// let strict = IdempotencyConfig::default().with(|c| c.message_id_policy = strict);
/// assert_eq!(strict.message_id_policy, MessageIdPolicy::StrictV4V7);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum MessageIdPolicy {
    /// Any UUID-shaped 128-bit value but nil and max; non-random versions are logged (default).
    #[default]
    Shape,
    /// Only RFC 9562 version 4 or 7 ids with the RFC variant.
    StrictV4V7,
}

/// A validated message id, in its one normalized (lowercase) form: the cache key. Shared, not
/// copied: the claim, the writer's batch and the memory tier each hold the one key.
///
/// ```
/// use idem_runtime::message_id::MessageId;
/// let id = MessageId::parse_str("0190B5A4-7C3E-7D2A-9F11-2B3C4D5E6F70").unwrap();
/// assert_eq!(id.as_str(), "0190b5a4-7c3e-7d2a-9f11-2b3c4d5e6f70");
/// assert!(MessageId::parse_str("not-a-uuid").is_err());
/// ```
#[derive(Clone)]
pub struct MessageId {
    text: Arc<str>,
    /// Taken once, here: the maps a call passes through hash by it (`fingerprint.rs`).
    fingerprint: u64,
}

/// Why a message id was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MessageIdError {
    /// No `params.message.messageId`.
    #[error("params.message.messageId is missing")]
    Missing,
    /// The params are an array or a scalar, where the messageId is looked for by name.
    #[error(
        "params must be an object holding message.messageId (by-name params), not an array \
         or a scalar"
    )]
    ParamsNotAnObject,
    /// The id is not a JSON string.
    #[error("params.message.messageId must be a string")]
    NotAString,
    /// The id is the empty string.
    #[error("params.message.messageId is empty")]
    Empty,
    /// The id has surrounding whitespace.
    #[error("params.message.messageId has leading or trailing whitespace")]
    Whitespace,
    /// Braces, `urn:uuid:`, or hyphens out of place.
    #[error("params.message.messageId must be the canonical UUID form xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx (braces and urn: forms are not accepted)")]
    NotCanonicalForm,
    /// Not exactly 32 hex digits.
    #[error("params.message.messageId must hold exactly 32 hex digits (128 bits)")]
    WrongLength,
    /// A character that is neither hex nor a hyphen.
    #[error("params.message.messageId has a non-hex character")]
    NotHex,
    /// The nil or max UUID.
    #[error("params.message.messageId is the nil or max UUID, which carries no entropy")]
    Degenerate,
    /// Strict mode: not an RFC 9562 v4 or v7.
    #[error("params.message.messageId is not a UUIDv4 or UUIDv7 (strict mode)")]
    NotV4OrV7,
}

impl MessageId {
    /// Parses the JSON value found at `params.message.messageId` (`None` when absent).
    pub fn parse_value(
        value: Option<&Value>,
        policy: MessageIdPolicy,
    ) -> Result<Self, MessageIdError> {
        let found = match value {
            None => FoundId::Missing,
            Some(Value::String(s)) => FoundId::Text(s.clone()),
            Some(_) => FoundId::NotAString,
        };
        Self::parse_found(found, policy)
    }

    /// Parses what the canonical pass found at `params.message.messageId`.
    pub(crate) fn parse_found(
        found: FoundId,
        policy: MessageIdPolicy,
    ) -> Result<Self, MessageIdError> {
        let parsed = match &found {
            FoundId::Missing => Err(MessageIdError::Missing),
            FoundId::ParamsNotAnObject => Err(MessageIdError::ParamsNotAnObject),
            FoundId::Text(s) => Self::parse_with(s, policy),
            FoundId::NotAString => Err(MessageIdError::NotAString),
        };
        if let Err(error) = &parsed {
            refused(&found, error);
        }
        parsed
    }

    /// Parses a string with the default policy.
    pub fn parse_str(s: &str) -> Result<Self, MessageIdError> {
        Self::parse_with(s, MessageIdPolicy::Shape)
    }

    /// Parses a string with the given policy.
    pub fn parse_with(s: &str, policy: MessageIdPolicy) -> Result<Self, MessageIdError> {
        check_shape(s)?;
        let mut lower = [0; 36];
        lower.copy_from_slice(s.as_bytes());
        lower.make_ascii_lowercase();
        let lower = std::str::from_utf8(&lower).expect("the shape is ASCII");
        let digits = Digits::of(lower);
        if digits.degenerate() {
            return Err(MessageIdError::Degenerate);
        }
        let id = MessageId::new(lower.into());
        match (policy, id.version(), id.has_rfc_variant()) {
            (MessageIdPolicy::StrictV4V7, 4 | 7, true) => {}
            (MessageIdPolicy::StrictV4V7, _, _) => return Err(MessageIdError::NotV4OrV7),
            (MessageIdPolicy::Shape, 1 | 2 | 3 | 5 | 6, true) => tracing::warn!(
                target: KEY_ANOMALY,
                message_id = %id,
                version = id.version(),
                "messageId uses a non-random UUID version; clients should send UUIDv4 or UUIDv7 (spec 7.2)"
            ),
            (MessageIdPolicy::Shape, _, _) => {}
        }
        if digits.look_low_entropy() {
            tracing::warn!(
                target: KEY_ANOMALY,
                message_id = %id,
                "messageId looks made by a counter, not at random (few distinct digits, or a \
                 counting run); clients should send UUIDv4 or UUIDv7 (spec 7.2)"
            );
        }
        Ok(id)
    }

    /// A key read back from the store, which only ever holds keys parsed here.
    pub(crate) fn from_stored(key: String) -> Self {
        MessageId::new(key.into())
    }

    fn new(text: Arc<str>) -> Self {
        let fingerprint = crate::fingerprint::of(&text);
        MessageId { text, fingerprint }
    }

    /// Which of `slots` slots the key falls in, for counters kept per group of keys.
    pub(crate) fn slot(&self, slots: usize) -> usize {
        (self.fingerprint % slots as u64) as usize
    }

    /// The key's fingerprint (`fingerprint.rs`).
    pub(crate) fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    /// The normalized lowercase form: the stored key (`<messageId>~<scope>` when scoped).
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The client's messageId, without the scope a scoped key carries.
    pub fn message_id(&self) -> &str {
        self.text
            .split_once('~')
            .map_or(&*self.text, |(id, _scope)| id)
    }

    /// The key this messageId is stored under for `principal`, where keys are scoped by
    /// principal ([`crate::IdempotencyConfig::scope_keys_by_principal`]).
    ///
    /// ```
    /// use idem_runtime::message_id::MessageId;
    /// let id = MessageId::parse_str("0190b5a4-7c3e-7d2a-9f11-2b3c4d5e6f70").unwrap();
    /// let alice = id.for_principal("alice");
    /// assert_ne!(alice, id.for_principal("bob"));
    /// assert_eq!(alice.message_id(), id.as_str());
    /// ```
    pub fn for_principal(&self, principal: &str) -> Self {
        self.scoped(&KeyScope::of(principal))
    }

    pub(crate) fn scoped(&self, scope: &KeyScope) -> Self {
        MessageId::new(format!("{}~{}", self.message_id(), scope.suffix()).into())
    }

    /// The RFC 9562 version digit (meaningful only with the RFC variant).
    pub fn version(&self) -> u8 {
        hex_value(self.text.as_bytes()[14])
    }

    fn has_rfc_variant(&self) -> bool {
        hex_value(self.text.as_bytes()[19]) & 0b1100 == 0b1000
    }
}

impl fmt::Display for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl fmt::Debug for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("MessageId").field(&self.text).finish()
    }
}

impl PartialEq for MessageId {
    fn eq(&self, other: &Self) -> bool {
        self.fingerprint == other.fingerprint && self.text == other.text
    }
}

impl Eq for MessageId {}

/// The fingerprint alone: equal keys have equal texts, so equal fingerprints.
impl Hash for MessageId {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.fingerprint);
    }
}

impl PartialOrd for MessageId {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for MessageId {
    fn cmp(&self, other: &Self) -> Ordering {
        self.text.cmp(&other.text)
    }
}

const HYPHENS: [usize; 4] = [8, 13, 18, 23];

fn check_shape(s: &str) -> Result<(), MessageIdError> {
    if is_canonical_form(s.as_bytes()) {
        return Ok(()); // what clients send: the reasons below are for what they should not
    }
    if s.is_empty() {
        return Err(MessageIdError::Empty);
    }
    if s.trim() != s {
        return Err(MessageIdError::Whitespace);
    }
    if s.starts_with('{') || s.to_ascii_lowercase().starts_with("urn:") {
        return Err(MessageIdError::NotCanonicalForm);
    }
    let digits = s.chars().filter(|c| *c != '-').count();
    if s.chars().any(|c| c != '-' && !c.is_ascii_hexdigit()) {
        return Err(MessageIdError::NotHex);
    }
    if digits != 32 {
        return Err(MessageIdError::WrongLength);
    }
    let hyphens_in_place = s.len() == 36
        && s.bytes()
            .enumerate()
            .all(|(i, b)| (b == b'-') == HYPHENS.contains(&i));
    if !hyphens_in_place {
        return Err(MessageIdError::NotCanonicalForm);
    }
    Ok(())
}

/// [`Digits::look_low_entropy`] of `id`.
#[cfg(test)]
fn looks_low_entropy(id: &str) -> bool {
    Digits::of(id).look_low_entropy()
}

/// What one pass over a UUID-shaped id's 32 hex digits tells.
struct Digits {
    /// Bit `d` set where digit `d` occurs.
    seen: u16,
    counting: Run,
    repeating: Run,
}

impl Digits {
    fn of(id: &str) -> Self {
        let mut digits = Digits {
            seen: 0,
            counting: Run::default(),
            repeating: Run::default(),
        };
        let mut last = None;
        for digit in id.bytes().filter(|b| *b != b'-').map(hex_value) {
            digits.seen |= 1 << digit;
            digits
                .counting
                .extend(last.is_some_and(|previous| digit == previous + 1));
            digits.repeating.extend(last == Some(digit));
            last = Some(digit);
        }
        digits
    }

    /// The nil UUID (all zeros) or the max (all `f`).
    fn degenerate(&self) -> bool {
        self.seen == 1 || self.seen == 1 << 15
    }

    /// Whether a UUID-shaped id's 32 hex digits look like no random scheme made them (spec §7.2
    /// names incrementing integers and timestamps without a random suffix): six or fewer distinct
    /// digits, which about one random id in five billion has; eight in a row that each count one up
    /// (about one in twenty million); or twelve equal digits in a row, the padding of a counter or
    /// timestamp written into the id (about one in a trillion). Logged only: no single value proves
    /// its entropy.
    fn look_low_entropy(&self) -> bool {
        self.seen.count_ones() <= 6 || self.counting.longest >= 8 || self.repeating.longest >= 12
    }
}

/// The longest run of digits that each follow the one before by some rule.
#[derive(Default)]
struct Run {
    current: u32,
    longest: u32,
}

impl Run {
    fn extend(&mut self, follows: bool) {
        self.current = if follows { self.current + 1 } else { 1 };
        self.longest = self.longest.max(self.current);
    }
}

fn hex_value(b: u8) -> u8 {
    match b {
        b'0'..=b'9' => b - b'0',
        b'a'..=b'f' => b - b'a' + 10,
        b'A'..=b'F' => b - b'A' + 10,
        _ => 0,
    }
}

/// `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` in hex digits of either case.
fn is_canonical_form(s: &[u8]) -> bool {
    s.len() == 36
        && s.iter().enumerate().all(|(i, &b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => b.is_ascii_hexdigit(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn err(s: &str) -> MessageIdError {
        MessageId::parse_str(s).unwrap_err()
    }

    #[test]
    fn counters_and_repeats_look_low_entropy_and_random_ids_do_not() {
        for made in [
            "11111111-1111-1111-1111-111111111111",
            "00000000-0000-0000-0000-000000000001",
            "deadbeef-dead-beef-dead-beefdeadbeef",
            "12345678-1234-1234-1234-123456789012",
            "0c8f2a41-9e3b-4d57-a123-456789abcdef",
            // Zero-padded: a counter, a millisecond timestamp.
            "00000000-0000-0000-0000-00004a3f2c7e",
            "00000000-0000-4000-8000-0193a2b4c5d6",
        ] {
            assert!(looks_low_entropy(made), "{made}");
            assert!(
                MessageId::parse_str(made).is_ok(),
                "logged, not refused: {made}"
            );
        }
        // 200,000 random 128-bit values (xorshift, fixed seed): none flagged.
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..200_000 {
            let hex = format!("{:016x}{:016x}", next(), next());
            let id = format!(
                "{}-{}-{}-{}-{}",
                &hex[..8],
                &hex[8..12],
                &hex[12..16],
                &hex[16..20],
                &hex[20..]
            );
            assert!(!looks_low_entropy(&id), "{id}");
        }
        assert!(
            !looks_low_entropy("01a24562-64fb-7377-be6e-c1f25ff25420"),
            "a UUIDv7"
        );
    }

    #[test]
    fn accepts_v4_v7_and_any_random_looking_value() {
        for ok in [
            "0190b5a4-7c3e-7d2a-9f11-2b3c4d5e6f70", // v7
            "9b2e7c1a-3f4d-4e5a-8b6c-7d8e9f0a1b2c", // v4
            "9b2e7c1a-3f4d-fe5a-cb6c-7d8e9f0a1b2c", // random 128 bits, any version/variant
            "00000000-0000-0000-0000-000000000001",
        ] {
            assert_eq!(MessageId::parse_str(ok).unwrap().as_str(), ok);
        }
    }

    #[test]
    fn normalizes_case() {
        let upper = MessageId::parse_str("9B2E7C1A-3F4D-4E5A-8B6C-7D8E9F0A1B2C").unwrap();
        let lower = MessageId::parse_str("9b2e7c1a-3f4d-4e5a-8b6c-7d8e9f0a1b2c").unwrap();
        assert_eq!(upper, lower);
    }

    #[test]
    fn refuses_each_malformation_with_its_reason() {
        use MessageIdError::*;
        assert_eq!(err(""), Empty);
        assert_eq!(err(" 9b2e7c1a-3f4d-4e5a-8b6c-7d8e9f0a1b2c"), Whitespace);
        assert_eq!(err("9b2e7c1a-3f4d-4e5a-8b6c-7d8e9f0a1b2c\n"), Whitespace);
        assert_eq!(
            err("{9b2e7c1a-3f4d-4e5a-8b6c-7d8e9f0a1b2c}"),
            NotCanonicalForm
        );
        assert_eq!(
            err("urn:uuid:9b2e7c1a-3f4d-4e5a-8b6c-7d8e9f0a1b2c"),
            NotCanonicalForm
        );
        assert_eq!(err("9b2e7c1a3f4d4e5a8b6c7d8e9f0a1b2c"), NotCanonicalForm);
        assert_eq!(
            err("9b2e7c1a-3f4d4-e5a-8b6c-7d8e9f0a1b2c"),
            NotCanonicalForm
        );
        assert_eq!(err("9b2e7c1a-3f4d-4e5a-8b6c-7d8e9f0a1b2"), WrongLength);
        assert_eq!(err("9b2e7c1a-3f4d-4e5a-8b6c-7d8e9f0a1b2c0"), WrongLength);
        assert_eq!(err("12345"), WrongLength);
        assert_eq!(err("9b2e7c1a-3f4d-4e5a-8b6c-7d8e9f0a1b2g"), NotHex);
        assert_eq!(err("msg-1"), NotHex);
        assert_eq!(err("00000000-0000-0000-0000-000000000000"), Degenerate);
        assert_eq!(err("FFFFFFFF-FFFF-FFFF-FFFF-FFFFFFFFFFFF"), Degenerate);
    }

    #[test]
    fn refuses_non_strings_and_absence() {
        let p = MessageIdPolicy::Shape;
        assert_eq!(
            MessageId::parse_value(None, p),
            Err(MessageIdError::Missing)
        );
        for v in [
            json!(42),
            json!(null),
            json!(["a"]),
            json!({"id": 1}),
            json!(true),
        ] {
            assert_eq!(
                MessageId::parse_value(Some(&v), p),
                Err(MessageIdError::NotAString)
            );
        }
    }

    #[test]
    fn non_random_versions_are_accepted_by_default_and_refused_when_strict() {
        let v1 = "c232ab00-9414-11ec-b3c8-9f6bdeced846";
        assert_eq!(MessageId::parse_str(v1).unwrap().version(), 1);
        let strict = MessageIdPolicy::StrictV4V7;
        assert_eq!(
            MessageId::parse_with(v1, strict),
            Err(MessageIdError::NotV4OrV7)
        );
        assert!(MessageId::parse_with("0190b5a4-7c3e-7d2a-9f11-2b3c4d5e6f70", strict).is_ok());
        assert!(MessageId::parse_with("9b2e7c1a-3f4d-4e5a-8b6c-7d8e9f0a1b2c", strict).is_ok());
        // Right version digit, wrong variant: not an RFC 9562 v4.
        assert_eq!(
            MessageId::parse_with("9b2e7c1a-3f4d-4e5a-cb6c-7d8e9f0a1b2c", strict),
            Err(MessageIdError::NotV4OrV7)
        );
    }
}
