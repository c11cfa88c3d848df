//! The durable stores: one entry per message id, the claims of calls in flight, and the
//! application's writes that commit with them. [`SqliteStore`] is the embedded default (one
//! process per file); `PostgresStore` (feature `postgres`) serves replicas that share a
//! database; a custom backend implements [`Store`]. [`Database`] is the application's own way
//! to the store's database, for work that does not belong to one call.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! use idem_runtime::store::{SqliteStore, Store};
//! use idem_runtime::IdempotencyConfig;
//! let dir = tempfile::tempdir().unwrap();
//! let store = SqliteStore::open(dir.path().join("a2a.db"), &IdempotencyConfig::default()).unwrap();
//! assert_eq!(store.row_count().await.unwrap(), 0);
//! # }
//! ```

mod bounded_wait;
pub(crate) mod database;
mod entry;
mod error;
mod lease;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
mod redacted_url;
pub(crate) mod settings;
pub(crate) mod sqlite;
pub(crate) mod stats;
pub(crate) mod touches;
// The suite runs every test on both backends.
#[cfg(all(test, feature = "postgres"))]
mod tests;

pub use crate::unit_of_work::{SqlWrite, WriteError};
pub(crate) use bounded_wait::{after, at_most};
pub use database::{Database, TransactError};
#[cfg(feature = "postgres")]
pub(crate) use entry::stored_hash;
pub(crate) use entry::{expired_before, is_expired, EntryRow, OpenStreamRow, ReadAt};
pub use entry::{Entry, OpenStream, StoredResponse};
pub use error::{causes, StoreError};
pub use lease::Lease;
#[cfg(feature = "postgres")]
pub use postgres::{PostgresOptions, PostgresStore};
pub use redacted_url::redacted_url;
/// The SQLite crate the staged writes are written with, re-exported so versions match.
pub use rusqlite;
pub use sqlite::SqliteStore;
pub use stats::{StoreStats, TOP_METHODS};
/// The PostgreSQL crates the staged writes and the pool are written with, re-exported so
/// versions match.
#[cfg(feature = "postgres")]
pub use {deadpool_postgres, tokio_postgres};

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::hash::{Glimpse, RequestHash, Spelling};
use crate::message_id::MessageId;

/// What holds a key, as seen by the call that has just claimed it.
#[derive(Debug)]
pub enum Found {
    /// A live entry.
    Entry(Arc<Entry>),
    /// A stream whose recording stopped before it ended (its process died, or its store write
    /// failed): these events were recorded durably, in order.
    Interrupted(OpenStream, Vec<Bytes>),
    /// Nothing: the claimer executes.
    Nothing,
}

/// What a call that has taken its key in this process finds in the store, which every process
/// sharing it sees alike.
#[derive(Debug)]
pub enum Acquired {
    /// The key is this call's: it executes, and completes under this lease.
    Won(Lease),
    /// A live entry holds the key.
    Entry(Arc<Entry>),
    /// A stream whose recording stopped before it ended; the lease is this call's, to close it.
    Interrupted(Lease, OpenStream, Vec<Bytes>),
    /// Another process holds a live claim of the key and is executing it.
    Held {
        /// The method of the call it executes.
        method: String,
        /// The request hash of the call it executes.
        request_hash: RequestHash,
    },
}

/// What a wait on another process's execution saw.
#[derive(Debug)]
pub enum Elsewhere {
    /// It finished and stored this entry.
    Done(Arc<Entry>),
    /// It gave up, or its lease expired: claim again.
    Released,
    /// Still running after the bound.
    StillRunning,
}

/// A pending write's end: see [`Store::unsettled`].
pub type Settling = std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send>>;

/// What runs if writes a store gave up waiting for commit after all: see
/// [`Store::apply_or_later`].
pub type IfLate = Box<dyn FnOnce() + Send>;

/// A read on one of the store's read connections.
pub type ReadJob = Box<dyn FnOnce(&rusqlite::Connection) + Send>;

