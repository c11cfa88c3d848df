//! The gate on the writer's connection: only the writer's own `COMMIT` commits, and every
//! rollback is noted.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use rusqlite::Connection;

use crate::store::sqlite::writer::run;

/// The writer's connection commits only where the writer says `COMMIT`. A staged write that
/// had SQLite roll the batch's transaction back (`INSERT OR ROLLBACK`, `RAISE(ROLLBACK)`)
/// and went on, having swallowed the error, would otherwise commit each later statement on
/// its own, its own and the next calls' writes and entries, while their calls are told the
/// batch failed and run again; a `COMMIT` of its own would commit half a batch. Any commit
/// but the writer's is turned into a rollback instead (the statement fails).
///
/// Every rollback is noted too: a write that rolled the batch back and then opened a
/// transaction of its own (`ROLLBACK; BEGIN`) leaves the connection in a transaction, which
/// the writer would otherwise take for the batch's, and commit the later calls' entries
/// while the earlier ones' were gone (see [`Batch::ended`](super::batch::Batch::ended)).
pub(crate) struct CommitGate {
    open: Arc<AtomicBool>,
    rolled_back: Arc<AtomicBool>,
}

impl CommitGate {
    /// Installs the gate on the writer's connection, closed.
    pub(crate) fn install(conn: &Connection) -> Self {
        let open = Arc::new(AtomicBool::new(false));
        let seen = open.clone();
        // `true` turns the commit into a rollback.
        conn.commit_hook(Some(move || !seen.load(Ordering::SeqCst)));
        let rolled_back = Arc::new(AtomicBool::new(false));
        let noted = rolled_back.clone();
        conn.rollback_hook(Some(move || noted.store(true, Ordering::SeqCst)));
        Self { open, rolled_back }
    }

    /// Begins the batch's transaction, with no rollback noted in it.
    pub(super) fn begin(&self, conn: &Connection) -> rusqlite::Result<()> {
        // IMMEDIATE takes the write lock up front, waiting on busy_timeout if another
        // connection holds it. A deferred transaction that reads first would fail at once
        // with SQLITE_BUSY when it upgrades to write.
        run(conn, "BEGIN IMMEDIATE")?;
        self.rolled_back.store(false, Ordering::SeqCst);
        Ok(())
    }

    pub(super) fn commit(&self, conn: &Connection) -> rusqlite::Result<()> {
        self.open.store(true, Ordering::SeqCst);
        let committed = run(conn, "COMMIT");
        self.open.store(false, Ordering::SeqCst);
        committed
    }

    /// The flag every rollback sets, for a batch to tell whether its transaction ended.
    pub(super) fn rolled_back(&self) -> Arc<AtomicBool> {
        self.rolled_back.clone()
    }
}
