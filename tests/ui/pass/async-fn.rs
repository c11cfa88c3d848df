// The realistic setup: `#[async_trait]` on the impl runs first, so #[idempotent] sees the
// desugared `fn ... -> Pin<Box<dyn Future ...>>`.
use idem::{idempotent, Replayable};
use jsonrpsee::core::{async_trait, RpcResult};
use jsonrpsee::proc_macros::rpc;
use jsonrpsee::types::ErrorObjectOwned;
use jsonrpsee::Extensions;
use serde_json::Value;

#[rpc(server)]
trait A2a {
    #[method(name = "message/send", with_extensions)]
    async fn send(&self, params: Value) -> RpcResult<Replayable<Value>>;
}

struct S;

fn invalid(msg: impl Into<String>) -> ErrorObjectOwned {
    ErrorObjectOwned::owned(-32602, msg.into(), None::<()>)
}

#[async_trait]
impl A2aServer for S {
    #[idempotent]
    async fn send(&self, ext: &Extensions, params: Value) -> RpcResult<Replayable<Value>> {
        let _ = ext;
        let message = params.get("message").ok_or_else(|| invalid("no message"))?;
        if message.is_null() {
            return Err(invalid("null message"));
        }
        let id: String = serde_json::from_value(message["messageId"].clone())
            .map_err(|e| invalid(e.to_string()))?;
        Ok(Value::from(id).into())
    }
}

fn main() {
    let _module = S.into_rpc();
}
