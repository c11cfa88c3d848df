//! The durable stores: one entry per message id, the claims of calls in flight, and the
//! application's writes that commit with them. [`SqliteStore`] is the embedded default (one
//! process per file); [`PostgresStore`] serves replicas that share a database; a custom
//! backend implements [`Store`]. [`Database`] is the application's own way to the store's
//! database, for work that does not belong to one call.
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

pub(crate) mod database;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
pub(crate) mod settings;
pub(crate) mod sqlite;
pub(crate) mod stats;
// The suite runs every test on both backends.
#[cfg(all(test, feature = "postgres"))]
mod tests;

pub use crate::unit_of_work::{SqlWrite, WriteError};
pub use database::{Database, TransactError};
#[cfg(feature = "postgres")]
pub use postgres::{PostgresOptions, PostgresStore};
/// The SQLite crate the staged writes are written with, re-exported so versions match.
pub use rusqlite;
pub use sqlite::SqliteStore;
pub use stats::{StoreStats, TOP_METHODS};
/// The PostgreSQL crates the staged writes and the pool are written with, re-exported so
/// versions match.
#[cfg(feature = "postgres")]
pub use {deadpool_postgres, tokio_postgres};

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::hash::{RequestHash, Spelling};
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

/// An entry's columns as both backends store them (spec §4.4: headers as a JSON object).
pub(crate) struct EntryRow {
    pub(crate) request_hash: String,
    pub(crate) status: u16,
    pub(crate) headers: Vec<u8>,
    pub(crate) body: Vec<u8>,
    pub(crate) inserted_at: i64,
    pub(crate) method: String,
}

/// An open stream's columns as both backends store them.
pub(crate) struct OpenStreamRow {
    pub(crate) method: String,
    pub(crate) request_hash: String,
    pub(crate) jsonrpc_id: String,
    pub(crate) started_at: i64,
}

impl OpenStreamRow {
    /// The open stream of key `id` this row holds, or which column is wrong.
    pub(crate) fn decode(self, id: &MessageId) -> Result<OpenStream, StoreError> {
        let column = "idempotency_open_streams.request_hash";
        Ok(OpenStream {
            message_id: id.clone(),
            request_hash: stored_hash(id, column, &self.request_hash)?,
            method: self.method,
            jsonrpc_id: self.jsonrpc_id,
            started_at: self.started_at.max(0) as u64,
        })
    }
}

/// The request hash a row of key `id` holds in `column`, or the corruption that names it.
pub(crate) fn stored_hash(
    id: &MessageId,
    column: &str,
    hex: &str,
) -> Result<RequestHash, StoreError> {
    RequestHash::from_hex(hex).ok_or_else(|| StoreError::Corrupt {
        message_id: id.to_string(),
        detail: column.to_owned(),
    })
}

impl EntryRow {
    /// The entry of key `id` this row holds, or which column is wrong.
    pub(crate) fn decode(self, id: &MessageId) -> Result<Entry, StoreError> {
        let corrupt = |detail: &str| StoreError::Corrupt {
            message_id: id.to_string(),
            detail: detail.to_owned(),
        };
        let request_hash = stored_hash(id, "request_hash", &self.request_hash)?;
        let headers: serde_json::Map<String, serde_json::Value> =
            serde_json::from_slice(&self.headers).map_err(|_| corrupt("response_headers"))?;
        let headers = headers
            .into_iter()
            .map(|(k, v)| match v {
                serde_json::Value::String(v) => Ok((k, v)),
                _ => Err(corrupt("response_headers")),
            })
            .collect::<Result<_, StoreError>>()?;
        Ok(Entry {
            message_id: id.clone(),
            method: self.method,
            request_hash,
            response: StoredResponse {
                status: self.status,
                headers,
                body: self.body,
            },
            inserted_at: self.inserted_at.max(0) as u64,
        })
    }
}

impl StoredResponse {
    /// The `response_headers` column: the headers as one JSON object.
    pub(crate) fn headers_json(&self) -> Vec<u8> {
        let object: serde_json::Map<String, serde_json::Value> = self
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), v.clone().into()))
            .collect();
        serde_json::to_vec(&object).expect("a map of strings serializes")
    }
}

