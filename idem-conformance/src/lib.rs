//! The conformance scenarios of idempotency/v1 (spec §6 AC-1..AC-4, plus §3 and §7.1, and the
//! same guarantees for streams in `streams.rs`), runnable against any server that implements the
//! extension. Each scenario is an async fn returning a
//! clear failure message; [`check`] decides whether it applies (from the AgentCard and the hooks
//! the caller has) and runs it. Used by the `conformance` command
//! line (`cli.rs`: `cargo run -p idem-conformance -- --url ...`) and by the workspace's tests,
//! which also start the example server through [`server_process`].
//!
//! Hooks a server may not offer: `metadata.delayMs` keeps a request in flight and
//! `metadata.durationMs` a stream running (our example server; elsewhere the concurrent
//! duplicates simply overlap less, and the checks that need a running stream do not apply), and a
//! database path lets the harness count `tasks` rows and `mission.assigned` outbox events (our
//! example server's schema) and see when an entry is stored (`idempotency_cache`, spec §4.4).

pub mod cli;
pub mod client;
pub mod postgres;
pub mod request;
pub mod request_hash;
mod restarted;
pub mod server_process;
pub mod side_effects;
pub mod sse;
mod streams;

pub use streams::stream_collision;

use std::time::{Duration, Instant};

use futures::future::{join_all, BoxFuture};
use serde_json::{json, Value};

use client::{CardEntry, Client, Reply, EXTENSION_URI};
use request::{new_message_id, new_message_id_v7, send, send_with_id_field};
use request_hash::request_hash;
pub use side_effects::Db;
use side_effects::SideEffects;

/// AC-3 waits past the TTL; longer TTLs than this are skipped rather than waited for.
pub const MAX_AC3_TTL_SECONDS: u64 = 5;
/// Margin past the TTL: entries are stamped in whole seconds (spec §4.4 `inserted_at`).
const AC3_MARGIN: Duration = Duration::from_millis(1500);
/// How many identical requests race in `concurrent-duplicates`, and how long each stays in flight.
const CONCURRENT_DUPLICATES: usize = 20;
const IN_FLIGHT_DELAY_MS: u64 = 500;

const KEY_REUSED: &str = "IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_PAYLOAD";

/// Every scenario, in the order the CLI runs them (the two that restart the server last).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    AgentCard,
    Ac1,
    Ac2,
    MalformedMessageId,
    NotActivated,
    ConcurrentDuplicates,
    CachedFailure,
    Ac3,
    StreamFresh,
    StreamReplay,
    StreamCollision,
    StreamMalformedId,
    StreamAttach,
    StreamDisconnectRetry,
    StreamA2a10,
    Ac4,
    StreamRestart,
}

impl Scenario {
    pub const ALL: [Scenario; 17] = [
        Scenario::AgentCard,
        Scenario::Ac1,
        Scenario::Ac2,
        Scenario::MalformedMessageId,
        Scenario::NotActivated,
        Scenario::ConcurrentDuplicates,
        Scenario::CachedFailure,
        Scenario::Ac3,
        Scenario::StreamFresh,
        Scenario::StreamReplay,
        Scenario::StreamCollision,
        Scenario::StreamMalformedId,
        Scenario::StreamAttach,
        Scenario::StreamDisconnectRetry,
        Scenario::StreamA2a10,
        Scenario::Ac4,
        Scenario::StreamRestart,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Scenario::AgentCard => "idempotency-v1-agent-card",
            Scenario::Ac1 => "idempotency-v1-ac1",
            Scenario::Ac2 => "idempotency-v1-ac2",
            Scenario::MalformedMessageId => "idempotency-v1-malformed-message-id",
            Scenario::NotActivated => "idempotency-v1-not-activated",
            Scenario::ConcurrentDuplicates => "idempotency-v1-concurrent-duplicates",
            Scenario::CachedFailure => "idempotency-v1-cached-failure",
            Scenario::Ac3 => "idempotency-v1-ac3",
            Scenario::Ac4 => "idempotency-v1-ac4",
            Scenario::StreamFresh => "idempotency-v1-stream-fresh",
            Scenario::StreamReplay => "idempotency-v1-stream-replay",
            Scenario::StreamCollision => "idempotency-v1-stream-collision",
            Scenario::StreamMalformedId => "idempotency-v1-stream-malformed-id",
            Scenario::StreamAttach => "idempotency-v1-stream-attach",
            Scenario::StreamDisconnectRetry => "idempotency-v1-stream-disconnect-retry",
            Scenario::StreamA2a10 => "idempotency-v1-stream-a2a-1.0",
            Scenario::StreamRestart => "idempotency-v1-stream-restart",
        }
    }

    /// Whether the scenario streams (and so applies only to servers that declare streaming).
    pub fn streams(self) -> bool {
        matches!(
            self,
            Scenario::StreamFresh
                | Scenario::StreamReplay
                | Scenario::StreamCollision
                | Scenario::StreamMalformedId
                | Scenario::StreamAttach
                | Scenario::StreamDisconnectRetry
                | Scenario::StreamA2a10
                | Scenario::StreamRestart
        )
    }
}

