//! What the guard stores: one entry per message id, and the durable `Store` that keeps them.

use std::sync::Arc;

use crate::canonical_hash::RequestHash;
use crate::message_id::MessageId;

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

/// The durable cache. Implementations must commit an entry before `put` returns.
#[async_trait::async_trait]
pub trait Store: Send + Sync + 'static {
    /// The live entry for `key`: `None` when absent, expired (TTL, checked lazily) or evicted.
    /// A hit counts as a use for the LRU bound.
    async fn get(&self, key: &MessageId) -> Result<Option<Entry>, StoreError>;

    /// Stores `entry` durably, replacing any row for its key (an expired one, AC-3).
    /// Returns only once the transaction has committed. Shared, not copied: the waiting
    /// duplicates are answered from the same entry.
    async fn put(&self, entry: Arc<Entry>) -> Result<(), StoreError>;

    /// Deletes expired entries; returns how many.
    async fn sweep(&self) -> Result<u64, StoreError>;

    /// How many rows the store holds (expired ones included until swept).
    async fn row_count(&self) -> Result<u64, StoreError>;

    /// Now, in Unix epoch seconds, by the store's clock (the `inserted_at` of a new entry).
    fn now_seconds(&self) -> u64;
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
    #[error("corrupt row for {message_id}: {detail}")]
    /// A row that cannot be read back as an entry.
    Corrupt {
        /// The row's key.
        message_id: String,
        /// Which column is wrong.
        detail: String,
    },
}
