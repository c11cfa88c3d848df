// The body's own `#![...]` attributes stay first in the function's body.
use idem::{idempotent, Replayable};
use jsonrpsee::core::RpcResult;
use jsonrpsee::Extensions;

struct S;

impl S {
    #[idempotent]
    async fn send(&self, ext: &Extensions) -> RpcResult<Replayable<u64>> {
        #![allow(clippy::let_and_return)]
        let _ = ext;
        let answer = Ok(1.into());
        answer
    }
}

fn main() {
    let _ = S.send(&Extensions::new());
}
