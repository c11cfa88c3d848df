//! The README's usage section as a program: `cargo run --example minimal`, then POST an A2A
//! `message/send` with `A2A-Extensions: https://agentic-sandbox.aiwg.io/extensions/idempotency/v1`
//! to http://127.0.0.1:8080 twice: the second answer is a replay. (Another address: its first
//! argument.)
use futures::stream::{self, StreamExt};
use idem::{idempotent, EventStream, Idempotency, IdempotencyConfig, Replayable, UnitOfWork};
use jsonrpsee::core::{async_trait, RpcResult};
use jsonrpsee::server::{middleware::rpc::RpcServiceBuilder, Server};
use jsonrpsee::{proc_macros::rpc, Extensions};
use serde_json::{json, Value};

#[rpc(server)]
pub trait A2a {
    // `with_extensions` hands the method the request's Extensions, where the layers put the
    // idempotency key and hash. A2A params are an object: its members are the arguments.
    #[method(name = "message/send", aliases = ["SendMessage"], with_extensions)]
    async fn send(&self, message: Value) -> RpcResult<Replayable<Value>>;

    #[method(name = "message/stream", aliases = ["SendStreamingMessage"], with_extensions)]
    async fn stream(&self, message: Value) -> RpcResult<EventStream<Value>>;
}

struct Agent;

#[async_trait]
impl A2aServer for Agent {
    #[idempotent]
    async fn send(&self, ext: &Extensions, message: Value) -> RpcResult<Replayable<Value>> {
        let id = uuid::Uuid::new_v4().to_string(); // runs once per messageId
        let task = json!({"kind": "task", "id": id, "status": {"state": "submitted"}, "history": [message]});
        let unit = UnitOfWork::of(ext)?; // the call's unit of work
        unit.stage(move |db| {
            // commits with the cache entry, or not at all
            db.execute("INSERT INTO tasks (id) VALUES (?1)", [&id])?;
            Ok(())
        })?;
        Ok(task.into()) // the typed result, as usual
    }

    #[idempotent]
    async fn stream(&self, ext: &Extensions, message: Value) -> RpcResult<EventStream<Value>> {
        let id = uuid::Uuid::new_v4().to_string();
        let task = json!({"kind": "task", "id": id, "status": {"state": "submitted"}, "history": [message]});
        let row = id.clone();
        UnitOfWork::of(ext)?.stage(move |db| {
            // commits before the first event is sent, with the record that the stream runs
            db.execute("INSERT INTO tasks (id) VALUES (?1)", [&row])?;
            Ok(())
        })?;
        let done = json!({"kind": "status-update", "taskId": id, "status": {"state": "completed"}, "final": true});
        let work = async move {
            tokio::time::sleep(std::time::Duration::from_millis(500)).await; // the task works
            Ok(done)
        };
        // A2A: the Task first, then its updates; a retry meanwhile attaches to this stream.
        let events = stream::iter([Ok(task)]).chain(stream::once(work));
        Ok(EventStream::new(events)) // a Stream of RpcResult<Value>
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt().init(); // the extension says why a call failed in its logs only

    // Room for the calls awaiting their commit: jsonrpsee's default, 100, answers 429 under load.
    let config = IdempotencyConfig::from_env()?.with(|c| c.max_requests_in_flight = 4096);
    let idem = Idempotency::open("minimal.db", config)?;
    let db = idem.database().expect("the store is open");
    db.transact(|db| db.execute_batch("CREATE TABLE IF NOT EXISTS tasks (id TEXT PRIMARY KEY)"))
        .await?;
    let listen = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:8080".into());
    // The AgentCard, with the extension's entry in capabilities.extensions (spec §3.1).
    let card = json!({"name": "Minimal agent", "url": format!("http://{listen}/"), "version": "1.0.0",
                      "capabilities": {"streaming": true}});
    let http = tower::ServiceBuilder::new()
        .layer(idem.agent_card_layer(card))
        .layer(idem.http_layer());
    // jsonrpsee's body limits and requests in flight at the extension's.
    let config = idem.server_config().build();
    let server = Server::builder()
        .set_config(config)
        .set_http_middleware(http)
        .set_rpc_middleware(RpcServiceBuilder::new().layer(idem.rpc_layer()))
        .build(listen)
        .await?;
    let handle = server.start(Agent.into_rpc());
    handle.stopped().await;
    Ok(())
}
