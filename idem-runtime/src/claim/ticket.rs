//! The ticket: the right and duty to execute a claimed call, and what its end releases.

use std::sync::{Arc, Mutex, Weak};

use tokio::sync::watch;

use crate::claim::in_flight::{Phase, Progress};
use crate::claim::{slot, Inner};
use crate::hash::RequestHash;
use crate::message_id::MessageId;
use crate::store::{after, Entry, Lease, OpenStream, Store, StoreError, StoredResponse};
use crate::unit_of_work::{Sealed, SqlWrite};

/// The right and duty to execute a claimed call. Dropping it without completing releases the key
/// (waiters then claim again), so a cancelled or panicking caller never wedges the key; only a
/// write the store gave up waiting for keeps it held, until that write lands or fails.
pub struct Ticket {
    cache: Weak<Inner>,
    key: MessageId,
    method: String,
    request_hash: RequestHash,
    phase: watch::Sender<Phase>,
    /// The store's claim, once won; taken when the call's outcome ended it.
    lease: Option<Lease>,
    /// What the call's unit of work runs once its staged writes are durable: run by what
    /// sees them commit (the call itself, or the drop that waits out a write the store gave
    /// up waiting for and that lands after all). In a mutex only so that a `&Ticket` is `Send`
    /// (the recorder awaits with one); `&mut self` reaches it without locking.
    after_commit: Mutex<Option<Sealed>>,
}

impl Ticket {
    /// The ticket of a call of `method` whose params hash to `hash`, which has just taken
    /// `key` in `cache`'s table; `phase` tells its waiters where it is.
    pub(super) fn new(
        cache: &Arc<Inner>,
        key: &MessageId,
        method: &str,
        hash: &RequestHash,
        phase: watch::Sender<Phase>,
    ) -> Self {
        Self {
            cache: Arc::downgrade(cache),
            key: key.clone(),
            method: method.to_owned(),
            request_hash: hash.clone(),
            phase,
            lease: None,
            after_commit: Mutex::new(None),
        }
    }

    /// The store's claim of the key is this ticket's.
    pub(super) fn won(&mut self, lease: Lease) {
        self.lease = Some(lease);
    }

    /// Binds the key in the in-flight table, and the ticket, to `method` and `hash`: what a
    /// call that finds the key held compares itself with. Calls already waiting compared
    /// themselves with the old binding: they are released (a new phase channel, the old one's
    /// sender dropped) to claim again and meet the new one, where they would have attached to,
    /// or been answered by, another payload's execution (found by helper-84).
    pub(super) fn bind(&mut self, method: &str, hash: &RequestHash) {
        if (self.method.as_str(), &self.request_hash) == (method, hash) {
            return;
        }
        if let Some(cache) = self.cache.upgrade() {
            let mut table = cache.in_flight.lock().expect("in-flight lock");
            if let Some(flight) = table.flights.get_mut(&self.key) {
                flight.method = method.to_owned();
                flight.request_hash = hash.clone();
                let (phase, watched) = watch::channel(Phase::Running);
                flight.phase = watched;
                self.phase = phase;
            }
        }
        self.method = method.to_owned();
        self.request_hash = hash.clone();
    }

    /// The writes of `sealed`, the call's unit of work, for this call's next commit (its
    /// entry, or its stream's start); its hooks run once those are durable, never if they
    /// are not.
    pub(crate) fn commits(&mut self, mut sealed: Sealed) -> Vec<SqlWrite> {
        let writes = sealed.take_writes();
        *self.hooks() = Some(sealed);
        writes
    }

