// A crate path that does not resolve is reported where it is written, not on the return type.
use idem::{idempotent, Replayable};
use jsonrpsee::core::RpcResult;
use jsonrpsee::Extensions;

struct S;

impl S {
    #[idempotent(crate = "::nope")]
    async fn send(&self, ext: &Extensions) -> RpcResult<Replayable<u64>> {
        Ok(1.into())
    }
}

fn main() {
    let _ = S.send(&Extensions::new());
}
