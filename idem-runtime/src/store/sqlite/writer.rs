//! The SQLite store's writer: one thread owns the only writing connection and commits every
//! queued write in one transaction (group commit), so durability costs one fsync per batch
//! instead of one per call, and the application never contends with the store for SQLite's
//! single write lock.
//!
//! A write that fails (a constraint in a call's staged writes, say) is rolled back alone and
//! answered with its error, while the rest of the batch commits. Savepoints do that, but each
//! copies every page its write touches into a sub-journal (8% of a call's instructions when
//! each write had one), and writes rarely fail. So the writes that may run again (all but
//! `Database::transact`'s) go first with no savepoint; if one fails, the batch is rolled back
//! and redone with a savepoint per write. The writes that run once always go last, each under
//! its own savepoint, so no redo ever needs them again. A failure that costs SQLite the whole
//! transaction (disk full, I/O error) fails every write in the batch: nothing of any of them
//! is stored.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};

use rusqlite::{params, Connection};

use crate::clock::Clock;
use crate::store::sqlite::application_writes;
use crate::store::sqlite::batch::{Batch, Change};
use crate::store::sqlite::checkpointer::Restart;
use crate::store::sqlite::commit_gate::CommitGate;
use crate::store::sqlite::connection::restored;
use crate::store::sqlite::entries;
use crate::store::sqlite::file_identity::FileIdentity;
use crate::store::sqlite::job::Job;
use crate::store::sqlite::key_index::KeyIndex;
use crate::store::sqlite::memory_tier::MemoryTier;
use crate::store::sqlite::purge_watch;
use crate::store::touches::{Touches, PER_WRITE};
use crate::store::StoreError;

/// Most writes committed in one transaction.
pub(in crate::store) const MAX_BATCH: usize = 512;
/// A batch takes no more writes once those it holds carry this many bytes of responses and
/// stream events: 512 answers of 10 MiB would otherwise be one 5 GiB transaction, its log as
/// large, and every call in it waiting for all of it.
pub(in crate::store) const MAX_BATCH_BYTES: usize = 32 * 1024 * 1024;

/// The writer thread's state.
pub(crate) struct Writer {
    pub(crate) conn: Connection,
    /// The file `conn` writes to: nothing commits once its path names another, or none.
    pub(crate) file: FileIdentity,
    /// The checkpointer's request to start the log over, run between two batches.
    pub(crate) restart: Restart,
    pub(crate) clock: Arc<dyn Clock>,
    /// LRU uses noted by reads, written with the next batch: a replay costs no fsync.
    pub(crate) touches: Arc<Touches>,
    pub(crate) max_entries: u64,
    /// Rows in the table, kept up to date so the bound costs no `COUNT(*)` per commit.
    pub(crate) rows: u64,
    /// The file's purge generation as the writer last read it.
    pub(crate) purge_generation: Option<i64>,
    /// An operator's purge deleted rows behind the writer since `rows` was counted: it may
    /// be too high (see [`Writer::note_purges`]).
    pub(crate) rows_may_be_fewer: bool,
    pub(crate) tier: Arc<MemoryTier>,
    pub(crate) index: Arc<KeyIndex>,
    /// Lets `conn` commit only the writer's own `COMMIT`.
    pub(crate) gate: CommitGate,
    /// Set when the writer stops for a panic of its own: the store is then closed.
    pub(crate) stopped: Arc<AtomicBool>,
}

/// `first`, and the writes queued behind it, up to [`MAX_BATCH`] of them or until they carry
/// [`MAX_BATCH_BYTES`].
pub(in crate::store) fn gather(
    first: Box<dyn Job>,
    jobs: &mpsc::Receiver<Box<dyn Job>>,
) -> Vec<Box<dyn Job>> {
    let mut bytes = first.bytes();
    let mut batch = vec![first];
    while batch.len() < MAX_BATCH && bytes < MAX_BATCH_BYTES {
        match jobs.try_recv() {
            Ok(job) => {
                bytes = bytes.saturating_add(job.bytes());
                batch.push(job);
            }
            Err(_) => break,
        }
    }
    batch
}

/// Closes the store if dropped by a panic's unwinding.
struct ClosesOnPanic(Arc<AtomicBool>);

impl Drop for ClosesOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.store(true, Ordering::SeqCst);
        }
    }
}

