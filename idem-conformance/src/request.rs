//! The requests the harness sends: A2A 0.3 `message/send` and `message/stream` bodies, A2A 1.0
//! `SendStreamingMessage` bodies, and the same body re-serialized with another key order and
//! whitespace (which JCS must normalize away, spec §6.1).

use serde_json::{json, Map, Value};

/// A fresh message id: UUIDv4 is acceptable per spec §4.2.
pub fn new_message_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// A fresh message id of the form the spec recommends (§7.2): a UUIDv7.
pub fn new_message_id_v7() -> String {
    uuid::Uuid::now_v7().to_string()
}

/// A `message/send` request with every optional member of a payload A2A 0.3 defines: spec §5
/// hashes them all, so each one changed is another payload ([`payload_variants`]). `changed`:
/// a JSON pointer into the body, and the value it takes there.
pub fn send_full(message_id: &str, changed: Option<(&str, Value)>) -> String {
    let mut body = json!({
        "jsonrpc": "2.0",
        "id": 1,
        "method": "message/send",
        "params": {
            "message": {
                "kind": "message",
                "role": "user",
                "messageId": message_id,
                "parts": [{"kind": "text", "text": "every member"}],
                "contextId": "0b7e3c52-5d6a-4e0f-9a51-6f2d9c8e1a40",
                "referenceTaskIds": [],
                "extensions": [],
                "metadata": {"m": 1},
            },
            "configuration": {
                "acceptedOutputModes": ["text/plain"],
                "historyLength": 2,
                "blocking": false,
            },
            "metadata": {"p": 1},
        },
    });
    if let Some((pointer, value)) = changed {
        *body.pointer_mut(pointer).expect("a member send_full has") = value;
    }
    body.to_string()
}

