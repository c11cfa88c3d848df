//! The conformance harness fails servers whose answers are wrong: each test puts the example
//! server behind a proxy that breaks its answers in one way (a header dropped, a byte of a
//! replay changed, a stream held back) and runs the scenario that must catch it, asserting the
//! failure names the broken property, so that the check meant to fire is the one that did.
//! helper-123 found these checks never shown to fail: each could have become a no-op with
//! every test still green. `harness_mutants.rs` does the same for broken requests.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem_conformance::{check, Outcome, Scenario, Target};
use serde_json::Value;

use crate::mutant::{AnswerBreakage, Body, Head, Mutant};

/// Runs `scenario` against the example server whose answers `breakage` breaks: it must fail,
/// saying `because` (so that the check meant to catch the breakage is the one that fired).
async fn assert_fails(scenario: Scenario, breakage: AnswerBreakage, because: &str) {
    let mutant = Mutant::answering(&[], breakage).await;
    assert_fails_at(scenario, &mutant.target(), because).await;
}

/// Runs `scenario` against `target`: it must fail, saying `because`.
async fn assert_fails_at(scenario: Scenario, target: &Target, because: &str) {
    match check(scenario, target, None).await {
        Outcome::Fail(reason) => assert!(reason.contains(because), "{reason}"),
        other => panic!("{}: expected a failure, got {other:?}", scenario.name()),
    }
}

/// Breaks only the answers the server marks as replays; executions pass on untouched.
fn replays(breakage: impl Fn(&mut Head) -> Body + Send + Sync + 'static) -> AnswerBreakage {
    Arc::new(move |head: &mut Head| match head.replayed() {
        true => breakage(head),
        false => Body::Live,
    })
}

/// Breaks only the first answer the server marks as a replay: one of many duplicates.
fn first_replay(breakage: impl Fn(&mut Head) -> Body + Send + Sync + 'static) -> AnswerBreakage {
    nth_replay(1, breakage)
}

/// Breaks only the `n`th answer (from 1) the server marks as a replay.
fn nth_replay(
    n: usize,
    breakage: impl Fn(&mut Head) -> Body + Send + Sync + 'static,
) -> AnswerBreakage {
    let seen = AtomicUsize::new(0);
    replays(
        move |head| match seen.fetch_add(1, Ordering::SeqCst) + 1 == n {
            true => breakage(head),
            false => Body::Live,
        },
    )
}

/// Breaks only the answers with HTTP `status`.
fn with_status(
    status: u16,
    breakage: impl Fn(&mut Head) -> Body + Send + Sync + 'static,
) -> AnswerBreakage {
    Arc::new(move |head: &mut Head| match head.status == status {
        true => breakage(head),
        false => Body::Live,
    })
}

/// The body read whole, one byte of it changed by [`change_one_byte`].
fn one_byte_changed() -> Body {
    Body::changed(|body| change_one_byte(body))
}

/// Changes the last digit of the first timestamp, as a replay that rendered the time anew
/// would: the body stays JSON (or an event stream) of the same length.
fn change_one_byte(body: &mut [u8]) {
    let end = body
        .windows(2)
        .position(|w| w == b"Z\"")
        .expect("a timestamp");
    let digit = &mut body[end - 1];
    *digit = b'0' + (*digit - b'0' + 1) % 10;
}

/// The body read whole, its JSON changed by `change`.
fn json_changed(change: impl FnOnce(&mut Value) + Send + 'static) -> Body {
    Body::changed(|body| {
        let mut json: Value = serde_json::from_slice(body).expect("a JSON answer");
        change(&mut json);
        *body = json.to_string().into_bytes();
    })
}

/// The prefix of an answer under the JSON-RPC id `id` (of each event, in a stream).
fn id_prefix(id: &str) -> String {
    format!("\"jsonrpc\":\"2.0\",\"id\":{id},")
}

