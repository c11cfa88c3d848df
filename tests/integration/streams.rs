//! `message/stream` over SSE through a real jsonrpsee server: recorded, replayed byte-for-byte,
//! attached to while running, and safe to retry after a disconnect.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem::IdempotencyConfig;
use serde_json::json;

use crate::support::*;

fn config() -> IdempotencyConfig {
    IdempotencyConfig::default()
}

#[tokio::test]
async fn fresh_stream_is_live_sse_then_replayed_byte_for_byte() {
    let db = Db::new();
    let server = db.server(config()).await;
    let mid = new_id();
    let body = stream_request(1, &mid, "go", json!({"events": 4, "stepMs": 150}));
    let mut first = SseReply::open(&server.url, body.clone(), ACTIVATED).await;
    assert_eq!(first.status, 200);
    assert_eq!(first.content_type(), "text/event-stream");
    assert!(!first.replayed());
    assert!(first.headers.get("a2a-extensions").is_some());
    let event = first.next_event().await.unwrap();
    assert_eq!(
        (event["id"].clone(), event["result"]["seq"].clone()),
        (json!(1), json!(0))
    );
    assert!(
        db.row(&mid).is_none(),
        "the first event is sent live, before the stream is stored"
    );
    let rest = first.rest().await;
    assert_eq!(rest.len(), 3);
    assert_eq!(rest[2]["result"]["final"], true);
    assert!(db.row(&mid).is_some(), "stored once the stream ended");

    let mut replay = SseReply::open(&server.url, body, ACTIVATED).await;
    assert!(replay.replayed());
    assert_eq!(replay.content_type(), "text/event-stream");
    replay.rest().await;
    assert_eq!(replay.raw(), first.raw(), "byte-for-byte");
    assert_eq!(server.executions(), 1);
}

/// A stream whose `Drop` panics after its last event (found by helper-39): its client gets
/// every event and the end, and the stream is stored as it ended, not as interrupted.
#[tokio::test]
async fn a_stream_that_panics_as_it_is_dropped_still_ends_and_is_stored() {
    let db = Db::new();
    let server = db.server(config()).await;
    let mid = new_id();
    let body = stream_request(1, &mid, "panic-on-drop", json!({"events": 3, "stepMs": 20}));
    let mut first = SseReply::open(&server.url, body.clone(), ACTIVATED).await;
    let events = tokio::time::timeout(Duration::from_secs(10), first.rest()).await;
    let events = events.expect("the stream ends");
    assert_eq!(events.len(), 3, "{events:?}");
    assert_eq!(events[2]["result"]["final"], true);
    let mut replay = SseReply::open(&server.url, body, ACTIVATED).await;
    assert!(replay.replayed());
    replay.rest().await;
    assert_eq!(replay.raw(), first.raw(), "stored as it ended");
    assert_eq!(server.executions(), 1);
}

#[tokio::test]
async fn a_replay_under_another_id_carries_that_id() {
    let db = Db::new();
    let server = db.server(config()).await;
    let mid = new_id();
    let mut first = SseReply::open(
        &server.url,
        stream_request(1, &mid, "go", json!({})),
        ACTIVATED,
    )
    .await;
    let original = first.rest().await;
    let mut other = SseReply::open(
        &server.url,
        stream_request(9, &mid, "go", json!({})),
        ACTIVATED,
    )
    .await;
    let replayed = other.rest().await;
    assert_eq!(replayed.len(), original.len());
    for (a, b) in original.iter().zip(&replayed) {
        assert_eq!((a["id"].clone(), b["id"].clone()), (json!(1), json!(9)));
        assert_eq!(a["result"], b["result"]);
    }
}