/// The durable cache. Every write returns only once its transaction has committed.
#[async_trait::async_trait]
pub trait Store: Send + Sync + 'static {
    /// The live entry for `key`: `None` when absent, expired (TTL, checked lazily) or evicted.
    /// A hit counts as a use for the LRU bound.
    async fn get(&self, key: &MessageId) -> Result<Option<Entry>, StoreError>;

    /// Like [`get`](Self::get), and also finds an interrupted stream: for the call that has
    /// just claimed `key`, so nothing else in this process is recording it.
    async fn lookup(&self, key: &MessageId) -> Result<Found, StoreError>;

    /// Claims `key` for a call of `method` whose params hash to `hash`, against every other
    /// process sharing the store: called once this process's own table has given the key to
    /// the call, so no other call of this process races it. `read_holds`: this process read
    /// `Found::Nothing` for the key since the last execution of it ended here.
    ///
    /// The default serves a store that one process owns: the process's table is the claim,
    /// and only what the store holds is left to read.
    async fn acquire(
        &self,
        key: &MessageId,
        _method: &str,
        _hash: &RequestHash,
        read_holds: bool,
    ) -> Result<Acquired, StoreError> {
        if read_holds {
            return Ok(Acquired::Won(Lease::exclusive()));
        }
        Ok(match self.lookup(key).await? {
            Found::Entry(entry) => Acquired::Entry(entry),
            Found::Interrupted(stream, events) => {
                Acquired::Interrupted(Lease::exclusive(), stream, events)
            }
            Found::Nothing => Acquired::Won(Lease::exclusive()),
        })
    }

    /// Gives up a claim that stored nothing (the call failed to store, or was cancelled):
    /// other processes waiting on it claim again. Never waits; a claim it cannot release at
    /// once expires with its lease.
    fn release(&self, _key: &MessageId, _lease: Lease) {}

    /// The method and request hash that a live open stream of `key` is bound to. Asked when a
    /// call of another payload holds the key in this process: it may be closing that stream as
    /// interrupted, whose outcome is then the key's, and the stream's retry must wait for it
    /// rather than meet the other payload's 422. `None` (the default) where this process's
    /// claim already holds such a key in the stream's name (its lookup finds the stream).
    async fn open_stream_binding(
        &self,
        _key: &MessageId,
    ) -> Result<Option<(String, RequestHash)>, StoreError> {
        Ok(None)
    }

    /// A write of `key` that this store stopped waiting for (the disk did not answer in time,
    /// or the call was cancelled) and that may still commit: it settles once the write has
    /// landed (`true`) or failed. The call's key stays held until then, so that no retry runs
    /// while the first call's writes may still commit. Asked once, by the call that gives up
    /// the key; `None` (the default) when no such write is pending.
    fn unsettled(&self, _key: &MessageId) -> Option<Settling> {
        None
    }

    /// Waits, at most `bound`, for another process's execution of `key` (reported as
    /// [`Acquired::Held`]) to store its entry or give up. Never called on a store that one
    /// process owns.
    async fn wait_elsewhere(
        &self,
        _key: &MessageId,
        _bound: Duration,
    ) -> Result<Elsewhere, StoreError> {
        Ok(Elsewhere::Released)
    }

    /// Who holds `key` in another process: the method and request hash of its live claim.
    async fn held_elsewhere(
        &self,
        _key: &MessageId,
    ) -> Result<Option<(String, RequestHash)>, StoreError> {
        Ok(None)
    }

    /// Applies the call's staged `writes` and stores `entry`, replacing any row for its key
    /// (an expired one, AC-3), in one transaction that ends the claim: all commit or nothing
    /// does, and nothing does unless `lease` still holds the key ([`StoreError::ClaimLost`]).
    /// Shared, not copied: the waiting duplicates are answered from the same entry.
    async fn put(
        &self,
        entry: Arc<Entry>,
        writes: Vec<SqlWrite>,
        lease: &Lease,
    ) -> Result<(), StoreError>;

    /// Applies a streaming call's staged `writes` and records the stream as open with its
    /// first event, in one transaction, fenced by `lease` as [`put`](Self::put) is.
    async fn open_stream(
        &self,
        stream: &OpenStream,
        first_event: Bytes,
        writes: Vec<SqlWrite>,
        lease: &Lease,
    ) -> Result<(), StoreError>;

    /// Records `events`, numbered from `first_seq` on (the stream's first event is 0), of an
    /// open stream in one transaction, all or none, and moves the record's
    /// [`OpenStream::recorded_at`] to now: left open, it expires a TTL after its last event.
    async fn append_events(
        &self,
        key: &MessageId,
        first_seq: u32,
        events: Vec<Bytes>,
        lease: &Lease,
    ) -> Result<(), StoreError>;

    /// Stores the finished stream's `entry`, drops its open record and ends the claim, in one
    /// transaction fenced by `lease`.
    async fn close_stream(&self, entry: Arc<Entry>, lease: &Lease) -> Result<(), StoreError>;

    /// Applies staged `writes` on their own (a call that is not deduplicated, or the
    /// application's own work), in one transaction.
    async fn apply(&self, writes: Vec<SqlWrite>) -> Result<(), StoreError>;

    /// [`apply`](Self::apply), for writes that work waits on (a unit of work's after-commit
    /// hooks): should the store stop waiting for them and fail (the disk did not answer in
    /// time) while they may still commit, `if_late` runs if they do. A store that cannot learn
    /// it (this default, and `PostgresStore`: a transaction whose commit went unanswered is
    /// not asked about again) drops `if_late` unrun.
    async fn apply_or_later(
        &self,
        writes: Vec<SqlWrite>,
        _if_late: IfLate,
    ) -> Result<(), StoreError> {
        self.apply(writes).await
    }

    /// Runs `job` on a read connection.
    async fn read(&self, job: ReadJob) -> Result<(), StoreError>;

    /// Deletes expired entries (and open streams older than the TTL); returns how many.
    async fn sweep(&self) -> Result<u64, StoreError>;

    /// How many rows the store holds (expired ones included until swept).
    async fn row_count(&self) -> Result<u64, StoreError>;

    /// What the store holds, in figures (the gauges, the admin tool's `stats`).
    async fn stats(&self) -> Result<StoreStats, StoreError>;

    /// Now, in Unix epoch seconds, by the store's clock (the `inserted_at` of a new entry).
    fn now_seconds(&self) -> u64;

    /// The live entry last answered to exactly these bytes (raw params, or a whole request),
    /// if this store keeps it in memory: a byte-identical retry, recognised without parsing or
    /// hashing canonically. The bytes are spelled (`spelling`, a SHA-256) only if their
    /// `glimpse` is one a remembered spelling has. Counts as a use, as [`get`](Self::get)
    /// does. Never waits.
    fn spelled(&self, _glimpse: Glimpse, _spelling: &dyn Fn() -> Spelling) -> Option<Arc<Entry>> {
        None
    }

    /// Remembers that each of `spellings` (the SHA-256 of some bytes, and their glimpse) asks
    /// for `answered`, the entry a lookup just gave: raw params whose request hash is the
    /// entry's, or a whole request that the entry's bytes answer. Nothing is noted once
    /// another entry of the key has replaced it.
    fn note_spellings(&self, _answered: &Entry, _spellings: &[(Glimpse, Spelling)]) {}

    /// Whether [`note_spellings`](Self::note_spellings) keeps anything: bytes are not spelled
    /// for a store that does not.
    fn keeps_spellings(&self) -> bool {
        false
    }

    /// The PostgreSQL pool the store commits through, for the application's own work.
    #[cfg(feature = "postgres")]
    fn postgres_pool(&self) -> Option<deadpool_postgres::Pool> {
        None
    }
}