/// Spec §4.4: expired when `inserted_at + ttl_seconds < now`.
pub(crate) fn is_expired(inserted_at: u64, ttl_seconds: u64, now_seconds: u64) -> bool {
    inserted_at.saturating_add(ttl_seconds) < now_seconds
}

/// `operation`'s output, or `None` once `bound` has passed by the wall clock. Not by tokio's
/// alone: a runtime whose time is paused (a test's `start_paused`) jumps its clock to the next
/// timer whenever it idles, which here is whenever it waits on a database, and every operation
/// would time out at once. There, a thread keeps the bound instead, so that waiting on the
/// database neither spins nor moves the test's clock.
pub(crate) async fn at_most<F: std::future::Future>(
    bound: Duration,
    operation: F,
) -> Option<F::Output> {
    let started = std::time::Instant::now();
    let mut operation = std::pin::pin!(operation);
    if !clock_paused() {
        match tokio::time::timeout(bound, &mut operation).await {
            Ok(output) => return Some(output),
            Err(_) if started.elapsed() >= bound => return None,
            // Paused meanwhile: the clock jumped to the timer.
            Err(_) => {}
        }
    }
    let expired = WallTimer::start(bound.saturating_sub(started.elapsed()));
    let expired = std::pin::pin!(expired.fired());
    match futures::future::select(operation, expired).await {
        futures::future::Either::Left((output, _)) => Some(output),
        futures::future::Either::Right(_) => None,
    }
}

/// Whether tokio's clock is paused: it then stands still (a running clock reads the wall
/// clock's time, to the nanosecond, at every call), or stands apart from the wall clock once
/// advanced. A running clock taken for paused costs one thread, never a wrong bound.
fn clock_paused() -> bool {
    let before = tokio::time::Instant::now();
    let wall = std::time::Instant::now();
    let after = tokio::time::Instant::now();
    let apart = wall
        .saturating_duration_since(after.into_std())
        .max(after.into_std().saturating_duration_since(wall));
    before == after || apart > Duration::from_millis(1)
}

/// A wall-clock timer on a thread of its own; dropped, it stops the thread at once.
struct WallTimer {
    _stop: std::sync::mpsc::Sender<()>,
    fired: tokio::sync::oneshot::Receiver<()>,
}

impl WallTimer {
    fn start(after: Duration) -> Self {
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let (fire, fired) = tokio::sync::oneshot::channel();
        std::thread::spawn(move || {
            if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(after) {
                let _ = fire.send(());
            }
        });
        Self { _stop: stop, fired }
    }

    async fn fired(self) {
        let Self { _stop, fired } = self;
        let _ = fired.await;
    }
}

/// Runs `then` with the outcome of `settling`: on the current runtime, or else on `runtime`
/// (a ticket dropped outside any, at shutdown, names the one that claimed it; a runtime
/// already shut down drops the wait, and `then` with it). With neither, on a thread of its
/// own, which keeps the store open until the disk answers; what `then` runs there has no
/// runtime to spawn on.
pub(crate) fn after(
    settling: Settling,
    runtime: Option<&tokio::runtime::Handle>,
    then: impl FnOnce(bool) + Send + 'static,
) {
    let wait = async move { then(settling.await) };
    match tokio::runtime::Handle::try_current()
        .ok()
        .or_else(|| runtime.cloned())
    {
        Some(runtime) => drop(runtime.spawn(wait)),
        None => drop(std::thread::spawn(move || {
            futures::executor::block_on(wait)
        })),
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
    /// Unix epoch seconds: when it started (the sweep takes a record left open a TTL after
    /// it; the entry it becomes is inserted when it ends).
    pub started_at: u64,
}

impl OpenStream {
    /// Whether the record was left open a TTL after it started: the sweep takes it, and a
    /// claim that reaches it first takes it for gone too, so that its key runs again as any
    /// expired key does (a stream this process still records is in flight, never claimed).
    pub(crate) fn expired(&self, ttl_seconds: u64, now_seconds: u64) -> bool {
        is_expired(self.started_at, ttl_seconds, now_seconds)
    }
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

/// A won claim. Where one process serves the store (SQLite) it is exclusive and never
/// expires; where several share it (PostgreSQL) it is a lease that the store renews while the
/// execution runs, and its fence is what every write of the call is checked against: a call
/// whose lease was taken over commits nothing.
#[derive(Debug)]
pub struct Lease {
    fence: i64,
    renewal: Option<Renewal>,
}

/// What keeps a shared store's lease alive: the flag that tells its renewal the call is ending
/// its own claim (a claim it then finds gone is not a takeover), and what stops the renewal.
struct Renewal {
    ending: Arc<std::sync::atomic::AtomicBool>,
    stop: Option<Box<dyn FnOnce() + Send + Sync>>,
}

impl std::fmt::Debug for Renewal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Renewal")
            .field("ending", &self.ending)
            .finish_non_exhaustive()
    }
}