#[tokio::test]
async fn errors_before_the_stream_are_json_with_their_status() {
    let db = Db::new();
    let server = db.server(config()).await;
    let mid = new_id();
    SseReply::open(
        &server.url,
        stream_request(1, &mid, "go", json!({})),
        ACTIVATED,
    )
    .await
    .rest()
    .await;
    let collision = post_activated(&server.url, stream_request(1, &mid, "other", json!({}))).await;
    assert_eq!(collision.status, 422);
    assert_eq!(collision.error_code(), -32422);
    assert!(collision
        .header("content-type")
        .unwrap()
        .starts_with("application/json"));
    let malformed = post_activated(&server.url, stream_request(1, "nope", "go", json!({}))).await;
    assert_eq!((malformed.status, malformed.error_code()), (400, -32400));
    let inactive = post(
        &server.url,
        stream_request(1, &new_id(), "go", json!({})),
        &[],
    )
    .await;
    assert_eq!((inactive.status, inactive.error_code()), (400, -32008));
    assert_eq!(server.executions(), 1);
}

#[tokio::test]
async fn a_failure_before_streaming_is_cached_as_json() {
    let db = Db::new();
    let server = db.server(config()).await;
    let mid = new_id();
    let first = post_activated(
        &server.url,
        stream_request(1, &mid, "fail-early", json!({})),
    )
    .await;
    assert_eq!((first.status, first.error_code()), (200, -32001));
    let replay = post_activated(
        &server.url,
        stream_request(1, &mid, "fail-early", json!({})),
    )
    .await;
    assert!(replay.replayed());
    assert_eq!(replay.body, first.body);
    assert_eq!(server.executions(), 1);
}

#[tokio::test]
async fn an_error_event_ends_the_stream_and_is_replayed() {
    let db = Db::new();
    let server = db.server(config()).await;
    // Events apart, and all ready at once: then the error ends a batch of events being
    // gathered for one commit.
    for step_ms in [50, 0] {
        let mid = new_id();
        let metadata = json!({"events": 5, "stepMs": step_ms});
        let body = stream_request(1, &mid, "fail-mid", metadata);
        let mut first = SseReply::open(&server.url, body.clone(), ACTIVATED).await;
        let events = first.rest().await;
        assert_eq!(events.len(), 3, "two results, then the error event ends it");
        assert_eq!(events[2]["error"]["code"], -32000);
        let mut replay = SseReply::open(&server.url, body, ACTIVATED).await;
        replay.rest().await;
        assert!(replay.replayed());
        assert_eq!(replay.raw(), first.raw());
    }
    assert_eq!(server.executions(), 2);
}

#[tokio::test]
async fn a_retry_during_the_stream_attaches_and_gets_the_identical_sequence() {
    let db = Db::new();
    let server = db.server(config()).await;
    let mid = new_id();
    let body = stream_request(1, &mid, "go", json!({"events": 5, "stepMs": 120}));
    let mut first = SseReply::open(&server.url, body.clone(), ACTIVATED).await;
    first.next_event().await.unwrap();
    first.next_event().await.unwrap();
    let mut retry = SseReply::open(&server.url, body, ACTIVATED).await;
    assert!(
        retry.replayed(),
        "attached retries carry Idempotent-Replayed"
    );
    let (_, _) = tokio::join!(first.rest(), retry.rest());
    assert_eq!(
        retry.raw(),
        first.raw(),
        "every event so far, then the live ones, to the end"
    );
    assert_eq!(server.executions(), 1);
}

/// A stream that produces faster than the disk commits (2,000 events, all ready at once) is
/// recorded in batches: its client, and a retry attached while it runs, get every event once
/// and in order, and its replay is byte for byte what they got.
#[tokio::test]
async fn a_stream_faster_than_the_disk_is_sent_whole_in_order_and_replayed() {
    let db = Db::new();
    let server = db.server(config()).await;
    let mid = new_id();
    let body = stream_request(1, &mid, "go", json!({"events": 2000, "stepMs": 0}));
    let mut first = SseReply::open(&server.url, body.clone(), ACTIVATED).await;
    first.next_event().await.unwrap();
    let mut retry = SseReply::open(&server.url, body.clone(), ACTIVATED).await;
    let (rest, _) = tokio::join!(first.rest(), retry.rest());
    let seqs: Vec<_> = rest.iter().map(|e| e["result"]["seq"].as_u64()).collect();
    let expected: Vec<_> = (1..2000).map(Some).collect();
    assert_eq!(seqs, expected);
    assert!(retry.replayed());
    assert_eq!(retry.raw(), first.raw());
    let mut replay = SseReply::open(&server.url, body, ACTIVATED).await;
    replay.rest().await;
    assert!(replay.replayed());
    assert_eq!(replay.raw(), first.raw(), "byte-for-byte");
    assert_eq!(server.executions(), 1);
}

