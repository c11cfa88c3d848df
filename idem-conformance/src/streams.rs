//! The stream scenarios: idempotency/v1 applied to `message/stream` (A2A 0.3) and
//! `SendStreamingMessage` (A2A 1.0), whose response is a whole sequence of Server-Sent Events.
//!
//! What they hold a server to: a fresh stream is sent live, event by event; its replay is the
//! same bytes with `Idempotent-Replayed: true` (under another JSON-RPC id, the same events
//! carrying that id); a duplicate arriving while the stream runs attaches to it (every event so
//! far, then the live ones) instead of executing again; a client that disconnects does not end
//! the mission, and its retry gets the whole sequence; errors before the stream starts are
//! ordinary JSON responses; the recording survives a restart.
//!
//! Hook: `params.metadata.durationMs` sets how long a mission runs (our example server). A server
//! that ignores it ends its streams sooner; the checks that need a running stream then apply
//! only where the stream did run long enough to tell.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::client::Reply;
use super::request::{self, new_message_id};
use super::sse::SseReply;
use super::{
    ensure, expect_collision, expect_echo, expect_refused, restarted_within_ttl, Restart, Target,
};

/// How long the missions of the scenarios that watch a stream run live.
const LIVE_MS: u64 = 1200;
/// How long the mission of `stream-disconnect-retry` runs, and how long past its end the retry
/// waits (the stream is stored when it ends).
const DISCONNECT_MS: u64 = 600;
const RETRY_MARGIN: Duration = Duration::from_millis(700);
/// The missions of the scenarios that only need a whole stream.
const SHORT_MS: u64 = 100;

/// The A2A version a stream is requested and rendered in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Version {
    /// `message/stream`: results tagged with `kind`, the last status update `final: true`.
    V0_3,
    /// `SendStreamingMessage` with `A2A-Version: 1.0`: results `{"task"}`, `{"statusUpdate"}`,
    /// `{"artifactUpdate"}`.
    V1_0,
}

/// A streaming request the scenarios send, with what its events must carry.
#[derive(Debug, Clone)]
struct StreamCall {
    body: String,
    jsonrpc_id: u64,
    version: Version,
}

impl StreamCall {
    fn v0_3(message_id: &str, text: &str, duration_ms: u64) -> Self {
        Self {
            body: request::stream(1, message_id, text, json!({"durationMs": duration_ms})),
            jsonrpc_id: 1,
            version: Version::V0_3,
        }
    }

    fn v1_0(message_id: &str, text: &str, duration_ms: u64) -> Self {
        Self {
            body: request::stream_1_0(1, message_id, text, json!({"durationMs": duration_ms})),
            jsonrpc_id: 1,
            version: Version::V1_0,
        }
    }

    /// The same request under another JSON-RPC id (`id` is outside the request hash).
    fn with_jsonrpc_id(&self, jsonrpc_id: u64) -> Self {
        let mut body: Value = serde_json::from_str(&self.body).expect("the harness's own JSON");
        body["id"] = jsonrpc_id.into();
        Self {
            body: body.to_string(),
            jsonrpc_id,
            ..self.clone()
        }
    }