impl Writer {
    pub(crate) fn run(mut self, jobs: mpsc::Receiver<Box<dyn Job>>) {
        while let Some(first) = self.next(&jobs) {
            let batch = first.map_or_else(Vec::new, |first| gather(first, &jobs));
            // A panic of the store's own past this point may leave the file and what the
            // process knows of it (the key index, the memory tier) out of step: a batch
            // committed and not published would be a miss in memory. So the store closes, as
            // `close` does: writes fail, and reads go to the file. It is said, not left for the
            // operator to find.
            let committed = catch_unwind(AssertUnwindSafe(|| self.commit(batch)));
            if committed.is_err() {
                tracing::error!("the SQLite store's writer panicked: the store is closed");
                return;
            }
            self.restart.run_if_asked(&self.conn, &self.file);
        }
    }

    /// The next write, waited for; or none, for a batch of LRU uses alone while a batch's
    /// worth of them waits and no write is queued: the uses a burst of replays left behind
    /// while the writer was busy asked for one batch only, and the rest waited for later
    /// writes (helper-125). `None` once the store is closed.
    fn next(&self, jobs: &mpsc::Receiver<Box<dyn Job>>) -> Option<Option<Box<dyn Job>>> {
        if self.touches.waiting() >= PER_WRITE {
            match jobs.try_recv() {
                Ok(job) => return Some(Some(job)),
                Err(mpsc::TryRecvError::Empty) => return Some(None),
                Err(mpsc::TryRecvError::Disconnected) => return None,
            }
        }
        jobs.recv().ok().map(Some)
    }

    /// Applies a batch in one transaction, then answers every write in it.
    fn commit(&mut self, mut jobs: Vec<Box<dyn Job>>) {
        // Dropped before `jobs` as a panic unwinds (locals go before parameters): a caller
        // woken by its job's drop finds the store closed already.
        let _closes = ClosesOnPanic(self.stopped.clone());
        // Stable: the writes that may run again first, in the order they came.
        jobs.sort_by_key(|job| !job.rerunnable());
        let touches = self.touches.take(PER_WRITE);
        let mut careful = false;
        let outcomes = loop {
            match self.transaction(&mut jobs, &touches, careful) {
                Ok(Attempt::Committed(outcomes)) => break outcomes,
                Ok(Attempt::Again) => careful = true,
                Ok(Attempt::RolledBackBy(guilty, error, so_far)) => {
                    for (job, outcome) in take_out(&mut jobs, guilty, error, so_far) {
                        finish(job, Err(outcome));
                    }
                    careful = true;
                }
                Ok(Attempt::OneByOne(first)) => break self.one_by_one(&mut jobs, &touches, first),
                Err(e) => {
                    let failure = e.to_string();
                    self.roll_back();
                    let failed = || Err(StoreError::Commit(failure.clone()));
                    break jobs.iter().map(|_| failed()).collect();
                }
            }
        };
        for (job, outcome) in jobs.into_iter().zip(outcomes) {
            finish(job, outcome);
        }
    }

    /// Commits each job in a transaction of its own, after the batch's commit failed for a
    /// deferred foreign key that one of its writes left unresolved (SQLite checks those at
    /// `COMMIT`, and does not say whose): that write fails alone, the others commit. The
    /// writes that run once ran in the lost transaction (`first`: each job's outcome there),
    /// and cannot run again: each keeps its own failure, or is told its work was lost.
    fn one_by_one(
        &mut self,
        jobs: &mut [Box<dyn Job>],
        touches: &[(String, u64)],
        first: Vec<Result<(), StoreError>>,
    ) -> Vec<Result<(), StoreError>> {
        let mut first = first.into_iter();
        let outcomes = jobs.iter_mut().map(|job| {
            let in_the_lost_one = first.next().and_then(Result::err);
            if !job.rerunnable() {
                return Err(in_the_lost_one.unwrap_or_else(lost_at_commit));
            }
            // Interrupted for its bound: not run again (helper-120).
            if let Some(error) = in_the_lost_one.filter(application_writes::was_interrupted) {
                return Err(error);
            }
            match self.transaction(std::slice::from_mut(job), touches, true) {
                Ok(Attempt::Committed(mut outcomes)) => {
                    outcomes.pop().unwrap_or_else(|| Err(lost()))
                }
                Ok(Attempt::RolledBackBy(_, error, _)) => Err(error),
                Ok(Attempt::Again | Attempt::OneByOne(_)) => Err(lost()),
                Err(error) => {
                    self.roll_back();
                    Err(StoreError::Commit(error.to_string()))
                }
            }
        });
        outcomes.collect()
    }

    /// Ends a transaction lost as a whole; the rows it counted are counted again.
    fn roll_back(&mut self) {
        if !self.conn.is_autocommit() {
            let _ = self.conn.execute_batch("ROLLBACK");
        }
        self.rows = entries::count(&self.conn).unwrap_or(self.rows);
    }

