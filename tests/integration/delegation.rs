//! One operation under two names (A2A 0.3's `message/send` and 1.0's `SendMessage`, say): an
//! `#[idempotent]` method that calls another with its `Extensions`. The outer guard claims,
//! stores and commits; the inner body runs once, under it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem::{idempotent, EventStream, IdempotencyConfig, Replayable, UnitOfWork};
use jsonrpsee::core::{async_trait, RpcResult};
use jsonrpsee::proc_macros::rpc;
use jsonrpsee::Extensions;
use serde_json::{json, Value};

use crate::support::*;

#[rpc(server)]
pub trait TwoNames {
    #[method(name = "names/inner", with_extensions)]
    async fn inner(&self, message: Value) -> RpcResult<Replayable<Value>>;

    #[method(name = "names/outer", with_extensions)]
    async fn outer(&self, message: Value) -> RpcResult<Replayable<Value>>;

    #[method(name = "names/inner-stream", with_extensions)]
    async fn inner_stream(&self, message: Value) -> RpcResult<EventStream<Value>>;

    #[method(name = "names/outer-stream", with_extensions)]
    async fn outer_stream(&self, message: Value) -> RpcResult<EventStream<Value>>;
}

struct Delegating(Arc<AtomicUsize>);

#[async_trait]
impl TwoNamesServer for Delegating {
    #[idempotent]
    async fn inner(&self, ext: &Extensions, message: Value) -> RpcResult<Replayable<Value>> {
        self.0.fetch_add(1, Ordering::SeqCst);
        let text = message["parts"][0]["text"].as_str().unwrap_or_default();
        stage_effect(&UnitOfWork::of(ext)?, text)?;
        Ok(json!({"kind": "task", "id": text}).into())
    }

    #[idempotent]
    async fn outer(&self, ext: &Extensions, message: Value) -> RpcResult<Replayable<Value>> {
        TwoNamesServer::inner(self, ext, message).await
    }

    #[idempotent]
    async fn inner_stream(
        &self,
        ext: &Extensions,
        _message: Value,
    ) -> RpcResult<EventStream<Value>> {
        let _ = ext;
        self.0.fetch_add(1, Ordering::SeqCst);
        let events = [Ok(json!({"kind": "status-update", "final": true}))];
        Ok(EventStream::new(futures::stream::iter(events)))
    }

    #[idempotent]
    async fn outer_stream(
        &self,
        ext: &Extensions,
        message: Value,
    ) -> RpcResult<EventStream<Value>> {
        TwoNamesServer::inner_stream(self, ext, message).await
    }
}

/// Governing all four; a short wait, so that a call waiting on its own claim fails fast.
async fn delegating_server(db: &Db) -> TestServer {
    let config = IdempotencyConfig::default().with(|c| c.in_flight_wait = Duration::from_secs(1));
    let names = [
        "names/inner",
        "names/outer",
        "names/inner-stream",
        "names/outer-stream",
    ];
    let idem = open_when_released(&db.path, config, db.clock.clone(), &names).await;
    let executions = Arc::new(AtomicUsize::new(0));
    let methods = Delegating(executions.clone()).into_rpc();
    TestServer::serve_on(idem, methods, executions).await
}

/// The inner method's guard waited on its own call's claim, then the outer one stored the
/// 409 it got as the call's outcome, replayed for a day; the body never ran (helper-82).
#[tokio::test]
async fn a_guarded_method_calling_another_runs_it_once_and_stores_its_answer() {
    let db = Db::new();
    let server = delegating_server(&db).await;
    let id = new_id();
    let request = send_with(1, "names/outer", &id, "t-outer", json!({}));
    let first = post_activated(&server.url, request.clone()).await;
    assert_eq!(first.status, 200);
    assert_eq!(
        first.json()["result"]["id"],
        "t-outer",
        "{}",
        first.describe()
    );
    assert!(!first.replayed());
    let again = post_activated(&server.url, request).await;
    assert!(again.replayed());
    assert_eq!(again.body, first.body);
    assert_eq!(server.executions(), 1);
    assert_eq!(
        db.effects(),
        ["before:t-outer", "t-outer"],
        "committed once, with the entry"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_guarded_stream_calling_another_runs_it_once_and_records_its_events() {
    let db = Db::new();
    let server = delegating_server(&db).await;
    let request = send_with(1, "names/outer-stream", &new_id(), "s", json!({}));
    let first = post_activated(&server.url, request.clone()).await;
    assert_eq!(
        (first.status, first.content_type()),
        (200, "text/event-stream".into())
    );
    assert!(
        first.describe().contains("status-update"),
        "{}",
        first.describe()
    );
    let again = post_activated(&server.url, request).await;
    assert!(again.replayed());
    assert_eq!(again.body, first.body);
    assert_eq!(server.executions(), 1);
    server.stop().await;
}
