//! Every governed call counted once in `idem::telemetry`'s metrics, for the calls that the
//! example server (whose metrics `operations.rs` reads) never makes: a governed method left
//! without `#[idempotent]`, a call over WebSocket, streams that end at their first item. In
//! this process, under a recorder of its own, on methods no other test calls.

use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, OnceLock};

use idem::{idempotent, EventStream, IdempotencyConfig};
use jsonrpsee::core::{async_trait, RpcResult};
use jsonrpsee::proc_macros::rpc;
use jsonrpsee::types::ErrorObjectOwned;
use jsonrpsee::Extensions;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use serde_json::{json, Value};

use crate::operations::Metrics;
use crate::support::*;

const SEND: &str = "counted/send";
const STREAM: &str = "counted/stream";

#[rpc(server)]
pub trait Counted {
    /// Governed, but its implementation lacks `#[idempotent]`.
    #[method(name = "counted/send")]
    async fn send(&self, message: Value, metadata: Option<Value>) -> RpcResult<Value>;

    /// Its text says how it ends: after one event (`ok`), with an error at once, or empty.
    #[method(name = "counted/stream", with_extensions)]
    async fn stream(
        &self,
        message: Value,
        metadata: Option<Value>,
    ) -> RpcResult<EventStream<Value>>;
}

struct Agent;

#[async_trait]
impl CountedServer for Agent {
    async fn send(&self, _message: Value, _metadata: Option<Value>) -> RpcResult<Value> {
        Ok(json!({"kind": "task", "id": "t-1"}))
    }

    #[idempotent]
    async fn stream(
        &self,
        ext: &Extensions,
        message: Value,
        _metadata: Option<Value>,
    ) -> RpcResult<EventStream<Value>> {
        let _ = ext;
        let events = match message["parts"][0]["text"].as_str() {
            Some("ok") => vec![Ok(json!({"kind": "status-update", "final": true}))],
            Some("empty") => vec![],
            _ => vec![Err(ErrorObjectOwned::owned(-32000, "failed", None::<()>))],
        };
        Ok(EventStream::new(futures::stream::iter(events)))
    }
}

/// The process's recorder, installed by the first test that asks.
fn recorder() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::set_global_recorder(recorder).expect("no other recorder in this process");
        idem::telemetry::describe();
        handle
    })
}

/// Found by helper-74: the refusals of a method without its guard and of a call over
/// WebSocket were counted nowhere, and a stream that ended at its first item committed
/// untimed, where the README promises one outcome a call and every commit timed.
#[tokio::test]
async fn calls_the_example_never_makes_are_counted_once_each() {
    let recorder = recorder();
    let db = Db::new();
    let config = IdempotencyConfig::default();
    let idem = open_when_released(&db.path, config, db.clock.clone(), &[SEND, STREAM]).await;
    let server = TestServer::serve_on(idem, Agent.into_rpc(), Arc::new(AtomicUsize::new(0))).await;

    let unguarded = post_activated(&server.url, send_with(1, SEND, &new_id(), "x", json!({})));
    assert_eq!(
        unguarded.await.data_code(),
        "IDEMPOTENCY_METHOD_NOT_GUARDED"
    );
    let over_websocket = send_with(2, SEND, &new_id(), "x", json!({}));
    let answer = websocket_call(&server.url, &over_websocket).await;
    assert_eq!(answer["error"]["data"]["code"], "IDEMPOTENCY_HTTP_ONLY");
    for text in ["ok", "fails", "empty"] {
        let body = send_with(3, STREAM, &new_id(), text, json!({}));
        let mut reply = SseReply::open(&server.url, body, ACTIVATED).await;
        reply.rest().await;
    }

    let m = Metrics::of(recorder.render());
    let calls = |method, outcome| {
        m.get(
            "idempotency_calls_total",
            &[("method", method), ("outcome", outcome)],
        )
    };
    assert_eq!(calls(SEND, "rejected"), 2.0);
    for code in ["IDEMPOTENCY_METHOD_NOT_GUARDED", "IDEMPOTENCY_HTTP_ONLY"] {
        let labels = [("method", SEND), ("code", code)];
        assert_eq!(
            m.get("idempotency_rejections_total", &labels),
            1.0,
            "{code}"
        );
    }
    assert_eq!(calls(STREAM, "executed"), 3.0);
    let commits = m.get("idempotency_commit_seconds_count", &[("method", STREAM)]);
    assert_eq!(commits, 3.0, "each stream's first commit, timed");
}