/// Whether an answer's body is under the JSON-RPC id `id`.
fn under_id(body: &[u8], id: &str) -> bool {
    String::from_utf8_lossy(body).contains(&id_prefix(id))
}

/// The body with the JSON-RPC id `from` made `to`, every other byte as it was.
fn id_changed(from: &'static str, to: &'static str) -> Body {
    Body::changed(move |body| {
        let text = String::from_utf8_lossy(body);
        *body = text.replace(&id_prefix(from), &id_prefix(to)).into_bytes();
    })
}

/// Fresh streams read to their end before they are passed on.
fn fresh_streams_held() -> AnswerBreakage {
    Arc::new(
        |head: &mut Head| match head.is_event_stream() && !head.replayed() {
            true => Body::held(Duration::ZERO),
            false => Body::Live,
        },
    )
}

#[tokio::test]
async fn a_replay_without_the_extension_echoed_fails_ac1() {
    let breakage = replays(|head| {
        head.remove("a2a-extensions");
        Body::Live
    });
    let because = "identical retry: the response A2A-Extensions header must list the extension";
    assert_fails(Scenario::Ac1, breakage, because).await;
}

/// §4.3.3: an execution carries no `Idempotent-Replayed` at all, not `false`.
#[tokio::test]
async fn an_execution_marked_replayed_false_fails_ac1() {
    let breakage = Arc::new(|head: &mut Head| {
        if !head.replayed() {
            head.set("idempotent-replayed", "false");
        }
        Body::Live
    });
    let because = "Idempotent-Replayed must be absent or \"true\", got \"false\"";
    assert_fails(Scenario::Ac1, breakage, because).await;
}

#[tokio::test]
async fn a_replay_without_its_replay_header_fails_ac1() {
    let breakage = replays(|head| {
        head.remove("idempotent-replayed");
        Body::Live
    });
    let because = "identical retry: expected Idempotent-Replayed: true";
    assert_fails(Scenario::Ac1, breakage, because).await;
}

/// A cache in front of the server might well say 203 of what it serves: §6.1 wants the status
/// unchanged.
#[tokio::test]
async fn a_replay_under_another_status_fails_ac1() {
    let breakage = replays(|head| {
        head.status = 203;
        Body::Live
    });
    let because = "identical retry: status 203 differs from the original 200";
    assert_fails(Scenario::Ac1, breakage, because).await;
}

/// §4.3.2: the replay's headers are the original's, `charset` and all.
#[tokio::test]
async fn a_replay_under_another_content_type_fails_ac1() {
    let breakage = replays(|head| {
        head.set("content-type", "application/json");
        Body::Live
    });
    let because = "identical retry: Content-Type Some(\"application/json\") differs";
    assert_fails(Scenario::Ac1, breakage, because).await;
}

#[tokio::test]
async fn a_replay_with_one_byte_changed_fails_ac1() {
    let breakage = replays(|_| one_byte_changed());
    let because = "identical retry: the body is not byte-identical to the original";
    assert_fails(Scenario::Ac1, breakage, because).await;
}

/// JSON-RPC 2.0 §5: an answer carries its request's id; a replay under id 2 that lost it is
/// neither the cached bytes nor the result under id 2.
#[tokio::test]
async fn a_replay_under_another_id_answered_without_it_fails_ac1() {
    let breakage = replays(|_| id_changed("2", "null"));
    let because = "retry under the JSON-RPC id 2: expected the original's bytes, or its result";
    assert_fails(Scenario::Ac1, breakage, because).await;
}

#[tokio::test]
async fn a_replay_under_another_id_with_another_result_fails_ac1() {
    let breakage = replays(|_| {
        Body::changed(|body| {
            if under_id(body, "2") {
                change_one_byte(body);
            }
        })
    });
    let because = "retry under the JSON-RPC id 2: expected the original's bytes, or its result";
    assert_fails(Scenario::Ac1, breakage, because).await;
}

