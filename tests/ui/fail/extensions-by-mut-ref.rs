use idem::{idempotent, Replayable};
use jsonrpsee::core::{async_trait, RpcResult};
use jsonrpsee::proc_macros::rpc;
use jsonrpsee::Extensions;
use serde_json::Value;

#[rpc(server)]
trait A2a {
    #[method(name = "message/send", with_extensions)]
    async fn send(&self, params: Value) -> RpcResult<Replayable<Value>>;
}

struct S;

#[async_trait]
impl A2aServer for S {
    #[idempotent]
    async fn send(&self, ext: &mut Extensions, params: Value) -> RpcResult<Replayable<Value>> {
        let _ = ext;
        Ok(params.into())
    }
}

fn main() {
    let _module = S.into_rpc();
}
