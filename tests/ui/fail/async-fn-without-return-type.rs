use idem::idempotent;
use jsonrpsee::Extensions;

struct S;

impl S {
    #[idempotent]
    async fn send(&self, ext: &Extensions) {}
}

fn main() {}
