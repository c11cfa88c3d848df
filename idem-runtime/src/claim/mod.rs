//! The atomic claim: the operation that starts an execution.
//!
//! A claim either wins the key (and must complete or drop its ticket), or reports what holds it:
//! a live cached entry, or an execution in flight. In-flight executions are tracked in memory
//! under one mutex, and a winner re-reads the store after taking the key, so no check-then-act
//! gap exists: two concurrent claims of one key can never both win, and an entry committed just
//! before a claim is always seen. One process serves a SQLite file; on PostgreSQL the store's
//! own claim, a fenced lease, arbitrates between processes. The runtime's own: the guard calls
//! it, and the store suite (`store/tests/`) drives the stores through it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use crate::fingerprint::ByFingerprint;
use crate::hash::RequestHash;
use crate::message_id::MessageId;
use crate::store::{Acquired, Entry, Found, Store, StoreError};

mod in_flight;
mod ticket;

use in_flight::{Flight, Holder, Phase};
pub use in_flight::{InFlight, Progress, Waited};
pub use ticket::Ticket;

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
                ticket.bind(method, hash);
                ticket.won(lease);
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
                ticket.bind(&stream.method, &stream.request_hash);
                let entry = Arc::new(Entry {
                    message_id: stream.message_id.clone(),
                    method: stream.method.clone(),
                    request_hash: stream.request_hash.clone(),
                    response: crate::guard::stream::interrupted(&stream, events),
                    // Completed now (spec §4.3: inserted on completion), so it is replayed a
                    // whole TTL from here, as any entry is.
                    inserted_at: store.now_seconds(),
                });
                ticket.won(lease);
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
        let ticket = Ticket::new(&self.inner, key, method, hash, phase_tx);
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
