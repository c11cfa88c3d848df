// `futures`' `BoxFuture` is a boxed future like the one `#[async_trait]` writes out. Its body
// is the method's own: an early `return` of a future, a `'static` future, and a parameter
// whose lifetime is not the future's all compile as they would without the attribute.
use futures::future::{BoxFuture, FutureExt};
use idem::{idempotent, Replayable};
use jsonrpsee::core::RpcResult;
use jsonrpsee::types::ErrorObjectOwned;
use jsonrpsee::Extensions;

struct S;

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
    fn send_static(&self, ext: &Extensions, n: u64) -> BoxFuture<'static, RpcResult<Replayable<u64>>> {
        async move { Ok((n + 1).into()) }.boxed()
    }

    #[idempotent]
    fn send_text<'a>(&'a self, ext: &'a Extensions, text: &str) -> BoxFuture<'a, RpcResult<Replayable<u64>>> {
        let len = text.len() as u64;
        async move { Ok(len.into()) }.boxed()
    }
}

fn main() {
    let ext = Extensions::new();
    let _ = S.send(&ext, 1);
    let _ = S.send_static(&ext, 1);
    let _ = S.send_text(&ext, "text");
}