    fn headers(&self) -> &'static [(&'static str, &'static str)] {
        match self.version {
            Version::V0_3 => &[],
            Version::V1_0 => &[("A2A-Version", "1.0")],
        }
    }

    /// Sends the request and checks the head of the response: 200, `text/event-stream`, the
    /// extension echoed, `Idempotent-Replayed: true` exactly when `replayed`.
    async fn open(&self, target: &Target, replayed: bool, what: &str) -> Result<SseReply, String> {
        let stream = target
            .client
            .open_stream(&self.body, self.headers())
            .await?;
        if stream.reply.status != 200 || !stream.is_event_stream() {
            let reply = stream.into_plain().await?;
            return Err(format!(
                "{what}: expected HTTP 200 text/event-stream, got {:?}: {}",
                reply.content_type(),
                reply.describe()
            ));
        }
        let reply = &stream.reply;
        match (replayed, reply.try_replayed()?) {
            (true, false) => Err(format!(
                "{what}: expected Idempotent-Replayed: true, got {}",
                reply.describe()
            )),
            (false, true) => Err(format!(
                "{what}: an execution must not carry Idempotent-Replayed"
            )),
            _ => expect_echo(reply, what),
        }?;
        Ok(stream)
    }

    /// [`open`](Self::open), then reads the whole stream and checks its events.
    async fn read(&self, target: &Target, replayed: bool, what: &str) -> Result<Streamed, String> {
        let (reply, events) = self.open(target, replayed, what).await?.finish().await?;
        self.expect_sequence(&events)
            .map_err(|e| format!("{what}: {e}"))?;
        Ok(Streamed { reply, events })
    }

    /// The events of one whole stream: JSON-RPC responses under this request's id; the Task
    /// first, then status and artifact updates of that task, the last a status update that ends
    /// it (0.3: `final: true`, and only there). A stream of one Message is whole too.
    fn expect_sequence(&self, events: &[Value]) -> Result<(), String> {
        let kinds: Vec<String> = events.iter().map(|e| self.kind(e)).collect();
        let shown = || format!("[{}]", kinds.join(", "));
        ensure(!events.is_empty(), || "the stream has no event".into())?;
        for event in events {
            ensure(
                event["jsonrpc"] == "2.0" && event.get("result").is_some(),
                || format!("every event must be a JSON-RPC result, got {event}"),
            )?;
            ensure(event["id"] == self.jsonrpc_id, || {
                format!(
                    "every event must carry the request's id {}, got {event}",
                    self.jsonrpc_id
                )
            })?;
        }
        if kinds == ["message"] {
            return Ok(());
        }
        ensure(kinds[0] == "task", || {
            format!("the first event must be the Task, got {}", shown())
        })?;
        let task_id = &self.inner(&events[0])["id"];
        ensure(task_id.is_string(), || {
            format!("the Task has no id: {}", events[0])
        })?;
        for (event, kind) in events.iter().zip(&kinds).skip(1) {
            ensure(
                kind.starts_with("status-update") || kind == "artifact-update",
                || {
                    format!(
                        "after the Task only status and artifact updates may come, got {}",
                        shown()
                    )
                },
            )?;
            ensure(self.inner(event)["taskId"] == *task_id, || {
                format!("an update names another task than {task_id}: {event}")
            })?;
        }
        let last = kinds.last().expect("not empty");
        let ends = match self.version {
            Version::V0_3 => last == "status-update (final)",
            Version::V1_0 => last.starts_with("status-update") && self.ends_task(events),
        };
        ensure(ends, || {
            format!(
                "the last event must be the status update that ends the task, got {}",
                shown()
            )
        })?;
        let finals = kinds.iter().filter(|k| k.ends_with("(final)")).count();
        ensure(finals <= 1, || {
            format!("only the last event may be final, got {}", shown())
        })
    }

    /// What an event is, as failure messages show it: `task`, `status-update (final)`, ….
    fn kind(&self, event: &Value) -> String {
        let result = &event["result"];
        let kind = match self.version {
            Version::V0_3 => result["kind"].as_str().unwrap_or("?").to_owned(),
            Version::V1_0 => match result.as_object().map(|o| o.keys().collect::<Vec<_>>()) {
                Some(keys) if keys.len() == 1 => match keys[0].as_str() {
                    "task" => "task",
                    "message" => "message",
                    "statusUpdate" => "status-update",
                    "artifactUpdate" => "artifact-update",
                    _ => "?",
                }
                .to_owned(),
                _ => "?".to_owned(),
            },
        };
        if self.version == Version::V0_3 && result["final"] == true {
            format!("{kind} (final)")
        } else {
            kind
        }
    }

    /// The Task or update inside an event's result (1.0 wraps it in a one-member object).
    fn inner<'a>(&self, event: &'a Value) -> &'a Value {
        let result = &event["result"];
        match (self.version, result.as_object()) {
            (Version::V1_0, Some(object)) if object.len() == 1 => {
                object.values().next().expect("one member")
            }
            _ => result,
        }
    }

    /// 1.0 has no `final`: the last status must be a state in which the task stops.
    fn ends_task(&self, events: &[Value]) -> bool {
        const ENDING: [&str; 6] = [
            "TASK_STATE_COMPLETED",
            "TASK_STATE_FAILED",
            "TASK_STATE_CANCELED",
            "TASK_STATE_REJECTED",
            "TASK_STATE_INPUT_REQUIRED",
            "TASK_STATE_AUTH_REQUIRED",
        ];
        let last = events.last().map(|e| self.inner(e));
        last.and_then(|update| update["status"]["state"].as_str())
            .is_some_and(|state| ENDING.contains(&state))
    }
}

/// A stream read to its end.
struct Streamed {
    /// Status, headers and every byte of the body.
    reply: Reply,
    events: Vec<Value>,
}