#[tokio::test]
async fn disconnect_mid_stream_then_retry_gets_the_whole_sequence() {
    let db = Db::new();
    let server = db.server(config()).await;
    let mid = new_id();
    let body = stream_request(1, &mid, "go", json!({"events": 4, "stepMs": 100}));
    {
        let mut dropped = SseReply::open(&server.url, body.clone(), ACTIVATED).await;
        dropped.next_event().await.unwrap();
    } // the client goes away after one event
    tokio::time::sleep(Duration::from_millis(600)).await;
    let mut retry = SseReply::open(&server.url, body, ACTIVATED).await;
    let events = retry.rest().await;
    assert!(retry.replayed());
    let seqs: Vec<_> = events
        .iter()
        .map(|e| e["result"]["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(
        seqs,
        [0, 1, 2, 3],
        "the mission ran to the end and was stored"
    );
    assert_eq!(server.executions(), 1);
}

#[tokio::test]
async fn streams_survive_a_restart() {
    let db = Db::new();
    let mid = new_id();
    let body = stream_request(1, &mid, "go", json!({}));
    let server = db.server(config()).await;
    let mut first = SseReply::open(&server.url, body.clone(), ACTIVATED).await;
    first.rest().await;
    server.stop().await;
    let restarted = db.server(config()).await;
    let mut replay = SseReply::open(&restarted.url, body, ACTIVATED).await;
    replay.rest().await;
    assert!(replay.replayed());
    assert_eq!(replay.raw(), first.raw());
    assert_eq!(restarted.executions(), 0);
}

#[tokio::test]
async fn streams_cannot_be_batched() {
    let db = Db::new();
    let server = db.server(config()).await;
    let batch = format!("[{}]", stream_request(1, &new_id(), "go", json!({})));
    let reply = post_activated(&server.url, batch).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.json()[0]["error"]["code"], -32600);
    assert_eq!(
        reply.json()[0]["error"]["data"]["code"],
        "IDEMPOTENCY_STREAM_IN_BATCH",
        "from the error table"
    );
    assert_eq!(server.executions(), 0);
}

#[tokio::test]
async fn undeduplicated_streams_are_still_served() {
    let db = Db::new();
    let server = db.server(config().with(|c| c.required = false)).await;
    let mid = new_id();
    for _ in 0..2 {
        let mut reply =
            SseReply::open(&server.url, stream_request(1, &mid, "go", json!({})), &[]).await;
        assert_eq!(reply.content_type(), "text/event-stream");
        assert_eq!(reply.rest().await.len(), 4);
        assert!(!reply.replayed());
    }
    assert_eq!(server.executions(), 2);
}

/// A live stream (not deduplicated) holds only what its client has not read: one far past
/// the recording limit is served whole (found by helper-39: it was cut at 8 MiB).
#[tokio::test]
async fn an_undeduplicated_stream_is_not_cut_at_the_recording_limit() {
    let db = Db::new();
    let server = db.server(config().with(|c| c.required = false)).await;
    let metadata = json!({"events": 12, "stepMs": 20, "padKiB": 1024});
    let body = stream_request(1, &new_id(), "big", metadata);
    let mut reply = SseReply::open(&server.url, body, &[]).await;
    let events = reply.rest().await;
    let errors: Vec<_> = events.iter().filter(|e| !e["error"].is_null()).collect();
    assert_eq!((events.len(), errors.len()), (12, 0), "{errors:?}");
    assert!(reply.raw().len() > idem::config::MAX_RECORDED_STREAM_BYTES);
}

