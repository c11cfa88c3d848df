//! The task store: tables `tasks` and `outbox` in the idempotency store's own database, a
//! SQLite file or a PostgreSQL database (`tasks/sqlite.rs`, `tasks/postgres.rs`, one SQL text
//! per statement in `tasks/sql.rs`).
//!
//! A task and the outbox event it causes commit in one transaction, so the outbox never
//! announces a task that does not exist and no task misses its event. A send stages them in
//! its call's unit of work, so they commit with the call's cache entry: a crash at any instant
//! leaves both or neither, and a retry never creates a second task, on any replica. Every
//! other write goes through the store too (SQLite's writer, PostgreSQL's pool): no connection
//! of the example's own, no mutex, no blocking thread per request.

mod pending;
mod postgres;
mod sql;
mod sqlite;

pub use pending::Pending;

use idem::store::deadpool_postgres::{Pool, PoolError};
use idem::store::tokio_postgres;
use idem::store::{rusqlite, Database, TransactError};
use idem::UnitOfWork;
use jsonrpsee::core::RpcResult;
use jsonrpsee::types::ErrorObjectOwned;
use serde_json::Value;

use crate::clock;
use crate::errors;
use crate::model::Task;
use crate::push::StoredConfig;

/// The counter of tasks this process staged, committed or not (`GET /metrics`). More than the
/// tasks table gained means a body ran whose writes its unit of work dropped: a second
/// execution the rows alone would not show, which the tests compare them for (helper-123).
pub const STAGED: &str = "a2a_tasks_staged_total";

/// An outbox row to write with a task change.
pub struct Event {
    pub event_type: &'static str,
    pub payload: Value,
}

/// The webhooks that took an outbox event in one attempt, for
/// [`TaskStore::record_deliveries`].
pub struct Took {
    pub event: i64,
    pub task: String,
    /// Each webhook's config id, with the URL it was posted to.
    pub configs: Vec<(String, String)>,
    /// No webhook the attempt meant to post failed or was held back.
    pub complete: bool,
}

/// The `tasks` and `outbox` tables.
#[derive(Clone)]
pub struct TaskStore {
    db: Backend,
}

#[derive(Clone)]
enum Backend {
    Sqlite(Database),
    Postgres(Pool),
}

/// A task as read, with what a later change of it is checked against.
pub struct Loaded {
    pub task: Task,
    /// When its mission completes (epoch ms).
    pub due_at_ms: u64,
    /// `task_json` as read: a staged change applies only if the row still holds it.
    seen: String,
}

/// A change of a task, and the event it causes, if any; an error leaves the task untouched.
type Change = Box<dyn FnOnce(&mut Task) -> Result<Option<Event>, ErrorObjectOwned> + Send>;

/// What makes this process's relay the one that delivers the outbox (`relay.rs`), so that each
/// event goes out once, in its task's order: on SQLite, being the one process that serves the
/// file (the store's file lock); on PostgreSQL, where replicas share the outbox, a session that
/// holds the relay's advisory lock.
pub enum RelayLock {
    Process,
    Session(postgres::RelaySession),
}

impl RelayLock {
    /// Whether it is still held: a replica's session can end under it (a restart of
    /// PostgreSQL, a dropped connection), and another replica's relay may then take over.
    pub async fn held(&self) -> bool {
        match self {
            RelayLock::Process => true,
            RelayLock::Session(session) => session.alive().await,
        }
    }
}

/// A `tasks` row to write, its columns as both databases take them.
struct TaskRow {
    id: String,
    context_id: String,
    state: &'static str,
    due_at: i64,
    now: i64,
    task_json: String,
}

/// A `push_configs` row to write: one webhook of a task.
struct PushRow {
    task_id: String,
    config_id: String,
    config_json: String,
    /// The config's URL: set again to the same one, the webhook keeps what it took.
    url: String,
    now: i64,
}

impl PushRow {
    fn of(task_id: &str, config: &StoredConfig) -> Self {
        Self {
            task_id: task_id.to_owned(),
            config_id: config.id.clone(),
            config_json: config.json.clone(),
            url: config.url.clone(),
            now: clock::now_ms() as i64,
        }
    }
}

/// An `outbox` row to write.
struct EventRow {
    task_id: String,
    event_type: &'static str,
    payload: String,
    now: i64,
}

