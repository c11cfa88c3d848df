//! Side effects read straight from the server's database: the `tasks` rows and the
//! `mission.assigned` outbox rows that a replay or a collision must not add (spec §6.1), and
//! whether a messageId has its `idempotency_cache` row (spec §4.4) yet. Only possible where the
//! harness is given the database: its SQLite file, read-only, or its PostgreSQL URL. The tables
//! read are the example server's, [`EXPECTED_TABLES`]; another server's are read through views
//! of those names.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

/// What the side-effect counts read, besides the spec's `idempotency_cache`.
pub const EXPECTED_TABLES: &str = "`tasks(id)`, one row a task, `outbox(id, task_id, \
    event_type)`, one row an event, `event_type = 'mission.assigned'` for a task's assignment, \
    and `idempotency_cache(message_id)`, one row a stored answer (the streaming scenarios read \
    it; it was left out of this list: helper-99)";

/// The server may be writing; wait for its lock rather than fail the read.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Counts at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub tasks: i64,
    pub assigned: i64,
}

/// The server's database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Db {
    File(PathBuf),
    Postgres(String),
}

impl Db {
    /// A `postgres://` URL, or a file path.
    pub fn parse(value: &str) -> Self {
        match value.starts_with("postgres://") || value.starts_with("postgresql://") {
            true => Self::Postgres(value.to_owned()),
            false => Self::File(PathBuf::from(value)),
        }
    }
}

/// The database to read, if the harness has one; without it every check passes vacuously.
#[derive(Debug, Clone, Default)]
pub struct SideEffects {
    pub db: Option<Db>,
}

impl SideEffects {
    /// The current counts, or `None` without a database.
    pub fn snapshot(&self) -> Result<Option<Counts>, String> {
        let Some(tasks) = self.count("SELECT COUNT(*) FROM tasks", None)? else {
            return Ok(None);
        };
        let assigned = self.count(
            "SELECT COUNT(*) FROM outbox WHERE event_type = 'mission.assigned'",
            None,
        )?;
        Ok(assigned.map(|assigned| Counts { tasks, assigned }))
    }

    /// Whether the cache holds a row for `message_id`, or `None` without a database.
    pub fn cached(&self, message_id: &str) -> Result<Option<bool>, String> {
        let sql = "SELECT COUNT(*) FROM idempotency_cache WHERE message_id = $1";
        Ok(self.count(sql, Some(message_id))?.map(|n| n > 0))
    }

    /// Every task's id with its number of `mission.assigned` events, or `None` without a
    /// database: where each messageId's one task is known, this shows that no call made a
    /// second task or event, not only that the totals agree.
    pub fn assigned_per_task(&self) -> Result<Option<HashMap<String, i64>>, String> {
        const SQL: &str = "SELECT t.id, COUNT(o.id) FROM tasks t
            LEFT JOIN outbox o ON o.task_id = t.id AND o.event_type = 'mission.assigned'
            GROUP BY t.id";
        let pairs = match &self.db {
            None => return Ok(None),
            Some(Db::File(path)) => read_file(path, |conn| {
                let mut statement = conn.prepare(SQL)?;
                let rows = statement.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
                rows.collect::<rusqlite::Result<Vec<_>>>()
            })?,
            Some(Db::Postgres(url)) => crate::postgres::pairs(url, SQL).map_err(schema_hint)?,
        };
        Ok(Some(pairs.into_iter().collect()))
    }

    /// The one integer `sql` (PostgreSQL's dialect, at most one text parameter `$1`) returns.
    fn count(&self, sql: &str, param: Option<&str>) -> Result<Option<i64>, String> {
        match &self.db {
            None => Ok(None),
            Some(Db::File(path)) => read_file(path, |conn| {
                let sql = sql.replace('$', "?");
                conn.query_row(&sql, rusqlite::params_from_iter(param), |r| r.get(0))
            })
            .map(Some),
            Some(Db::Postgres(url)) => crate::postgres::count(url, sql, param)
                .map(Some)
                .map_err(schema_hint),
        }
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

/// What `read` finds in the SQLite file at `path`, opened read-only: the harness must neither
/// create a missing file nor write to the server's.
fn read_file<T>(
    path: &Path,
    read: impl FnOnce(&Connection) -> rusqlite::Result<T>,
) -> Result<T, String> {
    let open = || {
        let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY)?;
        conn.busy_timeout(BUSY_TIMEOUT)?;
        read(&conn)
    };
    open().map_err(|e| schema_hint(format!("reading {}: {e}", path.display())))
}

/// `error`, with what the harness expects to find when it names a missing table (SQLite: "no
/// such table", PostgreSQL: "relation ... does not exist").
fn schema_hint(error: String) -> String {
    if !(error.contains("no such table") || error.contains("does not exist")) {
        return error;
    }
    format!(
        "{error}: --db counts side effects in the example server's tables, {EXPECTED_TABLES}; \
         over a schema of your own, create views of those names"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server of another schema gets told what to create, not only SQLite's "no such table".
    #[test]
    fn a_database_without_the_tables_names_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("other.db");
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch("CREATE TABLE jobs (id TEXT PRIMARY KEY)")
            .unwrap();
        let effects = SideEffects {
            db: Some(Db::File(path)),
        };
        let error = effects.snapshot().unwrap_err();
        assert!(error.contains("no such table: tasks"), "{error}");
        assert!(error.contains("outbox(id, task_id, event_type)"), "{error}");
        assert!(error.contains("create views of those names"), "{error}");
    }
}
