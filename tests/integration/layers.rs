//! idempotency/v1 through a real jsonrpsee server and a real SQLite file: AC-1..AC-4, headers,
//! concurrency, bad input, batches, failure caching.

use std::time::Duration;

use futures::future::join_all;
use idem::IdempotencyConfig;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::*;

fn config() -> IdempotencyConfig {
    IdempotencyConfig::default()
}

/// The request hash computed independently of the library (the harness's: serde_jcs + sha2).
fn independent_hash(body: &str) -> String {
    idem_conformance::request_hash::request_hash(body).unwrap()
}

#[tokio::test]
async fn ac1_identical_retry_is_replayed_byte_for_byte_without_reexecution() {
    let db = Db::new();
    let server = db.server(config()).await;
    let mid = new_id();
    let first = post_activated(&server.url, send(1, &mid, "hello")).await;
    assert_eq!(first.status, 200);
    assert!(
        !first.replayed(),
        "a fresh response has no Idempotent-Replayed header"
    );
    assert!(first.echoes_extension());
    assert_eq!(first.json()["result"]["echo"], "hello");

    let replay = post_activated(&server.url, send(1, &mid, "hello")).await;
    assert_eq!(replay.status, first.status);
    assert_eq!(replay.body, first.body, "byte-for-byte identical");
    assert!(replay.replayed());
    assert!(replay.echoes_extension());
    assert_eq!(server.executions(), 1);

    // Modulo whitespace and key order (JCS), and under another JSON-RPC id: the same result.
    let reordered = format!(
        r#"{{ "params": {{ "metadata": {{}}, "message": {{ "parts": [{{"text":"hello","kind":"text"}}], "role":"user", "messageId":"{mid}", "kind":"message" }} }}, "method":"message/send", "id": 7, "jsonrpc":"2.0" }}"#
    );
    let other = post_activated(&server.url, reordered).await;
    assert!(other.replayed());
    assert_eq!(other.json()["id"], 7);
    assert_eq!(other.json()["result"], first.json()["result"]);
    assert_eq!(server.executions(), 1);
}

#[tokio::test]
async fn ac2_other_payload_is_422_and_the_original_entry_is_untouched() {
    let db = Db::new();
    let server = db.server(config()).await;
    let mid = new_id();
    let original = send(1, &mid, "B");
    let first = post_activated(&server.url, original.clone()).await;
    let row_before = db.row(&mid).unwrap();

    let changed = send(2, &mid, "B-prime");
    let collision = post_activated(&server.url, changed.clone()).await;
    assert_eq!(collision.status, 422);
    assert_eq!(collision.error_code(), -32422);
    assert_eq!(
        collision.data_code(),
        "IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_PAYLOAD"
    );
    let data = &collision.json()["error"]["data"];
    assert_eq!(data["message_id"], mid.as_str());
    assert_eq!(data["original_request_hash"], independent_hash(&original));
    assert_eq!(data["submitted_request_hash"], independent_hash(&changed));
    assert_ne!(
        data["original_request_hash"],
        data["submitted_request_hash"]
    );
    assert!(collision.echoes_extension());
    assert!(!collision.replayed());

    assert_eq!(
        db.row(&mid).unwrap(),
        row_before,
        "the collision did not overwrite the entry"
    );
    let retry = post_activated(&server.url, original).await;
    assert!(retry.replayed());
    assert_eq!(retry.body, first.body);
    assert_eq!(server.executions(), 1);
}

