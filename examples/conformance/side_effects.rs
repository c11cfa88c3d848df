//! Side effects read straight from the server's SQLite file: the `tasks` rows and the
//! `mission.assigned` outbox rows that a replay or a collision must not add (spec §6.1), and
//! whether a messageId has its `idempotency_cache` row (spec §4.4) yet. Only possible where the
//! harness is given the database path (our example server).

use std::path::PathBuf;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

/// The server may be writing; wait for its lock rather than fail the read.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Counts at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub tasks: i64,
    pub assigned: i64,
}

/// The database to read, if the harness has one; without it every check passes vacuously.
#[derive(Debug, Clone, Default)]
pub struct SideEffects {
    pub db: Option<PathBuf>,
}

impl SideEffects {
    /// The current counts, or `None` without a database.
    pub fn snapshot(&self) -> Result<Option<Counts>, String> {
        self.read(|conn| {
            let tasks = conn.query_row("SELECT COUNT(*) FROM tasks", [], |r| r.get(0))?;
            let assigned = conn.query_row(
                "SELECT COUNT(*) FROM outbox WHERE event_type = 'mission.assigned'",
                [],
                |r| r.get(0),
            )?;
            Ok(Counts { tasks, assigned })
        })
    }

    /// Whether the cache holds a row for `message_id`, or `None` without a database.
    pub fn cached(&self, message_id: &str) -> Result<Option<bool>, String> {
        self.read(|conn| {
            conn.query_row(
                "SELECT EXISTS (SELECT 1 FROM idempotency_cache WHERE message_id = ?1)",
                [message_id],
                |r| r.get(0),
            )
        })
    }

    fn read<T>(
        &self,
        query: impl FnOnce(&Connection) -> rusqlite::Result<T>,
    ) -> Result<Option<T>, String> {
        let Some(db) = &self.db else { return Ok(None) };
        let read = || {
            // Read-only: the harness must neither create a missing file nor write to the server's.
            let conn = Connection::open_with_flags(db, OpenFlags::SQLITE_OPEN_READ_ONLY)?;
            conn.busy_timeout(BUSY_TIMEOUT)?;
            query(&conn)
        };
        read()
            .map(Some)
            .map_err(|e| format!("reading {}: {e}", db.display()))
    }

    /// Fails unless exactly `added` tasks and `mission.assigned` events appeared since `before`.
    pub fn expect_added(
        &self,
        before: Option<Counts>,
        added: i64,
        during: &str,
    ) -> Result<(), String> {
        let (Some(before), Some(now)) = (before, self.snapshot()?) else {
            return Ok(());
        };
        let expected = Counts {
            tasks: before.tasks + added,
            assigned: before.assigned + added,
        };
        if now == expected {
            return Ok(());
        }
        Err(format!(
            "{during}: expected {added} new task(s) and mission.assigned event(s), found {} and {}",
            now.tasks - before.tasks,
            now.assigned - before.assigned
        ))
    }
}
