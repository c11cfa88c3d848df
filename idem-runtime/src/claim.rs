//! The atomic claim: the operation that starts an execution.
//!
//! A claim either wins the key (and must complete or drop its ticket), or reports what holds it:
//! a live cached entry, or an execution in flight. In-flight executions are tracked in memory
//! under one mutex, and a winner re-reads the store after taking the key, so no check-then-act
//! gap exists: two concurrent claims of one key can never both win, and an entry committed just
//! before a claim is always seen. One process serves a SQLite file; on PostgreSQL the store's
//! own claim, a fenced lease, arbitrates between processes. The runtime's own: the guard calls
//! it, and the store suite (`store/tests/`) drives the stores through it.

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::watch;

use crate::fingerprint::ByFingerprint;
use crate::hash::RequestHash;
use crate::message_id::MessageId;
use crate::store::{
    after, Acquired, Elsewhere, Entry, Found, Lease, OpenStream, Store, StoreError, StoredResponse,
};
use crate::unit_of_work::{Sealed, SqlWrite};

/// The idempotency cache: a durable [`Store`] plus the executions in flight.
#[derive(Clone)]
pub struct IdempotencyCache {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn Store>,
    in_flight: Mutex<Table>,
    /// How many executions are in flight, for [`IdempotencyCache::quiesce`].
    running: watch::Sender<usize>,
    /// The runtime of the first claim: where a ticket dropped outside any runtime (at
    /// shutdown) waits out a write the store gave up waiting for, and runs its hooks.
    runtime: std::sync::OnceLock<tokio::runtime::Handle>,
}

/// The executions in flight.
struct Table {
    flights: HashMap<MessageId, Flight, ByFingerprint>,
    /// How many executions have ended, per slot of keys. A claim that read the store, then
    /// took the key and finds its slot unchanged, knows that no execution of the key committed
    /// in between (entries are committed only by the ticket holder, before it releases), so
    /// its read still holds: a miss costs one read, not two. Another key of the same slot
    /// only costs a second read.
    releases: Vec<u64>,
}

const RELEASE_SLOTS: usize = 4096;

fn slot(key: &MessageId) -> usize {
    key.slot(RELEASE_SLOTS)
}

/// An execution in flight, as the table holds it.
#[derive(Clone)]
struct Flight {
    method: String,
    request_hash: RequestHash,
    phase: watch::Receiver<Phase>,
}

/// Where a running execution is; waiters watch it without polling.
#[derive(Clone)]
enum Phase {
    Running,
    /// Sharing live progress (a stream's recording, for one).
    Progressing(Progress),
    /// Stored: the entry that answers duplicates.
    Done(Arc<Entry>),
}

/// Live progress an executor shares with the calls that wait on it.
pub type Progress = Arc<dyn Any + Send + Sync>;

/// What a wait on a running execution saw.
pub enum Waited {
    /// It finished and stored this entry.
    Done(Arc<Entry>),
    /// It shares live progress (asked for with `attach`).
    Progressing(Progress),
    /// It gave up without an outcome: claim again.
    Released,
    /// Still running after the bound.
    StillRunning,
}

impl Waited {
    /// The `result` label of the in-flight wait metric.
    pub(crate) fn label(&self) -> &'static str {
        match self {
            Self::Done(_) => "done",
            Self::Progressing(_) => "attached",
            Self::Released => "released",
            Self::StillRunning => "still_running",
        }
    }
}

/// The outcome of a claim.
pub enum Claim {
    /// The key is ours: run the call, then [`Ticket::complete_with`].
    Execute(Ticket),
    /// A live entry holds the key (it may answer another hash or method: the caller decides).
    Cached(Arc<Entry>),
    /// Another call holds the key and is running.
    InFlight(InFlight),
}

