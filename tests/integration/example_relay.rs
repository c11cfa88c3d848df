//! The example relay's own unit tests (the hand-out to its workers, the backoff), run here with
//! the files they live in: an example declared `test = true` is built by `cargo test` as a test
//! harness alone, and the server binary the other tests start was then never built.

#[allow(dead_code)]
#[path = "../../examples/a2a_server/relay/backoff.rs"]
mod backoff;
#[path = "../../examples/a2a_server/relay/hand_out.rs"]
mod hand_out;
#[allow(dead_code)]
#[path = "../../examples/a2a_server/tasks/pending.rs"]
mod pending;

use pending::Pending;
