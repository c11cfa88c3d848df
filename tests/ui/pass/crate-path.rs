// `crate = ...` for when idem is not reachable as `::idem`: quoted (like tokio) or bare.
extern crate idem as my_idem;

use jsonrpsee::core::{async_trait, RpcResult};
use jsonrpsee::proc_macros::rpc;
use jsonrpsee::Extensions;
use my_idem::{idempotent, Replayable};
use serde_json::Value;

#[rpc(server)]
trait A2a {
    #[method(name = "message/send", with_extensions)]
    async fn send(&self, params: Value) -> RpcResult<Replayable<Value>>;

    #[method(name = "tasks/cancel", with_extensions)]
    async fn cancel(&self, params: Value) -> RpcResult<Replayable<Value>>;
}

struct S;

#[async_trait]
impl A2aServer for S {
    #[idempotent(crate = "my_idem")]
    async fn send(&self, ext: &Extensions, params: Value) -> RpcResult<Replayable<Value>> {
        Ok(params.into())
    }

    #[idempotent(crate = my_idem)]
    async fn cancel(
        &self,
        ext: &jsonrpsee::Extensions,
        params: Value,
    ) -> RpcResult<Replayable<Value>> {
        Ok(params.into())
    }
}

fn main() {
    let _module = S.into_rpc();
}
