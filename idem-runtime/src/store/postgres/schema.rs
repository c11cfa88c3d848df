//! The store's tables on PostgreSQL, created by the first replica to open the database.

use deadpool_postgres::Pool;

use crate::store::postgres::replica_settings::{self, Serving};
use crate::store::{settings, StoreError};

/// The advisory lock key under which replicas that open at once create the schema in turn.
const SCHEMA_LOCK: i64 = 0x1de3_0001;

/// Spec §4.4's table (BLOB is BYTEA, epoch seconds a BIGINT), the two columns SQLite has too,
/// each row's expiry (see [`replica_settings`]), the claims, and the streams being recorded.
/// Created under an advisory lock, so replicas that start together do not race on it.
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS idempotency_cache (
    message_id       TEXT NOT NULL PRIMARY KEY,
    request_hash     TEXT NOT NULL,
    response_status  INTEGER NOT NULL,
    response_headers BYTEA NOT NULL,
    response_body    BYTEA NOT NULL,
    inserted_at      BIGINT NOT NULL,
    method           TEXT NOT NULL DEFAULT '',
    last_used_at     BIGINT NOT NULL DEFAULT 0,
    -- When the entry expires (epoch seconds): its inserted_at and the TTL of the replica that
    -- stored it (a stream's outcome: of the replica that started the stream). Null, or older than inserted_at, in a row an earlier version stored: the
    -- reader's TTL counts.
    expires_at       BIGINT
);
CREATE SEQUENCE IF NOT EXISTS idempotency_fence;
-- Executions in flight: one row per key, a lease (database clock, epoch ms) and its fence.
CREATE TABLE IF NOT EXISTS idempotency_claims (
    message_id   TEXT NOT NULL PRIMARY KEY,
    method       TEXT NOT NULL,
    request_hash TEXT NOT NULL,
    owner        TEXT NOT NULL,
    fence        BIGINT NOT NULL,
    lease_until  BIGINT NOT NULL,
    -- The owner's count of its claims when it sent this one (see `acquire`).
    attempt      BIGINT NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS idempotency_open_streams (
    message_id   TEXT NOT NULL PRIMARY KEY,
    method       TEXT NOT NULL,
    request_hash TEXT NOT NULL,
    jsonrpc_id   TEXT NOT NULL,
    -- When it started, then when its last event was recorded (`expires_at` moves with it):
    -- left open, it expires a TTL after that.
    started_at   BIGINT NOT NULL,
    expires_at   BIGINT
);
CREATE TABLE IF NOT EXISTS idempotency_stream_events (
    message_id TEXT NOT NULL,
    seq        INTEGER NOT NULL,
    event      BYTEA NOT NULL,
    PRIMARY KEY (message_id, seq)
);
-- Tables of an earlier version get the columns they lack. Looked up first: ALTER TABLE would
-- lock the table, and every replica's claims and renewals with it, on each start. In the
-- order a closing stream locks them (claim, open stream, entry): no deadlock with one.
DO $$ DECLARE added text[]; BEGIN
    FOREACH added SLICE 1 IN ARRAY ARRAY[
        ['idempotency_claims', 'attempt', 'BIGINT NOT NULL DEFAULT 0'],
        ['idempotency_open_streams', 'expires_at', 'BIGINT'],
        ['idempotency_cache', 'expires_at', 'BIGINT']
    ] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = added[1]::regclass
                       AND attname = added[2] AND NOT attisdropped) THEN
            EXECUTE format('ALTER TABLE %I ADD COLUMN %I ' || added[3], added[1], added[2]);
        END IF;
    END LOOP;
END $$;
";

/// The entries' indexes, by name and what they index: by age (spec §4.4), by use (the LRU
/// bound), by expiry, and the rows that expire by the reader's TTL rather than their own (an
/// earlier version's). The sweep's second pass reads the last: by age alone it would visit,
/// at every sweep, every live row of a longer expiry (a TTL lowered on a large table).
const INDEXES: [(&str, &str); 4] = [
    ("idx_idempotency_inserted_at", "(inserted_at)"),
    ("idx_idempotency_last_used_at", "(last_used_at)"),
    ("idx_idempotency_expires_at", "(expires_at)"),
    (
        "idx_idempotency_expiring_by_ttl",
        concat!("(inserted_at) WHERE ", expires_by_ttl!("inserted_at")),
    ),
];

/// The advisory lock key under which one replica at a time builds the missing indexes.
pub(crate) const INDEX_LOCK: i64 = 0x1de3_0003;

/// How long an index build, or the columns added to an earlier version's table, wait for
/// another transaction before they give up.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// [`settings::HOLDS_KEYS`], with the claims of calls running on live replicas, rows here.
const HOLDS_KEYS_OR_CLAIMS: &str = "SELECT EXISTS (SELECT 1 FROM idempotency_cache)
    OR EXISTS (SELECT 1 FROM idempotency_open_streams)
    OR EXISTS (SELECT 1 FROM idempotency_claims)";

/// The tables, and this replica's TTL recorded for the operator's tool; refused while a live
/// replica of another TTL or key scoping serves the database (the lock orders replicas that
/// open at once).
/// Then the indexes that are missing, built in the background.
pub(super) async fn create_schema(pool: &Pool, serving: Serving) -> Result<(), StoreError> {
    let Serving {
        ttl_seconds,
        scoped,
    } = serving;
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&SCHEMA_LOCK])
        .await?;
    // Under the schema lock: replicas that open at once see each other's record. Read
    // first: a live replica whose name does not say its scoping is held to the record.
    tx.batch_execute(settings::TABLE).await?;
    let recorded: Option<i64> = tx
        .query_opt(settings::RECORDED_SCOPING, &[])
        .await?
        .map(|row| row.get(0));
    replica_settings::refuse_another(&tx, serving, recorded.map(|value| value != 0)).await?;
    // A column added waits for the table's lock behind a long transaction (a `pg_dump`), and
    // every replica's calls would queue behind the wait: bounded, and the start refused.
    let bound = format!("SET LOCAL lock_timeout = {}", LOCK_WAIT.as_millis());
    tx.batch_execute(&bound).await?;
    tx.batch_execute(SCHEMA).await.map_err(held_tables)?;
    let ttl = settings::stored(ttl_seconds);
    tx.execute(settings::RECORD_TTL, &[&ttl]).await?;
    let holds_keys = tx.query_one(HOLDS_KEYS_OR_CLAIMS, &[]).await?.get(0);
    settings::scoping_kept(recorded, scoped, holds_keys)?;
    tx.execute(settings::RECORD_SCOPING, &[&i64::from(scoped)])
        .await?;
    tx.commit().await?;
    // The indexes make the sweep and the bound fast, not the calls right, so the replica
    // serves while they are built: a start held for the build of an earlier version's large
    // table would be killed by an orchestrator's probe, again at every start. A build that
    // fails, or is cut short with the process, is done by the next start (one left invalid
    // is dropped first).
    let session = deadpool_postgres::Object::take(client);
    tokio::spawn(async move {
        if let Err(error) = create_indexes(session).await {
            tracing::warn!(%error, "an index of idempotency_cache could not be built; serving without it");
        }
    });
    Ok(())
}

