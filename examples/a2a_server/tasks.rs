//! The task store: tables `tasks` and `outbox` in the same SQLite file as the idempotency cache.
//!
//! A task and the outbox event it causes commit in one transaction, so the outbox never
//! announces a task that does not exist and no task misses its event. A send stages them in
//! its call's unit of work, so they commit with the call's cache entry: a crash at any instant
//! leaves both or neither, and a retry never creates a second task. Every other write goes
//! through the same writer (`Database::transact`), reads go to the store's read connections:
//! no connection of the example's own, no mutex, no blocking thread per request.

use idem::{rusqlite, Database, TransactError, UnitOfWork, WriteError};
use jsonrpsee::core::RpcResult;
use jsonrpsee::types::ErrorObjectOwned;
use rusqlite::{params, Connection, OptionalExtension};
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
    db: Database,
}

/// A task as read, with what a later change of it is checked against.
pub struct Loaded {
    pub task: Task,
    /// When its mission completes (epoch ms).
    pub due_at_ms: u64,
    /// `task_json` as read: a staged change applies only if the row still holds it.
    seen: String,
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

impl From<TransactError<Failure>> for Failure {
    fn from(error: TransactError<Failure>) -> Self {
        match error {
            TransactError::Refused(failure) => failure,
            TransactError::Store(e) => Self::Storage(e.to_string()),
        }
    }
}

impl TaskStore {
    /// Creates the tables in the store's database if they are not there yet.
    pub async fn open(db: Database) -> Result<Self, String> {
        db.transact(|conn| conn.execute_batch(SCHEMA))
            .await
            .map_err(|e| e.to_string())?;
        Ok(Self { db })
    }

    /// Stages a new task, and the event that announces it, in the call's unit of work.
    pub fn stage_insert(
        &self,
        unit: &UnitOfWork,
        task: &Task,
        due_at_ms: u64,
        event: Event,
    ) -> RpcResult<()> {
        let task_json = serde_json::to_string(task).map_err(Failure::from)?;
        let (id, context_id, state) = (task.id.clone(), task.context_id.clone(), task.state.name());
        unit.stage(move |conn| {
            conn.prepare_cached(
                "INSERT INTO tasks (id, context_id, state, due_at, created_at, updated_at, task_json)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?5, ?6)",
            )?
            .execute(params![id, context_id, state, due_at_ms as i64, clock::now_ms() as i64, task_json])?;
            record(conn, &id, &event)?;
            Ok(())
        })
    }

    /// Stages `task`, changed from what `loaded` read, in the call's unit of work. It applies
    /// only if the row is unchanged since: a concurrent change fails the call (uncached), and
    /// its retry runs on the task as it is then.
    pub fn stage_update(&self, unit: &UnitOfWork, loaded: Loaded, task: &Task) -> RpcResult<()> {
        let task_json = serde_json::to_string(task).map_err(Failure::from)?;
        let (id, state) = (task.id.clone(), task.state.name());
        unit.stage(move |conn| {
            let changed = conn
                .prepare_cached(
                    "UPDATE tasks SET state = ?2, updated_at = ?3, task_json = ?4
                     WHERE id = ?1 AND task_json = ?5",
                )?
                .execute(params![
                    id,
                    state,
                    clock::now_ms() as i64,
                    task_json,
                    loaded.seen
                ])?;
            match changed {
                1 => Ok(()),
                _ => Err(WriteError::from(format!(
                    "task {id} changed while the call ran"
                ))),
            }
        })
    }

    /// The task `id`, or -32001.
    pub async fn get(&self, id: String) -> RpcResult<Task> {
        Ok(self.load(id).await?.task)
    }

    /// The task `id` with its deadline, or -32001.
    pub async fn load(&self, id: String) -> RpcResult<Loaded> {
        self.read(move |conn| load(conn, &id)).await
    }

    /// Applies `change` to task `id` and writes the result and its event (if any) atomically,
    /// through the store's writer. An error from `change` leaves the task untouched.
    pub async fn update(
        &self,
        id: String,
        change: impl FnOnce(&mut Task) -> Result<Option<Event>, ErrorObjectOwned> + Send + 'static,
    ) -> RpcResult<Task> {
        let changed = self.db.transact(move |conn| {
            // The writer's transaction holds the write lock: nothing changes between the
            // read and the write.
            let Loaded { mut task, .. } = load(conn, &id)?;
            let event = change(&mut task)?;
            conn.prepare_cached(
                "UPDATE tasks SET state = ?2, updated_at = ?3, task_json = ?4 WHERE id = ?1",
            )?
            .execute(params![
                task.id,
                task.state.name(),
                clock::now_ms() as i64,
                serde_json::to_string(&task)?
            ])?;
            if let Some(event) = event {
                record(conn, &task.id, &event)?;
            }
            Ok::<_, Failure>(task)
        });
        changed.await.map_err(|e| Failure::from(e).into())
    }

    /// Ids and deadlines of the missions still running: after a restart they are resumed.
    pub async fn working(&self) -> RpcResult<Vec<(String, u64)>> {
        self.read(|conn| {
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

    async fn read<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Connection) -> Result<T, Failure> + Send + 'static,
    ) -> RpcResult<T> {
        let read = self.db.read(work).await;
        read.map_err(|e| Failure::from(e).into())
    }
}

fn load(conn: &Connection, id: &str) -> Result<Loaded, Failure> {
    let row: Option<(String, i64)> = conn
        .prepare_cached("SELECT task_json, due_at FROM tasks WHERE id = ?1")?
        .query_row([id], |row| Ok((row.get(0)?, row.get(1)?)))
        .optional()?;
    match row {
        Some((seen, due_at)) => Ok(Loaded {
            task: serde_json::from_str(&seen)?,
            due_at_ms: due_at.max(0) as u64,
            seen,
        }),
        None => Err(errors::task_not_found(id).into()),
    }
}

fn record(conn: &Connection, task_id: &str, event: &Event) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "INSERT INTO outbox (task_id, event_type, payload, created_at) VALUES (?1, ?2, ?3, ?4)",
    )?
    .execute(params![
        task_id,
        event.event_type,
        event.payload.to_string(),
        clock::now_ms() as i64
    ])?;
    Ok(())
}