/// What became of one scenario.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Pass,
    Fail(String),
    Skip(String),
}

/// Restarts the server under test and returns its (possibly new) base URL once it answers.
pub type Restart<'a> = Box<dyn FnOnce() -> BoxFuture<'a, Result<String, String>> + Send + 'a>;

/// The server under test.
pub struct Target {
    client: Client,
    side_effects: SideEffects,
}

impl Target {
    /// `db`: the server's database, if the harness may read it (side-effect checks).
    pub fn new(url: &str, db: Option<Db>) -> Self {
        Self {
            client: Client::new(url),
            side_effects: SideEffects { db },
        }
    }

    /// The same server reached at another URL (after a restart on another port).
    fn at(&self, url: &str) -> Self {
        Self::new(url, self.side_effects.db.clone())
    }

    /// An in-scope request that activates the extension.
    async fn post(&self, body: &str) -> Result<Reply, String> {
        self.client.post(body, true).await
    }
}

/// Runs `scenario` unless it does not apply; `restart` is needed by AC-4 and stream-restart only.
pub async fn check(scenario: Scenario, target: &Target, restart: Option<Restart<'_>>) -> Outcome {
    let card = match target.client.card().await {
        Ok(card) => card,
        Err(e) => return Outcome::Fail(format!("AgentCard: {e}")),
    };
    if let Some(reason) = skip_reason(scenario, &card, restart.is_some()) {
        return Outcome::Skip(reason);
    }
    let result = match (scenario, restart) {
        (Scenario::AgentCard, _) => agent_card(&card),
        (Scenario::Ac1, _) => ac1(target).await,
        (Scenario::Ac2, _) => ac2(target).await,
        (Scenario::MalformedMessageId, _) => malformed_message_id(target).await,
        (Scenario::NotActivated, _) => not_activated(target).await,
        (Scenario::ConcurrentDuplicates, _) => concurrent_duplicates(target).await,
        (Scenario::CachedFailure, _) => return cached_failure(target).await,
        (Scenario::Ac3, _) => ac3(target, card.ttl_seconds).await,
        (Scenario::Ac4, Some(restart)) => ac4(target, card.ttl_seconds, restart).await,
        (Scenario::StreamFresh, _) => streams::stream_fresh(target).await,
        (Scenario::StreamReplay, _) => streams::stream_replay(target).await,
        (Scenario::StreamCollision, _) => streams::stream_collision(target).await,
        (Scenario::StreamMalformedId, _) => streams::stream_malformed_id(target).await,
        (Scenario::StreamAttach, _) => streams::stream_attach(target).await,
        (Scenario::StreamDisconnectRetry, _) => streams::stream_disconnect_retry(target).await,
        (Scenario::StreamA2a10, _) => streams::stream_a2a_1_0(target).await,
        (Scenario::StreamRestart, Some(restart)) => {
            streams::stream_restart(target, card.ttl_seconds, restart).await
        }
        (Scenario::Ac4 | Scenario::StreamRestart, None) => {
            unreachable!("skip_reason skips the restart scenarios without a restart hook")
        }
    };
    match result {
        Ok(()) => Outcome::Pass,
        Err(reason) => Outcome::Fail(reason),
    }
}