/// The error of a schema step that waited [`LOCK_WAIT`] for a table's lock, said as such.
fn held_tables(error: tokio_postgres::Error) -> StoreError {
    if error.code() != Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE) {
        return error.into();
    }
    let cause = format!(
        "the tables of an earlier version need columns added, and another transaction has \
         held them for {} s (a pg_dump, a long report?): start this replica again when it \
         has ended ({error})",
        LOCK_WAIT.as_secs()
    );
    StoreError::Backend {
        backend: "postgres",
        cause: cause.into(),
    }
}

/// Builds each index that is missing, or that a killed build left invalid: concurrently, so
/// that the other replicas keep writing (a plain `CREATE INDEX` on a large table of an earlier
/// version held their writes until it was built, 0.8 s per million rows, and they failed at
/// their statement bound), and only where missing (`IF NOT EXISTS` locks the table against
/// writes even when the index exists). A replica that finds another building them leaves them
/// to it. A concurrent build waits for every transaction older than itself on the database:
/// one it would wait for longer than [`LOCK_WAIT`] fails it, and the next start builds it.
/// `client` is this step's own session, closed after (its bounds changed, and its lock held,
/// until then).
async fn create_indexes(client: deadpool_postgres::ClientWrapper) -> Result<(), StoreError> {
    let locked = client.query_one("SELECT pg_try_advisory_lock($1)", &[&INDEX_LOCK]);
    if !locked.await?.get::<_, bool>(0) {
        tracing::info!("another replica builds the indexes of idempotency_cache: not waited for");
        return Ok(());
    }
    // Not named as a serving replica (`replica_settings.rs`): a build that outlives its replica
    // (the server ends a statement only when it is done) must not refuse a replica of another
    // setting.
    let bounds = format!(
        "SET application_name = 'idem index build'; SET statement_timeout = 0; \
         SET lock_timeout = {}",
        LOCK_WAIT.as_millis()
    );
    client.batch_execute(&bounds).await?;
    let validity = "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass($1)";
    for (name, definition) in INDEXES {
        match client.query_opt(validity, &[&name]).await? {
            Some(row) if row.get::<_, bool>(0) => continue,
            Some(_) => {
                let drop = format!("DROP INDEX CONCURRENTLY IF EXISTS {name}");
                client.batch_execute(&drop).await?
            }
            None => {}
        }
        let create = format!(
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON idempotency_cache{definition}"
        );
        client.batch_execute(&create).await?;
        tracing::info!(index = name, "built an index of idempotency_cache");
    }
    Ok(())
}
