//! What the extension tells an operator: is deduplication working, how often do clients retry,
//! how big is the cache, and why was a call refused.
//!
//! Counters, gauges and histograms go through the [`metrics`] facade: the runtime forces no
//! exporter, and costs next to nothing until the application installs a recorder (the example
//! server installs a Prometheus one and serves `GET /metrics`). Labels are the method and the
//! outcome, never the messageId (one series per key would be unbounded). Every governed call
//! also runs in a `tracing` span, `idempotent_call` at DEBUG, whose fields name the key, the
//! method, the request hash's first 16 hex digits and the outcome; a collision is logged at
//! WARN (target `idem::key_anomaly`) with both hashes, so a 422 can be explained from the logs
//! alone.
//!
//! ```
//! // After installing a recorder, give the metrics their help texts:
//! idem_runtime::telemetry::describe();
//! assert!(idem_runtime::telemetry::METRICS.iter().any(|m| m.name == "idempotency_calls_total"));
//! ```

use std::future::Future;
use std::time::{Duration, Instant};

use metrics::{counter, gauge, histogram, SharedString};

use crate::error::ErrorCode;
use crate::layers::scope::Outcome;
use crate::store::{StoreError, StoreStats};

/// One metric the runtime emits.
#[derive(Debug, Clone, Copy)]
pub struct Metric {
    /// Its name, as exporters show it.
    pub name: &'static str,
    /// Counter, gauge or histogram.
    pub kind: &'static str,
    /// Its labels.
    pub labels: &'static [&'static str],
    /// What it counts.
    pub help: &'static str,
}

const CALLS: &str = "idempotency_calls_total";
const REJECTIONS: &str = "idempotency_rejections_total";
const WAITS: &str = "idempotency_in_flight_waits_total";
const WAIT_SECONDS: &str = "idempotency_in_flight_wait_seconds";
const STORE_ERRORS: &str = "idempotency_store_errors_total";
const EVICTIONS: &str = "idempotency_evictions_total";
const SWEEP_SECONDS: &str = "idempotency_sweep_seconds";
const ENTRIES: &str = "idempotency_entries";
const STORED_BYTES: &str = "idempotency_stored_bytes";
const CLAIM_SECONDS: &str = "idempotency_claim_seconds";
const COMMIT_SECONDS: &str = "idempotency_commit_seconds";

/// Every metric the runtime emits: the README's list, and [`describe`]'s.
pub const METRICS: &[Metric] = &[
    Metric {
        name: CALLS,
        kind: "counter",
        labels: &["method", "outcome"],
        help: "Governed calls by outcome: executed, replayed, attached (to a running stream), \
               collision (422), rejected (any other refusal, by error name in \
               idempotency_rejections_total), store_error, undeduplicated (run without \
               deduplication: the extension off, or optional and not activated)",
    },
    Metric {
        name: REJECTIONS,
        kind: "counter",
        labels: &["method", "code"],
        help: "Calls the extension refused, by error name, the 422s included (so its sum is \
               the calls of outcome rejected and collision): IDEMPOTENCY_KEY_MALFORMED is the \
               400, EXTENSION_SUPPORT_REQUIRED -32008, IDEMPOTENCY_REQUEST_IN_PROGRESS the 409",
    },
    Metric {
        name: WAITS,
        kind: "counter",
        labels: &["method", "result"],
        help: "Duplicates that waited for the running original: done, attached, released, \
               still_running (answered 409)",
    },
    Metric {
        name: WAIT_SECONDS,
        kind: "histogram",
        labels: &["method"],
        help: "How long a duplicate waited for the running original",
    },
    Metric {
        name: STORE_ERRORS,
        kind: "counter",
        labels: &["kind"],
        help: "Store failures answered to a call: backend, write (a staged write refused), \
               claim_lost, commit (a lost transaction), closed, corrupt, io. Nothing of the \
               call was stored, except after a disk or database that did not answer in time: \
               its writes may still commit, and a retry then replays them",
    },
    Metric {
        name: EVICTIONS,
        kind: "counter",
        labels: &["reason"],
        help: "Entries deleted before a client asked again: ttl (swept), lru (the \
               max_cache_entries bound)",
    },
    Metric {
        name: SWEEP_SECONDS,
        kind: "histogram",
        labels: &[],
        help: "Duration of one TTL sweep",
    },
    Metric {
        name: ENTRIES,
        kind: "gauge",
        labels: &[],
        help: "Entries the store holds, read when the sweeper starts and after each sweep",
    },
    Metric {
        name: STORED_BYTES,
        kind: "gauge",
        labels: &[],
        help: "Bytes of stored response bodies, read when the sweeper starts and after each sweep",
    },
    Metric {
        name: CLAIM_SECONDS,
        kind: "histogram",
        labels: &["method"],
        help: "Time to claim a key: the store read, and on a shared store its claim",
    },
    Metric {
        name: COMMIT_SECONDS,
        kind: "histogram",
        labels: &["method"],
        help: "Time to commit an outcome with the call's staged writes, durably",
    },
];