/// Why `scenario` cannot run against this server with these hooks, if it cannot.
pub fn skip_reason(scenario: Scenario, card: &CardEntry, can_restart: bool) -> Option<String> {
    if scenario.streams() && !card.streaming {
        return Some("the AgentCard does not declare capabilities.streaming: true".into());
    }
    match scenario {
        Scenario::Ac3 if card.ttl_seconds > MAX_AC3_TTL_SECONDS => Some(format!(
            "needs params.ttl_seconds <= {MAX_AC3_TTL_SECONDS} to wait past it, the AgentCard says {} \
             (start the server with e.g. AIWG_IDEMPOTENCY_TTL=2)",
            card.ttl_seconds
        )),
        Scenario::Ac4 | Scenario::StreamRestart if !can_restart => {
            Some("needs a way to restart the server (--restart-cmd)".into())
        }
        Scenario::StreamA2a10 if !card.jsonrpc_1_0 => Some(
            "the AgentCard lists no supportedInterfaces[] entry with JSONRPC and protocolVersion 1.0"
                .into(),
        ),
        Scenario::NotActivated if !card.required => {
            Some("the AgentCard declares the extension required: false".into())
        }
        _ => None,
    }
}

/// §3.1: the AgentCard declares the extension with the params clients rely on.
pub fn agent_card(card: &CardEntry) -> Result<(), String> {
    let params = &card.raw["params"];
    ensure(card.raw["required"].is_boolean(), || {
        format!("`required` must be a boolean: {}", card.raw)
    })?;
    ensure(card.ttl_seconds > 0, || {
        "params.ttl_seconds must be positive".into()
    })?;
    ensure(params["canonicalization"] == "jcs-rfc8785", || {
        format!("params.canonicalization must be \"jcs-rfc8785\": {params}")
    })?;
    ensure(params["hash_algorithm"] == "sha-256", || {
        format!("params.hash_algorithm must be \"sha-256\": {params}")
    })?;
    match params.get("max_cache_entries") {
        Some(max) if max.as_u64().is_none_or(|m| m == 0) => Err(format!(
            "params.max_cache_entries must be a positive integer: {max}"
        )),
        _ => Ok(()),
    }
}

/// AC-1 (§6.1): an identical retry, also with other key order and whitespace, is the cached
/// response byte for byte with `Idempotent-Replayed: true`, and adds no side effect. Its key is
/// a UUIDv7, the form §7.2 recommends; a retry under another JSON-RPC id is the same result
/// under that id (JSON-RPC 2.0 §5: a response carries its request's id).
pub async fn ac1(target: &Target) -> Result<(), String> {
    let message_id = new_message_id_v7();
    let body = send(1, &message_id, "idempotency-v1-ac1", request::jcs_probe());
    let before = target.side_effects.snapshot()?;
    let first = target.post(&body).await?;
    expect_fresh(&first, "first send")?;
    target
        .side_effects
        .expect_added(before, 1, "the first send")?;

    let replay = target.post(&body).await?;
    expect_replay_of(&first, &replay, "identical retry")?;
    // §3.2: activated in a comma-separated list with another extension.
    let listed = format!("https://example.invalid/another-extension/v1, {EXTENSION_URI}");
    let headers = [("A2A-Extensions", listed.as_str())];
    let among_others = target.client.post_with(body.clone(), &headers).await?;
    expect_replay_of(&first, &among_others, "retry activating it among others")?;
    let reordered = target.post(&request::reordered(&body)).await?;
    expect_replay_of(
        &first,
        &reordered,
        "retry with other key order and whitespace",
    )?;
    // §5: the same values in other spellings (`1` for `1.0`, an escaped letter).
    let respelled = target.post(&request::respelled(&body)).await?;
    expect_replay_of(
        &first,
        &respelled,
        "retry with numbers and strings spelled otherwise",
    )?;
    let other_id = send(2, &message_id, "idempotency-v1-ac1", request::jcs_probe());
    let under_its_id = target.post(&other_id).await?;
    expect_replay_under_id(&first, &under_its_id, 2)?;
    target
        .side_effects
        .expect_added(before, 1, "the send and its replays")
}

