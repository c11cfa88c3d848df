// A hand-written method returning `impl Future` is wrapped as is.
use std::future::Future;

use idem::{idempotent, Replayable};
use jsonrpsee::core::RpcResult;
use jsonrpsee::Extensions;

struct S;

impl S {
    #[idempotent]
    fn send(
        &self,
        ext: &Extensions,
        n: u64,
    ) -> impl Future<Output = RpcResult<Replayable<u64>>> + Send + 'static {
        async move { Ok((n + 1).into()) }
    }
}

fn main() {
    let ext = Extensions::new();
    let _ = S.send(&ext, 1);
}
