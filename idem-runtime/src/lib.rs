//! Runtime of the A2A extension `idempotency/v1`.
//!
//! Everything that runs: the canonical request hash, the message-id check, the durable SQLite
//! store, the jsonrpsee HTTP and RPC layers, the guard that `#[idempotent]` expands to, and the
//! unit of work through which a call's database writes commit with its cache entry.

#![warn(missing_docs)]

// The request's path, in the order it runs: the HTTP layer and the RPC layer (`layers/`), the
// guard that `#[idempotent]` expands to (`guard/`), the claim (`claim/`), the store
// (`store/`, one folder per backend). `hash/` and `message_id.rs` turn a request into its key
// and hash; `idempotency.rs` builds it all, `state.rs` is what the parts share.
pub mod admin;
mod caller;
mod claim;
mod clock;
pub mod config;
mod error;
mod fingerprint;
mod guard;
pub mod hash;
mod idempotency;
pub mod layers;
pub mod message_id;
mod state;
pub mod store;
pub mod telemetry;
mod unit_of_work;
mod wire;

pub use caller::Caller;
pub use config::IdempotencyConfig;
pub use error::{ErrorCode, IdempotencyError};
pub use guard::replayable::Replayable;
pub use guard::stream::EventStream;
pub use idempotency::{Idempotency, IdempotencyBuilder};
pub use unit_of_work::UnitOfWork;

/// Clocks: the system's, and a manual one that tests advance by hand (TTL and LRU by the
/// store's clock).
///
/// ```
/// use idem_runtime::testing::{Clock, ManualClock};
/// use std::time::Duration;
/// let clock = ManualClock::new(1_800_000_000_000);
/// clock.advance(Duration::from_secs(61));
/// assert_eq!(clock.now_seconds(), 1_800_000_061);
/// ```
pub mod testing {
    pub use crate::clock::{Clock, ManualClock, SystemClock};
}

/// What `#[idempotent]` expands to reaches the runtime only through here. Not a public API.
#[doc(hidden)]
pub mod __private {
    pub use crate::guard::{guard, once, CallContext, Guard, Guarded};
}
