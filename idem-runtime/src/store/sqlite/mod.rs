//! The durable [`Store`] on SQLite: one file, WAL, `synchronous=FULL`, group commit.
//!
//! Writes go to one writer thread (`writer.rs`), which commits every queued write (`job.rs`)
//! in one transaction (`batch.rs`; only the writer's `COMMIT` commits, `commit_gate.rs`);
//! reads go to a few reader threads (`readers.rs`) with their own connections, which WAL
//! lets run while the writer commits. No SQLite call ever runs on an
//! async worker thread, and the thread count does not grow with the load. An OS lock
//! (`file_lock.rs`) keeps a second process off the file, which is what lets this process keep
//! what the file holds in memory: the keys and their rows' rowids (`key_index.rs`: a fresh key
//! reads nothing, a stored one is read by rowid, `entries.rs`) and the recent entries
//! (`memory_tier.rs`: a replay reads nothing).

pub(crate) mod application_writes;
mod batch;
mod checkpointer;
mod commit_gate;
pub(crate) mod connection;
mod entries;
mod file_identity;
pub(crate) mod file_lock;
pub(crate) mod file_size_limit;
pub(crate) mod job;
pub(crate) mod key_index;
pub(crate) mod memory_tier;
mod open_streams;
pub(crate) mod purge_watch;
pub(crate) mod readers;
mod repeated_failure;
pub(crate) mod writer;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use rusqlite::{params, Connection, OptionalExtension};
use tokio::sync::oneshot;

use crate::clock::{Clock, SystemClock};
use crate::config::IdempotencyConfig;
use crate::fingerprint::ByFingerprint;
use crate::hash::{Glimpse, Spelling};
use crate::message_id::MessageId;
use crate::store::settings;
use crate::store::sqlite::batch::{Batch, Change};
use crate::store::sqlite::checkpointer::{Checkpointer, Restart};
use crate::store::sqlite::commit_gate::CommitGate;
pub(crate) use crate::store::sqlite::connection::connect;
use crate::store::sqlite::connection::{a_file_path, create_private_file, create_tables};
use crate::store::sqlite::file_identity::FileIdentity;
use crate::store::sqlite::file_lock::ServingLock;
use crate::store::sqlite::job::{Call, Job};
use crate::store::sqlite::key_index::{KeyIndex, StoredKeys};
use crate::store::sqlite::memory_tier::MemoryTier;
use crate::store::sqlite::open_streams::{
    delete_open_stream, insert_event, insert_open_stream, select_open_stream, touch_open_stream,
    LiveStreams,
};
use crate::store::sqlite::purge_watch::PurgeWatch;
use crate::store::sqlite::readers::Readers;
use crate::store::sqlite::writer::{ended_the_transaction, Writer};
use crate::store::touches::Touches;
use crate::store::{
    after, at_most, expired_before, is_expired, Entry, Found, IfLate, Lease, OpenStream, ReadJob,
    Settling, Store, StoreError, StoreStats,
};
use crate::unit_of_work::SqlWrite;

/// Most expired rows one sweep step deletes. A step rides in a batch with the calls' writes
/// and delays them by its own time: at 100 rows, sweeping 100,000 rows under load kept the
/// writers' p99 within 1.3x of a quiet one in `cargo bench` runs (1,000 rows made it 2.6x).
const SWEEP_CHUNK: u64 = 100;

