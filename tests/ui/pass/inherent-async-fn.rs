// #[idempotent] sees a real `async fn`: `?`, early `return` and `.into()` conversions in the
// body must still infer.
use idem::{idempotent, Replayable};
use jsonrpsee::core::RpcResult;
use jsonrpsee::types::ErrorObjectOwned;
use jsonrpsee::Extensions;
use serde_json::Value;

struct S;

struct BadRequest(&'static str);

impl From<BadRequest> for ErrorObjectOwned {
    fn from(e: BadRequest) -> Self {
        ErrorObjectOwned::owned(-32602, e.0, None::<()>)
    }
}

impl S {
    #[idempotent]
    async fn send(&self, ext: &Extensions, params: Value) -> RpcResult<Replayable<Value>> {
        if params.is_null() {
            return Err(BadRequest("null params").into());
        }
        let n = params.as_u64().ok_or(BadRequest("not a number"))?;
        Ok(Value::from(n + self.offset()).into())
    }

    #[idempotent]
    async fn always_returns(&self, ext: &Extensions) -> RpcResult<Replayable<u64>> {
        return Ok(1.into());
    }

    fn offset(&self) -> u64 {
        1
    }
}

fn main() {
    let ext = Extensions::new();
    let fut = S.send(&ext, Value::from(1));
    let _: &dyn std::future::Future<Output = RpcResult<Replayable<Value>>> = &fut;
    let _ = S.always_returns(&ext);
}