/// AC-1's fifth replay is the one under id 2 (after the identical retry, the one among other
/// extensions, the reordered and the respelled one): its content type is checked as theirs
/// (the harness passed it typed `text/plain`: helper-124).
#[tokio::test]
async fn a_replay_under_another_id_of_another_content_type_fails_ac1() {
    let breakage = nth_replay(5, |head| {
        head.set("content-type", "text/plain");
        Body::Live
    });
    let because = "retry under the JSON-RPC id 2: Content-Type Some(\"text/plain\") differs";
    assert_fails(Scenario::Ac1, breakage, because).await;
}

/// §4.5: the 422 names the stored request's hash first; a server that swaps them misleads the
/// client about which payload it holds.
#[tokio::test]
async fn a_collision_with_its_hashes_swapped_fails_ac2() {
    let breakage = with_status(422, |_| {
        json_changed(|json| {
            let data = &mut json["error"]["data"];
            let original = data["original_request_hash"].take();
            data["original_request_hash"] = data["submitted_request_hash"].take();
            data["submitted_request_hash"] = original;
        })
    });
    let because = "same messageId, other payload: error.data.original_request_hash must be";
    assert_fails(Scenario::Ac2, breakage, because).await;
}

#[tokio::test]
async fn a_collision_naming_another_message_id_fails_ac2() {
    let breakage = with_status(422, |_| {
        json_changed(|json| {
            let data = &mut json["error"]["data"];
            let upper = data["message_id"].as_str().map(str::to_ascii_uppercase);
            data["message_id"] = upper.into();
        })
    });
    let because = "same messageId, other payload: error.data.message_id must be";
    assert_fails(Scenario::Ac2, breakage, because).await;
}

/// What a second execution of a duplicate looks like on the wire: no replay header, and a task
/// of its own. The proxy makes the first replay of the race one.
#[tokio::test]
async fn a_concurrent_duplicate_executed_again_fails_concurrent_duplicates() {
    let breakage = first_replay(|head| {
        head.remove("idempotent-replayed");
        Body::changed(|body| {
            let json: Value = serde_json::from_slice(body).expect("a JSON answer");
            let task = json["result"]["id"].as_str().expect("a task").to_owned();
            let another = uuid::Uuid::now_v7().to_string();
            let text = String::from_utf8_lossy(body);
            *body = text.replace(&task, &another).into_bytes();
        })
    });
    let because = "expected exactly 1 response without Idempotent-Replayed, got 2";
    assert_fails(Scenario::ConcurrentDuplicates, breakage, because).await;
}

#[tokio::test]
async fn a_concurrent_duplicate_under_another_status_fails_concurrent_duplicates() {
    let breakage = first_replay(|head| {
        head.status = 203;
        Body::Live
    });
    let because = "a replay's status differs";
    assert_fails(Scenario::ConcurrentDuplicates, breakage, because).await;
}

/// The duplicates that waited are answered on a path of their own (the example attaches
/// them): their headers are checked too. The harness passed one that echoed nothing there,
/// and one typed `text/plain` (helper-124).
#[tokio::test]
async fn a_concurrent_duplicate_without_the_extension_echoed_fails_concurrent_duplicates() {
    let breakage = first_replay(|head| {
        head.remove("a2a-extensions");
        Body::Live
    });
    let because = "a concurrent duplicate: the response A2A-Extensions header must list";
    assert_fails(Scenario::ConcurrentDuplicates, breakage, because).await;
}

#[tokio::test]
async fn a_concurrent_duplicate_of_another_content_type_fails_concurrent_duplicates() {
    let breakage = first_replay(|head| {
        head.set("content-type", "text/plain");
        Body::Live
    });
    let because = "a concurrent duplicate: Content-Type Some(\"text/plain\") differs";
    assert_fails(Scenario::ConcurrentDuplicates, breakage, because).await;
}

#[tokio::test]
async fn a_concurrent_duplicate_answered_otherwise_fails_concurrent_duplicates() {
    let breakage = first_replay(|_| one_byte_changed());
    let because = "the responses differ; all must be the one cached response";
    assert_fails(Scenario::ConcurrentDuplicates, breakage, because).await;
}

