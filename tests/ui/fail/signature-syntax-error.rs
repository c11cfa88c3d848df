use idem::{idempotent, Replayable};
use jsonrpsee::core::RpcResult;
use jsonrpsee::Extensions;

struct S;

impl S {
    #[idempotent]
    async fn send(&self, ext &Extensions) -> RpcResult<Replayable<u64>> {
        let n = ext.len();
        Ok(n.into())
    }
}

fn main() {
    let _ = S.send(&Extensions::new());
}
