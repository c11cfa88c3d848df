// `#[tracing::instrument]` under `#[idempotent]`, on an `#[async_trait]` method, still
// recognises the async body it instruments (with `err` it would not compile otherwise), and
// records a parameter as a field before the body takes it.
use idem::{idempotent, Replayable};
use jsonrpsee::core::{async_trait, RpcResult};
use jsonrpsee::proc_macros::rpc;
use jsonrpsee::Extensions;
use serde_json::Value;

#[rpc(server)]
trait A2a {
    #[method(name = "message/send", with_extensions)]
    async fn send(&self, params: Value) -> RpcResult<Replayable<Value>>;

    #[method(name = "message/stream", with_extensions)]
    async fn recorded(&self, params: Value) -> RpcResult<Replayable<Value>>;
}

struct S;

#[async_trait]
impl A2aServer for S {
    #[idempotent]
    #[tracing::instrument(skip_all, err)]
    async fn send(&self, ext: &Extensions, params: Value) -> RpcResult<Replayable<Value>> {
        let _ = ext;
        Ok(params.into())
    }

    #[idempotent]
    #[tracing::instrument(skip(self, ext))]
    async fn recorded(&self, ext: &Extensions, params: Value) -> RpcResult<Replayable<Value>> {
        Ok(params.into())
    }
}

fn main() {
    let _module = S.into_rpc();
}
