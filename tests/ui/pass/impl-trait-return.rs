// A return type that holds an `impl Trait` compiles with the attribute as it does without it
// (the type cannot be written where the expansion pinned it: helper-92).
use idem::{idempotent, Replayable};
use jsonrpsee::core::RpcResult;
use jsonrpsee::Extensions;

struct S;

impl S {
    #[idempotent]
    async fn send(
        &self,
        ext: &Extensions,
    ) -> RpcResult<Replayable<impl serde::Serialize + Send + 'static>> {
        Ok(Replayable::from(1u64))
    }
}

fn main() {
    let _ = S.send(&Extensions::new());
}