#[tokio::test]
async fn a_stream_replay_with_one_byte_changed_fails_stream_replay() {
    let breakage = replays(|_| one_byte_changed());
    let because = "identical retry: the stream is not byte-identical to the original";
    assert_fails(Scenario::StreamReplay, breakage, because).await;
}

/// The cached bytes replayed as they are, under the first request's id: a stream's events must
/// carry the id of the request they answer.
#[tokio::test]
async fn a_stream_replayed_under_the_original_id_fails_stream_replay() {
    let breakage = replays(|_| id_changed("2", "1"));
    let because = "retry under JSON-RPC id 2: every event must carry the request's id 2";
    assert_fails(Scenario::StreamReplay, breakage, because).await;
}

/// A recording cut before its last event: the replay never tells the client the task ended.
#[tokio::test]
async fn a_stream_replay_without_its_last_event_fails_stream_replay() {
    let breakage = replays(|_| {
        Body::changed(|body| {
            let text = String::from_utf8_lossy(body);
            let events: Vec<&str> = text.split_inclusive("\n\n").collect();
            *body = events[..events.len() - 1].concat().into_bytes();
        })
    });
    let because = "identical retry: the last event must be the status update that ends the task";
    assert_fails(Scenario::StreamReplay, breakage, because).await;
}

/// A fresh stream sent only once the mission has ended (a buffering server, or a proxy in
/// front of it) is not live.
#[tokio::test]
async fn a_fresh_stream_held_to_its_end_fails_stream_fresh() {
    let because = "the events are not sent as they happen";
    assert_fails(Scenario::StreamFresh, fresh_streams_held(), because).await;
}

/// A duplicate that waits for the stream to be stored and then replays it, instead of attaching
/// to the running stream: its answer comes a while after the stream's end.
#[tokio::test]
async fn a_duplicate_that_waits_for_the_stream_to_end_fails_stream_attach() {
    let breakage = replays(|head| match head.is_event_stream() {
        true => Body::held(Duration::from_millis(500)),
        false => Body::Live,
    });
    let because = "its first event came only after the original stream had ended";
    assert_fails(Scenario::StreamAttach, breakage, because).await;
}

/// The 422 of a streaming request is an ordinary JSON response, not an event stream.
#[tokio::test]
async fn a_stream_collision_typed_as_an_event_stream_fails_stream_collision() {
    let breakage = with_status(422, |head| {
        head.set("content-type", "text/event-stream");
        Body::Live
    });
    let because = "the collision: expected Content-Type application/json";
    assert_fails(Scenario::StreamCollision, breakage, because).await;
}

/// With the database the harness sees it sooner: the stream was stored before its first event
/// reached the client.
#[tokio::test]
async fn a_fresh_stream_held_to_its_end_fails_stream_fresh_on_the_cache() {
    let mutant = Mutant::answering(&[], fresh_streams_held()).await;
    let cached = "fresh stream: the cache held the stream when its first event arrived";
    assert_fails_at(Scenario::StreamFresh, &mutant.target_with_db(), cached).await;
}

/// The control: through the proxy alone every scenario above passes, so each failure is the
/// breakage's, not the proxy's (a stream passed on live stays live).
#[tokio::test]
async fn the_proxy_alone_breaks_no_scenario() {
    let mutant = Mutant::answering(&[], Arc::new(|_: &mut Head| Body::Live)).await;
    let target = mutant.target_with_db();
    for scenario in [
        Scenario::Ac1,
        Scenario::Ac2,
        Scenario::ConcurrentDuplicates,
        Scenario::StreamFresh,
        Scenario::StreamReplay,
        Scenario::StreamCollision,
        Scenario::StreamAttach,
    ] {
        let outcome = check(scenario, &target, None).await;
        assert_eq!(outcome, Outcome::Pass, "{}", scenario.name());
    }
}
