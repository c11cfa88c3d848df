//! An application's mistakes in wiring the extension: each answered loudly and naming the
//! mistake, never as a silent, undeduplicated success.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use idem::{idempotent, EventStream, Replayable, UnitOfWork};
use jsonrpsee::core::{async_trait, RpcResult};
use jsonrpsee::proc_macros::rpc;
use jsonrpsee::types::ErrorObjectOwned;
use jsonrpsee::Extensions;
use serde_json::{json, Value};

use crate::support::*;

/// Typed, so that jsonrpsee's own decoding can refuse a number.
type Metadata = serde_json::Map<String, Value>;

#[rpc(server)]
pub trait Careless {
    /// Governed (`message/send` is), but its implementation lacks `#[idempotent]`.
    #[method(name = "message/send", with_extensions)]
    async fn send(&self, message: Value, metadata: Option<Metadata>) -> RpcResult<Value>;

    /// Governed, without `#[idempotent]`, and staging nothing.
    #[method(name = "SendMessage", with_extensions)]
    async fn send_v1(&self, message: Value) -> RpcResult<Value>;

    /// `#[idempotent]`, but not among the methods the handle governs.
    #[method(name = "tasks/cancel", with_extensions)]
    async fn cancel(&self, id: String) -> RpcResult<Replayable<Value>>;

    /// `#[idempotent]` and streaming, but not among the methods the handle governs.
    #[method(name = "tasks/resubscribe", with_extensions)]
    async fn follow(&self, id: String) -> RpcResult<EventStream<Value>>;

    /// `#[idempotent]` and governed, but serving its events as `EventStream::live` does for
    /// a method outside the extension.
    #[method(name = "message/stream", with_extensions)]
    async fn stream(&self, message: Value) -> RpcResult<EventStream<Value>>;

    /// Not governed, as it should be: an error whose `data` is `null`.
    #[method(name = "tasks/get")]
    async fn get(&self, id: String) -> RpcResult<Value>;
}

struct CarelessAgent {
    executions: Arc<AtomicUsize>,
}

#[async_trait]
impl CarelessServer for CarelessAgent {
    async fn send(
        &self,
        ext: &Extensions,
        _message: Value,
        metadata: Option<Metadata>,
    ) -> RpcResult<Value> {
        self.executions.fetch_add(1, Ordering::SeqCst);
        if let Some(name) = metadata.as_ref().and_then(|m| m.get("effect")?.as_str()) {
            stage_effect(&UnitOfWork::of(ext)?, name)?;
        }
        Ok(json!({"kind": "task", "id": "t-1"}))
    }

    async fn send_v1(&self, _ext: &Extensions, message: Value) -> RpcResult<Value> {
        self.executions.fetch_add(1, Ordering::SeqCst);
        match message["parts"][0]["text"].as_str() {
            Some("fail") => return Err(ErrorObjectOwned::owned(-32000, "failed", None::<()>)),
            // The body's own validation, in JSON-RPC's words.
            Some("invalid") => return Err(jsonrpsee::types::ErrorCode::InvalidParams.into()),
            Some("invalid, why") => {
                let why = Some(json!({"reason": "no parts"}));
                return Err(ErrorObjectOwned::owned(-32602, "Invalid params", why));
            }
            _ => {}
        }
        Ok(json!({"kind": "task", "id": "t-2"}))
    }

    #[idempotent]
    async fn cancel(&self, ext: &Extensions, id: String) -> RpcResult<Replayable<Value>> {
        let _ = ext;
        self.executions.fetch_add(1, Ordering::SeqCst);
        Ok(json!({"id": id, "status": {"state": "canceled"}}).into())
    }

    #[idempotent]
    async fn follow(&self, ext: &Extensions, id: String) -> RpcResult<EventStream<Value>> {
        let _ = ext;
        self.executions.fetch_add(1, Ordering::SeqCst);
        let events = futures::stream::iter([Ok(json!({"kind": "task", "id": id}))]);
        Ok(EventStream::new(events))
    }

    #[idempotent]
    async fn stream(&self, ext: &Extensions, _message: Value) -> RpcResult<EventStream<Value>> {
        self.executions.fetch_add(1, Ordering::SeqCst);
        let events = futures::stream::iter([Ok(json!({"kind": "task", "id": "t-3"}))]);
        EventStream::live(ext, events)
    }

    async fn get(&self, id: String) -> RpcResult<Value> {
        let data = Some(Value::Null);
        Err(ErrorObjectOwned::owned(
            -32001,
            format!("Task not found: \"{id}\""),
            data,
        ))
    }
}