    /// The batch's transaction; `Err` when it is lost as a whole. Unless `careful`, the
    /// writes that may run again run without savepoints, and [`Attempt::Again`] says that one
    /// failed and the transaction was rolled back: try again carefully.
    fn transaction(
        &mut self,
        jobs: &mut [Box<dyn Job>],
        touches: &[(String, u64)],
        careful: bool,
    ) -> Result<Attempt, StoreError> {
        restored(&self.conn);
        self.gate.begin(&self.conn)?;
        self.note_purges()?;
        let now_ms = self.clock.now_millis();
        let mut batch = Batch::new(now_ms, self.rows, self.index.clone(), &self.gate);
        apply_touches(&self.conn, &self.index, touches)?;
        let mut outcomes = Vec::with_capacity(jobs.len());
        for (n, job) in jobs.iter_mut().enumerate() {
            let outcome = match careful || !job.rerunnable() {
                true => self.apply_alone(job.as_mut(), &mut batch)?,
                false => job.apply(&self.conn, &mut batch),
            };
            if batch.ended(&self.conn) {
                // SQLite rolled the whole transaction back: by the write's own request (an
                // error it returned, or one it swallowed and said nothing of), or for the disk
                // (full, an I/O error), which fails the batch. Nothing after it committed on
                // its own: the gate turned any such commit into a rollback. A transaction the
                // write opened since is not the batch's: rolled back with what it holds.
                if !self.conn.is_autocommit() {
                    run(&self.conn, "ROLLBACK")?;
                }
                return match outcome {
                    Ok(()) => Ok(Attempt::RolledBackBy(n, ended_the_transaction(), outcomes)),
                    Err(error) if rolled_back_by_the_write(&error) => {
                        Ok(Attempt::RolledBackBy(n, error, outcomes))
                    }
                    Err(error) => Err(StoreError::Commit(format!("transaction lost: {error}"))),
                };
            }
            let Err(error) = outcome else {
                outcomes.push(Ok(()));
                continue;
            };
            if careful || !job.rerunnable() {
                outcomes.push(Err(error));
                continue;
            }
            run(&self.conn, "ROLLBACK")?;
            // Interrupted past its bound: run again carefully, it held the writer as long
            // again, and the batch behind it passed the disk timeout (helper-118). It fails
            // here, and the others are redone without it.
            if application_writes::was_interrupted(&error) {
                return Ok(Attempt::RolledBackBy(n, error, outcomes));
            }
            return Ok(Attempt::Again);
        }
        let evicted = match self.rows_past_the_bound(&mut batch)? {
            true => evict_least_recently_used(&self.conn, &batch, self.max_entries)?,
            false => Vec::new(),
        };
        let evictions = evicted.len() as u64;
        batch.rows -= evictions;
        batch.changes.extend(evicted);
        self.file.check()?;
        // Taken while this transaction holds the file's write lock, so before any purge that
        // could delete what it stores.
        let purges_seen = self.tier.purges_seen();
        if let Err(error) = self.gate.commit(&self.conn) {
            if !fails_a_deferred_foreign_key(&error) {
                return Err(error.into());
            }
            // The transaction stays open after such a failure.
            run(&self.conn, "ROLLBACK")?;
            return Ok(match jobs.len() {
                1 => Attempt::RolledBackBy(0, StoreError::Write(Box::new(error)), Vec::new()),
                _ => Attempt::OneByOne(outcomes),
            });
        }
        crate::telemetry::evicted("lru", evictions);
        self.rows = batch.rows;
        self.publish(batch.changes, purges_seen);
        Ok(Attempt::Committed(outcomes))
    }

    /// Tells the memory tier and the key index what the committed batch changed, before any
    /// of its writers is answered. An entry it stored stays out of memory if an operator's
    /// purge was seen since `purges_seen` (the purge may have deleted it once it committed).
    fn publish(&self, changes: Vec<Change>, purges_seen: u64) {
        for change in changes {
            match change {
                Change::Stored { entry, rowid, new } => {
                    if new {
                        self.index.entry_added(&entry.message_id, rowid);
                    }
                    self.tier.insert(entry, purges_seen);
                }
                Change::Deleted { key, rowid } => {
                    self.index.entry_removed(&key, rowid);
                    self.tier.deleted([&key]);
                }
                Change::Opened(key) => self.index.stream_added(&key),
                Change::Closed(key) => self.index.stream_removed(&key),
                Change::Reloaded(keys) => self.index.reload(&keys),
            }
        }
    }