impl TaskRow {
    fn of(task: &Task, due_at_ms: u64) -> Result<Self, Failure> {
        Ok(Self {
            id: task.id.clone(),
            context_id: task.context_id.clone(),
            state: task.state.name(),
            due_at: due_at_ms as i64,
            now: clock::now_ms() as i64,
            task_json: serde_json::to_string(task)?,
        })
    }
}

impl EventRow {
    fn of(task_id: &str, event: &Event) -> Self {
        Self {
            task_id: task_id.to_owned(),
            event_type: event.event_type,
            payload: event.payload.to_string(),
            now: clock::now_ms() as i64,
        }
    }
}

impl TaskStore {
    /// Creates the tables in the store's database if they are not there yet.
    pub async fn open(db: Database) -> Result<Self, String> {
        let db = match db.postgres() {
            Some(pool) => {
                postgres::create(&pool).await?;
                Backend::Postgres(pool)
            }
            None => {
                sqlite::create(&db).await?;
                Backend::Sqlite(db)
            }
        };
        Ok(Self { db })
    }

    /// Stages a new task, and the events it causes, in the call's unit of work.
    pub fn stage_insert<const N: usize>(
        &self,
        unit: &UnitOfWork,
        task: &Task,
        due_at_ms: u64,
        events: [Event; N],
    ) -> RpcResult<()> {
        let row = TaskRow::of(task, due_at_ms)?;
        let events = events.iter().map(|e| EventRow::of(&task.id, e)).collect();
        match &self.db {
            Backend::Sqlite(_) => sqlite::stage_insert(unit, row, events),
            Backend::Postgres(_) => postgres::stage_insert(unit, row, events),
        }?;
        metrics::counter!(STAGED).increment(1);
        Ok(())
    }

    /// Stages `task`, changed from what `loaded` read, in the call's unit of work. It applies
    /// only if the row is unchanged since: a concurrent change fails the call (uncached), and
    /// its retry runs on the task as it is then.
    pub fn stage_update(&self, unit: &UnitOfWork, loaded: Loaded, task: &Task) -> RpcResult<()> {
        let row = TaskRow::of(task, loaded.due_at_ms)?;
        match &self.db {
            Backend::Sqlite(_) => sqlite::stage_update(unit, row, loaded.seen),
            Backend::Postgres(_) => postgres::stage_update(unit, row, loaded.seen),
        }
    }

    /// Stages a webhook of a task being created, in the call's unit of work.
    pub fn stage_push_config(
        &self,
        unit: &UnitOfWork,
        task_id: &str,
        config: &StoredConfig,
    ) -> RpcResult<()> {
        let row = PushRow::of(task_id, config);
        match &self.db {
            Backend::Sqlite(_) => sqlite::stage_push_config(unit, row),
            Backend::Postgres(_) => postgres::stage_push_config(unit, row),
        }
    }

    /// Sets (or replaces) a webhook of task `task_id`, which must exist (-32001).
    pub async fn set_push_config(&self, task_id: &str, config: &StoredConfig) -> RpcResult<()> {
        self.load(task_id.to_owned()).await?;
        let row = PushRow::of(task_id, config);
        let set = match &self.db {
            Backend::Sqlite(db) => sqlite::set_push_config(db, row).await,
            Backend::Postgres(pool) => postgres::set_push_config(pool, row).await,
        };
        Ok(set?)
    }

    /// The webhooks of task `task_id` (their JSON), oldest first.
    pub async fn push_configs(&self, task_id: String) -> RpcResult<Vec<String>> {
        let configs = match &self.db {
            Backend::Sqlite(db) => sqlite::push_configs(db, task_id).await,
            Backend::Postgres(pool) => postgres::push_configs(pool, task_id).await,
        };
        Ok(configs?)
    }

    /// Deletes a webhook; `false` if there was none.
    pub async fn delete_push_config(&self, task_id: String, config_id: String) -> RpcResult<bool> {
        let deleted = match &self.db {
            Backend::Sqlite(db) => sqlite::delete_push_config(db, task_id, config_id).await,
            Backend::Postgres(pool) => postgres::delete_push_config(pool, task_id, config_id).await,
        };
        Ok(deleted?)
    }

    /// The relay's lock, if this process can take it now (see [`RelayLock`]).
    pub async fn take_relay_lock(&self) -> RpcResult<Option<RelayLock>> {
        match &self.db {
            Backend::Sqlite(_) => Ok(Some(RelayLock::Process)),
            Backend::Postgres(pool) => {
                let session = postgres::take_relay_lock(pool).await?;
                Ok(session.map(RelayLock::Session))
            }
        }
    }