/// Registers every metric's help text with the installed recorder, and its counters' series
/// at zero: call it once, after installing one (a recorder installed later has no help texts
/// and shows each series from its first event on, and nothing else changes).
pub fn describe() {
    for metric in METRICS {
        match metric.kind {
            "counter" => metrics::describe_counter!(metric.name, metric.help),
            "gauge" => metrics::describe_gauge!(metric.name, metric.help),
            _ => metrics::describe_histogram!(metric.name, metric.help),
        }
    }
    counters_at_zero();
}

/// The outcomes of [`CALLS`], as [`outcome_label`] and [`store_error`] name them.
const OUTCOMES: [&str; 7] = [
    "executed",
    "replayed",
    "attached",
    "collision",
    "rejected",
    "store_error",
    "undeduplicated",
];

/// The codes a governed call is refused with ([`REJECTIONS`]): the series rendered at zero.
/// The others are answered as a call's outcome (`executed`), or as `store_error`, never as a
/// refusal: their series would sit at zero forever, and an alert on them never fire.
const REJECTION_CODES: [ErrorCode; 9] = [
    ErrorCode::KeyReusedWithDifferentPayload,
    ErrorCode::KeyMalformed,
    ErrorCode::RequestInProgress,
    ErrorCode::PayloadNotCanonicalizable,
    ErrorCode::ExtensionSupportRequired,
    ErrorCode::LayerMissing,
    ErrorCode::HttpOnly,
    ErrorCode::StreamInBatch,
    ErrorCode::NotGuarded,
];

/// The results of [`WAITS`] (`Waited::label`).
const WAIT_RESULTS: [&str; 4] = ["done", "attached", "released", "still_running"];

/// The kinds of [`STORE_ERRORS`] a call can be answered with (`StoreError::kind`).
const CALL_STORE_ERRORS: [&str; 7] = [
    "backend",
    "write",
    "claim_lost",
    "commit",
    "closed",
    "corrupt",
    "io",
];

/// The counters' series whose labels are known in advance (those of the default governed
/// methods), at zero. A series that first appears at 1 has no increase to show: an alert on
/// `increase(idempotency_calls_total{outcome="collision"}[5m]) > 0` missed the first 422 of a
/// server's life, and a dashboard showed no replays as no data.
fn counters_at_zero() {
    for method in crate::idempotency::DEFAULT_GOVERNED_METHODS {
        for outcome in OUTCOMES {
            counter!(CALLS, "method" => method, "outcome" => outcome).increment(0);
        }
        for result in WAIT_RESULTS {
            counter!(WAITS, "method" => method, "result" => result).increment(0);
        }
        for code in REJECTION_CODES {
            counter!(REJECTIONS, "method" => method, "code" => code.name()).increment(0);
        }
    }
    for kind in CALL_STORE_ERRORS {
        counter!(STORE_ERRORS, "kind" => kind).increment(0);
    }
    for reason in ["ttl", "lru"] {
        counter!(EVICTIONS, "reason" => reason).increment(0);
    }
}