/// AC-2 (§6.2): another payload under the same messageId is a 422 naming both hashes, and the
/// original entry survives it; so is a payload with any one member changed (§5), and one that
/// arrives while the original still runs.
pub async fn ac2(target: &Target) -> Result<(), String> {
    let message_id = new_message_id();
    // Metadata whose canonical form a naive canonicalizer gets wrong: both hashes of the 422
    // are checked against RFC 8785's.
    let original = send(1, &message_id, "B", request::jcs_probe());
    let changed = send(1, &message_id, "B-prime", request::jcs_probe());
    let before = target.side_effects.snapshot()?;
    let first = target.post(&original).await?;
    expect_fresh(&first, "first send")?;

    let collision = target.post(&changed).await?;
    expect_collision(&collision, &message_id, &original, &changed)?;
    let retry = target.post(&original).await?;
    expect_replay_of(&first, &retry, "retry of the original after the collision")?;
    // §5: every member of params is hashed; each changed alone is another payload.
    let mut executed = 2; // the first send, and the one in flight below
    for (member, value) in request::payload_variants() {
        let message_id = new_message_id();
        let original = request::send_full(&message_id, None);
        let changed = request::send_full(&message_id, Some((member, value)));
        // Whatever it answers (an error is cached too, §4.3.2): the key is now the original's.
        let answered = target.post(&original).await?;
        executed += i64::from(answered.try_json()?.get("result").is_some());
        let collision = target.post(&changed).await?;
        expect_collision(&collision, &message_id, &original, &changed)
            .map_err(|e| format!("{member} changed: {e}"))?;
    }
    collision_in_flight(target).await?;
    let sent = "the sends, the collisions and the retry";
    target.side_effects.expect_added(before, executed, sent)
}

/// §7.3: another payload that arrives while the original still runs never gets the original's
/// answer: a 422, a 409 that says it is in progress, or (§4.3 has it a miss while nothing is
/// stored yet) an execution of its own, never the original's response replayed.
async fn collision_in_flight(target: &Target) -> Result<(), String> {
    let message_id = new_message_id();
    let slow = json!({"delayMs": IN_FLIGHT_DELAY_MS});
    let original = send(1, &message_id, "in flight", slow.clone());
    let changed = send(1, &message_id, "in flight, changed", slow);
    let later = async {
        tokio::time::sleep(Duration::from_millis(IN_FLIGHT_DELAY_MS / 5)).await;
        target.post(&changed).await
    };
    let (first, second) = futures::join!(target.post(&original), later);
    let (first, second) = (first?, second?);
    // Sent 100 ms apart, they may still arrive the other way round on a busy machine: the
    // one that ran is the original, the other the collision.
    let ((ran, ran_body), (reply, other)) = match first.try_json()?.get("result") {
        Some(_) => ((first, &original), (second, &changed)),
        None => ((second, &changed), (first, &original)),
    };
    expect_fresh(&ran, "a send still in flight")?;
    let checked = match reply.status {
        409 => expect_refused(&reply, 409),
        422 => expect_collision(&reply, &message_id, ran_body, other),
        _ => ensure(!reply.try_replayed()? && reply.body != ran.body, || {
            format!(
                "got the original's response.\n  original: {}\n  this one: {}",
                ran.describe(),
                reply.describe()
            )
        }),
    };
    checked.map_err(|e| format!("another payload while the original is in flight: {e}"))
}

