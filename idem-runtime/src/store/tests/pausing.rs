//! A SQLite store whose n-th lookup waits until the test lets it go: a claim held between its
//! two reads, so that a test can move the clock or run another claim in that window.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::Notify;

use crate::message_id::MessageId;
use crate::store::{
    Entry, Found, IfLate, Lease, OpenStream, ReadJob, Settling, SqlWrite, SqliteStore, Store,
    StoreError, StoreStats,
};

pub struct Pausing {
    inner: Arc<SqliteStore>,
    lookups: AtomicUsize,
    pause_at: usize,
    /// Notified when the paused lookup has begun.
    pub paused: Notify,
    /// Notified by the test to let it go on.
    pub resume: Notify,
}

impl Pausing {
    /// `inner`, whose lookup number `pause_at` (from 0) waits for [`Pausing::resume`].
    pub fn new(inner: Arc<SqliteStore>, pause_at: usize) -> Arc<Self> {
        let lookups = AtomicUsize::new(0);
        let (paused, resume) = (Notify::new(), Notify::new());
        Arc::new(Self {
            inner,
            lookups,
            pause_at,
            paused,
            resume,
        })
    }
}

// `acquire` keeps the trait's default, which reads through `lookup`: this one.
#[async_trait::async_trait]
impl Store for Pausing {
    async fn get(&self, key: &MessageId) -> Result<Option<Entry>, StoreError> {
        self.inner.get(key).await
    }
    async fn lookup(&self, key: &MessageId) -> Result<Found, StoreError> {
        if self.lookups.fetch_add(1, Ordering::SeqCst) == self.pause_at {
            self.paused.notify_one();
            self.resume.notified().await;
        }
        self.inner.lookup(key).await
    }
    fn release(&self, key: &MessageId, lease: Lease) {
        self.inner.release(key, lease)
    }
    fn unsettled(&self, key: &MessageId) -> Option<Settling> {
        self.inner.unsettled(key)
    }
    async fn put(&self, e: Arc<Entry>, w: Vec<SqlWrite>, l: &Lease) -> Result<(), StoreError> {
        self.inner.put(e, w, l).await
    }
    async fn open_stream(
        &self,
        stream: &OpenStream,
        first: Bytes,
        writes: Vec<SqlWrite>,
        lease: &Lease,
    ) -> Result<(), StoreError> {
        self.inner.open_stream(stream, first, writes, lease).await
    }
    async fn append_events(
        &self,
        key: &MessageId,
        first_seq: u32,
        events: Vec<Bytes>,
        lease: &Lease,
    ) -> Result<(), StoreError> {
        self.inner
            .append_events(key, first_seq, events, lease)
            .await
    }
    async fn close_stream(&self, entry: Arc<Entry>, lease: &Lease) -> Result<(), StoreError> {
        self.inner.close_stream(entry, lease).await
    }
    async fn apply(&self, writes: Vec<SqlWrite>) -> Result<(), StoreError> {
        self.inner.apply(writes).await
    }
    async fn apply_or_later(&self, writes: Vec<SqlWrite>, late: IfLate) -> Result<(), StoreError> {
        self.inner.apply_or_later(writes, late).await
    }
    async fn read(&self, job: ReadJob) -> Result<(), StoreError> {
        self.inner.read(job).await
    }
    async fn sweep(&self) -> Result<u64, StoreError> {
        self.inner.sweep().await
    }
    async fn row_count(&self) -> Result<u64, StoreError> {
        self.inner.row_count().await
    }
    async fn stats(&self) -> Result<StoreStats, StoreError> {
        self.inner.stats().await
    }
    fn now_seconds(&self) -> u64 {
        self.inner.now_seconds()
    }
}