/// Resends of the very same bytes are answered from memory before any parsing; nothing about
/// the answer may differ from the hashed path: the body, the header, the 422 and its hashes.
#[tokio::test]
async fn resends_of_the_same_bytes_answer_exactly_as_hashed_ones() {
    let db = Db::new();
    let server = db.server(config()).await;
    let mid = new_id();
    let original = send(1, &mid, "same bytes");
    let first = post_activated(&server.url, original.clone()).await;
    for _ in 0..3 {
        let resend = post_activated(&server.url, original.clone()).await;
        assert!(resend.replayed());
        assert!(resend.echoes_extension());
        assert_eq!(resend.body, first.body, "byte-for-byte");
    }
    // The same params under another JSON-RPC id: the same result, this call's id.
    let other_id = post_activated(&server.url, send(9, &mid, "same bytes")).await;
    assert!(other_id.replayed());
    assert_eq!(other_id.json()["id"], 9);
    assert_eq!(other_id.json()["result"], first.json()["result"]);
    let other_id_again = post_activated(&server.url, send(9, &mid, "same bytes")).await;
    assert_eq!(
        other_id_again.body, other_id.body,
        "never the stored bytes of id 1"
    );
    // The same bytes without what made them a governed call are answered as such.
    let not_activated = post(&server.url, original.clone(), &[]).await;
    assert_eq!(not_activated.error_code(), -32008);
    assert!(!not_activated.replayed());
    let not_json = reqwest::Client::new()
        .post(&server.url)
        .header("content-type", "text/plain")
        .header("A2A-Extensions", URI)
        .body(original.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(not_json.status(), 415);
    // A batch holding the very same call is a batch: answered as one, not from memory.
    let batch = post_activated(&server.url, format!("[{original}]")).await;
    assert!(batch.json().is_array());
    assert_eq!(batch.batch_answer(1)["result"], first.json()["result"]);
    // Other params under the key: the 422, with both hashes as the spec computes them.
    let changed = send(2, &mid, "other bytes");
    let collision = post_activated(&server.url, changed.clone()).await;
    assert_eq!(collision.status, 422);
    let data = &collision.json()["error"]["data"];
    assert_eq!(data["original_request_hash"], independent_hash(&original));
    assert_eq!(data["submitted_request_hash"], independent_hash(&changed));
    assert_eq!(server.executions(), 1);

    // A restart empties the memory: the file gives the same answers.
    server.stop().await;
    let server = db.server(config()).await;
    let after = post_activated(&server.url, original.clone()).await;
    assert!(after.replayed());
    assert_eq!(after.body, first.body);
    let again = post_activated(&server.url, original).await;
    assert_eq!(again.body, first.body);
    let collision_after = post_activated(&server.url, changed).await;
    assert_eq!(collision_after.body, collision.body);
    assert_eq!(server.executions(), 0, "this process executed nothing");
}

#[tokio::test]
async fn ac2_metadata_change_is_a_collision_too() {
    let db = Db::new();
    let server = db.server(config()).await;
    let mid = new_id();
    post_activated(
        &server.url,
        send_with(1, "message/send", &mid, "x", json!({"a": 1})),
    )
    .await;
    let other = post_activated(
        &server.url,
        send_with(1, "message/send", &mid, "x", json!({"a": 2})),
    )
    .await;
    assert_eq!(other.status, 422);
    assert_eq!(server.executions(), 1);
}

/// Spec §4.3: failed responses are cached too, those of params whose types jsonrpsee refuses
/// before the body runs included (found by helper-47: that refusal was not stored, its retry
/// was no replay, and a corrected payload under the key ran instead of getting the 422).
#[tokio::test]
async fn params_that_do_not_decode_are_a_cached_failure() {
    let db = Db::new();
    let server = db.server(config()).await;
    let undecodable = |id: u64, mid: &str| {
        let message = json!({"kind": "message", "messageId": mid, "role": "user", "parts": []});
        let params = json!({"message": message, "configuration": {"historyLength": "x"}});
        json!({"jsonrpc": "2.0", "id": id, "method": "message/send", "params": params}).to_string()
    };
    let mid = new_id();
    let first = post_activated(&server.url, undecodable(1, &mid)).await;
    assert_eq!(first.error_code(), -32602, "{}", first.describe());
    assert!(!first.replayed());
    assert!(db.row(&mid).is_some(), "stored as the call's outcome");
    let again = post_activated(&server.url, undecodable(1, &mid)).await;
    assert!(again.replayed());
    assert_eq!(again.body, first.body, "byte for byte");
    let other_id = post_activated(&server.url, undecodable(2, &mid)).await;
    assert!(other_id.replayed());
    assert_eq!(other_id.json()["id"], 2);
    assert_eq!(other_id.json()["error"], first.json()["error"]);
    let corrected = post_activated(&server.url, send(3, &mid, "x")).await;
    assert_eq!(corrected.status, 422, "{}", corrected.describe());
    assert_eq!(server.executions(), 0);

    // In a batch alike: stored, and the corrected payload's 422 follows.
    let mid = new_id();
    let batch = post_activated(&server.url, format!("[{}]", undecodable(4, &mid))).await;
    assert_eq!(batch.batch_answer(4)["error"]["code"], -32602);
    assert!(db.row(&mid).is_some(), "stored as the call's outcome");
    let corrected = post_activated(&server.url, send(5, &mid, "x")).await;
    assert_eq!(corrected.status, 422, "{}", corrected.describe());
    assert_eq!(server.executions(), 0);
}

#[tokio::test]
async fn same_key_under_another_method_is_a_collision() {
    let db = Db::new();
    let server = db.server(config()).await;
    let mid = new_id();
    post_activated(&server.url, send(1, &mid, "x")).await;
    let other = post_activated(
        &server.url,
        send_with(1, "SendMessage", &mid, "x", json!({})),
    )
    .await;
    assert_eq!(other.status, 422);
    // Both methods named: the two hashes, equal, would not say why (found by helper-47).
    let data = &other.json()["error"]["data"];
    assert_eq!(data["original_method"], "message/send");
    assert_eq!(data["submitted_method"], "SendMessage");
    assert_eq!(
        data["original_request_hash"],
        data["submitted_request_hash"]
    );
    assert_eq!(server.executions(), 1);
}

#[tokio::test]
async fn ac3_past_ttl_the_request_is_new() {
    let db = Db::new();
    let server = db.server(config().with(|c| c.ttl_seconds = 60)).await;
    let mid = new_id();
    let first = post_activated(&server.url, send(1, &mid, "x")).await;
    let (_, _, inserted_t0) = db.row(&mid).unwrap();

    db.clock.advance(Duration::from_secs(61));
    let later = post_activated(&server.url, send(1, &mid, "x")).await;
    assert_eq!(later.status, 200);
    assert!(
        !later.replayed(),
        "past the TTL the response is not a replay"
    );
    assert_ne!(later.body, first.body, "executed again");
    assert_eq!(server.executions(), 2);
    let (_, body, inserted_t1) = db.row(&mid).unwrap();
    assert_eq!(
        inserted_t1,
        inserted_t0 + 61,
        "a new entry replaced the stale row"
    );
    assert_eq!(body, later.body);
    assert_eq!(db.row_count(), 1);

    let again = post_activated(&server.url, send(1, &mid, "x")).await;
    assert!(again.replayed());
    assert_eq!(again.body, later.body);
}

#[tokio::test]
async fn ac4_cache_survives_a_restart_on_the_same_file() {
    let db = Db::new();
    let mid = new_id();
    let server = db.server(config()).await;
    let first = post_activated(&server.url, send(1, &mid, "x")).await;
    server.stop().await; // the server, its store and writer thread are dropped here

    let restarted = db.server(config()).await;
    let replay = post_activated(&restarted.url, send(1, &mid, "x")).await;
    assert_eq!(replay.body, first.body);
    assert!(replay.replayed());
    assert_eq!(
        restarted.executions(),
        0,
        "the restarted server did not execute"
    );
}

#[tokio::test]
async fn legacy_and_multi_value_activation_headers() {
    let db = Db::new();
    let server = db.server(config()).await;
    let mid = new_id();
    let legacy = [("X-A2A-Extensions", URI)];
    let first = post(&server.url, send(1, &mid, "x"), &legacy).await;
    assert_eq!(first.status, 200);
    assert!(first.echoes_extension());
    let several = format!("urn:example:other ,  {URI},urn:x");
    let replay = post(
        &server.url,
        send(1, &mid, "x"),
        &[("A2A-Extensions", &several)],
    )
    .await;
    assert!(replay.replayed());
    assert_eq!(server.executions(), 1);
}

#[tokio::test]
async fn not_activated_with_required_extension_is_refused() {
    let db = Db::new();
    let server = db.server(config()).await;
    let reply = post(&server.url, send(1, &new_id(), "x"), &[]).await;
    assert_eq!(reply.status, 400);
    assert_eq!(reply.error_code(), -32008);
    assert_eq!(reply.json()["error"]["data"]["extension"], URI);
    assert!(!reply.echoes_extension(), "the request did not activate it");
    assert_eq!(server.executions(), 0);
    assert_eq!(db.row_count(), 0);
    // Ungoverned methods are not affected.
    let get = post(
        &server.url,
        r#"{"jsonrpc":"2.0","id":1,"method":"tasks/get"}"#,
        &[],
    )
    .await;
    assert_eq!((get.status, get.json()["result"].clone()), (200, json!(0)));
}

#[tokio::test]
async fn not_activated_with_optional_extension_runs_undeduplicated() {
    let db = Db::new();
    let server = db.server(config().with(|c| c.required = false)).await;
    assert_eq!(
        server.idem.agent_card_extension().unwrap()["required"],
        false
    );
    let mid = new_id();
    for _ in 0..2 {
        let reply = post(&server.url, send(1, &mid, "x"), &[]).await;
        assert_eq!(reply.status, 200);
        assert!(!reply.replayed());
        assert!(!reply.echoes_extension());
    }
    assert_eq!(server.executions(), 2);
    assert_eq!(db.row_count(), 0);
    // Activated calls on the same server are deduplicated.
    post_activated(&server.url, send(1, &mid, "x")).await;
    assert!(post_activated(&server.url, send(1, &mid, "x"))
        .await
        .replayed());
    assert_eq!(server.executions(), 3);
}

#[tokio::test]
async fn ungoverned_method_with_activation_gets_the_echo_only() {
    let db = Db::new();
    let server = db.server(config()).await;
    let get = post_activated(
        &server.url,
        r#"{"jsonrpc":"2.0","id":1,"method":"tasks/get"}"#,
    )
    .await;
    assert_eq!(get.status, 200);
    assert!(get.echoes_extension());
    assert!(!get.replayed());
}

#[tokio::test]
async fn hundred_concurrent_identical_calls_execute_once() {
    let db = Db::new();
    let server = db.server(config()).await;
    let mid = new_id();
    let body = send_with(1, "message/send", &mid, "x", json!({"delayMs": 300}));
    let replies = join_all((0..100).map(|_| post_activated(&server.url, body.clone()))).await;
    assert_eq!(server.executions(), 1);
    assert!(replies.iter().all(|r| r.status == 200));
    assert_eq!(replies.iter().filter(|r| r.replayed()).count(), 99);
    assert!(
        replies.iter().all(|r| r.body == replies[0].body),
        "one body for all"
    );
}

#[tokio::test]
async fn concurrent_different_payloads_under_one_key_get_422_at_once() {
    let db = Db::new();
    let server = db.server(config()).await;
    let mid = new_id();
    let (url, body) = (
        server.url.clone(),
        send_with(1, "message/send", &mid, "x", json!({"delayMs": 1500})),
    );
    let slow = tokio::spawn(async move { post_activated(&url, body).await });
    server.wait_for_executions(1).await;
    let others = join_all(
        (0..20).map(|i| post_activated(&server.url, send(1, &mid, &format!("other-{i}")))),
    )
    .await;
    assert!(others
        .iter()
        .all(|r| r.status == 422 && r.error_code() == -32422));
    assert!(
        !slow.is_finished(),
        "collisions do not wait for the first call"
    );
    assert_eq!(slow.await.unwrap().status, 200);
    assert_eq!(server.executions(), 1);
}

#[tokio::test]
async fn waiting_past_the_bound_is_409_then_the_replay_arrives() {
    let db = Db::new();
    let server = db
        .server(config().with(|c| c.in_flight_wait = Duration::from_millis(200)))
        .await;
    let mid = new_id();
    let body = send_with(1, "message/send", &mid, "x", json!({"delayMs": 1000}));
    let (url, first_body) = (server.url.clone(), body.clone());
    let first = tokio::spawn(async move { post_activated(&url, first_body).await });
    server.wait_for_executions(1).await;
    let busy = post_activated(&server.url, body.clone()).await;
    assert_eq!(busy.status, 409);
    assert_eq!(busy.data_code(), "IDEMPOTENCY_REQUEST_IN_PROGRESS");
    assert!(busy.echoes_extension());
    let first = first.await.unwrap();
    let replay = post_activated(&server.url, body).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, first.body);
    assert_eq!(server.executions(), 1);
}

