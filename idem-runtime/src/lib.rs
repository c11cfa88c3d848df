//! Runtime of the A2A extension `idempotency/v1`.
//!
//! Everything that runs: the canonical request hash, the message-id check, the durable SQLite
//! store, the jsonrpsee HTTP and RPC layers, the guard that `#[idempotent]` expands to, and the
//! unit of work through which a call's database writes commit with its cache entry.

#![warn(missing_docs)]

mod activation;
mod cache;
mod canonical_hash;
mod canonical_pass;
mod clock;
mod config;
mod database;
mod error;
mod file_lock;
mod guard;
mod http_layer;
mod idempotency;
mod jcs;
mod key_index;
mod memory_tier;
mod message_id;
mod number_exactness;
#[cfg(feature = "postgres")]
mod postgres_listener;
#[cfg(feature = "postgres")]
mod postgres_store;
mod recording;
mod replayable;
mod rpc_layer;
mod scope;
mod sqlite_checkpointer;
mod sqlite_readers;
mod sqlite_store;
mod sqlite_writer;
mod sse;
mod store;
mod stream;
mod unary;
mod unit_of_work;

pub use activation::{is_activated, A2A_EXTENSIONS, X_A2A_EXTENSIONS};
pub use cache::{Claim, IdempotencyCache, InFlight, Progress, Ticket, Waited};
pub use canonical_hash::{
    canonical_json, canonical_params, hash_params, parse_params, request_hash, spelling, HashError,
    RequestHash, Spelling,
};
pub use clock::{Clock, ManualClock, SystemClock};
pub use config::{ConfigError, IdempotencyConfig, CLAIM_LEASE_ENV, MAX_ENTRIES_ENV, TTL_ENV};
pub use database::{Database, TransactError};
pub use error::{ErrorCode, IdempotencyError, EXTENSION_URI};
pub use guard::{CallContext, Guarded, Payload};
pub use http_layer::{HttpLayer, HttpService, IDEMPOTENT_REPLAYED};
pub use idempotency::{Idempotency, DEFAULT_GOVERNED_METHODS};
pub use message_id::{MessageId, MessageIdError, MessageIdPolicy};
#[cfg(feature = "postgres")]
pub use postgres_store::{PostgresOptions, PostgresStore};
pub use recording::MAX_RECORDED_STREAM_BYTES;
pub use replayable::Replayable;
pub use rpc_layer::{RpcLayer, RpcService};
/// The SQLite crate the staged writes are written with, re-exported so versions match.
pub use rusqlite;
pub use sqlite_store::SqliteStore;
pub use sse::EVENT_STREAM;
pub use store::{
    Acquired, Elsewhere, Entry, Found, Lease, OpenStream, ReadJob, Store, StoreError,
    StoredResponse,
};
pub use stream::EventStream;
pub use unit_of_work::{SqlWrite, UnitOfWork, WriteError};
/// The PostgreSQL crates the staged writes and the pool are written with, re-exported so
/// versions match.
#[cfg(feature = "postgres")]
pub use {deadpool_postgres, tokio_postgres};

/// What `#[idempotent]` expands to reaches the runtime only through here. Not a public API.
#[doc(hidden)]
pub mod __private {
    pub use crate::guard::guard;
}
