// jsonrpsee takes any error that converts into an `ErrorObjectOwned`; the guard stores one.
use idem::{idempotent, Replayable};
use jsonrpsee::types::ErrorObjectOwned;
use jsonrpsee::Extensions;

struct S;

struct MyError;

impl From<MyError> for ErrorObjectOwned {
    fn from(_: MyError) -> Self {
        ErrorObjectOwned::owned(-32000, "mine", None::<()>)
    }
}

impl S {
    #[idempotent]
    async fn send(&self, ext: &Extensions) -> Result<Replayable<u64>, MyError> {
        let _ = ext;
        Ok(1.into())
    }
}

fn main() {
    let _ = S.send(&Extensions::new());
}
