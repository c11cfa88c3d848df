//! The atomic claim: the operation that starts an execution.
//!
//! A claim either wins the key (and must complete or drop its ticket), or reports what holds it:
//! a live cached entry, or an execution in flight. In-flight executions are tracked in memory
//! under one mutex, and a winner re-reads the store after taking the key, so no check-then-act
//! gap exists: two concurrent claims of one key can never both win, and an entry committed just
//! before a claim is always seen. (One process serves a store file at a time.)

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::watch;

use crate::canonical_hash::RequestHash;
use crate::message_id::MessageId;
use crate::store::{Entry, Store, StoreError, StoredResponse};

/// The idempotency cache: a durable [`Store`] plus the executions in flight.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use idem_runtime::{Claim, IdempotencyCache, IdempotencyConfig, MessageId, SqliteStore, StoredResponse, request_hash};
/// let dir = tempfile::tempdir().unwrap();
/// let store = SqliteStore::open(dir.path().join("c.db"), &IdempotencyConfig::default()).unwrap();
/// let cache = IdempotencyCache::new(store);
/// let key = MessageId::parse_str("9b2e7c1a-3f4d-4e5a-8b6c-7d8e9f0a1b2c").unwrap();
/// let hash = request_hash(b"{}").unwrap();
/// let Claim::Execute(ticket) = cache.claim(&key, "message/send", &hash).await.unwrap() else { panic!() };
/// let body = br#"{"jsonrpc":"2.0","id":1,"result":{}}"#.to_vec();
/// ticket.complete(StoredResponse { status: 200, headers: vec![], body }).await.unwrap();
/// assert!(matches!(cache.claim(&key, "message/send", &hash).await.unwrap(), Claim::Cached(_)));
/// # }
/// ```
#[derive(Clone)]
pub struct IdempotencyCache {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn Store>,
    in_flight: Mutex<HashMap<MessageId, Flight>>,
}

/// An execution in flight, as the table holds it.
#[derive(Clone)]
struct Flight {
    method: String,
    request_hash: RequestHash,
    done: watch::Receiver<Option<Arc<Entry>>>,
    /// Live progress an executor shares with waiters (a stream's recording, for one).
    progress: Arc<Mutex<Option<Arc<dyn Any + Send + Sync>>>>,
}

/// The outcome of a claim.
pub enum Claim {
    /// The key is ours: run the call, then [`Ticket::complete`].
    Execute(Ticket),
    /// A live entry holds the key (it may answer another hash or method: the caller decides).
    Cached(Entry),
    /// Another call holds the key and is running.
    InFlight(InFlight),
}

impl IdempotencyCache {
    /// A cache over `store`.
    pub fn new(store: impl Store) -> Self {
        Self::from_arc(Arc::new(store))
    }

