//! The task store's statements on PostgreSQL: staged writes run in the transaction that
//! stores the call's cache entry, everything else on the idempotency store's pool.

use idem::store::deadpool_postgres::{ClientWrapper, GenericClient, Object, Pool};
use idem::store::tokio_postgres::types::ToSql;
use idem::store::tokio_postgres::{self, Transaction};
use idem::store::WriteError;
use idem::UnitOfWork;
use jsonrpsee::core::RpcResult;

use super::sql;
use super::{Change, EventRow, Failure, Loaded, Pending, PushRow, TaskRow, Took};
use crate::model::Task;

/// The advisory lock keys: creating the tables, and delivering the outbox.
const SCHEMA_LOCK: i64 = 2002;
const RELAY_LOCK: i64 = 2003;

/// How long the relay's session may stay idle before PostgreSQL ends it, and with it the lock:
/// a replica cut off without its connection closing (a partition, a frozen host) hands the
/// outbox over after this, not after TCP's keepalive of hours. The relay uses its session far
/// more often (each read, each delivery).
const RELAY_IDLE_TIMEOUT: &str = "30s";

/// Under an advisory lock: replicas that start together do not race on `CREATE`.
pub async fn create(pool: &Pool) -> Result<(), String> {
    let create = async {
        let mut client = pool.get().await.map_err(Failure::from)?;
        let tx = client.transaction().await?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&SCHEMA_LOCK])
            .await?;
        tx.batch_execute(sql::POSTGRES_SCHEMA).await?;
        tx.batch_execute(&sql::postgres_held_index()).await?;
        tx.commit().await?;
        Ok::<_, Failure>(())
    };
    create.await.map_err(|e| e.to_string())
}

pub fn stage_insert(unit: &UnitOfWork, row: TaskRow, events: Vec<EventRow>) -> RpcResult<()> {
    unit.stage_postgres(move |tx| {
        Box::pin(async move {
            tx.execute(
                sql::INSERT_TASK,
                &[
                    &row.id,
                    &row.context_id,
                    &row.state,
                    &row.due_at,
                    &row.now,
                    &row.task_json,
                ],
            )
            .await?;
            for event in &events {
                record(tx, event).await?;
            }
            Ok(())
        })
    })
}

pub fn stage_update(unit: &UnitOfWork, row: TaskRow, seen: String) -> RpcResult<()> {
    unit.stage_postgres(move |tx| {
        Box::pin(async move {
            let changed = tx
                .execute(
                    sql::UPDATE_TASK_IF_UNCHANGED,
                    &[&row.id, &row.state, &row.now, &row.task_json, &seen],
                )
                .await?;
            match changed {
                1 => Ok(()),
                _ => Err(WriteError::from(super::changed_meanwhile(&row.id))),
            }
        })
    })
}

pub fn stage_push_config(unit: &UnitOfWork, row: PushRow) -> RpcResult<()> {
    unit.stage_postgres(move |tx| Box::pin(async move { Ok(upsert_push_config(tx, &row).await?) }))
}

pub async fn set_push_config(pool: &Pool, row: PushRow) -> Result<(), Failure> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    upsert_push_config(&tx, &row).await?;
    Ok(tx.commit().await?)
}

/// The config, its webhook's delivery records forgotten first where it moves to another URL,
/// as on SQLite: a send that set it again (to another URL) kept them, and the new URL skipped
/// what the old one took (found by helper-77).
async fn upsert_push_config(
    tx: &Transaction<'_>,
    row: &PushRow,
) -> Result<(), tokio_postgres::Error> {
    let webhook: [&(dyn tokio_postgres::types::ToSql + Sync); 3] =
        [&row.task_id, &row.config_id, &row.url];
    tx.execute(sql::LOCK_PUSH_CONFIG, &webhook[..2]).await?;
    tx.execute(sql::FORGET_DELIVERIES_IF_MOVED_LOCKED, &webhook)
        .await?;
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 4] =
        [&row.task_id, &row.config_id, &row.config_json, &row.now];
    tx.execute(sql::UPSERT_PUSH_CONFIG, &params).await?;
    Ok(())
}

pub async fn push_configs(pool: &Pool, task_id: String) -> Result<Vec<String>, Failure> {
    texts(pool, sql::PUSH_CONFIGS, &task_id).await
}

/// The first column of the rows `sql` reads for `param` (its `$1`), as text.
async fn texts(
    pool: &Pool,
    sql: &str,
    param: &(dyn tokio_postgres::types::ToSql + Sync),
) -> Result<Vec<String>, Failure> {
    let client = pool.get().await?;
    let rows = client.query(sql, &[param]).await?;
    Ok(rows.iter().map(|row| row.get(0)).collect())
}

pub async fn delete_push_config(
    pool: &Pool,
    task_id: String,
    config_id: String,
) -> Result<bool, Failure> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    let webhook = [
        &task_id as &(dyn tokio_postgres::types::ToSql + Sync),
        &config_id,
    ];
    let deleted = tx.execute(sql::DELETE_PUSH_CONFIG, &webhook).await?;
    tx.execute(sql::FORGET_DELIVERIES, &webhook).await?;
    tx.commit().await?;
    Ok(deleted > 0)
}