impl IdempotencyCache {
    /// A cache over a shared store.
    pub fn from_arc(store: Arc<dyn Store>) -> Self {
        Self {
            inner: Arc::new(Inner {
                store,
                in_flight: Mutex::new(Table {
                    flights: HashMap::default(),
                    releases: vec![0; RELEASE_SLOTS],
                }),
                running: watch::Sender::new(0),
                runtime: std::sync::OnceLock::new(),
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
        let seen = self.releases(key);
        let found = self.inner.store.lookup(key).await?;
        if let Found::Entry(entry) = found {
            return Ok(Claim::Cached(entry));
        }
        self.note_runtime();
        // A stream a crash interrupted is the key's outcome whoever claims it: the key is held
        // in the stream's name while it is closed, so that its retry meanwhile waits for that
        // outcome instead of meeting this call's payload, a 422 (found by helper-52).
        let (bound_method, bound_hash) = match &found {
            Found::Interrupted(stream, _) => (stream.method.as_str(), &stream.request_hash),
            _ => (method, hash),
        };
        let (mut ticket, unchanged) = match self.take(key, bound_method, bound_hash, seen) {
            Ok(taken) => taken,
            Err(in_flight) => return self.held(key, method, hash, in_flight).await,
        };
        // An execution of the key may have committed its entry between our read and taking
        // the key (here, or in another process sharing the store): the store decides, and
        // reads again unless none of the key's slot ended meanwhile.
        let read_holds = matches!(found, Found::Nothing) && unchanged;
        let store = &self.inner.store;
        match store.acquire(key, method, hash, read_holds).await? {
            Acquired::Won(lease) => {
                // The stream that was found is gone (swept): the key is this call's.
                self.bind(&mut ticket, method, hash);
                ticket.lease = Some(lease);
                Ok(Claim::Execute(ticket))
            }
            Acquired::Entry(entry) => Ok(Claim::Cached(entry)),
            Acquired::Held {
                method,
                request_hash,
            } => Ok(Claim::InFlight(InFlight(Holder::Elsewhere {
                store: store.clone(),
                key: key.clone(),
                method,
                request_hash,
            }))),
            // Nobody records it any more (the key is ours): a retry must never execute again,
            // so the stream's outcome becomes what was recorded, then the interruption.
            Acquired::Interrupted(lease, stream, events) => {
                // Bound to the stream's own method and hash, not this claim's (which may be
                // the 422 the replay decides): not `ticket.close_stream`.
                self.bind(&mut ticket, &stream.method, &stream.request_hash);
                let entry = Arc::new(Entry {
                    message_id: stream.message_id.clone(),
                    method: stream.method.clone(),
                    request_hash: stream.request_hash.clone(),
                    response: crate::guard::stream::interrupted(&stream, events),
                    // Completed now (spec §4.3: inserted on completion), so it is replayed a
                    // whole TTL from here, as any entry is.
                    inserted_at: store.now_seconds(),
                });
                ticket.lease = Some(lease);
                store.close_stream(entry.clone(), ticket.lease()).await?;
                ticket.stored();
                tracing::warn!(message_id = %key, "a stream interrupted before its end is closed as interrupted");
                drop(ticket);
                Ok(Claim::Cached(entry))
            }
        }
    }

    /// How many executions of keys in `key`'s slot have ended so far.
    fn releases(&self, key: &MessageId) -> u64 {
        let table = self.inner.in_flight.lock().expect("in-flight lock");
        table.releases[slot(key)]
    }

    /// Records the runtime of the first claim made on one (`Inner::runtime`): a claim after
    /// that neither looks it up nor clones its handle.
    fn note_runtime(&self) {
        if self.inner.runtime.get().is_none() {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                let _ = self.inner.runtime.set(runtime);
            }
        }
    }

    /// Takes the key in the in-flight table, or reports who holds it. Atomic under the mutex.
    /// With the ticket: whether the key's slot saw no release since `seen`.
    fn take(
        &self,
        key: &MessageId,
        method: &str,
        hash: &RequestHash,
        seen: u64,
    ) -> Result<(Ticket, bool), InFlight> {
        let mut table = self.inner.in_flight.lock().expect("in-flight lock");
        if let Some(flight) = table.flights.get(key) {
            return Err(InFlight(Holder::Here(flight.clone())));
        }
        let unchanged = table.releases[slot(key)] == seen;
        let (phase_tx, phase) = watch::channel(Phase::Running);
        table.flights.insert(
            key.clone(),
            Flight {
                method: method.to_owned(),
                request_hash: hash.clone(),
                phase,
            },
        );
        // Only reaching zero wakes `quiesce`: a start needs no notification.
        self.inner.running.send_if_modified(|n| {
            *n += 1;
            false
        });
        let ticket = Ticket {
            cache: Arc::downgrade(&self.inner),
            key: key.clone(),
            method: method.to_owned(),
            request_hash: hash.clone(),
            phase: phase_tx,
            lease: None,
            after_commit: Mutex::new(None),
        };
        Ok((ticket, unchanged))
    }

    /// The key held here by `in_flight`, for a call of `method` whose params hash to `hash`:
    /// where it is another payload's claim, it may be closing an interrupted stream of the
    /// key, and then it holds the key in the stream's name ([`Store::open_stream_binding`]).
    async fn held(
        &self,
        key: &MessageId,
        method: &str,
        hash: &RequestHash,
        in_flight: InFlight,
    ) -> Result<Claim, StoreError> {
        if (in_flight.method(), in_flight.request_hash()) == (method, hash) {
            return Ok(Claim::InFlight(in_flight));
        }
        let store = &self.inner.store;
        if let Some((method, request_hash)) = store.open_stream_binding(key).await? {
            return Ok(Claim::InFlight(in_flight.bound_to(method, request_hash)));
        }
        // Read after the stream: a close that committed in between left its entry.
        Ok(match store.lookup(key).await? {
            Found::Entry(entry) => Claim::Cached(entry),
            _ => Claim::InFlight(in_flight),
        })
    }

    /// Binds the ticket's key in the in-flight table, and the ticket, to `method` and `hash`:
    /// what a call that finds the key held compares itself with.
    fn bind(&self, ticket: &mut Ticket, method: &str, hash: &RequestHash) {
        if (ticket.method.as_str(), &ticket.request_hash) == (method, hash) {
            return;
        }
        let mut table = self.inner.in_flight.lock().expect("in-flight lock");
        if let Some(flight) = table.flights.get_mut(&ticket.key) {
            flight.method = method.to_owned();
            flight.request_hash = hash.clone();
        }
        ticket.method = method.to_owned();
        ticket.request_hash = hash.clone();
    }

    /// Who holds `key`: the method and request hash of the call in flight, or of the live
    /// entry. `None` when the key is free.
    pub async fn holder(
        &self,
        key: &MessageId,
    ) -> Result<Option<(String, RequestHash)>, StoreError> {
        let running = self
            .inner
            .in_flight
            .lock()
            .expect("in-flight lock")
            .flights
            .get(key)
            .cloned();
        if let Some(flight) = running {
            return Ok(Some((flight.method, flight.request_hash)));
        }
        if let Some(entry) = self.inner.store.get(key).await? {
            return Ok(Some((entry.method, entry.request_hash)));
        }
        self.inner.store.held_elsewhere(key).await
    }

    /// Waits until no execution is in flight (each stored or released), at most `bound`:
    /// for a clean shutdown, after the server stopped taking calls. `true` if none is left.
    pub async fn quiesce(&self, bound: Duration) -> bool {
        let mut running = self.inner.running.subscribe();
        let quiet = tokio::time::timeout(bound, running.wait_for(|n| *n == 0)).await;
        quiet.is_ok()
    }

    /// Runs [`Store::sweep`] every `interval` until the cache is dropped. The store's figures
    /// are read at once too, so that its gauges do not wait a whole interval for a value.
    pub fn spawn_sweeper(&self, interval: Duration) -> tokio::task::JoinHandle<()> {
        let weak = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(interval);
            ticks.tick().await;
            if let Some(inner) = weak.upgrade() {
                figures(inner.store.as_ref()).await;
            }
            loop {
                ticks.tick().await;
                let Some(inner) = weak.upgrade() else { return };
                sweep(inner.store.as_ref()).await;
            }
        })
    }
}

