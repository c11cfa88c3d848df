//! Raw request bytes through the whole stack, in process: jsonrpsee's HTTP service behind the
//! idempotency HTTP and RPC layers, an `#[idempotent]` method, a real SQLite file. Whatever
//! the bytes, the answer is an HTTP response whose body is JSON-RPC (or empty, for a
//! notification), with a status the extension or jsonrpsee gives; never a panic, never a hang.
#![no_main]

use std::sync::OnceLock;

use http_body_util::BodyExt;
use idem::{idempotent, Idempotency, IdempotencyConfig, Replayable};
use jsonrpsee::core::{async_trait, RpcResult};
use jsonrpsee::server::middleware::rpc::RpcServiceBuilder;
use jsonrpsee::server::{stop_channel, Server, ServerHandle};
use jsonrpsee::{proc_macros::rpc, Extensions};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use tower::Service;

#[rpc(server)]
pub trait Agent {
    #[method(name = "message/send", with_extensions)]
    async fn send(&self, message: Value) -> RpcResult<Replayable<Value>>;
}

struct Echo;

#[async_trait]
impl AgentServer for Echo {
    #[idempotent]
    async fn send(&self, _ext: &Extensions, message: Value) -> RpcResult<Replayable<Value>> {
        Ok(message.into())
    }
}

/// One request through the stack: the body, whether it activates the extension; the status
/// and body of the answer.
type Call = Box<dyn Fn(Vec<u8>, bool) -> (u16, Vec<u8>) + Send + Sync>;

/// What every iteration shares: the runtime, the store's file, the layers.
struct Stack {
    _runtime: tokio::runtime::Runtime,
    call: Call,
    _idem: Idempotency,
    _dir: tempfile::TempDir,
    _handle: ServerHandle,
}

fn stack() -> &'static Stack {
    static STACK: OnceLock<Stack> = OnceLock::new();
    STACK.get_or_init(|| {
        // A worker of its own drives the tasks the layers spawn while an iteration blocks.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fuzz.db");
        let (service, idem, handle) = runtime.block_on(async {
            let idem = Idempotency::open(&path, IdempotencyConfig::default()).unwrap();
            let (stop, handle) = stop_channel();
            let service = Server::builder()
                .set_http_middleware(tower::ServiceBuilder::new().layer(idem.http_layer()))
                .set_rpc_middleware(RpcServiceBuilder::new().layer(idem.rpc_layer()))
                .to_service_builder()
                .build(Echo.into_rpc(), stop);
            (service, idem, handle)
        });
        let runtime_handle = runtime.handle().clone();
        let call = move |body: Vec<u8>, activated: bool| {
            let mut service = service.clone();
            let mut request = http::Request::post("/")
                .header("content-type", "application/json")
                .header("content-length", body.len());
            if activated {
                request = request.header(
                    "a2a-extensions",
                    "https://agentic-sandbox.aiwg.io/extensions/idempotency/v1",
                );
            }
            let request = request
                .body(jsonrpsee::server::HttpBody::from(body))
                .unwrap();
            runtime_handle.block_on(async move {
                let response = service.call(request).await.expect("an HTTP response");
                let status = response.status().as_u16();
                let body = response.into_body().collect().await.unwrap().to_bytes();
                (status, body.to_vec())
            })
        };
        Stack {
            _runtime: runtime,
            call: Box::new(call),
            _idem: idem,
            _dir: dir,
            _handle: handle,
        }
    })
}

/// The statuses a JSON-RPC answer may carry here: jsonrpsee's and the extension's table.
const STATUSES: &[u16] = &[200, 204, 400, 409, 413, 415, 422, 500];

fuzz_target!(|data: &[u8]| {
    let Some((&flag, body)) = data.split_first() else {
        return;
    };
    let stack = stack();
    let (status, answer) = (stack.call)(body.to_vec(), flag & 1 == 1);
    assert!(STATUSES.contains(&status), "status {status}");
    if answer.is_empty() {
        return; // a notification (or a batch of them) is not answered
    }
    let json: Value = serde_json::from_slice(&answer)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&answer)));
    let answers = match &json {
        Value::Array(answers) => answers.clone(),
        one => vec![one.clone()],
    };
    for answer in answers {
        assert_eq!(answer["jsonrpc"], "2.0", "{answer}");
        assert!(
            answer.get("result").is_some() != answer.get("error").is_some(),
            "{answer}"
        );
    }
});
