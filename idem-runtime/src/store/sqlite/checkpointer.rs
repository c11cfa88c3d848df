//! The SQLite store's checkpointer: copies the write-ahead log back into the database file on
//! a thread of its own.
//!
//! SQLite's default runs a checkpoint inside the commit that grows the log past 1000 pages,
//! on the committing connection: the writer thread then stalls for the checkpoint's writes
//! and fsync while every call waiting on it waits too. Here the writer never checkpoints
//! (`wal_autocheckpoint=0`); this thread runs a PASSIVE checkpoint, which never blocks the
//! writer or a reader, every [`INTERVAL`], and the log restarts from its beginning once a
//! checkpoint has copied all of it.

use std::path::Path;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::Duration;

use rusqlite::Connection;

use crate::store::StoreError;

/// How often the log is copied back: often enough that it stays a few megabytes under load.
const INTERVAL: Duration = Duration::from_millis(250);

pub(crate) struct Checkpointer {
    stop: mpsc::Sender<()>,
    thread: JoinHandle<()>,
}

impl Checkpointer {
    pub(crate) fn start(
        path: &Path,
        connect: fn(&Path) -> Result<Connection, StoreError>,
    ) -> Result<Self, StoreError> {
        let conn = connect(path)?;
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("idem-sqlite-checkpoint".into())
            .spawn(move || loop {
                match stopped.recv_timeout(INTERVAL) {
                    Err(RecvTimeoutError::Timeout) => checkpoint(&conn, "PASSIVE"),
                    // Closing: copy what is left, so the file alone holds everything.
                    Ok(()) | Err(RecvTimeoutError::Disconnected) => {
                        return checkpoint(&conn, "TRUNCATE");
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

fn checkpoint(conn: &Connection, mode: &str) {
    let sql = format!("PRAGMA wal_checkpoint({mode})");
    if let Err(e) = conn.query_row(&sql, [], |_| Ok(())) {
        tracing::warn!(error = %e, "SQLite checkpoint failed; the log is copied back later");
    }
}
