//! `#[idempotent]` in a crate whose `Cargo.toml` calls idem `idempotency`: nothing here may
//! name `::idem`, and the attribute is given no `crate = ...`.

use idempotency::{idempotent, Replayable};
use jsonrpsee::core::{async_trait, RpcResult};
use jsonrpsee::proc_macros::rpc;
use jsonrpsee::Extensions;
use serde_json::Value;

#[rpc(server)]
pub trait A2a {
    #[method(name = "message/send", with_extensions)]
    async fn send(&self, params: Value) -> RpcResult<Replayable<Value>>;
}

pub struct Echo;

#[async_trait]
impl A2aServer for Echo {
    #[idempotent]
    async fn send(&self, ext: &Extensions, params: Value) -> RpcResult<Replayable<Value>> {
        Ok(params.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Compiling is the test; the module is built so the guarded method is really used.
    #[test]
    fn the_guarded_method_is_registered_under_a_renamed_dependency() {
        let module = Echo.into_rpc();
        assert!(module.method_names().any(|name| name == "message/send"));
    }
}
