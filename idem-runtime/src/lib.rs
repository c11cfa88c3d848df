//! Runtime of the A2A extension `idempotency/v1`.
//!
//! Everything that runs: the canonical request hash, the message-id check, the durable SQLite
//! store, the jsonrpsee HTTP and RPC layers, the guard that `#[idempotent]` expands to, and the
//! unit of work through which a call's database writes commit with its cache entry.

#![warn(missing_docs)]

// The request's path, in the order it runs: the HTTP layer and the RPC layer (`layers/`), the
// guard that `#[idempotent]` expands to (`guard/`), the claim (`claim.rs`), the store
// (`store/`, one folder per backend). `hash/` and `message_id.rs` turn a request into its key
// and hash; `idempotency.rs` builds it all, `state.rs` is what the parts share.
mod claim;
mod clock;
mod config;
mod error;
mod guard;
mod hash;
mod idempotency;
mod layers;
mod message_id;
mod state;
mod store;
mod unit_of_work;
mod wire;

pub use claim::{Claim, IdempotencyCache, InFlight, Progress, Ticket, Waited};
pub use clock::{Clock, ManualClock, SystemClock};
pub use config::{ConfigError, IdempotencyConfig, CLAIM_LEASE_ENV, MAX_ENTRIES_ENV, TTL_ENV};
pub use error::{ErrorCode, IdempotencyError, EXTENSION_URI};
pub use guard::recording::MAX_RECORDED_STREAM_BYTES;
pub use guard::replayable::Replayable;
pub use guard::sse::EVENT_STREAM;
pub use guard::stream::EventStream;
pub use guard::{CallContext, Guarded};
pub use hash::{
    canonical_json, canonical_params, hash_params, parse_params, request_hash, spelling, HashError,
    RequestHash, Spelling,
};
pub use idempotency::{Idempotency, DEFAULT_GOVERNED_METHODS};
pub use layers::activation::{is_activated, A2A_EXTENSIONS, X_A2A_EXTENSIONS};
pub use layers::http::{HttpLayer, HttpService, IDEMPOTENT_REPLAYED};
pub use layers::rpc::{RpcLayer, RpcService};
pub use message_id::{MessageId, MessageIdError, MessageIdPolicy};
/// The SQLite crate the staged writes are written with, re-exported so versions match.
pub use rusqlite;
pub use store::database::{Database, TransactError};
#[cfg(feature = "postgres")]
pub use store::postgres::{PostgresOptions, PostgresStore};
pub use store::sqlite::SqliteStore;
pub use store::{
    Acquired, Elsewhere, Entry, Found, Lease, OpenStream, ReadJob, Store, StoreError,
    StoredResponse,
};
pub use unit_of_work::{SqlWrite, UnitOfWork, WriteError};
pub use wire::Payload;
/// The PostgreSQL crates the staged writes and the pool are written with, re-exported so
/// versions match.
#[cfg(feature = "postgres")]
pub use {deadpool_postgres, tokio_postgres};

/// What `#[idempotent]` expands to reaches the runtime only through here. Not a public API.
#[doc(hidden)]
pub mod __private {
    pub use crate::guard::guard;
}
