//! The conformance harness fails broken servers: each test puts the example server behind a
//! proxy that breaks it in one way a real implementation might be broken, and runs the
//! scenario that must catch it. helper-66 found the harness passing each of these (a server
//! that hashed part of params, that answered another payload in flight with the original's
//! result, whose entries expired early, that refused UUIDv7 keys), and one more: a server
//! that keyed on the JSON-RPC id.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::mutant::Mutant;

/// The message of a request, where it has one.
fn message(json: &mut Value) -> Option<&mut serde_json::Map<String, Value>> {
    json.pointer_mut("/params/message")?.as_object_mut()
}

#[tokio::test]
async fn a_server_that_hashes_part_of_the_params_fails_ac2() {
    let only_text = Arc::new(|json: &mut Value| {
        if let Some(params) = json["params"].as_object_mut() {
            params.remove("configuration");
        }
        if let Some(message) = message(json) {
            for member in ["contextId", "referenceTaskIds", "extensions", "metadata"] {
                message.remove(member);
            }
        }
    });
    let mutant = Mutant::start(&[], only_text).await;
    let failed = idem_conformance::ac2(&mutant.target()).await.unwrap_err();
    assert!(failed.contains("changed: "), "{failed}");
}

#[tokio::test]
async fn a_server_that_answers_another_payload_in_flight_with_the_original_fails_ac2() {
    // The changed payload reaches the server as the original: it attaches to the running call.
    let same_as_the_original = Arc::new(|json: &mut Value| {
        if let Some(text) = json.pointer_mut("/params/message/parts/0/text") {
            if text == "in flight, changed" {
                *text = "in flight".into();
            }
        }
    });
    let mutant = Mutant::start(&[], same_as_the_original).await;
    let failed = idem_conformance::ac2(&mutant.target()).await.unwrap_err();
    assert!(
        failed.contains("while the original is in flight"),
        "{failed}"
    );
}

#[tokio::test]
async fn a_server_whose_entries_expire_early_fails_ac3() {
    // Past 2 s of a TTL of 5 s a retry is sent under a new key: executed again.
    let first_seen: Mutex<Vec<(String, Instant)>> = Mutex::default();
    let forgets_early = Arc::new(move |json: &mut Value| {
        let Some(message) = message(json) else { return };
        let Some(id) = message.get("messageId").and_then(Value::as_str) else {
            return;
        };
        let mut seen = first_seen.lock().unwrap();
        let first = match seen.iter().find(|(key, _)| key == id) {
            Some((_, at)) => *at,
            None => {
                seen.push((id.to_owned(), Instant::now()));
                return;
            }
        };
        if first.elapsed() > Duration::from_secs(2) {
            message.insert("messageId".into(), uuid::Uuid::new_v4().to_string().into());
        }
    });
    let mutant = Mutant::start(&[("AIWG_IDEMPOTENCY_TTL", "5")], forgets_early).await;
    let failed = idem_conformance::ac3(&mutant.target(), 5)
        .await
        .unwrap_err();
    assert!(failed.contains("retry near the TTL's end"), "{failed}");
}

/// At a TTL of 2 s, the one the harness starts servers with, a server whose entries live 0.5 s
/// fails AC-3 too: its late retry was skipped there, and such a server passed (helper-103).
#[tokio::test]
async fn a_server_whose_entries_expire_early_fails_ac3_at_a_ttl_of_2() {
    // Each key is the server's for 0.5 s, then another: a new execution each time.
    let mapped: Mutex<Vec<(String, String, Instant)>> = Mutex::default();
    let forgets_early = Arc::new(move |json: &mut Value| {
        let Some(message) = message(json) else { return };
        let Some(id) = message.get("messageId").and_then(Value::as_str) else {
            return;
        };
        let mut map = mapped.lock().unwrap();
        let server_key = match map.iter_mut().find(|(key, _, _)| key == id) {
            None => {
                map.push((id.to_owned(), id.to_owned(), Instant::now()));
                return;
            }
            Some((_, server_key, at)) => {
                if at.elapsed() > Duration::from_millis(500) {
                    *server_key = uuid::Uuid::new_v4().to_string();
                    *at = Instant::now();
                }
                server_key.clone()
            }
        };
        message.insert("messageId".into(), server_key.into());
    });
    let mutant = Mutant::start(&[("AIWG_IDEMPOTENCY_TTL", "2")], forgets_early).await;
    let failed = idem_conformance::ac3(&mutant.target(), 2)
        .await
        .unwrap_err();
    assert!(failed.contains("retry near the TTL's end"), "{failed}");
}