/// AC-3 (§6.3): past `ttl_seconds` the same request is new: executed again, not replayed, and
/// cached afresh; near the TTL's end ([`late_retry`]) it is still the replay. Past
/// it, another body under an expired key is new too, "the same M1 and body B (or any body)":
/// an expired entry that kept its key's binding answered it the 422 (helper-99).
pub async fn ac3(target: &Target, ttl_seconds: u64) -> Result<(), String> {
    ensure(ttl_seconds <= MAX_AC3_TTL_SECONDS, || {
        format!("ttl_seconds {ttl_seconds} is too long to wait for")
    })?;
    let body = send(1, &new_message_id(), "idempotency-v1-ac3", json!({}));
    let other_key = new_message_id();
    let before = target.side_effects.snapshot()?;
    let first = target.post(&body).await?;
    let cached_at = Instant::now();
    expect_fresh(&first, "first send")?;
    let other = send(2, &other_key, "idempotency-v1-ac3, a second key", json!({}));
    expect_fresh(&target.post(&other).await?, "first send of a second key")?;
    let replay = target.post(&body).await?;
    expect_replay_of(&first, &replay, "retry within the TTL")?;
    // Still replayed near the TTL's end, not only at once (entries that expire early).
    tokio::time::sleep_until((cached_at + late_retry(ttl_seconds)).into()).await;
    let late = target.post(&body).await?;
    expect_replay_of(&first, &late, "retry near the TTL's end")?;

    tokio::time::sleep_until((cached_at + Duration::from_secs(ttl_seconds) + AC3_MARGIN).into())
        .await;
    let later = target.post(&body).await?;
    // Executed anew: not a replay (§6.3). Its body may be the same (a deterministic server);
    // the side effects, where they can be counted, say it ran.
    expect_fresh(&later, "retry past the TTL")?;
    let changed = send(2, &other_key, "idempotency-v1-ac3, another body", json!({}));
    let what = "another body past the TTL, under the second key (§6.3: or any body)";
    expect_fresh(&target.post(&changed).await?, what)?;
    target.side_effects.expect_added(
        before,
        4,
        "two sends, and past the TTL the retry and the second key's other body",
    )?;
    let again = target.post(&body).await?;
    expect_replay_of(&later, &again, "retry of the new execution")
}

/// When AC-3's late retry is sent, after the first send: 2 s before the TTL ends, a second for
/// the whole-second stamps and a second for a busy machine's delays. A TTL of 2 s or less
/// leaves a correct entry `ttl - 1 s`: the retry goes at a quarter of the TTL, half of that
/// left for delays (skipped there, AC-3 passed a server that forgot in 0.5 s: helper-103).
fn late_retry(ttl_seconds: u64) -> Duration {
    let ttl = Duration::from_secs(ttl_seconds);
    ttl.saturating_sub(Duration::from_secs(2)).max(ttl / 4)
}

/// AC-4 (§6.4): after a restart the retry is still the cached response byte for byte.
pub async fn ac4(target: &Target, ttl_seconds: u64, restart: Restart<'_>) -> Result<(), String> {
    let body = send(1, &new_message_id(), "idempotency-v1-ac4", json!({}));
    let before = target.side_effects.snapshot()?;
    let first = target.post(&body).await?;
    let cached_at = Instant::now();
    expect_fresh(&first, "first send")?;

    let url = restart().await.map_err(|e| format!("restart: {e}"))?;
    let restarted = target.at(&url);
    let replay = restarted.post(&body).await?;
    restarted_within_ttl(cached_at, ttl_seconds)?;
    expect_replay_of(&first, &replay, "retry after the restart")?;
    restarted
        .side_effects
        .expect_added(before, 1, "the send, the restart and the replay")
}