    /// The outbox events to deliver now, in the order they happened: the oldest `limit` first
    /// attempts, the `limit` retries due longest and the oldest `limit` of any kind (see
    /// `sql::UNDELIVERED`), none that waits out a failed attempt's backoff (`retry_at`), nor
    /// a later one of its task.
    pub async fn undelivered(&self, limit: i64) -> RpcResult<Vec<Pending>> {
        let now = clock::now_ms() as i64;
        let pending = match &self.db {
            Backend::Sqlite(db) => sqlite::undelivered(db, limit, now).await,
            Backend::Postgres(pool) => postgres::undelivered(pool, limit, now).await,
        };
        Ok(pending?)
    }

    /// Marks outbox events `ids` delivered, in one transaction.
    pub async fn mark_delivered(&self, ids: Vec<i64>) -> RpcResult<()> {
        self.mark(sql::MARK_DELIVERED, ids, clock::now_ms()).await?;
        Ok(())
    }

    /// The webhooks (config ids) that took outbox event `id` already.
    pub async fn delivered_to(&self, id: i64) -> RpcResult<Vec<String>> {
        let delivered = match &self.db {
            Backend::Sqlite(db) => sqlite::delivered_to(db, id).await,
            Backend::Postgres(pool) => postgres::delivered_to(pool, id).await,
        };
        Ok(delivered?)
    }

    /// Records which webhooks took an outbox event, each while its config is still the one
    /// posted, and marks the event delivered where `took` is complete and every webhook of
    /// its task has it now: one transaction. Whether it marked the event.
    pub async fn record_deliveries(&self, took: Took) -> RpcResult<bool> {
        let now = clock::now_ms() as i64;
        let recorded = match &self.db {
            Backend::Sqlite(db) => sqlite::record_deliveries(db, took, now).await,
            Backend::Postgres(pool) => postgres::record_deliveries(pool, took, now).await,
        };
        Ok(recorded?)
    }

    /// Holds outbox event `id` (and the later events of its task) back until `at_ms`.
    pub async fn retry_at(&self, id: i64, at_ms: u64) -> RpcResult<()> {
        self.mark(sql::RETRY_AT, vec![id], at_ms).await?;
        Ok(())
    }

    /// Gives outbox event `id` up: it is not delivered, and its task's later events go.
    /// `false` if another relay delivered it meanwhile.
    pub async fn abandon(&self, id: i64) -> RpcResult<bool> {
        Ok(self.mark(sql::ABANDON, vec![id], clock::now_ms()).await? > 0)
    }

    /// Deletes the outbox events delivered before `before_ms`, and what their webhooks took
    /// of them, in short transactions; how many events.
    pub async fn prune_delivered(&self, before_ms: u64) -> RpcResult<u64> {
        let events = self.prune(sql::PRUNE_DELIVERED, before_ms).await?;
        self.prune(sql::PRUNE_DELIVERIES, before_ms).await?;
        Ok(events)
    }

    /// Runs `sql` (a delete of `$2` rows at most, before `$1`) until it deletes fewer; how
    /// many rows it deleted.
    async fn prune(&self, sql: &'static str, before_ms: u64) -> RpcResult<u64> {
        const CHUNK: i64 = 1_000;
        let before = before_ms as i64;
        let mut total = 0;
        loop {
            let deleted = match &self.db {
                Backend::Sqlite(db) => sqlite::delete_chunk(db, sql, before, CHUNK).await,
                Backend::Postgres(pool) => postgres::delete_chunk(pool, sql, before, CHUNK).await,
            }?;
            total += deleted;
            if deleted < CHUNK as u64 {
                return Ok(total);
            }
        }
    }

    /// Runs `sql` for each of `ids` with `value`; how many rows it changed.
    async fn mark(&self, sql: &'static str, ids: Vec<i64>, value: u64) -> RpcResult<u64> {
        let value = value as i64;
        let marked = match &self.db {
            Backend::Sqlite(db) => sqlite::mark(db, sql, ids, value).await,
            Backend::Postgres(pool) => postgres::mark(pool, sql, ids, value).await,
        };
        Ok(marked?)
    }

    /// The task `id`, or -32001.
    pub async fn get(&self, id: String) -> RpcResult<Task> {
        Ok(self.load(id).await?.task)
    }

