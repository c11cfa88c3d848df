// A `?` in a method that returns a boxed future is the compiler's error on the `?`, as
// without the attribute: the body is the method's own, not a block of the guard's.
use futures::future::{BoxFuture, FutureExt};
use idem::{idempotent, Replayable};
use jsonrpsee::core::RpcResult;
use jsonrpsee::types::ErrorObjectOwned;
use jsonrpsee::Extensions;

struct S;

fn check(n: u64) -> Result<u64, ErrorObjectOwned> {
    Ok(n)
}

impl S {
    #[idempotent]
    fn send<'a>(&'a self, ext: &'a Extensions, n: u64) -> BoxFuture<'a, RpcResult<Replayable<u64>>> {
        let m = check(n)?;
        async move { Ok((m + 1).into()) }.boxed()
    }
}

fn main() {}