/// The bound holds for the whole wait. An original that gave up without an outcome (its
/// staged write failed) woke its two waiters; one took the key and ran, and the other waited
/// a whole bound again, then ran in turn (helper-80, helper-84). It now gets its 409 once the
/// bound counted from its arrival has passed.
#[tokio::test]
async fn the_wait_bound_counts_from_arrival_across_a_released_original() {
    let db = Db::new();
    let wait = Duration::from_millis(2000);
    let server = db.server(config().with(|c| c.in_flight_wait = wait)).await;
    let database = server.idem.database().unwrap();
    let taken = "INSERT INTO effects (name) VALUES ('taken')";
    database
        .transact(move |db| db.execute(taken, []))
        .await
        .unwrap();
    // Each execution runs 1.5 s, then its staged write fails: nothing stored, the key released.
    let body = send_with(
        1,
        "message/send",
        &new_id(),
        "x",
        json!({"delayMs": 1500, "effect": "taken"}),
    );
    let send = |body: String| {
        let url = server.url.clone();
        tokio::spawn(async move { post_activated(&url, body).await })
    };
    let first = send(body.clone());
    server.wait_for_executions(1).await;
    let duplicates = [send(body.clone()), send(body.clone())];
    assert_eq!(first.await.unwrap().data_code(), "IDEMPOTENCY_WRITE_FAILED");
    let mut codes = Vec::new();
    for duplicate in duplicates {
        codes.push(duplicate.await.unwrap().data_code());
    }
    codes.sort();
    assert_eq!(
        codes,
        [
            "IDEMPOTENCY_REQUEST_IN_PROGRESS",
            "IDEMPOTENCY_WRITE_FAILED"
        ]
    );
    assert_eq!(server.executions(), 2);
}