impl Lease {
    /// The claim of a store that one process serves: nothing to renew, nothing to fence.
    pub fn exclusive() -> Self {
        Self {
            fence: 0,
            renewal: None,
        }
    }

    /// A lease with `fence`, renewed until the lease is dropped, which runs `stop`; `ending`,
    /// shared with the renewal, is set by [`end`](Self::end).
    pub fn renewed(
        fence: i64,
        ending: Arc<std::sync::atomic::AtomicBool>,
        stop: impl FnOnce() + Send + Sync + 'static,
    ) -> Self {
        Self {
            fence,
            renewal: Some(Renewal {
                ending,
                stop: Some(Box::new(stop)),
            }),
        }
    }

    /// The fencing number: larger for every later claim of any key.
    pub fn fence(&self) -> i64 {
        self.fence
    }

    /// The call is about to end its claim by storing its outcome: a renewal that finds the
    /// claim gone from then on is not told of a takeover.
    pub fn end(&self) {
        if let Some(renewal) = &self.renewal {
            renewal
                .ending
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(stop) = self.renewal.as_mut().and_then(|r| r.stop.take()) {
            stop();
        }
    }
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

    /// Records event number `seq` (the first is 0) of an open stream.
    async fn append_event(
        &self,
        key: &MessageId,
        seq: u32,
        event: Bytes,
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
    /// it (this default, and [`PostgresStore`]: a transaction whose commit went unanswered is
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
    /// hashing canonically. Counts as a use, as [`get`](Self::get) does. Never waits.
    fn spelled(&self, _spelling: &Spelling) -> Option<Arc<Entry>> {
        None
    }

    /// Remembers that each of `spellings` (the SHA-256 of some bytes) asks for `answered`, the
    /// entry a lookup or a commit just gave: raw params whose request hash is the entry's, or
    /// a whole request that the entry's bytes answer. Nothing is noted once another entry of
    /// the key has replaced it.
    fn note_spellings(&self, _answered: &Entry, _spellings: &[Spelling]) {}

    /// The PostgreSQL pool the store commits through, for the application's own work.
    #[cfg(feature = "postgres")]
    fn postgres_pool(&self) -> Option<deadpool_postgres::Pool> {
        None
    }
}

/// The store failed; the guard answers -32603 rather than pretend an outcome is cached.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    #[error("{backend}: {}", causes(cause.as_ref()))]
    /// The database refused an operation, or could not be reached.
    ///
    /// Its message carries the whole chain of what the database said (tokio-postgres says
    /// `db error` and leaves the reason to its source), so it names no `source()`: a report
    /// that walks the chain, as anyhow's `{:#}` does, would print each cause twice.
    Backend {
        /// Which database: `sqlite` or `postgres`.
        backend: &'static str,
        /// What it said: downcast it to the driver's error for its details.
        cause: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error(
        "the claim of {0} expired and another process took it over; nothing of this call was stored"
    )]
    /// The call's lease was taken over (it ran past it): nothing of it was committed.
    ClaimLost(String),
    #[error("io: {0}")]
    /// The database file could not be created or opened.
    Io(#[from] std::io::Error),
    #[error("the store is closed")]
    /// The store was closed; nothing more is written.
    Closed,
    #[error("commit failed: {0}")]
    /// A write transaction failed; nothing in it was stored.
    Commit(String),
    #[error("a staged write failed: {}", causes(.0.as_ref()))]
    /// A write the call staged refused; nothing of the call was stored.
    Write(WriteError),
    #[error(
        "another replica serves this database and keeps entries for {theirs} s, where this \
         one is configured for {ours} s: replicas that share a database must keep entries for \
         the same time (AIWG_IDEMPOTENCY_TTL), or the shorter TTL's sweep deletes entries the \
         others still replay; to change it, stop them all first"
    )]
    /// A live replica on the same PostgreSQL database keeps entries for another TTL.
    TtlMismatch {
        /// This store's TTL, in seconds.
        ours: u64,
        /// The other replica's, as its sessions name it.
        theirs: u64,
    },
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
    #[error(
        "database file {} is served by another process under another name (it was renamed or \
         moved while served, and SQLite names the file's log after the name it was opened \
         by); stop that process before serving the file again",
        path.display()
    )]
    /// Another live process serves the database file under the name it had (it holds the
    /// file's own lock).
    ServedElsewhere {
        /// The database file.
        path: PathBuf,
    },
    #[error(
        "database file {} has {links} names (hard links): SQLite names the file's log after \
         the name it is opened by, so each name would get a log of its own over one file, and \
         a process of its own; give the database one name",
        path.display()
    )]
    /// The database file has more than one name; one process per file cannot be enforced.
    HardLinked {
        /// The database file.
        path: PathBuf,
        /// How many names it has.
        links: u64,
    },
    #[error(
        "database file {} was deleted or replaced while this process served it; nothing more \
         is stored until the server restarts",
        .0.display()
    )]
    /// The database file is no longer at its path: what would be committed to it is lost
    /// once the process ends, so nothing is.
    Vanished(PathBuf),
    #[error(
        "the key's entry was deleted from {}, but process {pid}, which serves it, did not \
         confirm within {} s that it forgot the entries it holds in memory: until it does, it \
         may still answer the key from memory (restart it to be sure)",
        path.display(),
        waited.as_secs()
    )]
    /// An operator's purge committed, but the process serving the SQLite file did not say in
    /// time that it emptied its memory tier.
    PurgeUnconfirmed {
        /// The database file.
        path: PathBuf,
        /// The serving process, as it wrote itself in the lock file.
        pid: String,
        /// How long the purge waited.
        waited: std::time::Duration,
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

impl StoreError {
    /// The `kind` label of the store-error metric.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Backend { .. } => "backend",
            Self::ClaimLost(_) => "claim_lost",
            Self::Io(_) => "io",
            Self::Closed => "closed",
            Self::Commit(_) => "commit",
            Self::Write(_) => "write",
            Self::TtlMismatch { .. } => "ttl_mismatch",
            Self::InUse { .. } => "in_use",
            Self::ServedElsewhere { .. } => "served_elsewhere",
            Self::HardLinked { .. } => "hard_linked",
            Self::Vanished(_) => "vanished",
            Self::PurgeUnconfirmed { .. } => "purge_unconfirmed",
            Self::Corrupt { .. } => "corrupt",
        }
    }
}

/// An error and the errors under it, as one line: PostgreSQL's own words ("database \"a2a\"
/// does not exist") are a source or two below the "db error" its client says at the top.
fn causes(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let said = cause.to_string();
        if !text.contains(&said) {
            text = format!("{text}: {said}");
        }
        source = cause.source();
    }
    text
}

impl From<rusqlite::Error> for StoreError {
    fn from(error: rusqlite::Error) -> Self {
        Self::Backend {
            backend: "sqlite",
            cause: Box::new(error),
        }
    }
}

#[cfg(feature = "postgres")]
impl From<tokio_postgres::Error> for StoreError {
    fn from(error: tokio_postgres::Error) -> Self {
        Self::Backend {
            backend: "postgres",
            cause: Box::new(error),
        }
    }
}

#[cfg(feature = "postgres")]
impl From<deadpool_postgres::PoolError> for StoreError {
    fn from(error: deadpool_postgres::PoolError) -> Self {
        Self::Backend {
            backend: "postgres",
            cause: Box::new(error),
        }
    }
}