    /// A cache over a shared store.
    pub fn from_arc(store: Arc<dyn Store>) -> Self {
        Self {
            inner: Arc::new(Inner {
                store,
                in_flight: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// The durable store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    /// Claims `key` for a call of `method` whose params hash to `hash`.
    pub async fn claim(
        &self,
        key: &MessageId,
        method: &str,
        hash: &RequestHash,
    ) -> Result<Claim, StoreError> {
        // Most duplicates are retries of finished calls: answer them without touching the table.
        if let Some(entry) = self.inner.store.get(key).await? {
            return Ok(Claim::Cached(entry));
        }
        let ticket = match self.take(key, method, hash) {
            Ok(ticket) => ticket,
            Err(in_flight) => return Ok(Claim::InFlight(in_flight)),
        };
        // The entry may have been committed between our read and taking the key: read again.
        match self.inner.store.get(key).await? {
            Some(entry) => Ok(Claim::Cached(entry)),
            None => Ok(Claim::Execute(ticket)),
        }
    }

    /// Takes the key in the in-flight table, or reports who holds it. Atomic under the mutex.
    fn take(&self, key: &MessageId, method: &str, hash: &RequestHash) -> Result<Ticket, InFlight> {
        let mut table = self.inner.in_flight.lock().expect("in-flight lock");
        if let Some(flight) = table.get(key) {
            return Err(InFlight(flight.clone()));
        }
        let (done_tx, done) = watch::channel(None);
        let progress = Arc::new(Mutex::new(None));
        table.insert(
            key.clone(),
            Flight {
                method: method.to_owned(),
                request_hash: hash.clone(),
                done,
                progress: progress.clone(),
            },
        );
        Ok(Ticket {
            cache: Arc::downgrade(&self.inner),
            key: key.clone(),
            method: method.to_owned(),
            request_hash: hash.clone(),
            done: done_tx,
            progress,
        })
    }

    /// Runs [`Store::sweep`] every `interval` until the cache is dropped.
    pub fn spawn_sweeper(&self, interval: Duration) -> tokio::task::JoinHandle<()> {
        let weak = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(interval);
            ticks.tick().await;
            loop {
                ticks.tick().await;
                let Some(inner) = weak.upgrade() else { return };
                if let Err(e) = inner.store.sweep().await {
                    tracing::warn!(error = %e, "idempotency cache sweep failed");
                }
            }
        })
    }
}

/// The right and duty to execute a claimed call. Dropping it without completing releases the key
/// (waiters then claim again), so a cancelled or panicking caller never wedges the key.
pub struct Ticket {
    cache: Weak<Inner>,
    key: MessageId,
    method: String,
    request_hash: RequestHash,
    done: watch::Sender<Option<Arc<Entry>>>,
    progress: Arc<Mutex<Option<Arc<dyn Any + Send + Sync>>>>,
}

impl Ticket {
    /// Shares live progress with calls waiting on this one (see [`InFlight::progress`]).
    pub fn set_progress(&self, progress: Arc<dyn Any + Send + Sync>) {
        *self.progress.lock().expect("progress lock") = Some(progress);
    }

    /// Stores the outcome durably, then releases the key and hands the entry to the waiters.
    /// Returns only after the entry is committed.
    pub async fn complete(self, response: StoredResponse) -> Result<Entry, StoreError> {
        let cache = self.cache.upgrade().ok_or(StoreError::Closed)?;
        let entry = Entry {
            message_id: self.key.clone(),
            method: self.method.clone(),
            request_hash: self.request_hash.clone(),
            response,
            inserted_at: cache.store.now_seconds(),
        };
        cache.store.put(entry.clone()).await?;
        self.done.send_replace(Some(Arc::new(entry.clone())));
        Ok(entry)
        // Drop removes the key from the in-flight table, after the commit.
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if let Some(cache) = self.cache.upgrade() {
            cache
                .in_flight
                .lock()
                .expect("in-flight lock")
                .remove(&self.key);
        }
    }
}

/// A call that holds the key and is still running.
pub struct InFlight(Flight);

impl InFlight {
    /// The method the running call was made with.
    pub fn method(&self) -> &str {
        &self.0.method
    }

    /// The request hash of the running call.
    pub fn request_hash(&self) -> &RequestHash {
        &self.0.request_hash
    }

    /// Whether it answers a call of `method` whose params hash to `hash`.
    pub fn matches(&self, method: &str, hash: &RequestHash) -> bool {
        self.0.method == method && &self.0.request_hash == hash
    }

    /// Live progress the executor shares, if any.
    pub fn progress(&self) -> Option<Arc<dyn Any + Send + Sync>> {
        self.0.progress.lock().expect("progress lock").clone()
    }

    /// Waits, without polling, for the running call to finish, at most `bound`.
    /// `Ok(Some(entry))`: it finished and stored `entry`. `Ok(None)`: it gave up without an
    /// outcome (claim again). `Err(())`: still running after `bound`.
    pub async fn wait(mut self, bound: Duration) -> Result<Option<Arc<Entry>>, ()> {
        let finished = tokio::time::timeout(bound, self.0.done.wait_for(Option::is_some)).await;
        match finished {
            Err(_elapsed) => Err(()),
            Ok(Ok(entry)) => Ok(entry.clone()),
            Ok(Err(_released)) => Ok(None),
        }
    }
}