/// `stream-fresh`: a first stream is 200 `text/event-stream`, not replayed, with the extension
/// echoed; its events are sent while the mission runs, not buffered to its end: after the
/// first one the cache has no entry yet (with the database), and the end comes well after it.
pub async fn stream_fresh(target: &Target) -> Result<(), String> {
    let message_id = new_message_id();
    let call = StreamCall::v0_3(&message_id, "idempotency-v1-stream-fresh", LIVE_MS);
    let before = target.side_effects.snapshot()?;
    let sent_at = Instant::now();
    let mut stream = call.open(target, false, "fresh stream").await?;
    let first = stream
        .next_event()
        .await?
        .ok_or("fresh stream: it ended before its first event")?;
    let first_at = Instant::now();
    ensure(
        target.side_effects.cached(&message_id)? != Some(true),
        || {
            "fresh stream: the cache held the stream when its first event arrived: the events were \
         not sent live"
                .into()
        },
    )?;
    let mut events = vec![first];
    events.extend(stream.rest().await?);
    let ended_at = Instant::now();
    call.expect_sequence(&events)
        .map_err(|e| format!("fresh stream: {e}"))?;
    // Only where the mission visibly honored durationMs (elsewhere it may just be short).
    let live = Duration::from_millis(LIVE_MS);
    if ended_at - sent_at >= live / 2 {
        let ahead = ended_at - first_at;
        ensure(ahead >= live / 4, || {
            format!(
                "fresh stream: the first event came only {ahead:?} before the end of a \
                 {LIVE_MS} ms mission: the events are not sent as they happen"
            )
        })?;
    }
    target
        .side_effects
        .expect_added(before, 1, "the fresh stream")
}

/// `stream-replay`: the identical request again is the same bytes with `Idempotent-Replayed:
/// true`; under another JSON-RPC id, the same events carrying that id; one execution.
pub async fn stream_replay(target: &Target) -> Result<(), String> {
    let call = StreamCall::v0_3(&new_message_id(), "idempotency-v1-stream-replay", SHORT_MS);
    let before = target.side_effects.snapshot()?;
    let first = call.read(target, false, "first stream").await?;
    let replay = call.read(target, true, "identical retry").await?;
    expect_same_bytes(&first.reply, &replay.reply, "identical retry")?;

    let other = call.with_jsonrpc_id(2);
    let renamed = other
        .read(target, true, "retry under JSON-RPC id 2")
        .await?;
    ensure(renamed.events.len() == first.events.len(), || {
        format!(
            "retry under JSON-RPC id 2: {} events, the original has {}",
            renamed.events.len(),
            first.events.len()
        )
    })?;
    for (original, again) in first.events.iter().zip(&renamed.events) {
        let mut expected = original.clone();
        expected["id"] = json!(2);
        ensure(*again == expected, || {
            format!(
                "retry under JSON-RPC id 2: expected the original event under id 2\n  \
                 expected: {expected}\n  got:      {again}"
            )
        })?;
    }
    target
        .side_effects
        .expect_added(before, 1, "the stream and its replays")
}

/// `stream-collision`: another payload under the messageId of a stream is the 422 of §4.5, an
/// ordinary JSON response; the stream's entry survives it. While the stream still runs, it
/// never gets the stream's events: a 422, a 409, or a stream of its own.
pub async fn stream_collision(target: &Target) -> Result<(), String> {
    collision_while_streaming(target).await?;
    let message_id = new_message_id();
    let original = StreamCall::v0_3(&message_id, "B", SHORT_MS);
    let changed = StreamCall::v0_3(&message_id, "B-prime", SHORT_MS);
    let before = target.side_effects.snapshot()?;
    let first = original.read(target, false, "first stream").await?;

    let collision = target.post(&changed.body).await?;
    expect_json(&collision, "the collision")?;
    expect_collision(&collision, &message_id, &original.body, &changed.body)?;
    let retry = original
        .read(target, true, "retry of the original after the collision")
        .await?;
    expect_same_bytes(
        &first.reply,
        &retry.reply,
        "retry of the original after the collision",
    )?;
    target
        .side_effects
        .expect_added(before, 1, "the stream, the collision and the retry")
}

