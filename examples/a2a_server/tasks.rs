//! The task store: tables `tasks` and `outbox` in the same SQLite file as the idempotency cache.
//!
//! A task and the outbox event it causes commit in one transaction, so the outbox never
//! announces a task that does not exist and no task misses its event. One connection behind a
//! mutex is plenty for an example; every use of it runs on tokio's blocking pool.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use jsonrpsee::core::RpcResult;
use jsonrpsee::types::ErrorObjectOwned;
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use serde_json::Value;

use crate::clock;
use crate::errors;
use crate::model::Task;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS tasks (
    id          TEXT NOT NULL PRIMARY KEY,
    context_id  TEXT NOT NULL,
    state       TEXT NOT NULL,     -- working | completed | canceled
    due_at      INTEGER NOT NULL,  -- epoch ms at which the mission completes
    created_at  INTEGER NOT NULL,  -- epoch ms
    updated_at  INTEGER NOT NULL,  -- epoch ms
    task_json   TEXT NOT NULL      -- the whole task (history, artifacts) as this example models it
);
CREATE INDEX IF NOT EXISTS idx_tasks_state ON tasks(state);
CREATE TABLE IF NOT EXISTS outbox (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id      TEXT NOT NULL REFERENCES tasks(id),
    event_type   TEXT NOT NULL,    -- mission.assigned | mission.completed | mission.canceled
    payload      TEXT NOT NULL,    -- JSON
    created_at   INTEGER NOT NULL, -- epoch ms
    delivered_at INTEGER           -- set by a relay once delivered (none in this example)
);
CREATE INDEX IF NOT EXISTS idx_outbox_task ON outbox(task_id);
";

/// An outbox row to write with a task change.
pub struct Event {
    pub event_type: &'static str,
    pub payload: Value,
}

/// The `tasks` and `outbox` tables.
#[derive(Clone)]
pub struct TaskStore {
    conn: Arc<Mutex<Connection>>,
}

/// Why a unit of store work stopped: the store failed, or the change itself refused.
enum Failure {
    Storage(String),
    Refused(ErrorObjectOwned),
}

impl From<rusqlite::Error> for Failure {
    fn from(e: rusqlite::Error) -> Self {
        Self::Storage(e.to_string())
    }
}

impl From<serde_json::Error> for Failure {
    fn from(e: serde_json::Error) -> Self {
        Self::Storage(format!("task_json: {e}"))
    }
}

impl From<ErrorObjectOwned> for Failure {
    fn from(e: ErrorObjectOwned) -> Self {
        Self::Refused(e)
    }
}

impl From<Failure> for ErrorObjectOwned {
    fn from(failure: Failure) -> Self {
        match failure {
            Failure::Refused(error) => error,
            Failure::Storage(detail) => {
                tracing::error!(%detail, "task store failed");
                errors::internal()
            }
        }
    }
}

impl TaskStore {
    /// Opens the tables in the database file. The idempotency store normally created the file
    /// already; with the extension off this creates it, private (0600) like the store does.
    pub async fn open(path: PathBuf) -> Result<Self, String> {
        let conn = tokio::task::spawn_blocking(move || connect(&path))
            .await
            .map_err(|e| e.to_string())??;
        Ok(Self {
            conn: Arc::new(Mutex::new(conn)),
        })
    }

    /// Stores a new task together with the event that announces it.
    pub async fn insert(&self, task: Task, due_at_ms: u64, event: Event) -> RpcResult<()> {
        self.run(move |conn| {
            let tx = conn.transaction()?;
            let now = clock::now_ms() as i64;
            tx.execute(
                "INSERT INTO tasks (id, context_id, state, due_at, created_at, updated_at, task_json)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?5, ?6)",
                params![
                    task.id,
                    task.context_id,
                    task.state.name(),
                    due_at_ms as i64,
                    now,
                    serde_json::to_string(&task)?
                ],
            )?;
            record(&tx, &task.id, &event)?;
            tx.commit()?;
            Ok(())
        })
        .await
    }

    /// The task `id`, or -32001.
    pub async fn get(&self, id: String) -> RpcResult<Task> {
        self.run(move |conn| load(conn, &id)).await
    }

