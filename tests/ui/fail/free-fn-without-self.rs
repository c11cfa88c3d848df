use idem::{idempotent, Replayable};
use jsonrpsee::core::RpcResult;
use jsonrpsee::Extensions;

#[idempotent]
async fn send(_ext: &Extensions) -> RpcResult<Replayable<u64>> {
    Ok(1.into())
}

fn main() {}