/// §7.1: malformed messageIds are refused with 400 and a JSON-RPC error, and never executed.
/// The spec names the status only: the error's codes are the server's (this one's are -32400,
/// `IDEMPOTENCY_KEY_MALFORMED`).
/// A well-formed one of the form §7.2 recommends, a UUIDv7, is served.
pub async fn malformed_message_id(target: &Target) -> Result<(), String> {
    let before = target.side_effects.snapshot()?;
    for (label, message_id) in malformed_message_ids() {
        let body = send_with_id_field(1, message_id, "malformed", json!({}));
        let reply = target.post(&body).await?;
        expect_refused(&reply, 400).map_err(|e| format!("messageId {label}: {e}"))?;
    }
    target
        .side_effects
        .expect_added(before, 0, "the malformed requests")?;
    let v7 = send(1, &new_message_id_v7(), "well formed", json!({}));
    expect_fresh(&target.post(&v7).await?, "messageId a UUIDv7")?;
    target
        .side_effects
        .expect_added(before, 1, "the well-formed request")
}

/// The malformed messageIds (§7.1), each with how failure messages name it; `None` is missing.
/// §4.2 asks for the canonical form: UUID parsers that also read the hyphenless, braced and
/// URN forms must not let them through.
fn malformed_message_ids() -> [(&'static str, Option<Value>); 8] {
    [
        ("\"not-a-uuid\"", Some(json!("not-a-uuid"))),
        ("\"\" (empty)", Some(json!(""))),
        ("42 (a number)", Some(json!(42))),
        ("missing", None),
        (
            "the nil UUID",
            Some(json!("00000000-0000-0000-0000-000000000000")),
        ),
        (
            "32 hex digits without hyphens",
            Some(json!("9b2e7c1a3f4d4e5a8b6c0d1e2f3a4b5c")),
        ),
        (
            "a braced UUID",
            Some(json!("{9b2e7c1a-3f4d-4e5a-8b6c-0d1e2f3a4b5c}")),
        ),
        (
            "a URN",
            Some(json!("urn:uuid:9b2e7c1a-3f4d-4e5a-8b6c-0d1e2f3a4b5c")),
        ),
    ]
}

/// A2A required-extension rule (§3.1): without the activation header the call is refused
/// with `ExtensionSupportRequiredError` (-32008) and not executed. A2A gives its HTTP status
/// (400) for the REST binding only: over JSON-RPC, 200 is the binding's usual status of an
/// error, and this server's 400 is allowed too.
pub async fn not_activated(target: &Target) -> Result<(), String> {
    let body = send(1, &new_message_id(), "not-activated", json!({}));
    let before = target.side_effects.snapshot()?;
    let reply = target.client.post(&body, false).await?;
    ensure(matches!(reply.status, 200 | 400), || {
        format!("expected HTTP 200 or 400, got {}", reply.describe())
    })?;
    let (code, _) = reply.error_codes()?;
    ensure(code == -32008, || {
        format!("expected error.code -32008, got {}", reply.describe())
    })?;
    target
        .side_effects
        .expect_added(before, 0, "the refused request")
}

/// Identical requests racing while the first is in flight: one execution, one fresh response,
/// every other one its replay, or a 409 that says the first is still in progress (the spec
/// leaves in-flight duplicates open; what it forbids is a second execution).
pub async fn concurrent_duplicates(target: &Target) -> Result<(), String> {
    let metadata = json!({"delayMs": IN_FLIGHT_DELAY_MS});
    let body = send(1, &new_message_id(), "concurrent-duplicates", metadata);
    let before = target.side_effects.snapshot()?;
    let replies: Vec<Reply> = join_all((0..CONCURRENT_DUPLICATES).map(|_| target.post(&body)))
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    let replies: Vec<Reply> = replies.into_iter().filter(|r| r.status != 409).collect();
    let mut fresh = Vec::new();
    for reply in &replies {
        if !reply.try_replayed()? {
            fresh.push(reply);
        }
    }
    ensure(fresh.len() == 1, || {
        let n = fresh.len();
        format!("expected exactly 1 response without Idempotent-Replayed, got {n}")
    })?;
    expect_fresh(fresh[0], "the one execution")?;
    if let Some(bad) = replies.iter().find(|r| r.status != fresh[0].status) {
        return Err(format!("a replay's status differs: {}", bad.describe()));
    }
    // The duplicates that waited for the execution are answered on a path of their own on
    // many servers: their headers too (helper-124 passed one that echoed nothing there).
    for replay in &replies {
        expect_headers_of(fresh[0], replay, "a concurrent duplicate")?;
    }
    ensure(replies.iter().all(|r| r.body == replies[0].body), || {
        "the responses differ; all must be the one cached response".into()
    })?;
    target
        .side_effects
        .expect_added(before, 1, "the concurrent duplicates")
}

/// §4.3.2: a failed response is cached like a successful one. A send continuing a task that
/// does not exist fails (A2A's TaskNotFound); its retry is that failure replayed, not run
/// again. Skipped where the server answers it with a result: it has no such failure to cache.
pub async fn cached_failure(target: &Target) -> Outcome {
    let body = request::send_to_task(1, &new_message_id(), &new_message_id(), "no such task");
    let checked = async {
        let before = target.side_effects.snapshot()?;
        let first = target.post(&body).await?;
        if first.try_json()?.get("error").is_none() {
            return Ok(Some(format!(
                "the server answered a send to a task that does not exist with {}",
                first.describe()
            )));
        }
        let retry = target.post(&body).await?;
        expect_replay_of(&first, &retry, "retry of the failed send")?;
        let added = target
            .side_effects
            .expect_added(before, 0, "the failed send and its replay");
        added.map(|()| None)
    };
    match checked.await {
        Ok(None) => Outcome::Pass,
        Ok(Some(why)) => Outcome::Skip(why),
        Err(reason) => Outcome::Fail(reason),
    }
}

/// A first execution: a JSON-RPC result, no replay header, the extension echoed (§3.2, §4.3.3).
fn expect_fresh(reply: &Reply, what: &str) -> Result<(), String> {
    ensure((200..300).contains(&reply.status), || {
        format!("{what}: expected a 2xx, got {}", reply.describe())
    })?;
    ensure(reply.try_json()?.get("result").is_some(), || {
        format!(
            "{what}: expected a JSON-RPC result, got {}",
            reply.describe()
        )
    })?;
    ensure(!reply.try_replayed()?, || {
        format!("{what}: an execution must not carry Idempotent-Replayed")
    })?;
    expect_echo(reply, what)
}

/// A replay of `original`: same status, same bytes, `Idempotent-Replayed: true` (§6.1).
fn expect_replay_of(original: &Reply, replay: &Reply, what: &str) -> Result<(), String> {
    expect_replayed_as(original, replay, what)?;
    ensure(replay.body == original.body, || {
        format!(
            "{what}: the body is not byte-identical to the original.\n  original: {}\n  replay:   {}",
            original.describe(),
            replay.describe()
        )
    })?;
    expect_headers_of(original, replay, what)
}

/// §4.3.2: a replay is unchanged in its headers too, the content type first among them; and
/// it echoes the extension, as every answer does (§3.2).
fn expect_headers_of(original: &Reply, replay: &Reply, what: &str) -> Result<(), String> {
    let content_type = |reply: &Reply| reply.headers.get("content-type").cloned();
    ensure(content_type(replay) == content_type(original), || {
        format!(
            "{what}: Content-Type {:?} differs from the original's {:?}",
            content_type(replay),
            content_type(original)
        )
    })?;
    expect_echo(replay, what)
}

/// A replay of `original`'s request sent under the JSON-RPC id `id` (not hashed, §5): a hit,
/// `Idempotent-Replayed` with the same status, and either the cached bytes unchanged (§4.3
/// read literally) or the same result under `id` (as JSON-RPC 2.0 §5 has a response carry its
/// request's id).
fn expect_replay_under_id(original: &Reply, replay: &Reply, id: u64) -> Result<(), String> {
    let what = format!("retry under the JSON-RPC id {id}");
    expect_replayed_as(original, replay, &what)?;
    let (first, again) = (original.try_json()?, replay.try_json()?);
    let under_its_id = again["id"] == id && again["result"] == first["result"];
    ensure(replay.body == original.body || under_its_id, || {
        format!(
            "{what}: expected the original's bytes, or its result under id {id}.\n  original: {}\n  replay:   {}",
            original.describe(),
            replay.describe()
        )
    })?;
    expect_headers_of(original, replay, &what)
}

/// `Idempotent-Replayed: true`, and `original`'s status.
fn expect_replayed_as(original: &Reply, replay: &Reply, what: &str) -> Result<(), String> {
    ensure(replay.try_replayed()?, || {
        format!(
            "{what}: expected Idempotent-Replayed: true, got {}",
            replay.describe()
        )
    })?;
    ensure(replay.status == original.status, || {
        format!(
            "{what}: status {} differs from the original {}",
            replay.status, original.status
        )
    })
}

/// The 422 of §4.5, with both hashes checked against our own computation.
fn expect_collision(
    reply: &Reply,
    message_id: &str,
    original: &str,
    changed: &str,
) -> Result<(), String> {
    let what = "same messageId, other payload";
    expect_error(reply, 422, -32422, KEY_REUSED).map_err(|e| format!("{what}: {e}"))?;
    let data = &reply.try_json()?["error"]["data"];
    ensure(data["message_id"] == message_id, || {
        format!("{what}: error.data.message_id must be {message_id}: {data}")
    })?;
    let hashes = [
        ("original_request_hash", request_hash(original)?),
        ("submitted_request_hash", request_hash(changed)?),
    ];
    for (field, expected) in &hashes {
        ensure(data[field] == expected.as_str(), || {
            format!("{what}: error.data.{field} must be {expected} (JCS + SHA-256 of params minus messageId): {data}")
        })?;
    }
    ensure(hashes[0].1 != hashes[1].1, || {
        format!("{what}: the two payloads hash alike")
    })
}

/// An extension error: HTTP status, numeric `error.code`, string `error.data.code`, no replay.
fn expect_error(reply: &Reply, status: u16, code: i64, data_code: &str) -> Result<(), String> {
    expect_refused(reply, status)?;
    let codes = reply.error_codes()?;
    ensure(codes == (code, Some(data_code.to_owned())), || {
        format!(
            "expected error.code {code} and error.data.code {data_code}, got {}",
            reply.describe()
        )
    })
}

/// A JSON-RPC error with HTTP `status`, whatever its codes: where the spec names the status
/// only, as for a malformed messageId (§7.1), whose codes are in a table this harness does
/// not have (`error-codes.json`).
fn expect_refused(reply: &Reply, status: u16) -> Result<(), String> {
    ensure(reply.status == status, || {
        format!("expected HTTP {status}, got {}", reply.describe())
    })?;
    reply.error_codes()?;
    ensure(!reply.try_replayed()?, || {
        "an error that was not cached must not carry Idempotent-Replayed".into()
    })?;
    expect_echo(reply, "the error")
}

fn expect_echo(reply: &Reply, what: &str) -> Result<(), String> {
    ensure(reply.echoes_extension(), || {
        format!("{what}: the response A2A-Extensions header must list the extension (§3.2)")
    })
}

/// A slow restart on a short-TTL server would fail a replay for the wrong reason: say so.
fn restarted_within_ttl(cached_at: Instant, ttl_seconds: u64) -> Result<(), String> {
    ensure(
        cached_at.elapsed() < Duration::from_secs(ttl_seconds),
        || {
            format!(
                "the restart took {:?}, longer than ttl_seconds {ttl_seconds}: use a longer TTL",
                cached_at.elapsed()
            )
        },
    )
}

fn ensure(condition: bool, message: impl FnOnce() -> String) -> Result<(), String> {
    if condition {
        Ok(())
    } else {
        Err(message())
    }
}