/// The members of [`send_full`] AC-2 changes one at a time, as JSON pointers into its body,
/// each with another value.
pub fn payload_variants() -> [(&'static str, Value); 8] {
    [
        ("/params/metadata", json!({"p": 2})),
        ("/params/message/metadata", json!({"m": 2})),
        (
            "/params/message/contextId",
            json!("5f1c9a7e-2b3d-4c8e-8f60-1a2b3c4d5e6f"),
        ),
        (
            "/params/message/referenceTaskIds",
            json!(["7d2f4e6a-8b1c-4d3e-9f50-2a4b6c8d0e1f"]),
        ),
        (
            "/params/message/extensions",
            json!(["https://example.invalid/another-extension/v1"]),
        ),
        ("/params/configuration/historyLength", json!(3)),
        ("/params/configuration/blocking", json!(true)),
        (
            "/params/configuration/acceptedOutputModes",
            json!(["application/json"]),
        ),
    ]
}

/// A `message/send` request with a well-formed `messageId`.
pub fn send(jsonrpc_id: u64, message_id: &str, text: &str, metadata: Value) -> String {
    send_with_id_field(jsonrpc_id, Some(json!(message_id)), text, metadata)
}

/// A `message/send` request whose `messageId` is any JSON value, or missing (`None`).
pub fn send_with_id_field(
    jsonrpc_id: u64,
    message_id: Option<Value>,
    text: &str,
    metadata: Value,
) -> String {
    request_0_3("message/send", jsonrpc_id, message_id, text, metadata)
}

/// A `message/send` request whose message continues the task `task_id`.
pub fn send_to_task(jsonrpc_id: u64, message_id: &str, task_id: &str, text: &str) -> String {
    let mut body: Value = serde_json::from_str(&send(jsonrpc_id, message_id, text, json!({})))
        .expect("a request is JSON");
    body["params"]["message"]["taskId"] = json!(task_id);
    body.to_string()
}

/// A `message/stream` request (A2A 0.3) with a well-formed `messageId`.
pub fn stream(jsonrpc_id: u64, message_id: &str, text: &str, metadata: Value) -> String {
    stream_with_id_field(jsonrpc_id, Some(json!(message_id)), text, metadata)
}

/// A `message/stream` request whose `messageId` is any JSON value, or missing (`None`).
pub fn stream_with_id_field(
    jsonrpc_id: u64,
    message_id: Option<Value>,
    text: &str,
    metadata: Value,
) -> String {
    request_0_3("message/stream", jsonrpc_id, message_id, text, metadata)
}

/// A `SendStreamingMessage` request in the A2A 1.0 spelling (no `kind`, `ROLE_USER`).
pub fn stream_1_0(jsonrpc_id: u64, message_id: &str, text: &str, metadata: Value) -> String {
    let message = json!({
        "messageId": message_id,
        "role": "ROLE_USER",
        "parts": [{"text": text}],
    });
    envelope("SendStreamingMessage", jsonrpc_id, message, metadata)
}

fn request_0_3(
    method: &str,
    jsonrpc_id: u64,
    message_id: Option<Value>,
    text: &str,
    metadata: Value,
) -> String {
    let mut message = json!({
        "kind": "message",
        "role": "user",
        "parts": [{"kind": "text", "text": text}],
    });
    if let Some(id) = message_id {
        message["messageId"] = id;
    }
    envelope(method, jsonrpc_id, message, metadata)
}

fn envelope(method: &str, jsonrpc_id: u64, message: Value, metadata: Value) -> String {
    json!({
        "jsonrpc": "2.0",
        "id": jsonrpc_id,
        "method": method,
        "params": {"message": message, "metadata": metadata},
    })
    .to_string()
}

/// The same JSON with every object's keys in reverse order and extra whitespace: another byte
/// sequence for the same canonical (JCS) request.
/// Metadata whose RFC 8785 form differs from a naive one in each way §5 names: a number
/// written `1.0` (JCS writes `1`) and `1e21` (`1e+21`), and member names that sort one way by
/// UTF-16 code units (JCS) and the other by UTF-8 bytes (U+1F600 before U+E000). A server
/// that hashes a naive canonical form reports other hashes in its 422.
pub fn jcs_probe() -> Value {
    json!({"n": 1.0, "big": 1e21, "s": "caf\u{e9}", "\u{e000}": 1, "\u{1f600}": 2})
}

/// `body` (built with [`jcs_probe`] metadata) spelled otherwise where JSON allows: the number
/// `1.0` as `1`, the `é` as the escape `\u00e9`. The same request to a canonicalizing server.
pub fn respelled(body: &str) -> String {
    let respelled =
        body.replacen(r#""n":1.0"#, r#""n":1"#, 1)
            .replacen("caf\u{e9}", r"caf\u00e9", 1);
    assert_ne!(respelled, body, "the body carries jcs_probe's metadata");
    respelled
}

pub fn reordered(body: &str) -> String {
    let value: Value = serde_json::from_str(body).expect("the harness builds valid JSON");
    write_reversed(&value)
}

fn write_reversed(value: &Value) -> String {
    match value {
        Value::Object(map) => object_reversed(map),
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(write_reversed).collect();
            format!("[ {} ]", items.join(" , "))
        }
        scalar => scalar.to_string(),
    }
}

fn object_reversed(map: &Map<String, Value>) -> String {
    let mut keys: Vec<&String> = map.keys().collect();
    keys.sort();
    keys.reverse();
    let members: Vec<String> = keys
        .into_iter()
        .map(|k| format!("{} :  {}", Value::from(k.as_str()), write_reversed(&map[k])))
        .collect();
    format!("{{\n  {}\n}}", members.join(",\n  "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reordered_is_other_bytes_for_the_same_json() {
        let body = send(
            1,
            &new_message_id(),
            "x",
            json!({"a": 1, "b": [1, {"c": 2}]}),
        );
        let other = reordered(&body);
        assert_ne!(other, body);
        let (a, b): (Value, Value) = (
            serde_json::from_str(&body).unwrap(),
            serde_json::from_str(&other).unwrap(),
        );
        assert_eq!(a, b);
    }
}