/// A server that attaches another payload to the running stream of its messageId fails
/// stream-collision: here the proxy makes the changed request the original's, which the server
/// attaches. The harness checked another payload only after the stream had ended, and passed
/// such a server (helper-99).
#[tokio::test]
async fn a_server_that_attaches_another_payload_to_a_running_stream_fails_stream_collision() {
    let same_as_the_original = Arc::new(|json: &mut Value| {
        if let Some(text) = json.pointer_mut("/params/message/parts/0/text") {
            if text == "streaming, changed" {
                *text = "streaming".into();
            }
        }
    });
    let mutant = Mutant::start(&[], same_as_the_original).await;
    let failed = idem_conformance::stream_collision(&mutant.target())
        .await
        .unwrap_err();
    assert!(failed.contains("while the original streams"), "{failed}");
}

/// Past the TTL, another body under an expired key is new (§6.3, "or any body"). A server
/// whose expired entry kept its key's binding answers it the 422: here the proxy sends it
/// under a key whose entry is live, which the server answers the same way. The harness sent
/// only the same body past the TTL, and passed such a server (helper-99).
#[tokio::test]
async fn a_server_whose_expired_keys_stay_bound_fails_ac3() {
    let first_key: Mutex<Option<String>> = Mutex::default();
    let stays_bound = Arc::new(move |json: &mut Value| {
        let text = json.pointer("/params/message/parts/0/text").cloned();
        let Some(message) = message(json) else { return };
        let mut first = first_key.lock().unwrap();
        match text.as_ref().and_then(Value::as_str) {
            Some("idempotency-v1-ac3") if first.is_none() => {
                *first = message
                    .get("messageId")
                    .and_then(Value::as_str)
                    .map(str::to_owned);
            }
            Some("idempotency-v1-ac3, another body") => {
                let bound = first.clone().expect("the first key was sent first");
                message.insert("messageId".into(), bound.into());
            }
            _ => {}
        }
    });
    let mutant = Mutant::start(&[("AIWG_IDEMPOTENCY_TTL", "3")], stays_bound).await;
    let failed = idem_conformance::ac3(&mutant.target(), 3)
        .await
        .unwrap_err();
    assert!(failed.contains("another body past the TTL"), "{failed}");
}

#[tokio::test]
async fn a_server_that_refuses_uuidv7_keys_fails_the_malformed_id_scenario() {
    let refuses_v7 = Arc::new(|json: &mut Value| {
        let Some(message) = message(json) else { return };
        let v7 = message
            .get("messageId")
            .and_then(Value::as_str)
            .is_some_and(|id| id.as_bytes().get(14) == Some(&b'7'));
        if v7 {
            message.insert("messageId".into(), "not-a-uuid".into());
        }
    });
    let mutant = Mutant::start(&[], refuses_v7).await;
    let target = mutant.target();
    let failed = idem_conformance::malformed_message_id(&target)
        .await
        .unwrap_err();
    assert!(failed.contains("messageId a UUIDv7"), "{failed}");
    let failed = idem_conformance::ac1(&target).await.unwrap_err();
    assert!(failed.contains("first send"), "{failed}");
}

/// The JSON-RPC id is not part of the payload (§5): a server that keys on it takes a retry
/// under another id for another payload.
#[tokio::test]
async fn a_server_that_hashes_the_json_rpc_id_fails_ac1() {
    let hashes_the_id = Arc::new(|json: &mut Value| {
        let id = json["id"].clone();
        if let Some(metadata) = json.pointer_mut("/params/metadata") {
            metadata["jsonrpcId"] = id;
        }
    });
    let mutant = Mutant::start(&[], hashes_the_id).await;
    let failed = idem_conformance::ac1(&mutant.target()).await.unwrap_err();
    assert!(failed.contains("retry under the JSON-RPC id 2"), "{failed}");
}
