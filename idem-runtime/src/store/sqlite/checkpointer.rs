//! The SQLite store's checkpointer: copies the write-ahead log back into the database file on
//! a thread of its own.
//!
//! SQLite's default runs a checkpoint inside the commit that grows the log past 1000 pages,
//! on the committing connection: the writer thread then stalls for the checkpoint's writes
//! and fsync while every call waiting on it waits too. Here the writer never checkpoints
//! (`wal_autocheckpoint=0`); this thread runs a PASSIVE checkpoint, which never blocks the
//! writer or a reader, every [`BUSY_INTERVAL`] while the log grows and every [`IDLE_INTERVAL`]
//! once it stops, and the log restarts from its beginning once a checkpoint has copied all of
//! it.
//!
//! Under sustained load that moment never comes: the writer appends while the checkpoint
//! copies, so the log only grows (1.5 GB in 10 s of fresh calls, measured), and with it every
//! read's search of the log's index and the disk it takes. A RESTART checkpoint from here
//! would have to catch the writer between two batches, and starves (over a second, measured).
//! So once a passive checkpoint leaves the log longer than [`RESTART_FRAMES`], this asks the
//! writer to run one itself between two batches ([`Restart`]): with nothing being written it
//! copies the rest of the log, which is little since this thread copied most, and the
//! writer's next transaction starts the log over, truncated to `journal_size_limit`.
//!
//! The log is kept short ([`RESTART_FRAMES`]) because its length costs every write, not only
//! disk: each page the writer or a reader looks up is searched for in SQLite's index of the
//! log, one hash table per 4,096 frames, and a short log's pages are rewritten while the
//! kernel's copies of them are still in the CPU's caches. A 64 MiB log, restarted at its
//! end, ran fresh calls (`benches/load/fresh.lua`, 64 connections, 15 s) at 10,740, 10,524
//! and 11,023 req/s; this one, copied back every 50 ms and restarted past 8 MiB, at 11,685,
//! 11,121 and 11,619 in the same sitting, runs alternated.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use rusqlite::Connection;

use crate::store::sqlite::file_identity::FileIdentity;
use crate::store::sqlite::purge_watch::PurgeWatch;
use crate::store::sqlite::repeated_failure::RepeatedFailure;
use crate::store::StoreError;

/// How often the log is copied back while the writer adds to it: what is left for the
/// writer's own checkpoint at a start over is no more than this much of its writes.
const BUSY_INTERVAL: Duration = Duration::from_millis(50);

/// How often the log is looked at once nothing is written to it (and, at the latest, how
/// often another process's purges are looked for).
const IDLE_INTERVAL: Duration = Duration::from_millis(250);

/// A log longer than this (in pages: 8 MiB of 4 KiB ones) is started over.
const RESTART_FRAMES: i64 = 2 * 1024;

/// The checkpointer's request that the writer start the log over.
#[derive(Clone, Default)]
pub(crate) struct Restart(Arc<AtomicBool>);

impl Restart {
    /// Called by the writer between two batches, on its own connection: a checkpoint with
    /// nothing written meanwhile, if one was asked for and `file` may still be checkpointed
    /// (see `FileIdentity::may_checkpoint`; helper-78). The files are looked at only then,
    /// not after every batch.
    pub(crate) fn run_if_asked(&self, writer: &Connection, file: &FileIdentity) {
        if self.0.swap(false, Ordering::Relaxed) && file.may_checkpoint() {
            checkpoint(writer, "PASSIVE");
        }
    }
}

pub(crate) struct Checkpointer {
    stop: mpsc::Sender<()>,
    thread: JoinHandle<()>,
}

impl Checkpointer {
    pub(crate) fn start(
        path: &Path,
        connect: fn(&Path) -> Result<Connection, StoreError>,
        restart: Restart,
        mut purges: PurgeWatch,
    ) -> Result<Self, StoreError> {
        let conn = connect(path)?;
        let file = FileIdentity::of(path)?;
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("idem-sqlite-checkpoint".into())
            .spawn(move || {
                let mut failing = RepeatedFailure::new("SQLite checkpoint");
                let mut wait = IDLE_INTERVAL;
                let mut last_log_pages = None;
                loop {
                    match stopped.recv_timeout(wait) {
                        Err(RecvTimeoutError::Timeout) => {
                            purges.look(&conn);
                            let log_pages = file
                                .may_checkpoint()
                                .then(|| failing.note(try_checkpoint(&conn, "PASSIVE")))
                                .flatten();
                            if log_pages.unwrap_or(0) > RESTART_FRAMES {
                                restart.0.store(true, Ordering::Relaxed);
                            }
                            let growing = log_pages.is_some() && log_pages != last_log_pages;
                            wait = if growing {
                                BUSY_INTERVAL
                            } else {
                                IDLE_INTERVAL
                            };
                            last_log_pages = log_pages;
                        }
                        // Closing: copy what is left, so the file alone holds everything.
                        Ok(()) | Err(RecvTimeoutError::Disconnected) => {
                            if file.may_checkpoint() {
                                checkpoint(&conn, "TRUNCATE");
                            }
                            return;
                        }
                    }
                }
            })?;
        Ok(Self { stop, thread })
    }

    /// Runs a last checkpoint and joins the thread; call after the writer has stopped.
    pub(crate) fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.thread.join();
    }
}

/// Runs a checkpoint, once (the writer's start over, the last one at closing); a failure is
/// logged.
fn checkpoint(conn: &Connection, mode: &str) {
    if let Err(e) = try_checkpoint(conn, mode) {
        tracing::warn!(error = %e, "SQLite checkpoint failed; the log is copied back later");
    }
}

/// Runs a checkpoint; how many pages the log holds.
fn try_checkpoint(conn: &Connection, mode: &str) -> rusqlite::Result<i64> {
    let sql = format!("PRAGMA wal_checkpoint({mode})");
    conn.query_row(&sql, [], |row| row.get::<_, i64>(1))
}