    /// Applies `change` to task `id` and writes the result and its event (if any) atomically.
    /// An error from `change` leaves the task untouched.
    pub async fn update(
        &self,
        id: String,
        change: impl FnOnce(&mut Task) -> Result<Option<Event>, ErrorObjectOwned> + Send + 'static,
    ) -> RpcResult<Task> {
        self.run(move |conn| {
            // IMMEDIATE: the read and the write must see no other writer in between.
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let mut task = load(&tx, &id)?;
            let event = change(&mut task)?;
            tx.execute(
                "UPDATE tasks SET state = ?2, updated_at = ?3, task_json = ?4 WHERE id = ?1",
                params![
                    task.id,
                    task.state.name(),
                    clock::now_ms() as i64,
                    serde_json::to_string(&task)?
                ],
            )?;
            if let Some(event) = event {
                record(&tx, &task.id, &event)?;
            }
            tx.commit()?;
            Ok(task)
        })
        .await
    }

    /// Ids and deadlines of the missions still running: after a restart they are resumed.
    pub async fn working(&self) -> RpcResult<Vec<(String, u64)>> {
        self.run(|conn| {
            let mut statement = conn.prepare("SELECT id, due_at FROM tasks WHERE state = ?1")?;
            let rows = statement.query_map(["working"], |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, i64>(1)?.max(0) as u64,
                ))
            })?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    /// When the mission of a task completes (epoch ms).
    pub async fn due_at(&self, id: String) -> RpcResult<u64> {
        self.run(move |conn| {
            let mut statement = conn.prepare("SELECT due_at FROM tasks WHERE id = ?1")?;
            let due_at: i64 = statement.query_row([id], |row| row.get(0))?;
            Ok(due_at.max(0) as u64)
        })
        .await
    }

    /// Runs `work` on the blocking pool: SQLite calls block, async worker threads must not.
    async fn run<T: Send + 'static>(
        &self,
        work: impl FnOnce(&mut Connection) -> Result<T, Failure> + Send + 'static,
    ) -> RpcResult<T> {
        let conn = self.conn.clone();
        let outcome = tokio::task::spawn_blocking(move || {
            // A panic mid-transaction rolled it back; the connection is still usable.
            let mut conn = conn.lock().unwrap_or_else(PoisonError::into_inner);
            work(&mut conn)
        })
        .await;
        match outcome {
            Ok(result) => result.map_err(Into::into),
            Err(join_error) => Err(Failure::Storage(join_error.to_string()).into()),
        }
    }
}

fn connect(path: &Path) -> Result<Connection, String> {
    create_private(path).map_err(|e| e.to_string())?;
    open(path).map_err(|e| e.to_string())
}

/// Creates `path` with mode 0600 unless it exists: tasks hold what clients sent.
///
/// `create_new` never opens an existing file: closing any descriptor of a database file
/// drops every SQLite lock this process holds on it (POSIX lock semantics), and another
/// process could then checkpoint and delete the WAL under the idempotency store.
fn create_private(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let created = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path);
    match created {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => Err(e),
        _ => Ok(()),
    }
}

fn open(path: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open(path)?;
    // The idempotency store writes to the same file from its own thread.
    conn.busy_timeout(Duration::from_secs(5))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    // A task must be as durable as the cached response that points at it.
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.execute_batch(SCHEMA)?;
    Ok(conn)
}

fn load(conn: &Connection, id: &str) -> Result<Task, Failure> {
    let json: Option<String> = conn
        .query_row("SELECT task_json FROM tasks WHERE id = ?1", [id], |row| {
            row.get(0)
        })
        .optional()?;
    match json {
        Some(json) => Ok(serde_json::from_str(&json)?),
        None => Err(errors::task_not_found(id).into()),
    }
}

fn record(conn: &Connection, task_id: &str, event: &Event) -> Result<(), Failure> {
    conn.execute(
        "INSERT INTO outbox (task_id, event_type, payload, created_at) VALUES (?1, ?2, ?3, ?4)",
        params![
            task_id,
            event.event_type,
            event.payload.to_string(),
            clock::now_ms() as i64
        ],
    )?;
    Ok(())
}