#[tokio::test]
async fn a_stream_past_the_recording_limit_ends_with_an_error_event_stored_as_sent() {
    let db = Db::new();
    let server = db.server(config()).await;
    let mid = new_id();
    let metadata = json!({"events": 12, "stepMs": 1, "padKiB": 1024});
    let body = stream_request(1, &mid, "big", metadata);
    let mut first = SseReply::open(&server.url, body.clone(), ACTIVATED).await;
    let events = first.rest().await;
    let last = events.last().unwrap();
    assert_eq!(
        last["error"]["data"]["code"],
        "IDEMPOTENCY_STREAM_TOO_LARGE"
    );
    assert_eq!(
        events.len(),
        8,
        "seven 1 MiB events fit in 8 MiB, the eighth does not"
    );
    assert!(first.raw().len() <= idem::config::MAX_RECORDED_STREAM_BYTES + 1024);
    let mut replay = SseReply::open(&server.url, body, ACTIVATED).await;
    replay.rest().await;
    assert!(replay.replayed());
    assert_eq!(replay.raw(), first.raw());
    assert_eq!(server.executions(), 1);
}

/// Events gathered for one commit count toward the recording limit before they are recorded:
/// a stream whose events are all ready at once is cut at the same event as one whose events
/// come apart.
#[tokio::test]
async fn events_ready_at_once_are_cut_at_the_recording_limit_as_events_apart_are() {
    let db = Db::new();
    let server = db.server(config()).await;
    let mut sent = Vec::new();
    for step_ms in [1, 0] {
        let metadata = json!({"events": 100, "stepMs": step_ms, "padKiB": 100});
        let body = stream_request(1, &new_id(), "big", metadata);
        let mut first = SseReply::open(&server.url, body, ACTIVATED).await;
        let events = first.rest().await;
        let code = &events.last().unwrap()["error"]["data"]["code"];
        assert_eq!(code, "IDEMPOTENCY_STREAM_TOO_LARGE");
        assert!(first.raw().len() <= idem::config::MAX_RECORDED_STREAM_BYTES + 1024);
        sent.push(events.len());
    }
    assert_eq!(sent[0], sent[1], "cut at the same event");
}

/// A first event past the limit ends the stream before any event names what the body made:
/// its outcome is the error alone, and its staged writes are discarded, as a unary error's
/// are. A stream whose first event fits commits them.
#[tokio::test]
async fn a_first_event_past_the_recording_limit_discards_the_staged_writes() {
    let db = Db::new();
    let server = db.server(config()).await;
    let mid = new_id();
    let metadata = json!({"events": 2, "stepMs": 1, "padKiB": 8 * 1024 + 1, "effect": "big"});
    let body = stream_request(1, &mid, "big", metadata);
    let mut first = SseReply::open(&server.url, body.clone(), ACTIVATED).await;
    let events = first.rest().await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(
        events[0]["error"]["data"]["code"],
        "IDEMPOTENCY_STREAM_TOO_LARGE"
    );
    assert!(db.effects().is_empty(), "nothing staged was written");
    let mut replay = SseReply::open(&server.url, body, ACTIVATED).await;
    replay.rest().await;
    assert!(replay.replayed());
    assert_eq!(replay.raw(), first.raw());
    assert_eq!(server.executions(), 1);

    let fits = json!({"events": 2, "stepMs": 1, "effect": "small"});
    let mut small = SseReply::open(
        &server.url,
        stream_request(2, &new_id(), "small", fits),
        ACTIVATED,
    )
    .await;
    assert_eq!(small.rest().await.len(), 2);
    assert_eq!(db.effects(), ["before:small", "small"]);
}