    /// The task `id` with its deadline, or -32001.
    pub async fn load(&self, id: String) -> RpcResult<Loaded> {
        let loaded = match &self.db {
            Backend::Sqlite(db) => sqlite::load(db, id).await,
            Backend::Postgres(pool) => postgres::load(pool, id).await,
        };
        Ok(loaded?)
    }

    /// Applies `change` to task `id` and writes the result and its event (if any) atomically.
    /// An error from `change` leaves the task untouched.
    pub async fn update(
        &self,
        id: String,
        change: impl FnOnce(&mut Task) -> Result<Option<Event>, ErrorObjectOwned> + Send + 'static,
    ) -> RpcResult<Task> {
        let change: Change = Box::new(change);
        let updated = match &self.db {
            Backend::Sqlite(db) => sqlite::update(db, id, change).await,
            Backend::Postgres(pool) => postgres::update(pool, id, change).await,
        };
        Ok(updated?)
    }

    /// Whether several replicas may share its database (PostgreSQL).
    pub fn shared(&self) -> bool {
        matches!(self.db, Backend::Postgres(_))
    }

    /// Ids and deadlines of the missions still running: after a restart they are resumed.
    pub async fn working(&self) -> RpcResult<Vec<(String, u64)>> {
        let rows = match &self.db {
            Backend::Sqlite(db) => sqlite::in_state(db, "working").await,
            Backend::Postgres(pool) => postgres::in_state(pool, "working").await,
        };
        let rows = rows?.into_iter();
        Ok(rows.map(|(id, due)| (id, due.max(0) as u64)).collect())
    }
}

/// The task as a row held it, or -32001.
fn loaded(id: &str, row: Option<(String, i64)>) -> Result<Loaded, Failure> {
    match row {
        Some((seen, due_at)) => Ok(Loaded {
            task: task_from_json(&seen)?,
            due_at_ms: due_at.max(0) as u64,
            seen,
        }),
        None => Err(errors::task_not_found(id).into()),
    }
}

/// A task as its row holds it. Its history nests each message one level deeper than the
/// params that carried it, so a message the guard and jsonrpsee accepted (127 levels at most,
/// `idem::hash::MAX_DEPTH`) can take the task one past serde_json's default limit: the row was
/// written here, from such a message, so its depth is bounded all the same.
fn task_from_json(json: &str) -> serde_json::Result<Task> {
    let mut reader = serde_json::Deserializer::from_str(json);
    reader.disable_recursion_limit();
    let task = serde::Deserialize::deserialize(&mut reader)?;
    reader.end()?;
    Ok(task)
}

/// Applies `change` to a task read for update: the task, its row, and the event to record.
fn apply(loaded: Loaded, change: Change) -> Result<(Task, TaskRow, Option<EventRow>), Failure> {
    let Loaded {
        mut task,
        due_at_ms,
        ..
    } = loaded;
    let event = change(&mut task)?;
    let row = TaskRow::of(&task, due_at_ms)?;
    let event = event.map(|event| EventRow::of(&task.id, &event));
    Ok((task, row, event))
}

fn changed_meanwhile(id: &str) -> String {
    format!("task {id} changed while the call ran")
}

/// Why a unit of store work stopped: the store failed, or the change itself refused.
enum Failure {
    Storage(String),
    Refused(ErrorObjectOwned),
}

// With their causes: tokio-postgres says only "db error" at the top, PostgreSQL's own words
// below it (helper-114).
impl From<rusqlite::Error> for Failure {
    fn from(e: rusqlite::Error) -> Self {
        Self::Storage(idem::store::causes(&e))
    }
}

impl From<tokio_postgres::Error> for Failure {
    fn from(e: tokio_postgres::Error) -> Self {
        Self::Storage(idem::store::causes(&e))
    }
}

impl From<PoolError> for Failure {
    fn from(e: PoolError) -> Self {
        Self::Storage(idem::store::causes(&e))
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
            other => Self::Storage(other.to_string()),
        }
    }
}

impl From<TransactError<rusqlite::Error>> for Failure {
    fn from(error: TransactError<rusqlite::Error>) -> Self {
        match error {
            TransactError::Refused(error) => error.into(),
            other => Self::Storage(other.to_string()),
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Storage(detail) => f.write_str(detail),
            Failure::Refused(error) => write!(f, "{error}"),
        }
    }
}
