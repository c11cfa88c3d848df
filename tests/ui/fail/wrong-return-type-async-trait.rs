// The realistic setup: `#[async_trait]` runs first, and #[idempotent] sees the boxed future;
// the error is still shown on the return type as written.
use idem::idempotent;
use jsonrpsee::core::{async_trait, RpcResult};
use jsonrpsee::proc_macros::rpc;
use jsonrpsee::Extensions;
use serde_json::Value;

#[rpc(server)]
trait A2a {
    #[method(name = "message/send", with_extensions)]
    async fn send(&self, params: Value) -> RpcResult<Value>;
}

struct S;

#[async_trait]
impl A2aServer for S {
    #[idempotent]
    async fn send(&self, ext: &Extensions, params: Value) -> RpcResult<Value> {
        let _ = ext;
        Ok(params)
    }
}

fn main() {
    let _module = S.into_rpc();
}