async fn careless_server(db: &Db) -> TestServer {
    careless_server_with(db, idem::IdempotencyConfig::default()).await
}

async fn careless_server_with(db: &Db, config: idem::IdempotencyConfig) -> TestServer {
    let executions = Arc::new(AtomicUsize::new(0));
    let agent = CarelessAgent {
        executions: executions.clone(),
    };
    TestServer::serve(
        &db.path,
        config,
        db.clock.clone(),
        agent.into_rpc(),
        executions,
    )
    .await
}

/// A governed method without `#[idempotent]` would run undeduplicated, and what it staged
/// would never commit: it is refused, uncached, every time, with the method named.
#[tokio::test]
async fn a_governed_method_without_its_attribute_is_refused_not_run_undeduplicated() {
    let db = Db::new();
    let server = careless_server(&db).await;
    let mid = new_id();
    // It stages a write: UnitOfWork::of refuses, the body fails there.
    let staging = send_with(1, "message/send", &mid, "x", json!({"effect": "e1"}));
    for attempt in 1..=2 {
        let reply = post_activated(&server.url, staging.clone()).await;
        assert_eq!(reply.error_code(), -32603, "{}", reply.describe());
        assert_eq!(reply.data_code(), "IDEMPOTENCY_METHOD_NOT_GUARDED");
        assert!(!reply.replayed(), "attempt {attempt}: never cached");
    }
    assert_eq!(db.row(&mid), None, "nothing cached");
    // It stages nothing: its success is replaced by the error, which names the method.
    let plain = send_with(2, "SendMessage", &new_id(), "y", json!({}));
    let reply = post_activated(&server.url, plain).await;
    assert_eq!(reply.data_code(), "IDEMPOTENCY_METHOD_NOT_GUARDED");
    assert_eq!(reply.json()["error"]["data"]["method"], "SendMessage");
    assert_eq!(reply.json()["id"], 2);
    // Its failure is not what the body said either: an error would run again on every retry.
    let failing = send_with(5, "SendMessage", &new_id(), "fail", json!({}));
    let reply = post_activated(&server.url, failing).await;
    assert_eq!(reply.data_code(), "IDEMPOTENCY_METHOD_NOT_GUARDED");
    // In a batch, each such answer is replaced, and the others kept as they were.
    let mixed = format!(
        "[{},{},{}]",
        send_with(6, "SendMessage", &new_id(), "y", json!({})),
        r#"{"jsonrpc":"2.0","id":7,"method":"tasks/cancel","params":{"id":"t-1"}}"#,
        send_with(8, "SendMessage", &new_id(), "fail", json!({})),
    );
    let reply = post_activated(&server.url, mixed).await;
    for id in [6, 8] {
        let answer = reply.batch_answer(id);
        assert_eq!(
            answer["error"]["data"]["code"], "IDEMPOTENCY_METHOD_NOT_GUARDED",
            "{answer}"
        );
        assert_eq!(answer["error"]["data"]["method"], "SendMessage");
    }
    assert_eq!(
        reply.batch_answer(7)["error"]["data"]["code"],
        "IDEMPOTENCY_LAYER_MISSING",
        "an answer of another kind, kept"
    );
    // In a batch, a staging body fails at its unit of work all the same.
    let batch = format!(
        "[{}]",
        send_with(3, "message/send", &new_id(), "z", json!({"effect": "e2"}))
    );
    let reply = post_activated(&server.url, batch).await;
    assert_eq!(
        reply.batch_answer(3)["error"]["data"]["code"],
        "IDEMPOTENCY_METHOD_NOT_GUARDED"
    );
    // A governed call jsonrpsee refuses (params it cannot decode) keeps jsonrpsee's error.
    let undecodable = format!(
        r#"{{"jsonrpc":"2.0","id":4,"method":"message/send","params":{{"message":{{"kind":"message","messageId":"{}","role":"user","parts":[]}},"metadata":7}}}}"#,
        new_id()
    );
    assert_eq!(
        post_activated(&server.url, undecodable).await.error_code(),
        -32602
    );
    assert_eq!(
        server.executions(),
        7,
        "the bodies ran: the refusal comes after"
    );
    assert!(db.effects().is_empty(), "nothing staged was written");
}

