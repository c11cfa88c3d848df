//! The task store's statements on SQLite: staged writes run on the idempotency store's
//! writer thread, reads on its read connections.

use idem::store::{rusqlite, Database, WriteError};
use idem::UnitOfWork;
use jsonrpsee::core::RpcResult;
use rusqlite::{params, Connection, OptionalExtension};

use super::sql::{self, sqlite};
use super::{Change, EventRow, Failure, Loaded, Pending, PushRow, TaskRow, Took};
use crate::model::Task;

pub async fn create(db: &Database) -> Result<(), String> {
    let created = db.transact(|conn| add_tables(conn).map_err(not_ours));
    created.await.map_err(|e| e.to_string())
}

/// The example's tables, in the writer's transaction: all of them, or none.
fn add_tables(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(sql::SQLITE_SCHEMA)?;
    for (column, definition) in sql::OUTBOX_ADDED_COLUMNS {
        let has: i64 =
            conn.query_row(&sqlite(sql::SQLITE_OUTBOX_HAS), [column], |row| row.get(0))?;
        if has == 0 {
            conn.execute_batch(&format!(
                "ALTER TABLE outbox ADD COLUMN {column} {definition}"
            ))?;
        }
    }
    conn.execute_batch(sql::HELD_INDEX)
}

/// Why the tables could not be made: SQLite's reason alone, not the schema's 40 lines of SQL
/// that its error quotes (helper-63), and what to do.
fn not_ours(error: rusqlite::Error) -> String {
    let reason = match error {
        rusqlite::Error::SqlInputError { msg, .. } => msg,
        other => other.to_string(),
    };
    format!("its tables are not this example's ({reason}): serve another file, or move them out")
}

pub fn stage_insert(unit: &UnitOfWork, row: TaskRow, events: Vec<EventRow>) -> RpcResult<()> {
    unit.stage(move |conn| {
        conn.prepare_cached(&sqlite(sql::INSERT_TASK))?
            .execute(params![
                row.id,
                row.context_id,
                row.state,
                row.due_at,
                row.now,
                row.task_json
            ])?;
        for event in &events {
            record(conn, event)?;
        }
        Ok(())
    })
}

pub fn stage_update(unit: &UnitOfWork, row: TaskRow, seen: String) -> RpcResult<()> {
    unit.stage(move |conn| {
        let changed = conn
            .prepare_cached(&sqlite(sql::UPDATE_TASK_IF_UNCHANGED))?
            .execute(params![row.id, row.state, row.now, row.task_json, seen])?;
        match changed {
            1 => Ok(()),
            _ => Err(WriteError::from(super::changed_meanwhile(&row.id))),
        }
    })
}

pub fn stage_push_config(unit: &UnitOfWork, row: PushRow) -> RpcResult<()> {
    unit.stage(move |conn| Ok(upsert_push_config(conn, &row)?))
}

pub async fn set_push_config(db: &Database, row: PushRow) -> Result<(), Failure> {
    let set = db.transact(move |conn| upsert_push_config(conn, &row));
    Ok(set.await?)
}

/// The config, its webhook's delivery records forgotten first where it moves to another URL.
fn upsert_push_config(conn: &Connection, row: &PushRow) -> rusqlite::Result<()> {
    conn.prepare_cached(&sqlite(sql::FORGET_DELIVERIES_IF_MOVED))?
        .execute(params![row.task_id, row.config_id, row.url])?;
    conn.prepare_cached(&sqlite(sql::UPSERT_PUSH_CONFIG))?
        .execute(params![
            row.task_id,
            row.config_id,
            row.config_json,
            row.now
        ])?;
    Ok(())
}

fn forget_deliveries(conn: &Connection, task_id: &str, config_id: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(&sqlite(sql::FORGET_DELIVERIES))?
        .execute([task_id, config_id])?;
    Ok(())
}

pub async fn push_configs(db: &Database, task_id: String) -> Result<Vec<String>, Failure> {
    texts(db, sql::PUSH_CONFIGS, task_id).await
}

/// The first column of the rows `sql` reads for `param` (its `$1`), as text.
async fn texts(
    db: &Database,
    sql: &'static str,
    param: impl rusqlite::ToSql + Send + 'static,
) -> Result<Vec<String>, Failure> {
    let read = db.read(move |conn| {
        let mut statement = conn.prepare_cached(&sqlite(sql))?;
        let rows = statement.query_map([param], |row| row.get(0))?;
        rows.collect::<rusqlite::Result<Vec<String>>>()
    });
    Ok(read.await?)
}

pub async fn delete_push_config(
    db: &Database,
    task_id: String,
    config_id: String,
) -> Result<bool, Failure> {
    let deleted = db.transact(move |conn| {
        let mut statement = conn.prepare_cached(&sqlite(sql::DELETE_PUSH_CONFIG))?;
        let deleted = statement.execute([&task_id, &config_id])?;
        forget_deliveries(conn, &task_id, &config_id)?;
        Ok::<_, rusqlite::Error>(deleted)
    });
    Ok(deleted.await? > 0)
}

