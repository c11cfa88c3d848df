use idem::idempotent;
use jsonrpsee::core::RpcResult;
use jsonrpsee::Extensions;

struct S;

impl S {
    #[idempotent]
    async fn send(&self, ext: &Extensions) -> RpcResult<u64> {
        let _ = ext;
        Ok(1)
    }
}

fn main() {
    let _ = S.send(&Extensions::new());
}