/// A governed method without `#[idempotent]` whose body answers -32602 itself (its own check
/// of its input) is named as the mistake it is, alone and in a batch, and nothing is cached.
/// It was taken for jsonrpsee's refusal of undecodable params: stored as the key's outcome,
/// its retry ran the body again, answered as a replay (helper-97).
#[tokio::test]
async fn an_unguarded_body_s_own_invalid_params_is_named_a_wiring_mistake() {
    let db = Db::new();
    let server = careless_server(&db).await;
    for text in ["invalid", "invalid, why"] {
        let mid = new_id();
        for attempt in 1..=2 {
            let reply = post_activated(
                &server.url,
                send_with(1, "SendMessage", &mid, text, json!({})),
            )
            .await;
            assert_eq!(
                reply.data_code(),
                "IDEMPOTENCY_METHOD_NOT_GUARDED",
                "{}",
                reply.describe()
            );
            assert!(!reply.replayed(), "{text}, attempt {attempt}");
        }
        assert_eq!(db.row(&mid), None, "{text}: nothing cached");
        let batch = format!(
            "[{}]",
            send_with(2, "SendMessage", &new_id(), text, json!({}))
        );
        let reply = post_activated(&server.url, batch).await;
        let answer = reply.batch_answer(2);
        assert_eq!(
            answer["error"]["data"]["code"], "IDEMPOTENCY_METHOD_NOT_GUARDED",
            "{answer}"
        );
    }
    assert_eq!(server.executions(), 6, "each ran, once per request");
}