/// Not deduplicated (optional, not activated), the staged writes follow the same rule: a
/// first event past the limit discards them, one that fits commits them.
#[tokio::test]
async fn without_deduplication_a_first_event_past_the_limit_discards_the_writes_too() {
    let db = Db::new();
    let server = db.server(config().with(|c| c.required = false)).await;
    let big = json!({"events": 2, "stepMs": 1, "padKiB": 8 * 1024 + 1, "effect": "big"});
    let body = stream_request(1, &new_id(), "big", big);
    let events = SseReply::open(&server.url, body, &[]).await.rest().await;
    assert_eq!(
        events[0]["error"]["data"]["code"],
        "IDEMPOTENCY_STREAM_TOO_LARGE"
    );
    assert!(db.effects().is_empty(), "nothing staged was written");
    let fits = json!({"events": 2, "stepMs": 1, "effect": "small"});
    let body = stream_request(2, &new_id(), "small", fits);
    let events = SseReply::open(&server.url, body, &[]).await.rest().await;
    assert_eq!(events.len(), 2);
    assert_eq!(db.effects(), ["before:small", "small"]);
    assert_eq!(db.row_count(), 0, "neither was cached");
}

#[tokio::test]
async fn duplicates_of_a_stream_that_fails_before_streaming_all_get_its_json_error() {
    let db = Db::new();
    let server = db.server(config()).await;
    let mid = new_id();
    let body = stream_request(1, &mid, "fail-early", json!({"setupMs": 300}));
    let replies =
        futures::future::join_all((0..5).map(|_| post_activated(&server.url, body.clone()))).await;
    for reply in &replies {
        assert!(reply
            .header("content-type")
            .unwrap()
            .starts_with("application/json"));
        assert_eq!(reply.body, replies[0].body);
        assert_eq!(reply.error_code(), -32001);
    }
    assert_eq!(replies.iter().filter(|r| r.replayed()).count(), 4);
    assert_eq!(server.executions(), 1);
}

/// A live stream (not deduplicated: `EventStream::live`, as a resubscription) whose events
/// are counted as they are produced.
mod live {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use idem::EventStream;
    use jsonrpsee::core::{async_trait, RpcResult};
    use jsonrpsee::proc_macros::rpc;
    use jsonrpsee::Extensions;
    use serde_json::{json, Value};

    #[rpc(server)]
    pub trait Follow {
        #[method(name = "tasks/resubscribe", with_extensions)]
        async fn follow(&self, id: String) -> RpcResult<EventStream<Value>>;
    }

    pub struct Follower {
        pub produced: Arc<AtomicUsize>,
    }

    #[async_trait]
    impl FollowServer for Follower {
        async fn follow(&self, ext: &Extensions, id: String) -> RpcResult<EventStream<Value>> {
            let produced = self.produced.clone();
            // Events of these sizes in bytes, all ready at once.
            if let Some(sizes) = id.strip_prefix("sizes:") {
                let events: Vec<RpcResult<Value>> = sizes
                    .split(',')
                    .map(|size| Ok(json!("x".repeat(size.parse().unwrap()))))
                    .collect();
                return EventStream::live(ext, futures::stream::iter(events));
            }
            // One that takes a moment to set its stream up.
            if id == "slow" {
                tokio::time::sleep(Duration::from_millis(400)).await;
            }
            let events = futures::stream::unfold(0u32, move |n| {
                let produced = produced.clone();
                let id = id.clone();
                async move {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    produced.fetch_add(1, Ordering::SeqCst);
                    (n < 1000).then(|| (Ok(json!({"id": id, "n": n})), n + 1))
                }
            });
            EventStream::live(ext, events)
        }
    }
}

/// A server of [`live::Follower`], and the count of the events it made.
async fn follower_server() -> (Db, TestServer, Arc<AtomicUsize>) {
    use live::FollowServer;

    let db = Db::new();
    let produced = Arc::new(AtomicUsize::new(0));
    let follower = live::Follower {
        produced: produced.clone(),
    };
    let rpc = follower.into_rpc();
    let server = TestServer::serve(&db.path, config(), db.clock.clone(), rpc, produced.clone());
    let server = server.await;
    (db, server, produced)
}