/// §7.3: another payload that arrives while the original still streams never gets the
/// original's events: a 422, a 409, or a stream of its own. Checked only after the stream had
/// ended, a server that attached any request of the same messageId to its running stream
/// passed (helper-99).
async fn collision_while_streaming(target: &Target) -> Result<(), String> {
    let message_id = new_message_id();
    let original = StreamCall::v0_3(&message_id, "streaming", LIVE_MS);
    let changed = StreamCall::v0_3(&message_id, "streaming, changed", LIVE_MS);
    let mut running = original.open(target, false, "a long stream").await?;
    let first = running
        .next_event()
        .await?
        .ok_or("a long stream: it ended before its first event")?;
    let reply = target.post(&changed.body).await?;
    let what = "another payload while the original streams";
    let checked = match reply.status {
        409 => expect_refused(&reply, 409),
        422 => expect_collision(&reply, &message_id, &original.body, &changed.body),
        _ => {
            // A stream of its own names a task (or message) of its own, never the original's.
            let result = &first["result"];
            let own = result["id"].as_str().or(result["messageId"].as_str());
            let body = String::from_utf8_lossy(&reply.body);
            ensure(!own.is_some_and(|id| body.contains(id)), || {
                format!("got the original's events.\n  original: {first}\n  this one: {body}")
            })
        }
    };
    checked.map_err(|e| format!("{what}: {e}"))?;
    running
        .rest()
        .await
        .map(drop)
        .map_err(|e| format!("a long stream: {e}"))
}

/// `stream-malformed-id`: a streaming request with a malformed messageId is refused before any
/// stream starts: HTTP 400 JSON, a JSON-RPC error (its codes the server's), nothing executed.
pub async fn stream_malformed_id(target: &Target) -> Result<(), String> {
    let before = target.side_effects.snapshot()?;
    for (label, message_id) in super::malformed_message_ids() {
        let body = request::stream_with_id_field(
            1,
            message_id,
            "malformed",
            json!({"durationMs": SHORT_MS}),
        );
        let reply = target.post(&body).await?;
        expect_json(&reply, "the refusal").map_err(|e| format!("messageId {label}: {e}"))?;
        expect_refused(&reply, 400).map_err(|e| format!("messageId {label}: {e}"))?;
    }
    target
        .side_effects
        .expect_added(before, 0, "the malformed streaming requests")
}

/// `stream-attach`: the identical request sent while the stream runs gets the identical byte
/// sequence (the events so far, then the live ones) with `Idempotent-Replayed: true`, without
/// waiting for the end, and the mission runs once.
pub async fn stream_attach(target: &Target) -> Result<(), String> {
    let message_id = new_message_id();
    let call = StreamCall::v0_3(&message_id, "idempotency-v1-stream-attach", LIVE_MS);
    let before = target.side_effects.snapshot()?;
    let mut original = call.open(target, false, "first stream").await?;
    original
        .next_event()
        .await?
        .ok_or("first stream: it ended before its first event")?;

    let original_to_end = async {
        let rest = original.rest().await;
        (rest, Instant::now())
    };
    let duplicate = async {
        let sent_at = Instant::now();
        let mut duplicate = call
            .open(target, true, "duplicate during the stream")
            .await?;
        let first = duplicate.next_event().await?;
        let first_at = Instant::now();
        let cached_then = target.side_effects.cached(&message_id)?;
        let (reply, mut events) = duplicate.finish().await?;
        events.splice(0..0, first);
        Ok::<_, String>((sent_at, first_at, cached_then, Streamed { reply, events }))
    };
    let ((rest, original_end), duplicate) = tokio::join!(original_to_end, duplicate);
    rest.map_err(|e| format!("first stream: {e}"))?;
    let original = original.reply;
    let (sent_at, first_at, cached_then, duplicate) = duplicate?;

    call.expect_sequence(&duplicate.events)
        .map_err(|e| format!("duplicate during the stream: {e}"))?;
    expect_same_bytes(&original, &duplicate.reply, "duplicate during the stream")?;
    if sent_at < original_end {
        ensure(first_at < original_end, || {
            "duplicate during the stream: its first event came only after the original stream \
             had ended: it must attach to the running stream, not wait for its end"
                .into()
        })?;
    }
    ensure(cached_then != Some(true), || {
        "duplicate during the stream: the cache held the stream when the duplicate's first event \
         arrived: it was not attached to the running stream"
            .into()
    })?;
    target
        .side_effects
        .expect_added(before, 1, "the stream and its duplicate")
}

