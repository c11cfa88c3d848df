// `futures`' `BoxFuture` is a boxed future like the one `#[async_trait]` writes out.
use futures::future::{BoxFuture, FutureExt};
use idem::{idempotent, Replayable};
use jsonrpsee::core::RpcResult;
use jsonrpsee::Extensions;

struct S;

impl S {
    #[idempotent]
    fn send<'a>(&'a self, ext: &'a Extensions, n: u64) -> BoxFuture<'a, RpcResult<Replayable<u64>>> {
        async move { Ok((n + 1).into()) }.boxed()
    }
}

fn main() {
    let ext = Extensions::new();
    let _ = S.send(&ext, 1);
}
