//! What the guard stores: one entry per message id, and the durable `Store` that keeps them.

use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;

use crate::canonical_hash::{RequestHash, Spelling};
use crate::message_id::MessageId;
use crate::unit_of_work::{SqlWrite, WriteError};

/// A cached outcome (spec §4.4), bound to the method and the request hash it answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The idempotency key.
    pub message_id: MessageId,
    /// The JSON-RPC method the key is bound to: reuse under another method is a collision.
    pub method: String,
    /// SHA-256 of the canonical params.
    pub request_hash: RequestHash,
    /// What was answered.
    pub response: StoredResponse,
    /// Unix epoch seconds.
    pub inserted_at: u64,
}

/// The response as it was sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    /// HTTP status code.
    pub status: u16,
    /// Response headers that belong to the outcome (e.g. `content-type`).
    pub headers: Vec<(String, String)>,
    /// Raw response bytes.
    pub body: Vec<u8>,
}

impl Entry {
    /// Whether this entry answers a call of `method` whose params hash to `hash`.
    pub fn matches(&self, method: &str, hash: &RequestHash) -> bool {
        self.method == method && &self.request_hash == hash
    }
}

/// A stream being recorded: the durable record of a call whose side effects are committed and
/// whose response is still being produced (kept apart from the §4.4 table of completed entries).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenStream {
    /// The idempotency key.
    pub message_id: MessageId,
    /// The JSON-RPC method of the call.
    pub method: String,
    /// SHA-256 of the canonical params.
    pub request_hash: RequestHash,
    /// The call's JSON-RPC `id`, as JSON text: the terminal event of an interrupted stream
    /// carries it, as every recorded event does.
    pub jsonrpc_id: String,
    /// Unix epoch seconds: the `inserted_at` of the entry it becomes.
    pub started_at: u64,
}

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

    /// Applies the call's staged `writes` and stores `entry`, replacing any row for its key
    /// (an expired one, AC-3), in one transaction: both commit or neither does. Shared, not
    /// copied: the waiting duplicates are answered from the same entry.
    async fn put(&self, entry: Arc<Entry>, writes: Vec<SqlWrite>) -> Result<(), StoreError>;

    /// Applies a streaming call's staged `writes` and records the stream as open with its
    /// first event, in one transaction.
    async fn open_stream(
        &self,
        stream: &OpenStream,
        first_event: Bytes,
        writes: Vec<SqlWrite>,
    ) -> Result<(), StoreError>;

    /// Records event number `seq` (the first is 0) of an open stream.
    async fn append_event(&self, key: &MessageId, seq: u32, event: Bytes)
        -> Result<(), StoreError>;

    /// Stores the finished stream's `entry` and drops its open record, in one transaction.
    async fn close_stream(&self, entry: Arc<Entry>) -> Result<(), StoreError>;

    /// Applies staged `writes` on their own (a call that is not deduplicated, or the
    /// application's own work), in one transaction.
    async fn apply(&self, writes: Vec<SqlWrite>) -> Result<(), StoreError>;

    /// Runs `job` on a read connection.
    async fn read(&self, job: ReadJob) -> Result<(), StoreError>;

    /// Deletes expired entries (and open streams older than the TTL); returns how many.
    async fn sweep(&self) -> Result<u64, StoreError>;

    /// How many rows the store holds (expired ones included until swept).
    async fn row_count(&self) -> Result<u64, StoreError>;

    /// Now, in Unix epoch seconds, by the store's clock (the `inserted_at` of a new entry).
    fn now_seconds(&self) -> u64;

    /// The live entry last answered to exactly these bytes (raw params, or a whole request),
    /// if this store keeps it in memory: a byte-identical retry, recognised without parsing or
    /// hashing canonically. Counts as a use, as [`get`](Self::get) does. Never waits.
    fn spelled(&self, _spelling: &Spelling) -> Option<Arc<Entry>> {
        None
    }

    /// Remembers that the bytes spelled `spelling` ask for `key`'s entry (raw params whose
    /// request hash is the entry's, or a whole request that the entry's bytes answer).
    fn note_spelling(&self, _key: &MessageId, _spelling: Spelling) {}
}

/// The store failed; the guard answers -32603 rather than pretend an outcome is cached.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("sqlite: {0}")]
    /// SQLite refused an operation.
    Sqlite(#[from] rusqlite::Error),
    #[error("io: {0}")]
    /// The database file could not be created or opened.
    Io(#[from] std::io::Error),
    #[error("the store is closed")]
    /// The store was closed; nothing more is written.
    Closed,
    #[error("commit failed: {0}")]
    /// A write transaction failed; nothing in it was stored.
    Commit(String),
    #[error("a staged write failed: {0}")]
    /// A write the call staged refused; nothing of the call was stored.
    Write(WriteError),
    #[error(
        "database {} is already served by process {pid} (it holds the lock on {}); \
         one process serves a database file at a time",
        path.display(),
        lock.display()
    )]
    /// Another live process serves the database file (it holds its lock).
    InUse {
        /// The database file.
        path: PathBuf,
        /// The lock file.
        lock: PathBuf,
        /// The process that holds the lock, as it wrote it in the lock file.
        pid: String,
    },
    #[error("corrupt row for {message_id}: {detail}")]
    /// A row that cannot be read back as an entry.
    Corrupt {
        /// The row's key.
        message_id: String,
        /// Which column is wrong.
        detail: String,
    },
}