/// A session that holds the relay's advisory lock: while it lives, this replica's relay is
/// the one that delivers. It is taken out of the pool, so no other work ever runs on it and
/// the pool keeps its size; the lock ends with the session, when the process dies.
pub struct RelaySession(ClientWrapper);

/// The relay's lock, if no other session holds it.
pub async fn take_relay_lock(pool: &Pool) -> Result<Option<RelaySession>, Failure> {
    let client = pool.get().await?;
    let row = client
        .query_one("SELECT pg_try_advisory_lock($1)", &[&RELAY_LOCK])
        .await?;
    if !row.get::<_, bool>(0) {
        return Ok(None);
    }
    let session = Object::take(client);
    let timeout = format!("SET idle_session_timeout = '{RELAY_IDLE_TIMEOUT}'");
    if let Err(error) = session.batch_execute(&timeout).await {
        // Before PostgreSQL 14: a vanished replica's lock lasts until TCP gives up on it.
        tracing::warn!(%error, "relay: its session has no idle timeout");
    }
    Ok(Some(RelaySession(session)))
}

impl RelaySession {
    /// Whether the session, and so the lock, is still there (a round trip, which also keeps it
    /// from idling out).
    pub async fn alive(&self) -> bool {
        self.0.batch_execute("SELECT 1").await.is_ok()
    }
}

pub async fn undelivered(pool: &Pool, limit: i64, now: i64) -> Result<Vec<Pending>, Failure> {
    let client = pool.get().await?;
    let rows = client.query(sql::UNDELIVERED, &[&limit, &now]).await?;
    let pending = rows.iter().map(|row| Pending {
        id: row.get(0),
        task_id: row.get(1),
        event_type: row.get(2),
        has_webhooks: row.get(3),
        next_attempt_at: row.get(4),
        attempts: row.get::<_, i32>(5) as u32,
        reached_some: row.get(6),
    });
    Ok(pending.collect())
}

pub async fn delivered_to(pool: &Pool, id: i64) -> Result<Vec<String>, Failure> {
    texts(pool, sql::DELIVERED_TO, &id).await
}

pub async fn record_deliveries(pool: &Pool, took: Took, now: i64) -> Result<bool, Failure> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    let statement = tx.prepare_cached(sql::RECORD_DELIVERY_LOCKING).await?;
    for (config_id, url) in &took.configs {
        let params: [&(dyn ToSql + Sync); 5] = [&took.event, config_id, &now, &took.task, url];
        tx.execute(&statement, &params).await?;
    }
    let marked = match took.complete {
        true => {
            tx.execute(sql::MARK_DELIVERED_TO_ALL, &[&took.event, &now])
                .await?
                > 0
        }
        false => false,
    };
    tx.commit().await?;
    Ok(marked)
}

/// Runs `sql` (`$1` an event id, `$2` a value) for each of `ids`, in one transaction; how
/// many rows it changed.
pub async fn mark(pool: &Pool, sql: &str, ids: Vec<i64>, value: i64) -> Result<u64, Failure> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    let statement = tx.prepare_cached(sql).await?;
    let mut changed = 0;
    for id in &ids {
        changed += tx.execute(&statement, &[id, &value]).await?;
    }
    tx.commit().await?;
    Ok(changed)
}

/// Runs `sql` (a delete of `$2` rows at most, before `$1`) once; how many rows it deleted.
pub async fn delete_chunk(pool: &Pool, sql: &str, before: i64, chunk: i64) -> Result<u64, Failure> {
    let client = pool.get().await?;
    Ok(client.execute(sql, &[&before, &chunk]).await?)
}

pub async fn load(pool: &Pool, id: String) -> Result<Loaded, Failure> {
    let client = pool.get().await?;
    load_in(&client, &id, "").await
}

/// `FOR UPDATE` holds the row until commit: nothing changes between read and write.
pub async fn update(pool: &Pool, id: String, change: Change) -> Result<Task, Failure> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    let loaded = load_in(&tx, &id, " FOR UPDATE").await?;
    let (task, row, event) = super::apply(loaded, change)?;
    tx.execute(
        sql::UPDATE_TASK,
        &[&row.id, &row.state, &row.now, &row.task_json],
    )
    .await?;
    if let Some(event) = event {
        record(&tx, &event).await?;
    }
    tx.commit().await?;
    Ok(task)
}

pub async fn in_state(pool: &Pool, state: &'static str) -> Result<Vec<(String, i64)>, Failure> {
    let client = pool.get().await?;
    let rows = client.query(sql::TASKS_IN_STATE, &[&state]).await?;
    Ok(rows.iter().map(|row| (row.get(0), row.get(1))).collect())
}

async fn load_in(client: &impl GenericClient, id: &str, lock: &str) -> Result<Loaded, Failure> {
    let statement = client
        .prepare_cached(&format!("{}{lock}", sql::LOAD_TASK))
        .await?;
    let row = client.query_opt(&statement, &[&id]).await?;
    super::loaded(id, row.map(|row| (row.get(0), row.get(1))))
}

async fn record(tx: &Transaction<'_>, event: &EventRow) -> Result<(), tokio_postgres::Error> {
    tx.execute(
        sql::RECORD_EVENT,
        &[
            &event.task_id,
            &event.event_type,
            &event.payload,
            &event.now,
        ],
    )
    .await?;
    Ok(())
}
