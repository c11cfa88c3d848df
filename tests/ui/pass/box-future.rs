// `futures`' `BoxFuture` is a boxed future like the one `#[async_trait]` writes out. Its body
// is the method's own: an early `return` of a future compiles as it would without the
// attribute, and so does a future that reborrows `&mut self`.
use futures::future::{BoxFuture, FutureExt};
use idem::{idempotent, Replayable};
use jsonrpsee::core::RpcResult;
use jsonrpsee::types::ErrorObjectOwned;
use jsonrpsee::Extensions;

struct Inner;

impl Inner {
    fn call(&mut self) -> BoxFuture<'_, RpcResult<Replayable<u64>>> {
        async move { Ok(1.into()) }.boxed()
    }
}

struct S {
    inner: Inner,
}

impl S {
    #[idempotent]
    fn send<'a>(&'a self, ext: &'a Extensions, n: u64) -> BoxFuture<'a, RpcResult<Replayable<u64>>> {
        if n == 0 {
            let zero = ErrorObjectOwned::owned(-32602, "zero", None::<()>);
            return async move { Err(zero) }.boxed();
        }
        async move { Ok((n + 1).into()) }.boxed()
    }

    #[idempotent]
    fn reborrow<'a>(&'a mut self, ext: &'a Extensions) -> BoxFuture<'a, RpcResult<Replayable<u64>>> {
        self.inner.call()
    }
}

fn main() {
    let ext = Extensions::new();
    let mut s = S { inner: Inner };
    let _ = s.send(&ext, 1);
    let _ = s.reborrow(&ext);
}