    /// Notes an operator's purge committed since the last batch (one read of the purge
    /// generation, under the batch's write lock): the rows it deleted are still counted, and
    /// the LRU bound would evict live entries for them. They are counted again once the bound
    /// is passed ([`Writer::rows_past_the_bound`]), not at every batch of a long purge.
    fn note_purges(&mut self) -> rusqlite::Result<()> {
        let purges = purge_watch::generation(&self.conn)?;
        if purges != self.purge_generation {
            self.purge_generation = purges;
            self.rows_may_be_fewer = true;
        }
        Ok(())
    }

    /// Whether the batch's rows pass the LRU bound: counted again, with the batch's own
    /// writes, where a purge may have deleted some behind the writer.
    fn rows_past_the_bound(&mut self, batch: &mut Batch) -> rusqlite::Result<bool> {
        if batch.rows > self.max_entries && self.rows_may_be_fewer {
            batch.rows = entries::count(&self.conn)?;
            self.rows_may_be_fewer = false;
        }
        Ok(batch.rows > self.max_entries)
    }

    /// One job under its own savepoint, so that its failure undoes its own writes only: the
    /// job's outcome, or the savepoint's own failure. A job that fails with the connection in
    /// autocommit took the whole transaction with it; the caller sees to that.
    fn apply_alone(
        &self,
        job: &mut dyn Job,
        batch: &mut Batch,
    ) -> Result<Result<(), StoreError>, StoreError> {
        let mark = batch.mark();
        run(&self.conn, application_writes::SAVEPOINT)?;
        match job.apply(&self.conn, batch) {
            // The write ended the transaction, savepoint and all: the caller sees to it.
            Ok(()) if batch.ended(&self.conn) => Ok(Ok(())),
            Ok(()) => {
                run(&self.conn, application_writes::RELEASE)?;
                Ok(Ok(()))
            }
            Err(error) => {
                batch.rewind(mark);
                if !batch.ended(&self.conn) {
                    run(&self.conn, application_writes::ROLLBACK_TO)?;
                    run(&self.conn, application_writes::RELEASE)?;
                }
                Ok(Err(error))
            }
        }
    }
}

/// How one attempt at a batch's transaction ended, short of losing it.
enum Attempt {
    /// Committed, with each job's outcome.
    Committed(Vec<Result<(), StoreError>>),
    /// A write that may run again failed outside a savepoint, and the transaction was rolled
    /// back: try again, each write under a savepoint of its own.
    Again,
    /// The job at this index had SQLite roll the whole transaction back, with this error;
    /// the outcomes of the jobs before it.
    RolledBackBy(usize, StoreError, Vec<Result<(), StoreError>>),
    /// The commit failed for a deferred foreign key that one of several writes left; each
    /// job's outcome in the lost transaction.
    OneByOne(Vec<Result<(), StoreError>>),
}

/// Answers `job`. What its write captured is dropped here, on the writer's thread: a panic in
/// its `Drop` must not end the thread, which every later write needs.
fn finish(job: Box<dyn Job>, outcome: Result<(), StoreError>) {
    if catch_unwind(AssertUnwindSafe(|| job.finish(outcome))).is_err() {
        tracing::error!("what a staged write captured panicked as it was dropped");
    }
}

/// The failure of a write that ran once in a transaction lost for another write's sake.
fn lost() -> StoreError {
    let why = "another call's write rolled the batch's transaction back";
    StoreError::Commit(format!("{why}; nothing of this one was stored"))
}

/// The failure of a write that ran once in a batch whose commit a deferred foreign key failed.
fn lost_at_commit() -> StoreError {
    let why = "the batch's commit failed for a deferred foreign key that one of its writes \
               (perhaps this one) left unresolved";
    StoreError::Commit(format!("{why}; nothing of this one was stored"))
}

/// The jobs that end with a batch whose transaction the job at `guilty` rolled back: that job,
/// with `error`, the writes that ran once before it (they may not run again, and their work
/// went with the transaction), each with its own failure if it failed (`so_far`, the outcomes
/// of the jobs before `guilty`), and the writes before it that were interrupted for their
/// bound (run again, each would hold the writer as long again: helper-120). The rest stay in
/// `jobs`, for the next attempt.
fn take_out(
    jobs: &mut Vec<Box<dyn Job>>,
    guilty: usize,
    error: StoreError,
    so_far: Vec<Result<(), StoreError>>,
) -> Vec<(Box<dyn Job>, StoreError)> {
    let mut so_far = so_far.into_iter().map(Result::err);
    let mut error = Some(error);
    let mut out = Vec::new();
    for (at, job) in std::mem::take(jobs).into_iter().enumerate() {
        let failed = if at < guilty {
            so_far.next().flatten()
        } else {
            None
        };
        match failed {
            _ if at == guilty => out.push((job, error.take().expect("one guilty job"))),
            failed if at < guilty && !job.rerunnable() => {
                out.push((job, failed.unwrap_or_else(lost)))
            }
            Some(failed) if application_writes::was_interrupted(&failed) => out.push((job, failed)),
            _ => jobs.push(job),
        }
    }
    out
}

