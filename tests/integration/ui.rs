#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}

/// Compiled with the suite, so that `cargo clippy --all-targets -- -D warnings` sees what the
/// attribute makes of a body not written yet: `todo!()` is the user's to leave there, and a
/// lint of the expansion's (`diverging_sub_expression`) failed such a build (helper-92).
#[allow(dead_code)]
struct Unfinished;

impl Unfinished {
    #[allow(dead_code)]
    #[idem::idempotent]
    async fn send(
        &self,
        ext: &jsonrpsee::Extensions,
    ) -> jsonrpsee::core::RpcResult<idem::Replayable<u64>> {
        todo!()
    }
}