/// Fails if `produced` still grows after `settle`: events made for no one.
async fn assert_stopped(produced: &AtomicUsize, settle: Duration) {
    tokio::time::sleep(settle).await;
    let after_hang_up = produced.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let later = produced.load(Ordering::SeqCst);
    assert_eq!(later, after_hang_up, "still producing for no one");
}

/// A live stream whose client hangs up stops producing: nothing replays it, so events no one
/// reads are not made (a follower left open to a long task's end before).
#[tokio::test]
async fn a_live_stream_stops_once_its_client_hangs_up() {
    let (_db, server, produced) = follower_server().await;
    let body =
        json!({"jsonrpc": "2.0", "id": 1, "method": "tasks/resubscribe", "params": {"id": "t"}});
    let mut stream = SseReply::open(&server.url, body.to_string(), &[]).await;
    assert_eq!(stream.next_event().await.unwrap()["result"]["n"], 0);
    assert_eq!(stream.next_event().await.unwrap()["result"]["n"], 1);
    drop(stream); // the client hangs up
    assert_stopped(&produced, Duration::from_millis(500)).await;
}

/// A live stream holds only what its client has not read: events ready together, 12 MiB in
/// all, reach a client that reads them, where they were cut at 8 MiB as if unread
/// (helper-111); one event over 8 MiB alone still ends the stream with the error that says so.
#[tokio::test]
async fn a_live_stream_s_events_ready_together_reach_a_client_that_reads_them() {
    let (_db, server, _produced) = follower_server().await;
    let four_mib = 4 * 1024 * 1024;
    let follow = |sizes: String| {
        let params = json!({"id": format!("sizes:{sizes}")});
        json!({"jsonrpc": "2.0", "id": 1, "method": "tasks/resubscribe", "params": params})
            .to_string()
    };
    let all = SseReply::open(
        &server.url,
        follow(format!("{four_mib},{four_mib},{four_mib}")),
        &[],
    );
    let events = all.await.rest().await;
    let lengths: Vec<_> = events
        .iter()
        .map(|event| event["result"].as_str().map(str::len))
        .collect();
    assert_eq!(lengths, [Some(four_mib); 3], "every event, whole");
    let over = idem::config::MAX_RECORDED_STREAM_BYTES;
    let cut = SseReply::open(&server.url, follow(format!("1,{over}")), &[]);
    let events = cut.await.rest().await;
    assert_eq!(events.len(), 2, "the first, then the error");
    let code = &events[1]["error"]["data"]["code"];
    assert_eq!(code, "IDEMPOTENCY_STREAM_TOO_LARGE", "{}", events[1]);
}

/// Over WebSocket a live stream has no HTTP response to go out in: the call is told so, as a
/// governed one is, not that the layers are missing (helper-91), and no event is made.
#[tokio::test]
async fn a_live_stream_over_websocket_is_refused_as_http_only() {
    let (_db, server, produced) = follower_server().await;
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"tasks/resubscribe","params":{"id":"t"}}"#;
    let answer = websocket_call(&server.url, body).await;
    assert_eq!(answer["error"]["code"], -32600, "{answer}");
    assert_eq!(answer["error"]["data"]["code"], "IDEMPOTENCY_HTTP_ONLY");
    assert_stopped(&produced, Duration::from_millis(100)).await;
    assert_eq!(produced.load(Ordering::SeqCst), 0);
}

/// The same for a client that hangs up before its answer's head was sent, while the method
/// still set its stream up: the stream waited for a reader for as long as it ran (helper-71).
#[tokio::test]
async fn a_live_stream_stops_when_its_client_hung_up_before_the_answer_began() {
    use tokio::io::AsyncWriteExt;

    let (_db, server, produced) = follower_server().await;
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tasks/resubscribe",
        "params": {"id": "slow"}});
    let body = body.to_string();
    let addr = server.url.strip_prefix("http://").unwrap();
    let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "POST / HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    socket.write_all(request.as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(socket); // while the method waits its 400 ms before it streams
    assert_stopped(&produced, Duration::from_millis(1000)).await;
}