/// The SQLite store.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use idem_runtime::IdempotencyConfig;
/// use idem_runtime::store::{SqliteStore, Store};
/// let dir = tempfile::tempdir().unwrap();
/// let store = SqliteStore::open(dir.path().join("cache.db"), &IdempotencyConfig::default()).unwrap();
/// assert_eq!(store.row_count().await.unwrap(), 0);
/// // One process serves a file: a second store on it is refused until this one closes.
/// assert!(SqliteStore::open(store.path(), &IdempotencyConfig::default()).is_err());
/// # }
/// ```
pub struct SqliteStore {
    path: PathBuf,
    ttl_seconds: u64,
    /// The LRU bound: the sweep evicts down to it, a chunk a step, where it was lowered.
    max_entries: u64,
    /// How long a write waits for the disk (see [`IdempotencyConfig::disk_timeout`]).
    disk_timeout: Duration,
    /// The writes of calls that stopped waiting for the disk, by key, until the calls give
    /// their keys up ([`Store::unsettled`]).
    unsettled: Mutex<HashMap<MessageId, Settling, ByFingerprint>>,
    /// The keys whose stream this process records now: the sweep never takes their open
    /// records (every other one was left by a process that is gone, or by a recording here
    /// that failed and released its key).
    live_streams: LiveStreams,
    clock: Arc<dyn Clock>,
    touches: Arc<Touches>,
    tier: Arc<MemoryTier>,
    index: Arc<KeyIndex>,
    /// The operators' purges seen (`MemoryTier::purges_seen`) when the sweep last reloaded
    /// the key index: it forgets what they deleted at the next sweep after them.
    index_reloaded_for: AtomicU64,
    /// Set by [`close`](Self::close), or by a writer that stopped: the memory (the tier, the
    /// key index) answers nothing more either.
    closed: Arc<AtomicBool>,
    readers: Readers,
    writer: Mutex<Option<mpsc::Sender<Box<dyn Job>>>>,
    writer_thread: Mutex<Option<JoinHandle<()>>>,
    checkpointer: Mutex<Option<Checkpointer>>,
    lock: Mutex<Option<ServingLock>>,
}

impl SqliteStore {
    /// Whether the key index may hold a row of `key` (for tests of the admin tool's purge).
    #[cfg(all(test, feature = "postgres"))]
    pub(crate) fn indexes(&self, key: &MessageId) -> bool {
        self.index.may_hold(key)
    }

    /// Opens (or creates, with mode 0600) the database at `path`, on the system clock.
    /// Fails with [`StoreError::InUse`] while another store (in any process) serves it.
    pub fn open(path: impl AsRef<Path>, config: &IdempotencyConfig) -> Result<Self, StoreError> {
        Self::open_with_clock(path, config, Arc::new(SystemClock))
    }

