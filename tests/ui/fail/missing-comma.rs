use idem::{idempotent, Replayable};
use jsonrpsee::core::RpcResult;
use jsonrpsee::Extensions;

struct S;

impl S {
    #[idempotent(crate = "idem" ttl = 60)]
    async fn send(&self, _ext: &Extensions) -> RpcResult<Replayable<u64>> {
        Ok(1.into())
    }

    #[idempotent(crate = "idem";)]
    async fn cancel(&self, _ext: &Extensions) -> RpcResult<Replayable<u64>> {
        Ok(1.into())
    }
}

fn main() {
    let ext = Extensions::new();
    let _ = (S.send(&ext), S.cancel(&ext));
}