/// `stream-disconnect-retry`: a client that goes away after the first event does not end the
/// mission; its retry, past the mission's end, gets the whole sequence, replayed.
pub async fn stream_disconnect_retry(target: &Target) -> Result<(), String> {
    let call = StreamCall::v0_3(
        &new_message_id(),
        "idempotency-v1-stream-disconnect-retry",
        DISCONNECT_MS,
    );
    let before = target.side_effects.snapshot()?;
    let sent_at = Instant::now();
    let first = {
        let mut stream = call.open(target, false, "first stream").await?;
        stream
            .next_event()
            .await?
            .ok_or("first stream: it ended before its first event")?
    }; // dropped: the connection closes mid-stream
    let mission_end = sent_at + Duration::from_millis(DISCONNECT_MS);
    tokio::time::sleep_until((mission_end + RETRY_MARGIN).into()).await;

    let retry = call
        .read(target, true, "retry after the disconnect")
        .await?;
    ensure(retry.events[0] == first, || {
        format!(
            "retry after the disconnect: it must start with the event the client got before \
             it went away.\n  then: {first}\n  now:  {}",
            retry.events[0]
        )
    })?;
    // The mission ran to its end: the client's leaving did not cancel (or fail) it. A stream
    // of one Message has no task to end (A2A 0.3 allows it; it failed here: helper-99).
    let last = retry.events.last().expect("a sequence");
    let state = &last["result"]["status"]["state"];
    let message = last["result"]["kind"] == "message" || last["result"].get("message").is_some();
    let one_message = retry.events.len() == 1 && message;
    ensure(one_message || state == "completed", || {
        format!("retry after the disconnect: the task must end completed, got {last}")
    })?;
    target
        .side_effects
        .expect_added(before, 1, "the interrupted stream and its retry")
}

/// `stream-restart`: after a restart the retry of a finished stream is still its bytes.
pub async fn stream_restart(
    target: &Target,
    ttl_seconds: u64,
    restart: Restart<'_>,
) -> Result<(), String> {
    let call = StreamCall::v0_3(&new_message_id(), "idempotency-v1-stream-restart", SHORT_MS);
    let before = target.side_effects.snapshot()?;
    let first = call.read(target, false, "first stream").await?;
    let cached_at = Instant::now();

    let url = restart().await.map_err(|e| format!("restart: {e}"))?;
    let restarted = target.at(&url);
    let replay = call
        .read(&restarted, true, "retry after the restart")
        .await?;
    restarted_within_ttl(cached_at, ttl_seconds)?;
    expect_same_bytes(&first.reply, &replay.reply, "retry after the restart")?;
    restarted
        .side_effects
        .expect_added(before, 1, "the stream, the restart and the replay")
}

/// `stream-a2a-1.0`: `SendStreamingMessage` with `A2A-Version: 1.0` streams the 1.0 shapes
/// (`{"task"}`, `{"statusUpdate"}`, `{"artifactUpdate"}`) and is replayed byte for byte.
pub async fn stream_a2a_1_0(target: &Target) -> Result<(), String> {
    let call = StreamCall::v1_0(&new_message_id(), "idempotency-v1-stream-a2a-1.0", SHORT_MS);
    let before = target.side_effects.snapshot()?;
    let first = call.read(target, false, "first 1.0 stream").await?;
    let replay = call.read(target, true, "identical 1.0 retry").await?;
    expect_same_bytes(&first.reply, &replay.reply, "identical 1.0 retry")?;
    target
        .side_effects
        .expect_added(before, 1, "the 1.0 stream and its replay")
}

/// An error before the stream starts is an ordinary JSON response, not an event stream.
fn expect_json(reply: &Reply, what: &str) -> Result<(), String> {
    let content_type = reply.content_type();
    ensure(content_type == "application/json", || {
        format!(
            "{what}: expected Content-Type application/json, got {content_type:?}: {}",
            reply.describe()
        )
    })
}

/// A replayed stream is the original's body, byte for byte.
fn expect_same_bytes(original: &Reply, replay: &Reply, what: &str) -> Result<(), String> {
    let (a, b) = (&original.body, &replay.body);
    let Some(at) = (0..a.len().max(b.len())).find(|&i| a.get(i) != b.get(i)) else {
        return Ok(());
    };
    let around = |bytes: &[u8]| {
        let from = at.saturating_sub(60);
        let to = (at + 60).min(bytes.len());
        String::from_utf8_lossy(bytes.get(from..to).unwrap_or_default()).into_owned()
    };
    Err(format!(
        "{what}: the stream is not byte-identical to the original ({} vs {} bytes, first \
         difference at byte {at}).\n  original: …{:?}…\n  replay:   …{:?}…",
        a.len(),
        b.len(),
        around(a),
        around(b)
    ))
}
