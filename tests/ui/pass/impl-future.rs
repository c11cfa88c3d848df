// A hand-written method returning `impl Future` is wrapped as is; an early `return` in it is
// the method's own.
use std::future::Future;

use futures::future::{BoxFuture, FutureExt};
use idem::{idempotent, Replayable};
use jsonrpsee::core::RpcResult;
use jsonrpsee::types::ErrorObjectOwned;
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

    #[idempotent]
    fn send_or_refuse(
        &self,
        ext: &Extensions,
        n: u64,
    ) -> impl Future<Output = RpcResult<Replayable<u64>>> + Send + 'static {
        let answer: BoxFuture<'static, RpcResult<Replayable<u64>>> = if n == 0 {
            let zero = ErrorObjectOwned::owned(-32602, "zero", None::<()>);
            return async move { Err(zero) }.boxed();
        } else {
            async move { Ok((n + 1).into()) }.boxed()
        };
        answer
    }
}

fn main() {
    let ext = Extensions::new();
    let _ = S.send(&ext, 1);
    let _ = S.send_or_refuse(&ext, 1);
}