pub async fn undelivered(db: &Database, limit: i64, now: i64) -> Result<Vec<Pending>, Failure> {
    let read = db.read(move |conn| {
        let mut statement = conn.prepare_cached(&sqlite(sql::UNDELIVERED))?;
        let rows = statement.query_map([limit, now], |row| {
            Ok(Pending {
                id: row.get(0)?,
                task_id: row.get(1)?,
                event_type: row.get(2)?,
                has_webhooks: row.get(3)?,
                next_attempt_at: row.get(4)?,
                attempts: row.get(5)?,
                reached_some: row.get(6)?,
            })
        })?;
        rows.collect::<rusqlite::Result<Vec<_>>>()
    });
    Ok(read.await?)
}

pub async fn delivered_to(db: &Database, id: i64) -> Result<Vec<String>, Failure> {
    texts(db, sql::DELIVERED_TO, id).await
}

pub async fn record_deliveries(db: &Database, took: Took, now: i64) -> Result<bool, Failure> {
    let recorded = db.transact(move |conn| {
        let mut statement = conn.prepare_cached(&sqlite(sql::RECORD_DELIVERY))?;
        for (config_id, url) in &took.configs {
            statement.execute(params![took.event, config_id, now, took.task, url])?;
        }
        if !took.complete {
            return Ok(false);
        }
        let mut mark = conn.prepare_cached(&sqlite(sql::MARK_DELIVERED_TO_ALL))?;
        Ok::<_, rusqlite::Error>(mark.execute(params![took.event, now])? > 0)
    });
    Ok(recorded.await?)
}

/// Runs `sql` (`$1` an event id, `$2` a value) for each of `ids`, in one transaction; how
/// many rows it changed.
pub async fn mark(db: &Database, sql: &str, ids: Vec<i64>, value: i64) -> Result<u64, Failure> {
    let sql = sqlite(sql);
    let marked = db.transact(move |conn| {
        let mut statement = conn.prepare_cached(&sql)?;
        let mut changed = 0;
        for id in &ids {
            changed += statement.execute(params![id, value])? as u64;
        }
        Ok::<_, rusqlite::Error>(changed)
    });
    Ok(marked.await?)
}

/// Runs `sql` (a delete of `$2` rows at most, before `$1`) once; how many rows it deleted.
pub async fn delete_chunk(
    db: &Database,
    sql: &str,
    before: i64,
    chunk: i64,
) -> Result<u64, Failure> {
    let sql = sqlite(sql);
    let deleted = db.transact(move |conn| {
        let deleted = conn.prepare_cached(&sql)?.execute(params![before, chunk])?;
        Ok::<_, rusqlite::Error>(deleted as u64)
    });
    Ok(deleted.await?)
}

pub async fn load(db: &Database, id: String) -> Result<Loaded, Failure> {
    let read = db.read(move |conn| load_in(conn, &id)).await;
    Ok(read?)
}

/// The writer's transaction holds the write lock: nothing changes between read and write.
pub async fn update(db: &Database, id: String, change: Change) -> Result<Task, Failure> {
    let changed = db.transact(move |conn| {
        let loaded = load_in(conn, &id)?;
        let (task, row, event) = super::apply(loaded, change)?;
        conn.prepare_cached(&sqlite(sql::UPDATE_TASK))?
            .execute(params![row.id, row.state, row.now, row.task_json])?;
        if let Some(event) = event {
            record(conn, &event)?;
        }
        Ok::<_, Failure>(task)
    });
    Ok(changed.await?)
}

pub async fn in_state(db: &Database, state: &'static str) -> Result<Vec<(String, i64)>, Failure> {
    let read = db.read(move |conn| {
        let mut statement = conn.prepare_cached(&sqlite(sql::TASKS_IN_STATE))?;
        let rows = statement.query_map([state], |row| Ok((row.get(0)?, row.get(1)?)))?;
        Ok::<_, Failure>(rows.collect::<Result<Vec<_>, _>>()?)
    });
    Ok(read.await?)
}

fn load_in(conn: &Connection, id: &str) -> Result<Loaded, Failure> {
    let row: Option<(String, i64)> = conn
        .prepare_cached(&sqlite(sql::LOAD_TASK))?
        .query_row([id], |row| Ok((row.get(0)?, row.get(1)?)))
        .optional()?;
    super::loaded(id, row)
}

fn record(conn: &Connection, event: &EventRow) -> rusqlite::Result<()> {
    conn.prepare_cached(&sqlite(sql::RECORD_EVENT))?
        .execute(params![
            event.task_id,
            event.event_type,
            event.payload,
            event.now
        ])?;
    Ok(())
}