/// The outcome label of a recorded outcome.
fn outcome_label(outcome: Outcome) -> &'static str {
    match outcome {
        Outcome::Executed => "executed",
        Outcome::Replayed => "replayed",
        Outcome::Attached => "attached",
        Outcome::Rejected(ErrorCode::KeyReusedWithDifferentPayload) => "collision",
        Outcome::Rejected(_) => "rejected",
        Outcome::Undeduplicated => "undeduplicated",
    }
}

/// The method as a label: the governed methods' names without an allocation per call (a
/// method governed by configuration pays one).
fn method_label(method: &str) -> SharedString {
    match crate::idempotency::DEFAULT_GOVERNED_METHODS
        .iter()
        .find(|name| **name == method)
    {
        Some(name) => SharedString::const_str(name),
        None => SharedString::from(method.to_owned()),
    }
}

/// Counts what happened to a governed call of `method`, and notes it in the call's span.
pub(crate) fn outcome(method: &str, outcome: Outcome) {
    let label = outcome_label(outcome);
    tracing::Span::current().record("outcome", label);
    counter!(CALLS, "method" => method_label(method), "outcome" => label).increment(1);
    if let Outcome::Rejected(code) = outcome {
        counter!(REJECTIONS, "method" => method_label(method), "code" => code.name()).increment(1);
    }
}

/// Counts a store failure answered to a call of `method` (none for work outside a call).
pub(crate) fn store_error(method: Option<&str>, error: &StoreError) {
    counter!(STORE_ERRORS, "kind" => error.kind()).increment(1);
    if let Some(method) = method {
        tracing::Span::current().record("outcome", "store_error");
        counter!(CALLS, "method" => method_label(method), "outcome" => "store_error").increment(1);
    }
}

/// Counts a duplicate's wait for the running original, and how long it took.
pub(crate) fn waited(method: &str, result: &'static str, took: Duration) {
    counter!(WAITS, "method" => method_label(method), "result" => result).increment(1);
    histogram!(WAIT_SECONDS, "method" => method_label(method)).record(took);
}

/// Records the time a claim of a key of `method` took.
pub(crate) fn claimed(method: &str, took: Duration) {
    histogram!(CLAIM_SECONDS, "method" => method_label(method)).record(took);
}

/// Runs `commit`, a commit of a call of `method` (its outcome or a stream's start, with the
/// call's staged writes), and records the time it took.
pub(crate) async fn committed<T>(method: &str, commit: impl Future<Output = T>) -> T {
    let started = Instant::now();
    let done = commit.await;
    histogram!(COMMIT_SECONDS, "method" => method_label(method)).record(started.elapsed());
    done
}

/// Counts entries deleted for `reason` (`ttl` or `lru`).
pub(crate) fn evicted(reason: &'static str, count: u64) {
    if count > 0 {
        counter!(EVICTIONS, "reason" => reason).increment(count);
    }
}

/// Records a sweep's duration.
pub(crate) fn swept(took: Duration) {
    histogram!(SWEEP_SECONDS).record(took);
}

/// Records the store's size.
pub(crate) fn sized(stats: &StoreStats) {
    gauge!(ENTRIES).set(stats.entries as f64);
    gauge!(STORED_BYTES).set(stats.bytes as f64);
}

/// The span a governed call runs in (see the module's documentation).
pub(crate) fn call_span(method: &str, key: &str, hash: &str) -> tracing::Span {
    tracing::debug_span!(
        "idempotent_call",
        method,
        message_id = key,
        request_hash = &hash[..16.min(hash.len())],
        outcome = tracing::field::Empty,
    )
}