/// In a batch, only the answers in the places of unguarded calls are replaced: not another
/// answer that shares their id, and the others are what jsonrpsee wrote, byte for byte.
#[tokio::test]
async fn in_a_batch_only_the_unguarded_answers_are_replaced_the_rest_kept_byte_for_byte() {
    let db = Db::new();
    let server = careless_server(&db).await;
    let get = r#"{"jsonrpc":"2.0","id":5,"method":"tasks/get","params":{"id":"t-\u00e9"}}"#;
    let alone = post_activated(&server.url, get.to_owned()).await;
    let written = String::from_utf8_lossy(&alone.body).into_owned();
    assert!(written.contains(r#""data":null"#), "{written}");
    let unguarded = send_with(5, "SendMessage", &new_id(), "y", json!({}));
    let reply = post_activated(&server.url, format!("[{unguarded},{get}]")).await;
    let answers: Vec<Box<serde_json::value::RawValue>> =
        serde_json::from_slice(&reply.body).unwrap();
    assert_eq!(answers.len(), 2);
    assert!(
        answers[0].get().contains("IDEMPOTENCY_METHOD_NOT_GUARDED"),
        "{}",
        answers[0]
    );
    assert_eq!(
        answers[1].get().as_bytes(),
        &alone.body[..],
        "the same id, kept as written"
    );

    // On a server whose methods are all guarded, a call jsonrpsee refuses keeps its -32602,
    // and the guarded call under the same id its success.
    let other = Db::new();
    let guarded = other.server(idem::IdempotencyConfig::default()).await;
    let bad = r#"{"jsonrpc":"2.0","id":6,"method":"message/send","params":{"message":{"kind":"message","messageId":"MID","role":"user","parts":[]},"configuration":{"historyLength":"x"}}}"#;
    let batch = format!(
        "[{},{}]",
        bad.replace("MID", &new_id()),
        send(6, &new_id(), "ok")
    );
    let reply = post_activated(&guarded.url, batch).await;
    let answers: Vec<Value> = serde_json::from_slice(&reply.body).unwrap();
    assert_eq!(answers[0]["error"]["code"], -32602, "{answers:?}");
    assert_eq!(answers[1]["result"]["echo"], "ok", "{answers:?}");
}

/// `#[idempotent]` on a method the handle does not govern: the body never runs, and the
/// error says to govern it rather than that the layers are missing.
#[tokio::test]
async fn an_attributed_method_that_is_not_governed_says_so() {
    let db = Db::new();
    let server = careless_server(&db).await;
    for method in ["tasks/cancel", "tasks/resubscribe"] {
        let body =
            format!(r#"{{"jsonrpc":"2.0","id":1,"method":"{method}","params":{{"id":"t-1"}}}}"#);
        let reply = post_activated(&server.url, body.clone()).await;
        assert_eq!(reply.data_code(), "IDEMPOTENCY_LAYER_MISSING");
        let reason = reply.json()["error"]["data"]["reason"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(reason.contains("not governed"), "{method}: {reason}");
        assert!(reason.contains("IdempotencyBuilder::govern"), "{reason}");
        // Over WebSocket too, where it was told the layers were not installed (helper-82; a
        // streaming method still was: helper-88).
        let answer = websocket_call(&server.url, &body).await;
        let reason = answer["error"]["data"]["reason"]
            .as_str()
            .unwrap_or_default();
        assert!(reason.contains("not governed"), "{method}: {answer}");
    }
    assert_eq!(server.executions(), 0);
}

/// A result or an event whose `Serialize` panics: a bug in the application's types.
#[derive(Clone)]
pub struct Unserializable;

impl serde::Serialize for Unserializable {
    fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
        panic!("a bug in Serialize")
    }
}

#[rpc(server)]
pub trait Buggy {
    #[method(name = "message/send", with_extensions)]
    async fn send(&self, message: Value) -> RpcResult<Replayable<Unserializable>>;

    #[method(name = "message/stream", with_extensions)]
    async fn stream(&self, message: Value) -> RpcResult<idem::EventStream<Unserializable>>;
}

struct BuggyAgent {
    executions: Arc<AtomicUsize>,
}

#[async_trait]
impl BuggyServer for BuggyAgent {
    #[idempotent]
    async fn send(
        &self,
        ext: &Extensions,
        _message: Value,
    ) -> RpcResult<Replayable<Unserializable>> {
        let _ = ext;
        self.executions.fetch_add(1, Ordering::SeqCst);
        Ok(Unserializable.into())
    }

    #[idempotent]
    async fn stream(
        &self,
        ext: &Extensions,
        _message: Value,
    ) -> RpcResult<idem::EventStream<Unserializable>> {
        let _ = ext;
        self.executions.fetch_add(1, Ordering::SeqCst);
        let events = futures::stream::iter([Ok(Unserializable)]);
        Ok(idem::EventStream::new(events))
    }
}

/// A result whose serialization panics is the call's panic, cached as one (spec §7.5), for an
/// answer and for a stream's event alike: never an unwinding guard that caches nothing (and
/// runs again on the retry), nor a stream whose readers wait for an end that never comes.
#[tokio::test]
async fn a_result_that_panics_as_it_is_serialized_is_cached_as_the_call_s_panic() {
    let db = Db::new();
    let executions = Arc::new(AtomicUsize::new(0));
    let agent = BuggyAgent {
        executions: executions.clone(),
    };
    let config = idem::IdempotencyConfig::default();
    let server = TestServer::serve(
        &db.path,
        config,
        db.clock.clone(),
        agent.into_rpc(),
        executions,
    )
    .await;
    let body = send(1, &new_id(), "x");
    let first = post_activated(&server.url, body.clone()).await;
    assert_eq!(
        first.data_code(),
        "IDEMPOTENCY_EXECUTION_PANICKED",
        "{}",
        first.describe()
    );
    let replay = post_activated(&server.url, body).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, first.body);

    let body = stream_request(2, &new_id(), "x", json!({}));
    let mut first = SseReply::open(&server.url, body.clone(), &[("A2A-Extensions", URI)]).await;
    let events = tokio::time::timeout(std::time::Duration::from_secs(10), first.rest())
        .await
        .expect("the stream ends");
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(
        events[0]["error"]["data"]["code"],
        "IDEMPOTENCY_EXECUTION_PANICKED"
    );
    let mut replay = SseReply::open(&server.url, body, &[("A2A-Extensions", URI)]).await;
    replay.rest().await;
    assert!(replay.replayed());
    assert_eq!(replay.raw(), first.raw());
    assert_eq!(server.executions(), 2, "each executed once");
}

/// `EventStream::live` in a governed method would send events the guard never saw: refused
/// with an error that says what to return instead, as the call's outcome (it ran, so a retry
/// replays it), where it read as if the layers were missing.
#[tokio::test]
async fn a_governed_stream_served_live_is_refused_naming_what_to_return() {
    let db = Db::new();
    let server = careless_server(&db).await;
    let body = stream_request(1, &new_id(), "go", json!({}));
    let first = post_activated(&server.url, body.clone()).await;
    assert!(first
        .header("content-type")
        .unwrap()
        .starts_with("application/json"));
    assert_eq!(first.data_code(), "IDEMPOTENCY_STREAM_UNAVAILABLE");
    let reason = first.json()["error"]["data"]["reason"].clone();
    assert!(
        reason.as_str().unwrap().contains("EventStream::new"),
        "{reason}"
    );
    let retry = post_activated(&server.url, body.clone()).await;
    assert!(retry.replayed());
    assert_eq!(retry.body, first.body, "the outcome, replayed");
    assert_eq!(server.executions(), 1);
    server.stop().await;
    // Not deduplicated (optional, not activated), the same refusal.
    let optional = idem::IdempotencyConfig::default().with(|c| c.required = false);
    let server = careless_server_with(&db, optional).await;
    let alone = post(
        &server.url,
        stream_request(2, &new_id(), "go", json!({})),
        &[],
    )
    .await;
    assert_eq!(alone.data_code(), "IDEMPOTENCY_STREAM_UNAVAILABLE");
}
