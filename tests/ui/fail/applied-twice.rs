use idem::{idempotent, Replayable};
use jsonrpsee::core::RpcResult;
use jsonrpsee::Extensions;

struct S;

impl S {
    #[idempotent]
    #[idempotent]
    async fn send(&self, _ext: &Extensions) -> RpcResult<Replayable<u64>> {
        Ok(1.into())
    }
}

fn main() {
    let _ = S.send(&Extensions::new());
}
