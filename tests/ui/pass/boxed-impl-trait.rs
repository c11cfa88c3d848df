// A boxed future whose type holds an `impl Trait` compiles with the attribute as it does
// without it: the closure the body runs in cannot be given that type (helper-109).
use std::future::Future;
use std::pin::Pin;

use futures::future::{BoxFuture, FutureExt};
use idem::{idempotent, Replayable};
use jsonrpsee::core::RpcResult;
use jsonrpsee::Extensions;

struct S;

impl S {
    #[idempotent]
    fn pinned(
        &self,
        ext: &Extensions,
    ) -> Pin<Box<impl Future<Output = RpcResult<Replayable<u64>>> + Send + 'static>> {
        Box::pin(async move { Ok(1.into()) })
    }

    #[idempotent]
    fn boxed(
        &self,
        ext: &Extensions,
    ) -> BoxFuture<'static, RpcResult<Replayable<impl serde::Serialize + Send + 'static>>> {
        async move { Ok(Replayable::from(1u64)) }.boxed()
    }
}

fn main() {
    let ext = Extensions::new();
    let _ = S.pinned(&ext);
    let _ = S.boxed(&ext);
}