/// One sweep, measured: its duration, what it deleted, and the store's figures after it.
async fn sweep(store: &dyn Store) {
    let started = std::time::Instant::now();
    match store.sweep().await {
        Ok(deleted) => crate::telemetry::evicted("ttl", deleted),
        Err(e) => tracing::warn!(error = %e, "idempotency cache sweep failed"),
    }
    crate::telemetry::swept(started.elapsed());
    figures(store).await;
}

/// The store's size, read into its gauges.
async fn figures(store: &dyn Store) {
    match store.stats().await {
        Ok(stats) => crate::telemetry::sized(&stats),
        Err(e) => tracing::warn!(error = %e, "idempotency cache figures could not be read"),
    }
}

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
    /// `sealed`'s hooks run once the writes of this call's next commit (its entry, or its
    /// stream's start) are durable; never if they are not.
    pub(crate) fn after_commit(&mut self, sealed: Sealed) {
        *self.hooks() = Some(sealed);
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
    fn lease(&self) -> &Lease {
        self.lease.as_ref().expect("a ticket holds its lease")
    }

    /// The outcome is stored, and the store ended the claim with it: nothing to release.
    fn stored(&mut self) {
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
fn release(cache: &Inner, key: &MessageId, lease: Option<Lease>) {
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

/// A call that holds the key and is still running.
pub struct InFlight(Holder);

/// Where the running call is.
enum Holder {
    /// In this process: its phase is watched.
    Here(Flight),
    /// In another process sharing the store: the store waits for it.
    Elsewhere {
        store: Arc<dyn Store>,
        key: MessageId,
        method: String,
        request_hash: RequestHash,
    },
}

impl InFlight {
    /// The same holder, answering for the call of `method` with `request_hash`.
    fn bound_to(self, method: String, request_hash: RequestHash) -> Self {
        InFlight(match self.0 {
            Holder::Here(flight) => Holder::Here(Flight {
                method,
                request_hash,
                ..flight
            }),
            Holder::Elsewhere { store, key, .. } => Holder::Elsewhere {
                store,
                key,
                method,
                request_hash,
            },
        })
    }

    /// The method the running call was made with.
    pub fn method(&self) -> &str {
        match &self.0 {
            Holder::Here(flight) => &flight.method,
            Holder::Elsewhere { method, .. } => method,
        }
    }

    /// The request hash of the running call.
    pub fn request_hash(&self) -> &RequestHash {
        match &self.0 {
            Holder::Here(flight) => &flight.request_hash,
            Holder::Elsewhere { request_hash, .. } => request_hash,
        }
    }

    /// Whether it answers a call of `method` whose params hash to `hash`.
    // Only the store suite, which runs on both backends, calls it.
    #[cfg(all(test, feature = "postgres"))]
    pub fn matches(&self, method: &str, hash: &RequestHash) -> bool {
        self.method() == method && self.request_hash() == hash
    }

    /// Waits, without polling, at most `bound`, for the running call to finish or, with
    /// `attach`, to share live progress (only a call in this process shares it).
    pub async fn wait(self, bound: Duration, attach: bool) -> Waited {
        match self.0 {
            Holder::Here(flight) => wait_here(flight, bound, attach).await,
            Holder::Elsewhere { store, key, .. } => match store.wait_elsewhere(&key, bound).await {
                Ok(Elsewhere::Done(entry)) => Waited::Done(entry),
                Ok(Elsewhere::StillRunning) => Waited::StillRunning,
                // A store that cannot be read is met again, and answered, by the next claim.
                Ok(Elsewhere::Released) | Err(_) => Waited::Released,
            },
        }
    }
}

async fn wait_here(mut flight: Flight, bound: Duration, attach: bool) -> Waited {
    let seen = tokio::time::timeout(
        bound,
        flight.phase.wait_for(|phase| match phase {
            Phase::Running => false,
            Phase::Progressing(_) => attach,
            Phase::Done(_) => true,
        }),
    )
    .await;
    match seen {
        Err(_elapsed) => Waited::StillRunning,
        Ok(Err(_released)) => Waited::Released,
        Ok(Ok(phase)) => match &*phase {
            Phase::Done(entry) => Waited::Done(entry.clone()),
            Phase::Progressing(progress) => Waited::Progressing(progress.clone()),
            Phase::Running => Waited::StillRunning,
        },
    }
}