/// The error of a write that ended the batch's transaction and said nothing of it.
pub(crate) fn ended_the_transaction() -> StoreError {
    StoreError::Write(Box::new(EndedTheTransaction))
}

#[derive(Debug, thiserror::Error)]
#[error(
    "the write ended the batch's transaction (a statement that rolled it back, whose error it \
     did not return, or a COMMIT or ROLLBACK of its own); nothing of it was stored"
)]
struct EndedTheTransaction;

/// Whether SQLite rolled the transaction back because the write asked it to (a conflict
/// under `ON CONFLICT ROLLBACK`, a trigger's `RAISE(ROLLBACK, ...)`), whatever its error says
/// of it (a write may well return an error of its own words): the write's own failure, unless
/// its error names the disk, whose failure is the batch's. A disk's failure taken for the
/// write's costs one more attempt, which then fails the batch.
fn rolled_back_by_the_write(error: &StoreError) -> bool {
    match error {
        StoreError::Write(write) => !sqlite_code_of(write.as_ref()).is_some_and(is_the_disk_s),
        _ => false,
    }
}

/// The SQLite error among `error` and its causes, if there is one.
fn sqlite_code_of(error: &(dyn std::error::Error + 'static)) -> Option<rusqlite::ffi::Error> {
    let mut cause = Some(error);
    while let Some(error) = cause {
        if let Some(rusqlite::Error::SqliteFailure(failure, _)) = error.downcast_ref() {
            return Some(*failure);
        }
        cause = error.source();
    }
    None
}

fn is_the_disk_s(failure: rusqlite::ffi::Error) -> bool {
    use rusqlite::ErrorCode::*;
    matches!(
        failure.code,
        DiskFull
            | SystemIoFailure
            | DatabaseCorrupt
            | NotADatabase
            | OutOfMemory
            | CannotOpen
            | ReadOnly
            | FileLockingProtocolFailed
    )
}

/// Whether a `COMMIT` failed for a deferred foreign key left unresolved.
fn fails_a_deferred_foreign_key(error: &rusqlite::Error) -> bool {
    sqlite_code_of(error)
        .is_some_and(|failure| failure.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_FOREIGNKEY)
}

/// A statement without results, prepared once: the writer runs these for every write.
pub(super) fn run(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([])?;
    Ok(())
}

fn apply_touches(
    conn: &Connection,
    index: &KeyIndex,
    touches: &[(String, u64)],
) -> rusqlite::Result<()> {
    for (key, at) in touches {
        entries::touch(conn, index, key, *at)?;
    }
    Ok(())
}

/// Keeps at most `max_entries` rows, enforced in the same transaction as the inserts;
/// returns what it evicted.
/// Never an entry the batch itself stores, whatever its stamp says (a wall clock stepped
/// back, or a bound below the batch's size): evicted as it commits, its call's retry would run
/// again. The table is over its bound until the next batch then.
/// At most as many rows as the batch stores, and a sweep chunk more: a bound lowered across a
/// restart is reached batch by batch and by the sweep, never in one call's commit (one batch
/// evicting 199,000 rows took 9 s and wrote an 800 MB log: helper-102).
fn evict_least_recently_used(
    conn: &Connection,
    batch: &Batch,
    max_entries: u64,
) -> rusqlite::Result<Vec<Change>> {
    if batch.rows <= max_entries {
        return Ok(Vec::new());
    }
    let stored: Vec<i64> = batch
        .changes
        .iter()
        .filter_map(|change| match change {
            Change::Stored { rowid, .. } => Some(*rowid),
            _ => None,
        })
        .collect();
    let most = stored.len() as u64 + super::SWEEP_CHUNK;
    entries::delete(
        conn,
        "DELETE FROM idempotency_cache WHERE rowid IN
           (SELECT rowid FROM idempotency_cache
            WHERE rowid NOT IN (SELECT value FROM json_each(?2))
            ORDER BY last_used_at, rowid LIMIT ?1)
         RETURNING rowid, message_id",
        params![
            (batch.rows - max_entries).min(most) as i64,
            serde_json::to_string(&stored).expect("integers"),
        ],
    )
}