/// A call whose client hung up runs to its end, its body held, and it keeps its place under
/// `max_requests_in_flight` as long: the place went with the answer, and the bound on what
/// bodies take in memory was twice what the README says (helper-88).
#[tokio::test]
async fn a_call_whose_client_left_keeps_its_place_until_it_ends() {
    let db = Db::new();
    let server = db
        .server(config().with(|c| c.max_requests_in_flight = 1))
        .await;
    let slow = send_with(1, "message/send", &new_id(), "x", json!({"delayMs": 1500}));
    let request = format!(
        "POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         A2A-Extensions: {URI}\r\nContent-Length: {}\r\n\r\n{slow}",
        slow.len()
    );
    let address = server
        .url
        .trim_start_matches("http://")
        .trim_end_matches('/');
    let mut left = tokio::net::TcpStream::connect(address).await.unwrap();
    left.write_all(request.as_bytes()).await.unwrap();
    server.wait_for_executions(1).await;
    drop(left);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let other = send_with(1, "message/send", &new_id(), "y", json!({}));
    let refused = post_activated(&server.url, other.clone()).await;
    assert_eq!(refused.status, 429, "{}", refused.describe());
    // Once the call has ended, its place is free again.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while post_activated(&server.url, other.clone()).await.status == 429 {
        assert!(
            std::time::Instant::now() < deadline,
            "the place never came back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(server.executions(), 2);
}

#[tokio::test]
async fn bad_input_is_refused_with_a_clear_error_and_never_executed() {
    let db = Db::new();
    let server = db.server(config()).await;
    let envelope = |params: &str| {
        format!(r#"{{"jsonrpc":"2.0","id":1,"method":"message/send","params":{params}}}"#)
    };
    let parts = r#""parts":[{"kind":"text","text":"x"}]"#;
    let mid = new_id();
    let cases: Vec<(&str, String, u16, i64)> = vec![
        (
            "numeric messageId",
            envelope(&format!(r#"{{"message":{{"messageId":42,{parts}}}}}"#)),
            400,
            -32400,
        ),
        (
            "null messageId",
            envelope(&format!(r#"{{"message":{{"messageId":null,{parts}}}}}"#)),
            400,
            -32400,
        ),
        (
            "missing messageId",
            envelope(&format!(r#"{{"message":{{{parts}}}}}"#)),
            400,
            -32400,
        ),
        (
            "malformed messageId",
            envelope(&format!(r#"{{"message":{{"messageId":"msg-1",{parts}}}}}"#)),
            400,
            -32400,
        ),
        (
            "nil messageId",
            envelope(&format!(
                r#"{{"message":{{"messageId":"00000000-0000-0000-0000-000000000000",{parts}}}}}"#
            )),
            400,
            -32400,
        ),
        (
            "params an array",
            envelope(&format!(
                r#"[{{"message":{{"messageId":"{mid}",{parts}}}}}]"#
            )),
            400,
            -32400,
        ),
        ("params a string", envelope(r#""hello""#), 400, -32400),
        (
            "no params",
            r#"{"jsonrpc":"2.0","id":1,"method":"message/send"}"#.to_owned(),
            400,
            -32400,
        ),
        (
            "duplicate keys",
            envelope(&format!(
                r#"{{"message":{{"messageId":"{mid}",{parts},"parts":[]}}}}"#
            )),
            400,
            -32602,
        ),
        (
            "inexact number",
            envelope(&format!(
                r#"{{"message":{{"messageId":"{mid}",{parts}}},"metadata":{{"n":9007199254740993}}}}"#
            )),
            400,
            -32602,
        ),
        (
            "lone surrogate",
            envelope(&format!(
                r#"{{"message":{{"messageId":"{mid}",{parts}}},"metadata":{{"s":"\ud800"}}}}"#
            )),
            400,
            -32602,
        ),
        (
            "truncated JSON",
            envelope(&format!(r#"{{"message":{{"messageId":"{mid}""#)),
            400,
            -32700,
        ),
    ];
    for (name, body, status, code) in cases {
        let reply = post_activated(&server.url, body).await;
        assert_eq!(
            (reply.status, reply.error_code()),
            (status, code),
            "{name}: {}",
            String::from_utf8_lossy(&reply.body)
        );
        assert!(
            reply.json()["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{name}"
        );
        if status == 400 {
            assert!(reply.echoes_extension(), "{name}");
            let reason = &reply.json()["error"]["data"]["reason"];
            assert!(
                reason.as_str().is_some_and(|r| !r.is_empty()),
                "{name}: reason {reason}"
            );
            // Params by position hold their messageId where it is not looked for: the reason
            // says so, not that it is missing (found by helper-40).
            if name.starts_with("params a") {
                let reason = reason.as_str().unwrap();
                assert!(
                    reason.starts_with("params must be an object"),
                    "{name}: {reason}"
                );
            }
        }
    }
    // Invalid UTF-8 inside a string of the params.
    let mut bytes = envelope(&format!(
        r#"{{"message":{{"messageId":"{mid}",{parts}}},"metadata":{{"s":"XX"}}}}"#
    ))
    .into_bytes();
    let at = bytes.windows(2).position(|w| w == b"XX").unwrap();
    bytes[at] = 0xff;
    let reply = post_activated(&server.url, bytes).await;
    // Not UTF-8, so not JSON: refused before jsonrpsee reads it.
    assert_eq!(
        (reply.status, reply.error_code()),
        (400, -32700),
        "invalid UTF-8"
    );

    assert_eq!(server.executions(), 0, "nothing executed");
    assert_eq!(db.row_count(), 0, "nothing cached");
    let healthy = post_activated(&server.url, send(1, &new_id(), "x")).await;
    assert_eq!(healthy.status, 200, "the server is still healthy");
}

#[tokio::test]
async fn batch_entries_each_get_their_own_answer() {
    let db = Db::new();
    let server = db.server(config()).await;
    let (a, b) = (new_id(), new_id());
    post_activated(&server.url, send(1, &a, "a")).await;
    let batch = format!(
        "[{}, {}, {}, {}, {}]",
        send(10, &a, "a"),
        send(11, &b, "b"),
        send(12, "not-a-uuid", "c"),
        send(13, &a, "a-changed"),
        r#"{"jsonrpc":"2.0","id":14,"method":"tasks/get"}"#
    );
    let reply = post_activated(&server.url, batch).await;
    assert_eq!(reply.status, 200, "a batch keeps HTTP 200");
    assert!(!reply.replayed(), "not every answer is a replay");
    assert!(reply.echoes_extension());
    let by_id = |id: u64| reply.batch_answer(id);
    assert_eq!(by_id(10)["result"]["echo"], "a", "replayed entry");
    assert_eq!(by_id(10)["result"]["execution"], 1);
    assert_eq!(by_id(11)["result"]["echo"], "b", "executed entry");
    assert_eq!(by_id(12)["error"]["code"], -32400);
    assert_eq!(by_id(13)["error"]["code"], -32422);
    assert_eq!(by_id(14)["result"], 2);
    assert_eq!(server.executions(), 2);

    // A batch whose every answer is a replay was served from the cache as a whole (spec
    // §4.3): it says so. One answer that is not (executed, refused, ungoverned) and it does not.
    let replays = format!("[{}, {}]", send(20, &a, "a"), send(21, &b, "b"));
    let whole = post_activated(&server.url, replays).await;
    assert!(whole.replayed(), "{}", whole.describe());
    assert_eq!(whole.batch_answer(21)["result"]["echo"], "b");
    let notification = r#"{"jsonrpc":"2.0","method":"tasks/get"}"#;
    let with_notification = format!("[{}, {notification}]", send(22, &a, "a"));
    assert!(post_activated(&server.url, with_notification)
        .await
        .replayed());
    for partly in [
        format!("[{}, {}]", send(30, &a, "a"), send(31, &new_id(), "new")),
        format!("[{}, {}]", send(32, &a, "a"), send(33, "not-a-uuid", "c")),
        format!(
            r#"[{}, {{"jsonrpc":"2.0","id":34,"method":"tasks/get"}}]"#,
            send(35, &a, "a")
        ),
    ] {
        let reply = post_activated(&server.url, partly.clone()).await;
        assert!(!reply.replayed(), "{partly}: {}", reply.describe());
    }
    assert_eq!(server.executions(), 3);
}

/// JSON allows any whitespace before a value: a call or a batch after 128 bytes of it (past
/// which jsonrpsee alone stops looking for the request and answers a Parse error) is served,
/// each batch entry answered (found by helper-56).
#[tokio::test]
async fn a_body_after_much_whitespace_is_served() {
    let db = Db::new();
    let server = db.server(config()).await;
    let padding = " \n".repeat(200);
    let single = send(1, &new_id(), "after whitespace");
    let reply = post_activated(&server.url, format!("{padding}{single}")).await;
    assert_eq!(
        reply.json()["result"]["echo"],
        "after whitespace",
        "{}",
        reply.describe()
    );
    let retry = post_activated(&server.url, format!("{padding}{single}")).await;
    assert!(
        retry.replayed() && retry.body == reply.body,
        "{}",
        retry.describe()
    );
    let batch = format!(
        "{padding}[{}, {}]",
        send(2, &new_id(), "x"),
        send(3, &new_id(), "y")
    );
    let reply = post_activated(&server.url, batch).await;
    assert_eq!(
        reply.batch_answer(2)["result"]["echo"],
        "x",
        "{}",
        reply.describe()
    );
    assert_eq!(reply.batch_answer(3)["result"]["echo"], "y");
    assert_eq!(server.executions(), 3);
}

/// A form feed is skipped by jsonrpsee before a request, but is no whitespace in JSON: a body
/// led by one is a Parse error, and runs nothing (found by helper-76: it ran the method).
#[tokio::test]
async fn a_body_led_by_a_form_feed_is_not_json_and_runs_nothing() {
    let db = Db::new();
    let server = db.server(config()).await;
    for lead in ["\x0c", " \n\x0c"] {
        let body = format!("{lead}{}", send(1, &new_id(), "after a form feed"));
        assert!(serde_json::from_str::<serde_json::Value>(&body).is_err());
        let reply = post_activated(&server.url, body).await;
        assert_eq!(reply.status, 400, "{}", reply.describe());
        assert_eq!(reply.error_code(), -32700);
    }
    assert_eq!(server.executions(), 0);
}

#[tokio::test]
async fn failures_are_cached_and_replayed_like_successes() {
    let db = Db::new();
    let server = db.server(config()).await;
    let mid = new_id();
    let first = post_activated(&server.url, send(1, &mid, "fail")).await;
    assert_eq!(first.status, 200);
    assert_eq!(first.error_code(), -32000);
    let replay = post_activated(&server.url, send(1, &mid, "fail")).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, first.body);
    assert_eq!(server.executions(), 1);
}

/// A method's own -32600 is its answer, HTTP 200 as any method's error, cached and replayed
/// as sent: a resend of its very bytes (answered from them) and a retry under another id
/// alike. Only a body that is not a Request is a 400.
#[tokio::test]
async fn a_method_s_own_invalid_request_error_keeps_its_status_on_every_replay() {
    let db = Db::new();
    let server = db.server(config()).await;
    let mid = new_id();
    let first = post_activated(&server.url, send(1, &mid, "invalid")).await;
    assert_eq!((first.status, first.error_code()), (200, -32600));
    // A retry by key, then a resend answered from its very bytes.
    for _ in 0..2 {
        let resent = post_activated(&server.url, send(1, &mid, "invalid")).await;
        assert!(resent.replayed());
        assert_eq!((resent.status, &resent.body), (200, &first.body));
    }
    let retried = post_activated(&server.url, send(2, &mid, "invalid")).await;
    assert!(retried.replayed());
    assert_eq!(
        (retried.status, retried.json()["id"].clone()),
        (200, json!(2))
    );
    assert_eq!(server.executions(), 1);
}

#[tokio::test]
async fn a_panicking_body_is_cached_as_a_failure_and_the_server_lives() {
    let db = Db::new();
    let server = db.server(config()).await;
    let mid = new_id();
    let first = post_activated(&server.url, send(1, &mid, "panic")).await;
    assert_eq!(first.error_code(), -32603);
    assert_eq!(first.data_code(), "IDEMPOTENCY_EXECUTION_PANICKED");
    for _ in 0..2 {
        let replay = post_activated(&server.url, send(1, &mid, "panic")).await;
        assert!(replay.replayed());
        assert_eq!(replay.body, first.body);
    }
    assert_eq!(server.executions(), 1);
    assert_eq!(
        post_activated(&server.url, send(1, &new_id(), "ok"))
            .await
            .status,
        200
    );
}

/// The card layer serves the application's card with this extension's entry as the
/// configuration makes it (spec §3.1), its headers alone to HEAD, and 405 to what it does
/// not serve; JSON-RPC over POST on its path is jsonrpsee's, as on every path.
#[tokio::test]
async fn the_agent_card_layer_serves_the_card_with_the_extension_s_entry() {
    let db = Db::new();
    let server = db.server(config().with(|c| c.ttl_seconds = 600)).await;
    let url = format!("{}/.well-known/agent-card.json", server.url);
    let http = reqwest::Client::new();
    let got = http.get(&url).send().await.unwrap();
    assert_eq!(got.status(), 200);
    assert_eq!(got.headers()["content-type"], "application/json");
    let card: Value = got.json().await.unwrap();
    assert_eq!(card["name"], "Test agent");
    let entries = card["capabilities"]["extensions"].as_array().unwrap();
    let ours: Vec<_> = entries.iter().filter(|e| e["uri"] == URI).collect();
    assert_eq!(ours.len(), 1, "one entry of the extension: {entries:?}");
    assert_eq!(*ours[0], server.idem.agent_card_extension().unwrap());
    assert_eq!(ours[0]["params"]["ttl_seconds"], 600);
    assert!(entries
        .iter()
        .any(|e| e["uri"] == "https://example.invalid/other/v1"));

    let head = http.head(&url).send().await.unwrap();
    assert_eq!(head.status(), 200);
    let length = card.to_string().len().to_string();
    assert_eq!(head.headers()["content-length"], length.as_str());
    let put = http.put(&url).send().await.unwrap();
    assert_eq!(put.status(), 405);
    assert_eq!(put.headers()["allow"], "GET, HEAD, POST");
    let rpc = post_activated(&url, send(1, &new_id(), "on the card's path")).await;
    assert_eq!(rpc.json()["result"]["echo"], "on the card's path");
}

#[tokio::test]
async fn without_the_layers_the_method_fails_loudly() {
    let db = Db::new();
    let server = TestServer::start_without_layers(&db.path).await;
    let reply = post_activated(&server.url, send(1, &new_id(), "x")).await;
    assert_eq!(reply.error_code(), -32603);
    assert_eq!(reply.data_code(), "IDEMPOTENCY_LAYER_MISSING");
    assert_eq!(server.executions(), 0);
}

#[tokio::test]
async fn a_client_that_hangs_up_mid_call_does_not_cause_a_second_execution() {
    let db = Db::new();
    let server = db.server(config()).await;
    let mid = new_id();
    let body = send_with(1, "message/send", &mid, "x", json!({"delayMs": 800}));
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let gave_up = impatient
        .post(&server.url)
        .header("content-type", "application/json")
        .header("A2A-Extensions", URI)
        .body(body.clone())
        .send()
        .await;
    assert!(gave_up.is_err(), "the client hung up before the answer");
    server.wait_for_executions(1).await;
    // The call goes on without its client; once stored, the retry is its replay.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while db.row(&mid).is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "the call was never stored"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let retry = post_activated(&server.url, body).await;
    assert!(retry.replayed(), "the call ran to its end and was stored");
    assert_eq!(server.executions(), 1);
}

#[tokio::test]
async fn another_payload_is_422_even_when_jsonrpsee_cannot_decode_it() {
    let db = Db::new();
    let server = db.server(config()).await;
    let mid = new_id();
    post_activated(&server.url, send(1, &mid, "x")).await;
    let undecodable = format!(
        r#"{{"jsonrpc":"2.0","id":2,"method":"message/send","params":{{"message":{{"messageId":"{mid}","parts":[]}},"configuration":{{"historyLength":"ten"}}}}}}"#
    );
    let reply = post_activated(&server.url, undecodable).await;
    assert_eq!((reply.status, reply.error_code()), (422, -32422));
    assert_eq!(reply.json()["id"], 2);
    assert_eq!(server.executions(), 1);
    assert!(post_activated(&server.url, send(1, &mid, "x"))
        .await
        .replayed());
}

#[tokio::test]
async fn governed_calls_over_websocket_are_refused() {
    let db = Db::new();
    let server = db.server(config()).await;
    let answer = websocket_call(&server.url, &send(1, &new_id(), "x")).await;
    assert_eq!(answer["error"]["code"], -32600);
    assert_eq!(answer["error"]["data"]["code"], "IDEMPOTENCY_HTTP_ONLY");
    assert_eq!(server.executions(), 0);
    let get = websocket_call(
        &server.url,
        r#"{"jsonrpc":"2.0","id":2,"method":"tasks/get"}"#,
    )
    .await;
    assert_eq!(get["result"], 0, "ungoverned methods are served");
}

/// Only a GET opens a WebSocket (RFC 6455 §4.1): a POST that asks for an upgrade is served as
/// the HTTP request it is, deduplicated, where jsonrpsee took it for a handshake and answered
/// 200 in plain text, its call unread (helper-103). A GET handshake jsonrpsee cannot complete
/// is a 400 -32600 that says why.
#[tokio::test]
async fn only_a_get_is_a_handshake_and_a_broken_one_is_a_json_rpc_error() {
    let db = Db::new();
    let server = db.server(config()).await;
    let upgrade = [
        ("A2A-Extensions", URI),
        ("Connection", "Upgrade"),
        ("Upgrade", "websocket"),
    ];
    let body = send(1, &new_id(), "upgrade");
    let first = post(&server.url, body.clone(), &upgrade).await;
    assert_eq!(first.status, 200);
    assert!(first.json()["result"].is_object(), "{}", first.json());
    let again = post(&server.url, body, &upgrade).await;
    assert!(again.replayed());
    assert_eq!(again.body, first.body);
    assert_eq!(server.executions(), 1);

    let keyless = reqwest::Client::new()
        .get(&server.url)
        .header("Connection", "Upgrade")
        .header("Upgrade", "websocket")
        .header("Sec-WebSocket-Version", "13")
        .send()
        .await
        .unwrap();
    assert_eq!(keyless.status(), 400);
    assert_eq!(keyless.headers()["content-type"], "application/json");
    let error: serde_json::Value = keyless.json().await.unwrap();
    assert_eq!(error["error"]["code"], -32600, "{error}");
    let reason = error["error"]["data"]["reason"].as_str().unwrap();
    assert!(reason.contains("Sec-WebSocket-Key"), "{reason}");
}

/// Every spelling RFC 9110 allows of a JSON Content-Type in UTF-8 is served, and deduplicated,
/// as `application/json` is (jsonrpsee answered 415 to `application/json ; charset=utf-8` and
/// to a quoted charset: helper-62); another charset is still refused.
#[tokio::test]
async fn json_content_types_spelled_any_way_rfc_9110_allows_are_served() {
    let db = Db::new();
    let server = db.server(config()).await;
    let http = reqwest::Client::new();
    let body = send(1, &new_id(), "spelled");
    let as_type = |content_type: &'static str| {
        http.post(&server.url)
            .header("content-type", content_type)
            .header("A2A-Extensions", URI)
            .body(body.clone())
    };
    let spellings = [
        "application/json ; charset=utf-8",
        "application/json; charset=\"UTF-8\"",
        "Application/JSON;  charset=utf-8",
    ];
    let mut answers = Vec::new();
    for spelling in spellings {
        let answer = as_type(spelling).send().await.unwrap();
        assert_eq!(answer.status(), 200, "{spelling}");
        let replayed = answer.headers().contains_key("idempotent-replayed");
        answers.push((replayed, answer.bytes().await.unwrap()));
    }
    assert_eq!(server.executions(), 1, "one execution, then replays");
    assert!(!answers[0].0 && answers[1].0 && answers[2].0);
    assert!(answers.iter().all(|(_, bytes)| *bytes == answers[0].1));
    let latin1 = as_type("application/json; charset=iso-8859-1").send().await;
    assert_eq!(latin1.unwrap().status(), 415);
    assert_eq!(server.executions(), 1);
}

/// jsonrpsee refuses a method other than POST (405) and a body that is not JSON (415) in plain
/// text, before the extension sees the call: the refusals keep their status and become
/// JSON-RPC errors, the 405 names the method allowed, and nothing runs.
#[tokio::test]
async fn requests_jsonrpsee_refuses_unread_get_json_rpc_errors() {
    let db = Db::new();
    let server = db.server(config()).await;
    let http = reqwest::Client::new();
    let body = send(1, &new_id(), "x");
    let refusals = [
        (http.get(&server.url), 405, "POST"),
        (http.put(&server.url).body(body.clone()), 405, "POST"),
        (
            http.post(&server.url)
                .header("content-type", "text/plain")
                .body(body.clone()),
            415,
            "Content-Type: application/json",
        ),
        (http.post(&server.url).body(body), 415, "Content-Type"),
    ];
    for (request, status, named) in refusals {
        for activated in [true, false] {
            let request = request.try_clone().unwrap();
            let request = match activated {
                true => request.header("A2A-Extensions", URI),
                false => request,
            };
            let refused = request.send().await.unwrap();
            assert_eq!(refused.status(), status);
            let headers = refused.headers().clone();
            assert_eq!(headers["content-type"], "application/json");
            if status == 405 {
                assert_eq!(headers["allow"], "POST");
            }
            let echoed = headers.get_all("a2a-extensions").iter().any(|v| v == URI);
            assert_eq!(echoed, activated, "echoed only where activated");
            let error: serde_json::Value = refused.json().await.unwrap();
            assert_eq!(error["id"], serde_json::Value::Null);
            assert_eq!(error["error"]["code"], -32600, "{error}");
            let reason = error["error"]["data"]["reason"].as_str().unwrap();
            assert!(reason.contains(named), "{reason}");
        }
    }
    assert_eq!(server.executions(), 0);
}

#[tokio::test]
async fn in_a_batch_an_undecodable_entry_under_a_held_key_is_422_too() {
    let db = Db::new();
    let server = db.server(config()).await;
    let mid = new_id();
    post_activated(&server.url, send(1, &mid, "x")).await;
    let undecodable = format!(
        r#"{{"jsonrpc":"2.0","id":2,"method":"message/send","params":{{"message":{{"messageId":"{mid}","parts":[]}},"configuration":{{"historyLength":"ten"}}}}}}"#
    );
    let reply = post_activated(
        &server.url,
        format!("[{undecodable}, {}]", send(3, &mid, "x")),
    )
    .await;
    assert_eq!(reply.status, 200);
    let by_id = |id: u64| reply.batch_answer(id);
    assert_eq!(by_id(2)["error"]["code"], -32422);
    assert_eq!(
        by_id(3)["result"]["echo"],
        "x",
        "the original still replays"
    );
    assert_eq!(server.executions(), 1);
}

/// The same, where the key is taken by an entry before it in the same batch: jsonrpsee runs
/// a batch's entries one after the other, so the first executes and stores, and the
/// undecodable one after it, under another payload, is the 422 it would be alone.
#[tokio::test]
async fn in_a_batch_an_undecodable_entry_under_a_key_taken_earlier_in_it_is_422() {
    let db = Db::new();
    let server = db.server(config()).await;
    let mid = new_id();
    let undecodable = format!(
        r#"{{"jsonrpc":"2.0","id":2,"method":"message/send","params":{{"message":{{"messageId":"{mid}","parts":[]}},"configuration":{{"historyLength":"ten"}}}}}}"#
    );
    let batch = format!("[{}, {undecodable}]", send(1, &mid, "x"));
    let reply = post_activated(&server.url, batch).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.batch_answer(1)["result"]["echo"], "x");
    assert_eq!(
        reply.batch_answer(2)["error"]["code"],
        -32422,
        "{}",
        reply.json()
    );
    assert_eq!(server.executions(), 1);
}

/// A body over the limit is read, dropped and answered 413 with the error that names the
/// limit, never a reset connection, whether its length was announced or it came chunked
/// (jsonrpsee alone answers a chunked one 500); a body at the limit is served as usual.
#[tokio::test]
async fn a_body_over_the_limit_is_413_naming_the_limit_and_never_runs() {
    let db = Db::new();
    let server = db
        .server(config().with(|c| c.max_request_body_bytes = 4096))
        .await;
    let big = send(1, &new_id(), &"x".repeat(5000));
    for body in [big.clone().into(), chunked(big)] {
        let refused = post_activated(&server.url, body).await;
        assert_eq!(refused.status, 413);
        assert_eq!(refused.error_code(), -32600);
        assert_eq!(refused.data_code(), "IDEMPOTENCY_REQUEST_TOO_LARGE");
        assert_eq!(refused.json()["error"]["data"]["limit_bytes"], 4096);
        assert_eq!(refused.json()["id"], serde_json::Value::Null);
        assert!(refused.echoes_extension(), "spec §3.2: it activated it");
    }
    // A client that waits for `100 Continue` before it sends the body is answered 413 at once,
    // not told to go on and send what will be dropped (found by helper-40).
    let address = server.url.trim_start_matches("http://");
    let mut socket = tokio::net::TcpStream::connect(address).await.unwrap();
    let head = format!(
        "POST / HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\n\
         Content-Length: 5000\r\nExpect: 100-continue\r\n\r\n"
    );
    socket.write_all(head.as_bytes()).await.unwrap();
    let mut answer = vec![0; 64];
    let read = tokio::time::timeout(Duration::from_secs(10), socket.read(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer[..read.expect("an answer").unwrap()]).to_string();
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer:?}");
    assert_eq!(server.executions(), 0);

    let small = send(2, &new_id(), "x");
    let padded = format!("{small:<4096}");
    assert_eq!(padded.len(), 4096);
    let served = post_activated(&server.url, padded.clone()).await;
    assert_eq!(served.status, 200, "{}", served.json());
    assert_eq!(server.executions(), 1);
    // Chunked at the limit: served, and a resend of its bytes is the replay (a retry by key,
    // then from its very bytes).
    for _ in 0..2 {
        let resent = post_activated(&server.url, chunked(padded.clone())).await;
        assert!(resent.replayed(), "{}", resent.describe());
        assert_eq!(resent.body, served.body);
    }
    let fresh = format!("{:<4096}", send(3, &new_id(), "x"));
    let chunked_fresh = post_activated(&server.url, chunked(fresh)).await;
    assert_eq!(chunked_fresh.status, 200, "{}", chunked_fresh.describe());
    assert_eq!(server.executions(), 2);
}

/// A result that fits the limit under its first id may not under a longer one: a retry of the
/// same bytes is answered alike by the guard (through jsonrpsee, which cuts it) and from
/// memory (which did not: found by helper-76), a stored error with its `data` as well
/// (helper-78).
#[tokio::test]
async fn a_replay_under_a_longer_id_is_cut_alike_by_the_guard_and_from_memory() {
    let db = Db::new();
    let limit = 400;
    let server = db
        .server(config().with(|c| c.max_response_body_bytes = limit))
        .await;
    let padding = "x".repeat(290);
    for text in [padding.clone(), format!("fail-echo{padding}")] {
        let mid = new_id();
        let first = post_activated(&server.url, send(1, &mid, &text)).await;
        let size = first.body.len() as u32;
        assert!(
            size <= limit && size + 11 > limit,
            "the test needs an answer just within the limit: {}",
            first.describe()
        );
        let retry = send(123_456_789_012, &mid, &text);
        let by_key = post_activated(&server.url, retry.clone()).await;
        let from_memory = post_activated(&server.url, retry).await;
        assert!(by_key.replayed() && from_memory.replayed());
        let text = |reply: &Reply| String::from_utf8_lossy(&reply.body).into_owned();
        assert_eq!(text(&from_memory), text(&by_key));
        assert_eq!(by_key.data_code(), "IDEMPOTENCY_RESPONSE_TOO_LARGE");
    }
    assert_eq!(server.executions(), 2);
}

/// jsonrpsee answers a response over its limit with -32008, which is A2A's
/// ExtensionSupportRequiredError: a method outside the extension gets
/// `IDEMPOTENCY_RESPONSE_TOO_LARGE` instead, naming the limit (found by helper-77).
#[tokio::test]
async fn a_response_over_the_limit_is_never_answered_with_a2a_s_32008() {
    let db = Db::new();
    let server = db
        .server(config().with(|c| c.max_response_body_bytes = 4096))
        .await;
    let padded = |bytes: usize| {
        json!({"jsonrpc": "2.0", "id": 1, "method": "tasks/padded", "params": {"bytes": bytes}})
            .to_string()
    };
    let reply = post(&server.url, padded(5000), &[]).await;
    assert_eq!(reply.error_code(), -32603, "{}", reply.describe());
    assert_eq!(reply.data_code(), "IDEMPOTENCY_RESPONSE_TOO_LARGE");
    assert_eq!(reply.json()["error"]["data"]["limit_bytes"], 4096);
    assert_eq!(reply.json()["id"], 1);
    let within = post(&server.url, padded(100), &[]).await;
    assert_eq!(within.json()["result"].as_str().map(str::len), Some(100));
    // In a batch too, whose entries jsonrpsee runs itself (found by helper-78); the others
    // as they were.
    let batch = format!(
        "[{},{}]",
        padded(5000),
        padded(10).replace(r#""id":1"#, r#""id":2"#)
    );
    let reply = post(&server.url, batch, &[]).await;
    let over = reply.batch_answer(1);
    assert_eq!(
        over["error"]["data"]["code"], "IDEMPOTENCY_RESPONSE_TOO_LARGE",
        "{over}"
    );
    assert_eq!(reply.batch_answer(2)["result"], "x".repeat(10));
}

/// A batch whose answers together outgrow the limit: jsonrpsee runs its calls in order up to
/// the one whose answer passes it and answered its own -32011 alone, which said nothing of
/// what ran. The answer says it, as `IDEMPOTENCY_RESPONSE_TOO_LARGE`; what ran replays, the
/// rest runs when sent alone.
#[tokio::test]
async fn a_batch_whose_answers_outgrow_the_limit_says_what_ran() {
    let db = Db::new();
    let server = db
        .server(config().with(|c| c.max_response_body_bytes = 4096))
        .await;
    let sends: Vec<String> = (1..=5)
        .map(|n| send(n, &new_id(), &"x".repeat(1000)))
        .collect();
    let reply = post_activated(&server.url, format!("[{}]", sends.join(","))).await;
    assert_eq!(reply.error_code(), -32603, "{}", reply.describe());
    assert_eq!(reply.data_code(), "IDEMPOTENCY_RESPONSE_TOO_LARGE");
    let data = &reply.json()["error"]["data"];
    assert_eq!(data["limit_bytes"], 4096);
    assert!(
        data["reason"].as_str().unwrap().contains("did not run"),
        "{data}"
    );
    let ran = server.executions();
    assert!((1..5).contains(&ran), "{ran} of 5 ran");
    for (n, alone) in sends.iter().enumerate() {
        let again = post_activated(&server.url, alone.clone()).await;
        assert_eq!(again.replayed(), n < ran, "call {n}");
    }
    assert_eq!(server.executions(), 5);
}

/// jsonrpsee cuts a response over its limit after the guard stored it: the extension answers,
/// stores and replays the failure instead, so every answer is the one the client first got.
#[tokio::test]
async fn a_response_over_the_limit_is_cached_as_the_failure_the_client_got() {
    let db = Db::new();
    let server = db
        .server(config().with(|c| c.max_response_body_bytes = 4096))
        .await;
    let mid = new_id();
    let big = send_with(
        1,
        "message/send",
        &mid,
        &"x".repeat(5000),
        json!({"effect": "big"}),
    );
    let first = post_activated(&server.url, big.clone()).await;
    assert_eq!(first.status, 200);
    assert_eq!(first.error_code(), -32603);
    assert_eq!(first.data_code(), "IDEMPOTENCY_RESPONSE_TOO_LARGE");
    let data = &first.json()["error"]["data"];
    assert_eq!(data["limit_bytes"], 4096);
    assert!(data["response_bytes"].as_u64().unwrap() > 4096, "{data}");
    assert!(!first.replayed());
    assert!(
        db.effects().is_empty(),
        "a failed call's staged writes are discarded"
    );

    for _ in 0..2 {
        let resend = post_activated(&server.url, big.clone()).await;
        assert!(resend.replayed());
        assert_eq!(
            resend.body, first.body,
            "byte-for-byte, never the stored oversized result"
        );
    }
    let other_id = send_with(
        9,
        "message/send",
        &mid,
        &"x".repeat(5000),
        json!({"effect": "big"}),
    );
    let other_id = post_activated(&server.url, other_id).await;
    assert!(other_id.replayed());
    assert_eq!(other_id.json()["id"], 9);
    assert_eq!(other_id.json()["error"], first.json()["error"]);
    assert_eq!(server.executions(), 1);

    // From the file, through the guard and jsonrpsee: the same bytes.
    server.stop().await;
    let server = db
        .server(config().with(|c| c.max_response_body_bytes = 4096))
        .await;
    let after = post_activated(&server.url, big).await;
    assert!(after.replayed());
    assert_eq!(after.body, first.body);
    assert_eq!(server.executions(), 0, "the replay did not execute");
    let small = post_activated(&server.url, send(1, &new_id(), "small")).await;
    assert_eq!(small.json()["result"]["echo"], "small");
}