    /// Like [`open`](Self::open), with an injected clock.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use idem_runtime::store::{SqliteStore, Store};
    /// use idem_runtime::testing::ManualClock;
    /// use idem_runtime::IdempotencyConfig;
    /// let dir = tempfile::tempdir().unwrap();
    /// let clock = Arc::new(ManualClock::new(1_800_000_000_000));
    /// let config = IdempotencyConfig::default();
    /// let path = dir.path().join("a2a.db");
    /// let store = SqliteStore::open_with_clock(path, &config, clock.clone()).unwrap();
    /// assert_eq!(store.now_seconds(), 1_800_000_000);
    /// clock.advance(Duration::from_secs(config.ttl_seconds + 1)); // every entry so far is expired
    /// assert_eq!(store.now_seconds(), 1_800_086_401);
    /// clock.step_back(Duration::from_secs(1)); // as NTP may step a wall clock back
    /// assert_eq!(store.now_seconds(), 1_800_086_400);
    /// # }
    /// ```
    pub fn open_with_clock(
        path: impl AsRef<Path>,
        config: &IdempotencyConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, StoreError> {
        // The builders check too; a store opened on its own is held to the same values.
        config.checked()?;
        // Before anything of the file's is written: the first connection's close copies a
        // log left by a crash back into the file (a restart under the limit was killed there
        // at every start: helper-113).
        file_size_limit::ignore_the_signal();
        let path = path.as_ref().to_path_buf();
        a_file_path(&path)?;
        create_private_file(&path)?;
        let lock = ServingLock::acquire(&path)?;
        create_tables(&path)?;
        let conn = connect(&path)?;
        let ttl = settings::stored(config.ttl_seconds);
        conn.execute(settings::RECORD_TTL, rusqlite::named_params! {"$1": ttl})?;
        keep_scoping(&conn, config.scope_keys_by_principal)?;
        purge_watch::prepare(&conn)?;
        // The checkpointer's thread copies the log back; the writer only when asked to start it
        // over (see there).
        conn.pragma_update(None, "wal_autocheckpoint", 0)?;
        application_writes::guard(&conn, config.disk_timeout / 2);
        let restart = Restart::default();
        let tier = Arc::new(MemoryTier::new(config.memory_tier_bytes));
        let purges = PurgeWatch::new(&conn, tier.clone())?;
        let checkpointer = Checkpointer::start(&path, connect, restart.clone(), purges)?;
        let touches = Arc::new(Touches::default());
        // Read before the rows: an operator's purge that lands between the reads is then one
        // the writer sees as new, and counts again for (helper-52).
        let purge_generation = purge_watch::generation(&conn)?;
        let index = Arc::new(KeyIndex::new(&stored_keys(&conn)?));
        let closed = Arc::new(AtomicBool::new(false));
        let writer = Writer {
            stopped: closed.clone(),
            gate: CommitGate::install(&conn),
            restart,
            file: FileIdentity::of(&path)?,
            rows: entries::count(&conn)?,
            purge_generation,
            rows_may_be_fewer: false,
            conn,
            clock: clock.clone(),
            touches: touches.clone(),
            max_entries: config.max_cache_entries,
            tier: tier.clone(),
            index: index.clone(),
        };
        let readers = Readers::start(&path, connect, config.disk_timeout)?;
        let (tx, rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("idem-sqlite-writer".into())
            .spawn(move || writer.run(rx))?;
        Ok(Self {
            path,
            ttl_seconds: config.ttl_seconds,
            max_entries: config.max_cache_entries,
            disk_timeout: config.disk_timeout,
            unsettled: Mutex::new(HashMap::default()),
            live_streams: LiveStreams::default(),
            clock,
            touches,
            tier,
            index,
            index_reloaded_for: AtomicU64::new(0),
            closed,
            readers,
            writer: Mutex::new(Some(tx)),
            writer_thread: Mutex::new(Some(thread)),
            checkpointer: Mutex::new(Some(checkpointer)),
            lock: Mutex::new(Some(lock)),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Commits what is queued, stops the threads and releases the file. Later calls fail with
    /// [`StoreError::Closed`], those the memory would have answered too: once the file is
    /// released another process may serve, purge or expire it.
    pub fn close(&self) {
        self.closed.store(true, SeqCst);
        drop(self.writer.lock().expect("writer lock").take());
        if let Some(thread) = self.writer_thread.lock().expect("thread lock").take() {
            let _ = thread.join();
        }
        if let Some(checkpointer) = self.checkpointer.lock().expect("checkpointer lock").take() {
            checkpointer.stop();
        }
        self.readers.close();
        self.tier.forget_all();
        drop(self.lock.lock().expect("lock lock").take());
    }

    /// Queues `work` for the writer's next batch; its value arrives once the batch committed.
    /// `rerunnable`: `work` only writes through the connection, so a rolled-back attempt may
    /// be followed by another (see `writer.rs`).
    ///
    /// A disk that does not answer within `disk_timeout` (hung, or its file system frozen)
    /// fails the write while it stays queued: it may still commit. A write of a call's `key`
    /// is then left for the call's ticket to wait out before it gives the key up, as it is
    /// when the call is cancelled while it waits.
    pub(in crate::store) async fn write<T: Send + 'static>(
        &self,
        unanswered: Unanswered<'_>,
        rerunnable: bool,
        bytes: usize,
        work: impl FnMut(&Connection, &mut Batch) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let (call, done) = Call::new(rerunnable, bytes, work);
        self.queue(Box::new(call))?;
        let mut answer = Answer {
            done: Some(done),
            unanswered,
            unsettled: &self.unsettled,
        };
        let waiting = answer.done.as_mut().expect("not yet answered");
        match at_most(self.disk_timeout, waiting).await {
            Some(answered) => {
                answer.done = None;
                answered.map_err(|_| StoreError::Closed)?
            }
            None => Err(no_answer(self.disk_timeout)),
        }
    }

    /// Commits staged `writes` on their own, in one transaction.
    async fn commit_alone(
        &self,
        mut writes: Vec<SqlWrite>,
        unanswered: Unanswered<'_>,
    ) -> Result<(), StoreError> {
        self.write(
            unanswered,
            all_rerunnable(&writes),
            0,
            move |conn, batch| apply_writes(conn, batch, &mut writes),
        )
        .await
    }

    /// Spec §4.4's TTL, by this store's clock.
    fn is_live(&self, entry: &Entry) -> bool {
        !is_expired(
            entry.inserted_at,
            self.ttl_seconds,
            self.clock.now_seconds(),
        )
    }

    /// A use of `entry`, for the LRU bound: written with the writer's next batches. While
    /// only replays come, the writer runs none: it is asked for one once a batch's worth of
    /// uses waits.
    fn touch(&self, entry: &Entry) {
        let now = self.clock.now_millis();
        if self.touches.note(entry.message_id.as_str(), now) {
            self.ask_for_a_batch();
        }
    }

    /// Queues a write of nothing, so the writer runs a batch (and writes waiting uses); a
    /// closed store has none to run.
    fn ask_for_a_batch(&self) {
        let (nothing, _) = Call::new(true, 0, |_: &Connection, _: &mut Batch| Ok(()));
        let _ = self.queue(Box::new(nothing));
    }

    /// Queues `job` for the writer.
    fn queue(&self, job: Box<dyn Job>) -> Result<(), StoreError> {
        let writer = self.writer.lock().expect("writer lock");
        let writer = writer.as_ref().ok_or(StoreError::Closed)?;
        writer.send(job).map_err(|_| StoreError::Closed)
    }

    /// An entry from the memory tier, if live (an expired one leaves the tier); a use.
    fn used(&self, entry: Option<Arc<Entry>>) -> Option<Arc<Entry>> {
        let entry = entry?;
        self.touch(&entry);
        Some(entry)
    }

    /// An entry just read from the file: `None` past its TTL; else a use, kept in the memory
    /// tier unless a delete raced the read (`deletions` was taken before it).
    fn read_back(&self, entry: Option<Entry>, deletions: u64) -> Option<Arc<Entry>> {
        let entry = Arc::new(entry.filter(|e| self.is_live(e))?);
        self.touch(&entry);
        self.tier.fill(entry.clone(), deletions);
        Some(entry)
    }

    /// The live entry of `key` without leaving this thread: from the memory tier, or
    /// `Ok(None)` when the key index knows the file holds no row of it. `Err(())`: ask the
    /// file.
    fn in_memory(&self, key: &MessageId) -> Result<Option<Arc<Entry>>, ()> {
        if self.closed.load(SeqCst) {
            return Err(()); // the file's answer: closed
        }
        if let Some(entry) = self.used(self.tier.get(key, |e| self.is_live(e))) {
            return Ok(Some(entry));
        }
        match self.index.may_hold(key) {
            true => Err(()),
            false => Ok(None),
        }
    }

    /// Reads `key`'s entry from the file, keeping it in the memory tier if it is live.
    async fn read_entry(&self, key: &MessageId) -> Result<Option<Arc<Entry>>, StoreError> {
        let (id, deletions) = (key.clone(), self.tier.deletions(key));
        let rowids = self.index.entry_rows(key);
        let entry = self
            .readers
            .run(move |conn| entries::select(conn, &id, &rowids))
            .await?;
        Ok(self.read_back(entry, deletions))
    }
}

impl Drop for SqliteStore {
    fn drop(&mut self) {
        self.close();
    }
}

#[async_trait::async_trait]
impl Store for SqliteStore {
    async fn get(&self, key: &MessageId) -> Result<Option<Entry>, StoreError> {
        let entry = match self.in_memory(key) {
            Ok(entry) => entry,
            Err(()) => self.read_entry(key).await?,
        };
        Ok(entry.map(Arc::unwrap_or_clone))
    }

    async fn lookup(&self, key: &MessageId) -> Result<Found, StoreError> {
        match self.in_memory(key) {
            Ok(Some(entry)) => return Ok(Found::Entry(entry)),
            Ok(None) => return Ok(Found::Nothing),
            Err(()) => {}
        }
        let deletions = self.tier.deletions(key);
        let (id, ttl, now) = (key.clone(), self.ttl_seconds, self.clock.now_seconds());
        // Taken before the read: a stream closed in between (its entry stored, its row gone)
        // looks like nothing at all here. The claim reads again in that case: the close
        // releases the key after the key index learnt the entry (`claim.rs`, `releases`).
        let rowids = self.index.entry_rows(key);
        let (entry, open) = self
            .readers
            .run(move |conn| {
                let live = |entry: &Option<Entry>| {
                    matches!(entry, Some(e) if !is_expired(e.inserted_at, ttl, now))
                };
                // While an entry is live no stream of its key can be open: a replay reads none.
                let entry = entries::select(conn, &id, &rowids)?;
                if live(&entry) {
                    return Ok((entry, None));
                }
                // Otherwise the entry, the open stream and its events as of one moment: a
                // sweep of the stream between two reads would leave its record without its
                // events, and the retry would store it as interrupted with none of them.
                let snapshot = conn.unchecked_transaction()?;
                let entry = entries::select(&snapshot, &id, &rowids)?;
                let open = match live(&entry) {
                    true => None,
                    false => select_open_stream(&snapshot, &id, ttl, now)?,
                };
                snapshot.finish()?;
                Ok((entry, open))
            })
            .await?;
        if let Some(entry) = self.read_back(entry, deletions) {
            return Ok(Found::Entry(entry));
        }
        Ok(match open {
            Some((stream, events)) => Found::Interrupted(stream, events),
            None => Found::Nothing,
        })
    }

    // One process serves the file: the in-process claim table is the claim, and its leases
    // (exclusive) fence nothing.
    async fn put(
        &self,
        entry: Arc<Entry>,
        mut writes: Vec<SqlWrite>,
        _lease: &Lease,
    ) -> Result<(), StoreError> {
        let (key, bytes) = (entry.message_id.clone(), entry.response.body.len());
        self.write(
            Unanswered::HoldsKey(&key),
            all_rerunnable(&writes),
            bytes,
            move |conn, batch| {
                apply_writes(conn, batch, &mut writes)?;
                entries::store(conn, batch, entry.clone())
            },
        )
        .await
    }

    async fn open_stream(
        &self,
        stream: &OpenStream,
        first_event: Bytes,
        mut writes: Vec<SqlWrite>,
        _lease: &Lease,
    ) -> Result<(), StoreError> {
        let stream = stream.clone();
        // Before the commit: a sweep right after it must already see the stream recorded.
        self.live_streams.start(&stream.message_id);
        let key = stream.message_id.clone();
        self.write(
            Unanswered::HoldsKey(&key),
            all_rerunnable(&writes),
            first_event.len(),
            move |conn, batch| {
                apply_writes(conn, batch, &mut writes)?;
                let may_exist = batch.may_hold(&stream.message_id);
                let new = insert_open_stream(conn, &stream, may_exist)?;
                batch.opened(&stream.message_id, new);
                insert_event(conn, &stream.message_id, 0, &first_event)
            },
        )
        .await
    }

    async fn append_events(
        &self,
        key: &MessageId,
        first_seq: u32,
        events: Vec<Bytes>,
        _lease: &Lease,
    ) -> Result<(), StoreError> {
        let (id, now) = (key.clone(), self.clock.now_seconds());
        let bytes = events.iter().map(Bytes::len).sum();
        self.write(Unanswered::HoldsKey(key), true, bytes, move |conn, _| {
            for (seq, event) in (first_seq..).zip(&events) {
                insert_event(conn, &id, seq, event)?;
            }
            touch_open_stream(conn, &id, now)
        })
        .await
    }

    async fn close_stream(&self, entry: Arc<Entry>, _lease: &Lease) -> Result<(), StoreError> {
        let (recorded, bytes) = (entry.message_id.clone(), entry.response.body.len());
        let closed = self
            .write(
                Unanswered::HoldsKey(&recorded),
                true,
                bytes,
                move |conn, batch| {
                    let key = entry.message_id.clone();
                    entries::store(conn, batch, entry.clone())?;
                    // After the entry: the key index never misses the key between the two changes.
                    if delete_open_stream(conn, key.as_str())? {
                        batch.changes.push(Change::Closed(key));
                    }
                    Ok(())
                },
            )
            .await;
        if closed.is_ok() {
            self.live_streams.stop(&recorded);
        }
        closed
    }

    /// A key given up without its outcome stored: a stream it recorded is no longer recorded.
    fn release(&self, key: &MessageId, _lease: Lease) {
        self.live_streams.stop(key);
    }

    fn unsettled(&self, key: &MessageId) -> Option<Settling> {
        let mut unsettled = lock(&self.unsettled);
        match unsettled.is_empty() {
            true => None,
            false => unsettled.remove(key),
        }
    }

    async fn apply(&self, writes: Vec<SqlWrite>) -> Result<(), StoreError> {
        self.commit_alone(writes, Unanswered::Forgotten).await
    }

    async fn apply_or_later(
        &self,
        writes: Vec<SqlWrite>,
        if_late: IfLate,
    ) -> Result<(), StoreError> {
        let unanswered = Unanswered::RunsIfLanded(if_late);
        self.commit_alone(writes, unanswered).await
    }

    async fn read(&self, job: ReadJob) -> Result<(), StoreError> {
        self.readers.run_for_application(job).await
    }

    async fn sweep(&self) -> Result<u64, StoreError> {
        let (ttl, max_entries) = (self.ttl_seconds, self.max_entries);
        let (mut total, mut eviction_steps) = (0, None);
        loop {
            let live = self.live_streams.clone();
            let (tier, reloaded_for) = (self.tier.clone(), self.index_reloaded_for.load(SeqCst));
            let (deleted, reloaded, over_by) = self
                .write(Unanswered::Forgotten, true, 0, move |conn, batch| {
                    let now = batch.now_ms / 1000;
                    let n = sweep_chunk(conn, ttl, now, &live, &mut batch.changes)?;
                    // Counted out before the bound is looked at: counted in, they had live
                    // entries evicted below the bound (helper-106).
                    batch.rows = batch.rows.saturating_sub(n);
                    if n == SWEEP_CHUNK {
                        return Ok((n, None, None));
                    }
                    // Over the LRU bound by more than the chunk the writer evicts after this
                    // step (a bound lowered across a restart): another step.
                    if batch.rows > max_entries.saturating_add(SWEEP_CHUNK) {
                        return Ok((n, None, Some(batch.rows - max_entries)));
                    }
                    // The last step counts the rows again, and after an operator's purge
                    // reloads the key index: the purge deleted rows the writer never counted
                    // out (the LRU bound would keep the table that much smaller) and the index
                    // never forgot (it would grow with every purge until a restart).
                    batch.rows = entries::count(conn)?;
                    // Read under the write lock: no purge commits between the two.
                    let purges_seen = tier.purges_seen();
                    if purges_seen == reloaded_for {
                        return Ok((n, None, None));
                    }
                    batch.changes.push(Change::Reloaded(stored_keys(conn)?));
                    Ok((n, Some(purges_seen), None))
                })
                .await?;
            if let Some(purges_seen) = reloaded {
                self.index_reloaded_for.store(purges_seen, SeqCst);
            }
            total += deleted;
            if let Some(over_by) = over_by {
                // As many steps as the rows over it take, counted once: a count that drifted
                // never keeps the sweep going.
                let left = eviction_steps.get_or_insert(over_by / SWEEP_CHUNK + 1);
                *left -= 1;
                if *left == 0 {
                    return Ok(total);
                }
            } else if deleted < SWEEP_CHUNK {
                return Ok(total);
            }
        }
    }

    async fn row_count(&self) -> Result<u64, StoreError> {
        self.readers.run(|conn| Ok(entries::count(conn)?)).await
    }

    async fn stats(&self) -> Result<StoreStats, StoreError> {
        let (now, ttl) = (self.clock.now_seconds(), self.ttl_seconds);
        let read = move |conn: &Connection| Ok(StoreStats::read_sqlite(conn, now, ttl)?);
        self.readers.run(read).await
    }

    fn now_seconds(&self) -> u64 {
        self.clock.now_seconds()
    }

    fn spelled(&self, glimpse: Glimpse, spelling: &dyn Fn() -> Spelling) -> Option<Arc<Entry>> {
        if self.closed.load(SeqCst) {
            return None;
        }
        let live = |e: &Entry| self.is_live(e);
        self.used(self.tier.get_spelled(glimpse, spelling, live))
    }

    fn keeps_spellings(&self) -> bool {
        self.tier.keeps_anything() && !self.closed.load(SeqCst)
    }

    fn note_spellings(&self, answered: &Entry, spellings: &[(Glimpse, Spelling)]) {
        self.tier.add_spellings(answered, spellings);
    }
}

/// A write's answer, awaited. Dropped unanswered (its caller stopped waiting, or was
/// cancelled), it leaves behind what its `unanswered` says: the write is still queued and may
/// commit.
struct Answer<'a, T: Send + 'static> {
    done: Option<oneshot::Receiver<Result<T, StoreError>>>,
    unanswered: Unanswered<'a>,
    unsettled: &'a Mutex<HashMap<MessageId, Settling, ByFingerprint>>,
}

/// What waits on a write whose caller may stop waiting for it.
pub(in crate::store) enum Unanswered<'a> {
    /// Nothing (a sweep, the application's own transaction: its caller was told).
    Forgotten,
    /// A call's key: left in `unsettled` for the call's ticket to wait out.
    HoldsKey(&'a MessageId),
    /// Work to run if the write commits after all.
    RunsIfLanded(IfLate),
}

impl<T: Send + 'static> Drop for Answer<'_, T> {
    fn drop(&mut self) {
        let Some(done) = self.done.take() else {
            return;
        };
        let landed = || -> Settling { Box::pin(async move { matches!(done.await, Ok(Ok(_))) }) };
        match std::mem::replace(&mut self.unanswered, Unanswered::Forgotten) {
            Unanswered::Forgotten => {}
            Unanswered::HoldsKey(key) => {
                lock(self.unsettled).insert(key.clone(), landed());
            }
            Unanswered::RunsIfLanded(if_late) => after(landed(), None, move |landed| {
                if landed {
                    if_late();
                }
            }),
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// The keys of the rows the file holds, as the key index starts with them.
fn stored_keys(conn: &Connection) -> rusqlite::Result<StoredKeys> {
    let entries = entries::all_keys(conn)?;
    let mut streams = conn.prepare("SELECT message_id FROM idempotency_open_streams")?;
    let streams = streams
        .query_map([], |row| row.get::<_, String>(0))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(StoredKeys { entries, streams })
}

/// Whether a redo of the batch may run these writes again.
fn all_rerunnable(writes: &[SqlWrite]) -> bool {
    writes.iter().all(SqlWrite::is_rerunnable)
}

/// A call's staged writes, in the order it staged them. One that ended the batch's
/// transaction and said nothing of it fails all the same, before anything else runs.
fn apply_writes(
    conn: &Connection,
    batch: &Batch,
    writes: &mut [SqlWrite],
) -> Result<(), StoreError> {
    for write in writes {
        write.run(conn).map_err(StoreError::Write)?;
        if batch.ended(conn) {
            return Err(ended_the_transaction());
        }
    }
    Ok(())
}

/// Refuses a file whose entries were stored with keys scoped otherwise, and records how this
/// store scopes them (the process holds the file's lock: no other store opens it meanwhile).
fn keep_scoping(conn: &Connection, scoped: bool) -> Result<(), StoreError> {
    let recorded = conn
        .query_row(settings::RECORDED_SCOPING, [], |row| row.get(0))
        .optional()?;
    let holds_keys = conn.query_row(settings::HOLDS_KEYS, [], |row| row.get(0))?;
    settings::scoping_kept(recorded, scoped, holds_keys)?;
    let scoped = i64::from(scoped);
    conn.execute(
        settings::RECORD_SCOPING,
        rusqlite::named_params! {"$1": scoped},
    )?;
    Ok(())
}

/// Deletes a chunk of expired entries, and the open streams started more than a TTL ago that
/// nothing records any more (whose retries are new requests by now); returns how many
/// entries it deleted. A stream still `live` is never swept: its retry must attach,
/// and after a crash get its interrupted outcome, never run again.
fn sweep_chunk(
    conn: &Connection,
    ttl: u64,
    now: u64,
    live: &LiveStreams,
    changes: &mut Vec<Change>,
) -> Result<u64, StoreError> {
    // `inserted_at + ttl < now` (spec §4.4), written so that the index on `inserted_at`
    // finds the expired rows instead of a scan of the table.
    let before = expired_before(ttl, now);
    let deleted = entries::delete(
        conn,
        "DELETE FROM idempotency_cache WHERE rowid IN
           (SELECT rowid FROM idempotency_cache WHERE inserted_at < ?1 LIMIT ?2)
         RETURNING rowid, message_id",
        params![before, SWEEP_CHUNK as i64],
    )?;
    let count = deleted.len() as u64;
    changes.extend(deleted);
    let mut old = conn
        .prepare_cached("SELECT message_id FROM idempotency_open_streams WHERE started_at < ?1")?;
    let old = old
        .query_map([before], |row| row.get::<_, String>(0))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    for key in old.into_iter().map(MessageId::from_stored) {
        if !live.holds(&key) && delete_open_stream(conn, key.as_str())? {
            changes.push(Change::Closed(key));
        }
    }
    Ok(count)
}

/// The file has not answered within `bound`: its disk, or a long write queued ahead.
pub(crate) fn no_answer(bound: Duration) -> StoreError {
    let cause = format!(
        "no answer from the database file in {} ms",
        bound.as_millis()
    );
    StoreError::Backend {
        backend: "sqlite",
        cause: cause.into(),
    }
}
