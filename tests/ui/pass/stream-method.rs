// A streaming method: the same attribute, with `EventStream` in the return position.
use futures::stream;
use idem::{idempotent, EventStream};
use jsonrpsee::core::{async_trait, RpcResult};
use jsonrpsee::proc_macros::rpc;
use jsonrpsee::Extensions;
use serde_json::{json, Value};

#[rpc(server)]
trait A2a {
    #[method(name = "message/stream", with_extensions)]
    async fn stream(&self, message: Value) -> RpcResult<EventStream<Value>>;
}

struct S;

#[async_trait]
impl A2aServer for S {
    #[idempotent]
    async fn stream(&self, ext: &Extensions, message: Value) -> RpcResult<EventStream<Value>> {
        let id = message["messageId"].clone();
        let events = stream::iter([Ok(json!({"kind": "task", "for": id})), Ok(json!({"final": true}))]);
        Ok(EventStream::new(events))
    }
}

fn main() {
    let _module = S.into_rpc();
}