    fn hooks(&mut self) -> &mut Option<Sealed> {
        self.after_commit
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Shares live progress with the calls waiting on this one, and wakes those that attach.
    pub fn set_progress(&self, progress: Progress) {
        self.phase.send_replace(Phase::Progressing(progress));
    }

    /// Stops sharing progress that ends in a failure no retry should get: calls that wait from
    /// now on wait for the key (those already attached have what they read).
    pub(crate) fn withdraw_progress(&self) {
        self.phase.send_replace(Phase::Running);
    }

    /// Stores the outcome durably, then releases the key and hands the entry to the waiters.
    /// Returns only after the entry is committed.
    // Only the store suite, which runs on both backends, calls it.
    #[cfg(all(test, feature = "postgres"))]
    pub async fn complete(self, response: StoredResponse) -> Result<Arc<Entry>, StoreError> {
        self.complete_with(response, Vec::new()).await
    }

    /// Stores the outcome durably with the call's staged `writes`, in one transaction (both
    /// are stored or neither is), then releases the key and hands the entry to the waiters.
    /// Returns the entry as stored, only after it is committed.
    pub async fn complete_with(
        mut self,
        response: StoredResponse,
        writes: Vec<SqlWrite>,
    ) -> Result<Arc<Entry>, StoreError> {
        let (store, entry) = self.entry(response)?;
        store.put(entry.clone(), writes, self.lease()).await?;
        self.stored();
        self.phase.send_replace(Phase::Done(entry.clone()));
        let hooks = self.hooks().take();
        // Removes the key from the in-flight table, after the commit.
        drop(self);
        if let Some(hooks) = hooks {
            hooks.committed();
        }
        Ok(entry)
    }

    /// Commits a stream's staged `writes` with the durable record that it runs and its first
    /// event. `jsonrpc_id` is the call's id as JSON text.
    pub async fn open_stream(
        &mut self,
        jsonrpc_id: String,
        first_event: bytes::Bytes,
        writes: Vec<SqlWrite>,
    ) -> Result<(), StoreError> {
        let store = self.store()?;
        let stream = OpenStream {
            message_id: self.key.clone(),
            method: self.method.clone(),
            request_hash: self.request_hash.clone(),
            jsonrpc_id,
            recorded_at: store.now_seconds(),
        };
        store
            .open_stream(&stream, first_event, writes, self.lease())
            .await?;
        if let Some(hooks) = self.hooks().take() {
            hooks.committed();
        }
        Ok(())
    }

    /// Records `events`, numbered from `first_seq` on, of the open stream durably, in one
    /// transaction.
    pub async fn append_events(
        &self,
        first_seq: u32,
        events: Vec<bytes::Bytes>,
    ) -> Result<(), StoreError> {
        if events.is_empty() {
            return Ok(());
        }
        let store = self.store()?;
        store
            .append_events(&self.key, first_seq, events, self.lease())
            .await
    }

    /// Stores the finished stream as the entry and drops its open record, in one transaction.
    pub async fn close_stream(mut self, response: StoredResponse) -> Result<(), StoreError> {
        let (store, entry) = self.entry(response)?;
        store.close_stream(entry.clone(), self.lease()).await?;
        self.stored();
        self.phase.send_replace(Phase::Done(entry));
        Ok(())
    }

    /// The key it holds.
    pub(crate) fn key(&self) -> &MessageId {
        &self.key
    }

    /// The store's claim: a ticket is handed out only once it is won.
    pub(super) fn lease(&self) -> &Lease {
        self.lease.as_ref().expect("a ticket holds its lease")
    }

    /// The outcome is stored, and the store ended the claim with it: nothing to release.
    pub(super) fn stored(&mut self) {
        self.lease = None;
    }

    fn store(&self) -> Result<Arc<dyn Store>, StoreError> {
        let cache = self.cache.upgrade().ok_or(StoreError::Closed)?;
        Ok(cache.store.clone())
    }

    fn entry(&self, response: StoredResponse) -> Result<(Arc<dyn Store>, Arc<Entry>), StoreError> {
        let store = self.store()?;
        let entry = Arc::new(Entry {
            message_id: self.key.clone(),
            method: self.method.clone(),
            request_hash: self.request_hash.clone(),
            response,
            // On completion (spec §4.3), a stream's too: its TTL runs from its end.
            inserted_at: store.now_seconds(),
        });
        Ok((store, entry))
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let Some(cache) = self.cache.upgrade() else {
            return;
        };
        let lease = self.lease.take();
        // Nothing stored: a write the store gave up waiting for may still commit. Until it
        // settles the key stays held, and its waiters wait, or a retry would run it again.
        let unsettled = match &lease {
            Some(_) => cache.store.unsettled(&self.key),
            None => None,
        };
        let Some(settling) = unsettled else {
            return release(&cache, &self.key, lease);
        };
        // A stream's recording ended with the failure: retries wait, not attach to it.
        self.phase.send_replace(Phase::Running);
        let held = Held {
            cache,
            key: self.key.clone(),
            lease,
            after_commit: self.hooks().take(),
            _phase: std::mem::replace(&mut self.phase, watch::Sender::new(Phase::Running)),
        };
        tracing::warn!(message_id = %held.key, "the key stays held until the store answers its write");
        let runtime = held.cache.runtime.get().cloned();
        after(settling, runtime.as_ref(), move |landed| {
            held.settled(landed)
        });
    }
}

/// Ends an execution of `key`: the store's claim, then this process's.
pub(super) fn release(cache: &Inner, key: &MessageId, lease: Option<Lease>) {
    if let Some(lease) = lease {
        cache.store.release(key, lease);
    }
    let mut table = cache.in_flight.lock().expect("in-flight lock");
    table.flights.remove(key);
    table.releases[slot(key)] += 1;
    drop(table);
    cache.running.send_if_modified(|n| {
        *n -= 1;
        *n == 0
    });
}

/// A key kept held after its call ended, while a write of it may still commit. Dropped (the
/// write settled, or the wait was cancelled at shutdown), it releases the key, and then its
/// waiters, which claim again.
struct Held {
    cache: Arc<Inner>,
    key: MessageId,
    lease: Option<Lease>,
    after_commit: Option<Sealed>,
    /// Kept only to be dropped last: its waiters wake once the key is free.
    _phase: watch::Sender<Phase>,
}

impl Held {
    fn settled(mut self, landed: bool) {
        match self.after_commit.take() {
            Some(hooks) if landed => hooks.committed(),
            _ => {}
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        release(&self.cache, &self.key, self.lease.take());
    }
}
