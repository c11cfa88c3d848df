use std::future::Future;
use std::pin::Pin;

use futures::future::{FutureExt, LocalBoxFuture};
use idem::{idempotent, Replayable};
use jsonrpsee::core::RpcResult;
use jsonrpsee::Extensions;

/// A boxed future the attribute cannot see through: it sees tokens, not types.
type Fut<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

struct S;

impl S {
    #[idempotent]
    fn send(&self, _ext: &Extensions) -> RpcResult<Replayable<u64>> {
        Ok(1.into())
    }

    #[idempotent]
    fn aliased<'a>(&'a self, _ext: &'a Extensions) -> Fut<'a, RpcResult<Replayable<u64>>> {
        Box::pin(async move { Ok(1.into()) })
    }

    #[idempotent]
    fn local<'a>(&'a self, _ext: &'a Extensions) -> LocalBoxFuture<'a, RpcResult<Replayable<u64>>> {
        async move { Ok(1.into()) }.boxed_local()
    }
}

fn main() {
    let ext = Extensions::new();
    let _ = (S.send(&ext), S.aliased(&ext), S.local(&ext));
}
