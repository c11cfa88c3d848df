use idem::idempotent;

#[idempotent]
struct Handler {
    calls: u32,
}

fn main() {}
