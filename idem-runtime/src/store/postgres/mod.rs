//! The durable [`Store`] on PostgreSQL, for replicas that share one database.
//!
//! Every process keeps its own table of the calls it runs (`claim.rs`), and the database
//! arbitrates between processes: a claim is a row of `idempotency_claims`, won with one
//! `INSERT ... ON CONFLICT`, held as a lease that the winner renews while it executes, and
//! stamped with a fencing number from a sequence, so a later claim of the key always carries
//! a larger one. Every write of a call (its entry, its staged writes, its stream) commits only
//! while the row still carries its fence: a replica that ran past its lease (a pause, a
//! partition) commits nothing, and the replica that took the claim over executes against a
//! database that holds no trace of the first. Ends of claims are announced with `NOTIFY`
//! (`listener.rs`), so waiters on other replicas wake without polling.
//!
//! Every fenced statement checks the claim's owner (this process) as well as its fence, so a
//! process never commits under another's claim even if the sequence were ever set back (a
//! restore, a hand reset). Leases are timed by the database's clock, never a replica's; TTLs by
//! the store's clock, as on SQLite. Entries are not kept in memory: another replica may evict
//! or sweep one at any time, and an evicted entry is a miss everywhere.

mod listener;
mod one_ttl;

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use deadpool_postgres::{
    GenericClient, Hook, HookError, Manager, ManagerConfig, Pool, RecyclingMethod,
};
use tokio_postgres::types::ToSql;
use tokio_postgres::{NoTls, Row};

use crate::clock::{Clock, SystemClock};
use crate::config::IdempotencyConfig;
use crate::hash::RequestHash;
use crate::message_id::MessageId;
use crate::store::postgres::listener::{Listener, CHANNEL};
use crate::store::postgres::one_ttl::named;
use crate::store::postgres::renewer::Renewer;
use crate::store::settings;
use crate::store::{
    at_most, is_expired, stored_hash, Acquired, Elsewhere, Entry, EntryRow, Found, Lease,
    OpenStream, OpenStreamRow, ReadJob, Store, StoreError, StoreStats,
};
use crate::unit_of_work::SqlWrite;

/// The database's clock, in epoch milliseconds: what leases are timed by.
macro_rules! now_ms {
    () => {
        "(extract(epoch from clock_timestamp()) * 1000)::bigint"
    };
}
pub(crate) use now_ms;

/// Spec §4.4's table (BLOB is BYTEA, epoch seconds a BIGINT), the two columns SQLite has too,
/// the claims, and the streams being recorded. Created under an advisory lock, so replicas
/// that start together do not race on it.
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS idempotency_cache (
    message_id       TEXT NOT NULL PRIMARY KEY,
    request_hash     TEXT NOT NULL,
    response_status  INTEGER NOT NULL,
    response_headers BYTEA NOT NULL,
    response_body    BYTEA NOT NULL,
    inserted_at      BIGINT NOT NULL,
    method           TEXT NOT NULL DEFAULT '',
    last_used_at     BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS idx_idempotency_inserted_at ON idempotency_cache(inserted_at);
CREATE INDEX IF NOT EXISTS idx_idempotency_last_used_at ON idempotency_cache(last_used_at);
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
-- A claims table of an earlier version gets the column. Looked up first: ALTER TABLE would
-- lock the table, claims and renewals of every replica with it, on each start.
DO $$ BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = 'idempotency_claims'::regclass
                   AND attname = 'attempt' AND NOT attisdropped) THEN
        ALTER TABLE idempotency_claims ADD COLUMN attempt BIGINT NOT NULL DEFAULT 0;
    END IF;
END $$;
CREATE TABLE IF NOT EXISTS idempotency_open_streams (
    message_id   TEXT NOT NULL PRIMARY KEY,
    method       TEXT NOT NULL,
    request_hash TEXT NOT NULL,
    jsonrpc_id   TEXT NOT NULL,
    started_at   BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS idempotency_stream_events (
    message_id TEXT NOT NULL,
    seq        INTEGER NOT NULL,
    event      BYTEA NOT NULL,
    PRIMARY KEY (message_id, seq)
);
";

/// The advisory lock keys: creating the schema, and enforcing the LRU bound.
const SCHEMA_LOCK: i64 = 0x1de3_0001;
const BOUND_LOCK: i64 = 0x1de3_0002;

/// Most expired rows one sweep statement deletes: short transactions, no long-held locks.
const SWEEP_CHUNK: i64 = 500;

/// Most entries past the LRU bound one statement of the sweep evicts: well within the
/// statement bound, and a table millions of rows past the bound drained in minutes.
const EVICTION_CHUNK: i64 = 5_000;

/// How long a lease may have been expired before the sweep deletes its row.
const STALE_CLAIM_MS: i64 = 60_000;

/// Where and how the PostgreSQL store connects.
///
/// ```
/// use idem_runtime::store::PostgresOptions;
/// let options = PostgresOptions::new("postgres://app@127.0.0.1:5432/a2a");
/// assert_eq!(options.pool_size, 16);
/// assert!(options.listen_url.is_none());
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PostgresOptions {
    /// The database the pool connects to, as a URL (`postgres://user@host:port/db`) or a
    /// libpq key-value string. TLS is not built in: use a loopback or Unix-socket address, or
    /// a TLS-terminating proxy.
    pub url: String,
    /// A direct connection for `LISTEN`, when `url` goes through a pooler in transaction mode
    /// (which does not carry it); `None` listens on `url`.
    pub listen_url: Option<String>,
    /// Most pooled connections.
    pub pool_size: usize,
}

impl PostgresOptions {
    /// Options for the database at `url`, listening on the same address.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            listen_url: None,
            pool_size: 16,
        }
    }
}

// After `now_ms!`, which it uses.
mod renewer;

/// The PostgreSQL store: several processes may serve one database.
///
/// ```no_run
/// # async fn run() -> Result<(), idem_runtime::store::StoreError> {
/// use idem_runtime::store::{PostgresStore, Store};
/// use idem_runtime::{Idempotency, IdempotencyConfig};
/// let config = IdempotencyConfig::default();
/// let store = PostgresStore::connect("postgres://app@127.0.0.1:5432/a2a", &config).await?;
/// assert_eq!(store.row_count().await?, 0);
/// // What an application writes instead: the store, its sweeper and both layers.
/// let idem = Idempotency::connect("postgres://app@127.0.0.1:5432/a2a", config).await?;
/// # Ok(()) }
/// ```
pub struct PostgresStore {
    pool: Pool,
    listener: Listener,
    /// This process, as claims name their owner.
    owner: String,
    ttl_seconds: u64,
    max_entries: u64,
    lease: Duration,
    clock: Arc<dyn Clock>,
    /// LRU uses noted by reads, written by the sweep (or by a commit that enforces the bound).
    touches: Mutex<HashMap<String, u64>>,
    /// Rows as this process last counted them, plus its own inserts since: the LRU bound is
    /// checked against the database only once this nears it.
    rows: AtomicU64,
    /// Renews the leases of the claims this process holds.
    renewer: Renewer,
    /// How many claims this process has sent: a claim carries its number (see `acquire`).
    attempts: AtomicU64,
}

impl PostgresStore {
    /// Connects to the database at `url`, on the system clock, and creates the tables. Fails
    /// with [`StoreError::TtlMismatch`] while a replica of another TTL serves the database.
    pub async fn connect(url: &str, config: &IdempotencyConfig) -> Result<Self, StoreError> {
        Self::connect_with(PostgresOptions::new(url), config, Arc::new(SystemClock)).await
    }

    /// Like [`connect`](Self::connect), with every option and an injected clock.
    pub async fn connect_with(
        options: PostgresOptions,
        config: &IdempotencyConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, StoreError> {
        let (lease, ttl) = (config.claim_lease, config.ttl_seconds);
        let pool = pool_of(&options, options.pool_size, lease, ttl)?;
        create_schema(&pool, ttl).await?;
        let listen = named(options.listen_url.as_ref().unwrap_or(&options.url), ttl)?;
        let owner = owner();
        let store = Self {
            listener: Listener::start(listen),
            // A connection of its own: renewals never queue behind the calls' commits.
            renewer: Renewer::start(pool_of(&options, 1, lease, ttl)?, owner.clone(), lease),
            owner,
            ttl_seconds: config.ttl_seconds,
            max_entries: config.max_cache_entries,
            lease: config.claim_lease,
            clock,
            touches: Mutex::default(),
            rows: AtomicU64::new(0),
            attempts: AtomicU64::new(0),
            pool,
        };
        store.count().await?;
        Ok(store)
    }

    /// The pool the store commits through. The server ends a session of it whose transaction
    /// has been idle for one claim lease (a replica frozen mid-commit must not hold its
    /// claim's row lock for longer): an application's own transaction on it must not wait
    /// that long between two statements.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, StoreError> {
        Ok(self.pool.get().await?)
    }

    /// `operation`, or the error that the database did not answer it in time: within the
    /// sessions' statement bound and their idle bound together (three leases, at least 3 s).
    ///
    /// A database process stopped while its host still answers TCP (SIGSTOP, a paused
    /// container) ends no statement, and neither `statement_timeout` nor `tcp_user_timeout`
    /// fires: without this a call would wait until it ran again. What such a call had sent is
    /// the database's to decide once it runs: an uncommitted transaction rolls back, a commit
    /// that lands is fenced as any is, and the retry reads the outcome there.
    async fn in_time<T>(
        &self,
        operation: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        self.within(Duration::ZERO, operation).await
    }

    /// [`in_time`](Self::in_time), for an operation that may also wait `wait` on purpose.
    async fn within<T>(
        &self,
        wait: Duration,
        operation: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let (idle, statement) = session_bounds(self.lease);
        let bound = wait + statement + idle;
        let answered = at_most(bound, operation).await;
        answered.unwrap_or_else(|| {
            // The operation dropped its connection back into the pool, its statement still
            // unanswered: none of the idle ones is to be trusted with the next call.
            drop(self.pool.retain(|_, _| false));
            Err(StoreError::Backend {
                backend: "postgres",
                cause: format!("no answer from the database in {} ms", bound.as_millis()).into(),
            })
        })
    }

    /// What a call's transaction that failed with `error` answers. One whose connection was
    /// cut off (the server ends the session of a replica frozen mid-commit, see [`pool_of`])
    /// failed as neither a staged write nor the database did: the claim, read again on another
    /// connection, tells whether another replica took the key over meanwhile
    /// ([`StoreError::ClaimLost`]) or the database was out of reach.
    async fn cut_off(&self, key: &MessageId, fence: i64, error: StoreError) -> StoreError {
        if !connection_lost(&error) {
            return error;
        }
        let Ok(client) = self.client().await else {
            return error;
        };
        let ours = "SELECT 1 FROM idempotency_claims
                    WHERE message_id = $1 AND fence = $2 AND owner = $3";
        match query_opt(&client, ours, &[&key.as_str(), &fence, &self.owner]).await {
            Ok(None) => StoreError::ClaimLost(key.to_string()),
            Ok(Some(_)) | Err(_) => match error {
                StoreError::Write(cause) => StoreError::Backend {
                    backend: "postgres",
                    cause,
                },
                other => other,
            },
        }
    }

    /// Counts the rows, for the bound's estimate.
    async fn count(&self) -> Result<u64, StoreError> {
        let client = self.client().await?;
        let n: i64 = query_one(&client, "SELECT COUNT(*) FROM idempotency_cache", &[])
            .await?
            .get(0);
        self.rows.store(n.max(0) as u64, Ordering::Relaxed);
        Ok(n.max(0) as u64)
    }

    /// `entry` if it is live, noting the use for the LRU bound.
    fn used(&self, entry: Option<Entry>) -> Option<Entry> {
        let entry = entry
            .filter(|e| !is_expired(e.inserted_at, self.ttl_seconds, self.clock.now_seconds()))?;
        let mut touches = self.touches.lock().expect("touches lock");
        touches.insert(entry.message_id.to_string(), self.clock.now_millis());
        Some(entry)
    }

    async fn live_entry(
        &self,
        client: &impl GenericClient,
        key: &MessageId,
    ) -> Result<Option<Entry>, StoreError> {
        Ok(self.used(select_entry(client, key).await?))
    }

    /// Writes the uses noted since the last flush, in `tx`.
    async fn flush_touches(&self, client: &impl GenericClient) -> Result<(), StoreError> {
        let touches = std::mem::take(&mut *self.touches.lock().expect("touches lock"));
        if touches.is_empty() {
            return Ok(());
        }
        let (ids, used): (Vec<String>, Vec<i64>) =
            touches.into_iter().map(|(k, v)| (k, v as i64)).unzip();
        execute(
            client,
            "UPDATE idempotency_cache AS c SET last_used_at = GREATEST(c.last_used_at, t.used)
             FROM unnest($1::text[], $2::bigint[]) AS t(id, used) WHERE c.message_id = t.id",
            &[&ids, &used],
        )
        .await?;
        Ok(())
    }

    /// Evicts the least recently used entries past the bound, `at_most` of them, if this
    /// process is the one doing it now (the others skip: no convoy, no entry counted twice).
    /// Chunked: a table far past its bound (the bound lowered on a restart) evicted in one
    /// statement outran the sessions' statement bound, was cancelled, and failed every call
    /// that tried it again; a call's commit evicts [`SWEEP_CHUNK`], the sweep chunk after chunk.
    async fn enforce_bound(
        &self,
        client: &impl GenericClient,
        at_most: i64,
    ) -> Result<u64, StoreError> {
        let locked: bool = query_one(
            client,
            "SELECT pg_try_advisory_xact_lock($1)",
            &[&BOUND_LOCK],
        )
        .await?
        .get(0);
        if !locked {
            return Ok(0);
        }
        self.flush_touches(client).await?;
        let max = self.max_entries.min(i64::MAX as u64) as i64;
        let evicted = execute(
            client,
            "DELETE FROM idempotency_cache WHERE message_id IN (
               SELECT message_id FROM idempotency_cache ORDER BY last_used_at, message_id
               LIMIT LEAST($2, GREATEST(0, (SELECT COUNT(*) FROM idempotency_cache) - $1)))",
            &[&max, &at_most],
        )
        .await?;
        crate::telemetry::evicted("lru", evicted);
        // Saturating in one step: two evictions at once must not wrap the estimate around.
        let _ = self
            .rows
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |rows| {
                Some(rows.saturating_sub(evicted))
            });
        Ok(evicted)
    }

    /// Stores `entry` and ends its claim in one statement, fenced: nothing is stored unless
    /// the claim still carries `fence` ([`StoreError::ClaimLost`]). Announces the end at commit.
    /// `true`: this insert may have passed the LRU bound ([`enforce_bound`](Self::enforce_bound)
    /// is due, in a transaction).
    async fn store_entry(
        &self,
        client: &impl GenericClient,
        entry: &Entry,
        fence: i64,
    ) -> Result<bool, StoreError> {
        let stored = query_one(
            client,
            "WITH claim AS (
               DELETE FROM idempotency_claims
               WHERE message_id = $1 AND fence = $2 AND owner = $11
               RETURNING message_id
             ), stored AS (
               INSERT INTO idempotency_cache
                 (message_id, request_hash, response_status, response_headers, response_body,
                  inserted_at, method, last_used_at)
               SELECT message_id, $3, $4, $5, $6, $7, $8, $9 FROM claim
               ON CONFLICT (message_id) DO UPDATE SET request_hash = EXCLUDED.request_hash,
                 response_status = EXCLUDED.response_status,
                 response_headers = EXCLUDED.response_headers,
                 response_body = EXCLUDED.response_body, inserted_at = EXCLUDED.inserted_at,
                 method = EXCLUDED.method, last_used_at = EXCLUDED.last_used_at
               RETURNING (xmax = 0) AS inserted
             ), announced AS (
               SELECT pg_notify($10, message_id) FROM claim
             )
             SELECT (SELECT inserted FROM stored), (SELECT COUNT(*) FROM announced)",
            &[
                &entry.message_id.as_str(),
                &fence,
                &entry.request_hash.as_str(),
                &i32::from(entry.response.status),
                &entry.response.headers_json(),
                &entry.response.body,
                &(entry.inserted_at as i64),
                &entry.method,
                &(self.clock.now_millis() as i64),
                &CHANNEL,
                &self.owner,
            ],
        )
        .await?;
        let inserted: Option<bool> = stored.get(0);
        match inserted {
            None => Err(StoreError::ClaimLost(entry.message_id.to_string())),
            Some(true) => Ok(self.rows.fetch_add(1, Ordering::Relaxed) + 1 > self.max_entries),
            Some(false) => Ok(false),
        }
    }
}

#[async_trait::async_trait]
impl Store for PostgresStore {
    async fn get(&self, key: &MessageId) -> Result<Option<Entry>, StoreError> {
        self.in_time(async {
            let client = self.client().await?;
            self.live_entry(&client, key).await
        })
        .await
    }

    /// The live entry, or nothing: a stream left open is found by [`acquire`](Store::acquire),
    /// which alone knows whether another process still records it.
    async fn lookup(&self, key: &MessageId) -> Result<Found, StoreError> {
        Ok(match self.get(key).await? {
            Some(entry) => Found::Entry(Arc::new(entry)),
            None => Found::Nothing,
        })
    }

    async fn acquire(
        &self,
        key: &MessageId,
        method: &str,
        hash: &RequestHash,
        _read_holds: bool,
    ) -> Result<Acquired, StoreError> {
        // Numbered as this process's table gave the key out: a claim whose statement the
        // database takes late (sent by a call that gave up waiting) carries a smaller number
        // than a retry's, and never replaces its claim.
        let attempt = self.attempts.fetch_add(1, Ordering::Relaxed) as i64 + 1;
        self.in_time(async {
            let client = self.client().await?;
            let lease_ms = self.lease.as_millis().min(i64::MAX as u128) as i64;
            let (id, hash_hex) = (key.as_str(), hash.as_str());
            loop {
                let won = query_opt(
                    &client,
                    concat!(
                        "INSERT INTO idempotency_claims AS c
                           (message_id, method, request_hash, owner, fence, lease_until, attempt)
                         VALUES ($1, $2, $3, $4, nextval('idempotency_fence'), ",
                        now_ms!(),
                        " + $5, $6)
                         ON CONFLICT (message_id) DO UPDATE SET
                           method = EXCLUDED.method, request_hash = EXCLUDED.request_hash,
                           owner = EXCLUDED.owner, fence = EXCLUDED.fence,
                           lease_until = EXCLUDED.lease_until, attempt = EXCLUDED.attempt
                         WHERE c.lease_until < ",
                        now_ms!(),
                        // An earlier claim of this process is stale: its table gave the key to
                        // this call, so the call that held it has ended (its release may not
                        // have run yet).
                        " OR (c.owner = $4 AND c.attempt < $6) RETURNING fence"
                    ),
                    &[&id, &method, &hash_hex, &self.owner, &lease_ms, &attempt],
                )
                .await?;
                if let Some(row) = won {
                    let lease = self.renewer.lease(key, row.get(0));
                    // The entry may have been committed before the claim was won.
                    let (entry, open) = select_after_claim(&client, key).await?;
                    if let Some(entry) = self.used(entry) {
                        end_claim(&client, id, lease.fence(), &self.owner).await?;
                        return Ok(Acquired::Entry(Arc::new(entry)));
                    }
                    let open = match open {
                        true => {
                            let (ttl, now) = (self.ttl_seconds, self.clock.now_seconds());
                            select_open_stream(&client, key, ttl, now).await?
                        }
                        false => None,
                    };
                    return Ok(match open {
                        Some((stream, events)) => Acquired::Interrupted(lease, stream, events),
                        None => Acquired::Won(lease),
                    });
                }
                if let Some((method, request_hash, _)) = held(&client, key).await? {
                    return Ok(Acquired::Held {
                        method,
                        request_hash,
                    });
                }
                // The claim ended between the two statements: claim again.
            }
        })
        .await
    }

    fn release(&self, key: &MessageId, lease: Lease) {
        let (pool, key, fence) = (self.pool.clone(), key.to_string(), lease.fence());
        let owner = self.owner.clone();
        drop(lease);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // The lease expires on its own.
        };
        runtime.spawn(async move {
            let released = match pool.get().await {
                Ok(client) => end_claim(&client, &key, fence, &owner).await,
                Err(error) => Err(error.into()),
            };
            if let Err(error) = released {
                tracing::warn!(message_id = %key, %error, "claim release failed; it expires with its lease");
            }
        });
    }

    async fn wait_elsewhere(
        &self,
        key: &MessageId,
        bound: Duration,
    ) -> Result<Elsewhere, StoreError> {
        self.within(bound, async {
            let deadline = tokio::time::Instant::now() + bound;
            // Subscribed before the first read: an end announced after it is never missed.
            let mut ends = self.listener.subscribe(key.as_str());
            loop {
                let client = self.client().await?;
                // The claim first: its end commits with the entry, so once it is gone the entry,
                // if any, is there to read.
                let left_ms = match held(&client, key).await? {
                    Some((_, _, left_ms)) if left_ms >= 0 => left_ms,
                    _ => {
                        return Ok(match self.live_entry(&client, key).await? {
                            Some(entry) => Elsewhere::Done(Arc::new(entry)),
                            None => Elsewhere::Released,
                        })
                    }
                };
                drop(client);
                let now = tokio::time::Instant::now();
                if now >= deadline {
                    return Ok(Elsewhere::StillRunning);
                }
                // Never past the lease: a holder that died sends no notification.
                let nap = (deadline - now).min(Duration::from_millis(left_ms as u64 + 10));
                ends.next(nap).await;
            }
        })
        .await
    }

    async fn held_elsewhere(
        &self,
        key: &MessageId,
    ) -> Result<Option<(String, RequestHash)>, StoreError> {
        self.in_time(async {
            let client = self.client().await?;
            Ok(held(&client, key)
                .await?
                .filter(|(_, _, left_ms)| *left_ms >= 0)
                .map(|(method, hash, _)| (method, hash)))
        })
        .await
    }

    async fn put(
        &self,
        entry: Arc<Entry>,
        writes: Vec<SqlWrite>,
        lease: &Lease,
    ) -> Result<(), StoreError> {
        self.in_time(async {
            lease.end();
            let mut client = self.client().await?;
            if writes.is_empty() {
                // One statement, its own transaction; the bound, if due, in another.
                if self.store_entry(&client, &entry, lease.fence()).await? {
                    let tx = client.transaction().await?;
                    self.enforce_bound(&tx, SWEEP_CHUNK).await?;
                    tx.commit().await?;
                }
                return Ok(());
            }
            let committed = async {
                let tx = client.transaction().await?;
                apply_writes(&tx, writes).await?;
                // Fenced last: if the claim was lost meanwhile, the writes roll back with it.
                if self.store_entry(&tx, &entry, lease.fence()).await? {
                    self.enforce_bound(&tx, SWEEP_CHUNK).await?;
                }
                Ok(tx.commit().await?)
            };
            let fence = lease.fence();
            match committed.await {
                Ok(()) => Ok(()),
                Err(error) => Err(self.cut_off(&entry.message_id, fence, error).await),
            }
        })
        .await
    }

    async fn open_stream(
        &self,
        stream: &OpenStream,
        first_event: Bytes,
        writes: Vec<SqlWrite>,
        lease: &Lease,
    ) -> Result<(), StoreError> {
        self.in_time(async {
            let mut client = self.client().await?;
            let opened = async {
                let tx = client.transaction().await?;
                fenced(&tx, &stream.message_id, lease, &self.owner).await?;
                apply_writes(&tx, writes).await?;
                let id = stream.message_id.as_str();
                execute(
                    &tx,
                    "INSERT INTO idempotency_open_streams
                       (message_id, method, request_hash, jsonrpc_id, started_at)
                     VALUES ($1, $2, $3, $4, $5)
                     ON CONFLICT (message_id) DO UPDATE SET method = EXCLUDED.method,
                       request_hash = EXCLUDED.request_hash, jsonrpc_id = EXCLUDED.jsonrpc_id,
                       started_at = EXCLUDED.started_at",
                    &[
                        &id,
                        &stream.method,
                        &stream.request_hash.as_str(),
                        &stream.jsonrpc_id,
                        &(stream.started_at as i64),
                    ],
                )
                .await?;
                // Events of an earlier recording under this key (one past its TTL) are not this one's.
                delete_events(&tx, id).await?;
                execute(
                    &tx,
                    "INSERT INTO idempotency_stream_events (message_id, seq, event) VALUES ($1, 0, $2)",
                    &[&id, &first_event.as_ref()],
                )
                .await?;
                Ok(tx.commit().await?)
            };
            match opened.await {
                Ok(()) => Ok(()),
                Err(error) => Err(self.cut_off(&stream.message_id, lease.fence(), error).await),
            }
        })
        .await
    }

    async fn append_event(
        &self,
        key: &MessageId,
        seq: u32,
        event: Bytes,
        lease: &Lease,
    ) -> Result<(), StoreError> {
        self.in_time(async {
            let client = self.client().await?;
            let appended = execute(
                &client,
                "INSERT INTO idempotency_stream_events (message_id, seq, event)
                 SELECT $1, $2, $3 WHERE EXISTS
                   (SELECT 1 FROM idempotency_claims
                    WHERE message_id = $1 AND fence = $4 AND owner = $5)",
                &[
                    &key.as_str(),
                    &(seq as i32),
                    &event.as_ref(),
                    &lease.fence(),
                    &self.owner,
                ],
            )
            .await?;
            match appended {
                1 => Ok(()),
                _ => Err(StoreError::ClaimLost(key.to_string())),
            }
        })
        .await
    }

    async fn close_stream(&self, entry: Arc<Entry>, lease: &Lease) -> Result<(), StoreError> {
        self.in_time(async {
            lease.end();
            let mut client = self.client().await?;
            let tx = client.transaction().await?;
            if self.store_entry(&tx, &entry, lease.fence()).await? {
                self.enforce_bound(&tx, SWEEP_CHUNK).await?;
            }
            let id = entry.message_id.as_str();
            delete_events(&tx, id).await?;
            execute(
                &tx,
                "DELETE FROM idempotency_open_streams WHERE message_id = $1",
                &[&id],
            )
            .await?;
            tx.commit().await?;
            Ok(())
        })
        .await
    }

    async fn apply(&self, writes: Vec<SqlWrite>) -> Result<(), StoreError> {
        self.in_time(async {
            let mut client = self.client().await?;
            let tx = client.transaction().await?;
            apply_writes(&tx, writes).await?;
            tx.commit().await?;
            Ok(())
        })
        .await
    }

    async fn read(&self, _job: ReadJob) -> Result<(), StoreError> {
        Err(StoreError::Backend {
            backend: "postgres",
            cause: "a read job is a SQLite closure; on PostgreSQL, use the pool \
                     (Database::postgres)"
                .into(),
        })
    }

    async fn sweep(&self) -> Result<u64, StoreError> {
        let client = self.client().await?;
        let (ttl, now) = (self.ttl_seconds as i64, self.clock.now_seconds() as i64);
        self.flush_touches(&client).await?;
        let mut total = 0;
        loop {
            // SKIP LOCKED: replicas sweeping at once take disjoint rows, and none waits.
            let deleted = execute(
                &client,
                "DELETE FROM idempotency_cache WHERE message_id IN (
                   SELECT message_id FROM idempotency_cache WHERE inserted_at < $2::BIGINT - $1::BIGINT
                   LIMIT $3 FOR UPDATE SKIP LOCKED)",
                &[&ttl, &now, &SWEEP_CHUNK],
            )
            .await?;
            total += deleted;
            if deleted < SWEEP_CHUNK as u64 {
                break;
            }
        }
        // An open stream whose claim is live is still running on some replica: never swept,
        // so that its retries attach (or, after a crash, get its interrupted outcome). One
        // statement: its record and events go together, or neither does.
        execute(
            &client,
            concat!(
                "WITH gone AS (
                   DELETE FROM idempotency_open_streams o WHERE started_at + $1 < $2
                   AND NOT EXISTS (SELECT 1 FROM idempotency_claims c
                                   WHERE c.message_id = o.message_id AND c.lease_until > ",
                now_ms!(),
                ") RETURNING message_id)
                 DELETE FROM idempotency_stream_events e USING gone
                 WHERE e.message_id = gone.message_id"
            ),
            &[&ttl, &now],
        )
        .await?;
        execute(
            &client,
            concat!(
                "DELETE FROM idempotency_claims WHERE lease_until + $1 < ",
                now_ms!()
            ),
            &[&STALE_CLAIM_MS],
        )
        .await?;
        drop(client);
        if self.count().await? > self.max_entries {
            // Chunk after chunk, each counting the table once, until one comes back short:
            // the bound is met (or another replica holds its lock, and evicts).
            loop {
                let mut client = self.client().await?;
                let tx = client.transaction().await?;
                let evicted = self.enforce_bound(&tx, EVICTION_CHUNK).await?;
                tx.commit().await?;
                if evicted < EVICTION_CHUNK as u64 {
                    break;
                }
            }
        }
        Ok(total)
    }

    async fn row_count(&self) -> Result<u64, StoreError> {
        self.count().await
    }

    async fn stats(&self) -> Result<StoreStats, StoreError> {
        let mut client = self.client().await?;
        // One snapshot: the totals and the top methods agree.
        let tx = client
            .build_transaction()
            .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await?;
        let now = self.clock.now_seconds();
        let stats = StoreStats::read_postgres(&*tx, now, self.ttl_seconds).await?;
        tx.commit().await?;
        Ok(stats)
    }

    fn now_seconds(&self) -> u64 {
        self.clock.now_seconds()
    }

    fn postgres_pool(&self) -> Option<Pool> {
        Some(self.pool.clone())
    }
}

/// A pool of `size` connections to the database `options` names, whose sessions the server
/// ends when one of their transactions has been idle for `lease` (at least a second), and
/// whose statements it cancels past two leases.
///
/// A replica frozen mid-commit (SIGSTOP, a VM paused, a partition with the socket still up)
/// holds the row lock of its claim; the replica taking the claim over waits on that lock, so
/// without this bound a retry would hang until the frozen one came back. Once its lease has
/// run out, a frozen holder's claim is another's to take anyway, and fencing keeps whatever
/// it sends after waking from committing.
///
/// A statement that waits longer (a table another session holds locked) fails its call with
/// `IDEMPOTENCY_STORE_UNAVAILABLE` instead of holding it for as long as the lock is held: by
/// then the call's own lease has run out twice. A database host that stops answering (a
/// partition) is given up by TCP after two leases too.
fn pool_of(
    options: &PostgresOptions,
    size: usize,
    lease: Duration,
    ttl_seconds: u64,
) -> Result<Pool, StoreError> {
    let mut config = named(&options.url, ttl_seconds)?;
    let (idle, statement) = session_bounds(lease);
    if config.get_tcp_user_timeout().is_none() {
        config.tcp_user_timeout(statement);
    }
    // `SET`s once connected, not startup options: poolers refuse startup options they do
    // not know.
    let set: Arc<str> = format!(
        "SET idle_in_transaction_session_timeout = {}; SET statement_timeout = {}",
        idle.as_millis(),
        statement.as_millis()
    )
    .into();
    let set_idle_bound = Hook::async_fn(move |client, _| {
        let set = set.clone();
        Box::pin(async move { client.batch_execute(&set).await.map_err(HookError::Backend) })
    });
    let manager = Manager::from_config(
        config,
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    // Bounded waits: with the database down, a call fails in seconds instead of hanging.
    let bound = Some(Duration::from_secs(5));
    Pool::builder(manager)
        .max_size(size)
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .wait_timeout(bound)
        .create_timeout(bound)
        .recycle_timeout(bound)
        .post_create(set_idle_bound)
        .build()
        .map_err(|error| StoreError::Backend {
            backend: "postgres",
            cause: Box::new(error),
        })
}

/// The server's bounds on a session's idle transaction (the lease) and on its statements (two
/// leases), each from a second to PostgreSQL's largest timeout.
fn session_bounds(lease: Duration) -> (Duration, Duration) {
    let largest = Duration::from_millis(crate::config::MAX_POSTGRES_TIMEOUT_MS);
    let bound = |d: Duration| d.clamp(Duration::from_secs(1), largest);
    (bound(lease), bound(lease.saturating_mul(2)))
}

/// The tables, and this replica's TTL recorded for the operator's tool; refused while a live
/// replica of another TTL serves the database (the lock orders replicas that open at once).
async fn create_schema(pool: &Pool, ttl_seconds: u64) -> Result<(), StoreError> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&SCHEMA_LOCK])
        .await?;
    one_ttl::refuse_another(&tx, ttl_seconds).await?;
    tx.batch_execute(SCHEMA).await?;
    tx.batch_execute(settings::TABLE).await?;
    let ttl = settings::stored(ttl_seconds);
    tx.execute(settings::RECORD_TTL, &[&ttl]).await?;
    tx.commit().await?;
    Ok(())
}

/// This process, as its claims name it.
fn owner() -> String {
    use std::hash::{BuildHasher, Hasher};
    let nonce = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    format!("pid {} ({nonce:016x})", std::process::id())
}

async fn query_opt(
    client: &impl GenericClient,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Option<Row>, StoreError> {
    let statement = client.prepare_cached(sql).await?;
    Ok(client.query_opt(&statement, params).await?)
}

async fn query_one(
    client: &impl GenericClient,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Row, StoreError> {
    let statement = client.prepare_cached(sql).await?;
    Ok(client.query_one(&statement, params).await?)
}

async fn execute(
    client: &impl GenericClient,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<u64, StoreError> {
    let statement = client.prepare_cached(sql).await?;
    Ok(client.execute(&statement, params).await?)
}

/// Locks the claim row of `key` for the transaction, if it still carries `lease`'s fence:
/// else nothing of the transaction may commit. The lock holds off a takeover until commit.
async fn fenced(
    tx: &deadpool_postgres::Transaction<'_>,
    key: &MessageId,
    lease: &Lease,
    owner: &str,
) -> Result<(), StoreError> {
    let row = query_opt(
        tx,
        "SELECT 1 FROM idempotency_claims
         WHERE message_id = $1 AND fence = $2 AND owner = $3 FOR UPDATE",
        &[&key.as_str(), &lease.fence(), &owner],
    )
    .await?;
    row.map(|_| ())
        .ok_or_else(|| StoreError::ClaimLost(key.to_string()))
}

/// Deletes the claim of `fence`, if it is still there, and announces its end.
async fn end_claim(
    client: &impl GenericClient,
    key: &str,
    fence: i64,
    owner: &str,
) -> Result<(), StoreError> {
    execute(
        client,
        "DELETE FROM idempotency_claims WHERE message_id = $1 AND fence = $2 AND owner = $3",
        &[&key, &fence, &owner],
    )
    .await?;
    // Delivered when the transaction commits, and only then.
    query_one(client, "SELECT pg_notify($1, $2)", &[&CHANNEL, &key]).await?;
    Ok(())
}

/// The method, request hash and milliseconds left (negative: expired) of `key`'s claim.
async fn held(
    client: &impl GenericClient,
    key: &MessageId,
) -> Result<Option<(String, RequestHash, i64)>, StoreError> {
    let row = query_opt(
        client,
        concat!(
            "SELECT method, request_hash, lease_until - ",
            now_ms!(),
            " FROM idempotency_claims WHERE message_id = $1"
        ),
        &[&key.as_str()],
    )
    .await?;
    let Some(row) = row else { return Ok(None) };
    let hash = stored_hash(key, "idempotency_claims.request_hash", row.get(1))?;
    Ok(Some((row.get(0), hash, row.get(2))))
}

/// Whether `error` is a connection that closed, or a session the server ended, under a
/// transaction: a staged write's error is the application's, and may be either.
fn connection_lost(error: &StoreError) -> bool {
    let source: &(dyn std::error::Error + 'static) = match error {
        StoreError::Write(source) => source.as_ref(),
        StoreError::Backend { cause, .. } => cause.as_ref(),
        _ => return false,
    };
    let Some(error) = source.downcast_ref::<tokio_postgres::Error>() else {
        return false;
    };
    let ended = [
        tokio_postgres::error::SqlState::IDLE_IN_TRANSACTION_SESSION_TIMEOUT,
        tokio_postgres::error::SqlState::ADMIN_SHUTDOWN,
    ];
    error.is_closed() || error.code().is_some_and(|code| ended.contains(code))
}

async fn apply_writes(
    tx: &deadpool_postgres::Transaction<'_>,
    writes: Vec<SqlWrite>,
) -> Result<(), StoreError> {
    for write in writes {
        write.run_postgres(tx).await.map_err(StoreError::Write)?;
    }
    Ok(())
}

/// The columns of an entry, as `select_entry` and `select_after_claim` read them.
const ENTRY_COLUMNS: &str =
    "e.request_hash, e.response_status, e.response_headers, e.response_body, e.inserted_at, e.method";

async fn select_entry(
    client: &impl GenericClient,
    id: &MessageId,
) -> Result<Option<Entry>, StoreError> {
    let sql = format!("SELECT {ENTRY_COLUMNS} FROM idempotency_cache e WHERE message_id = $1");
    let row = query_opt(client, &sql, &[&id.as_str()]).await?;
    row.map(|row| entry_of(&row, id))
        .transpose()
        .map(Option::flatten)
}

/// What a claim just won finds, in one round trip: the entry, if any, and whether a stream
/// of the key is open.
async fn select_after_claim(
    client: &impl GenericClient,
    id: &MessageId,
) -> Result<(Option<Entry>, bool), StoreError> {
    let sql = format!(
        "SELECT {ENTRY_COLUMNS},
           EXISTS (SELECT 1 FROM idempotency_open_streams WHERE message_id = $1)
         FROM (SELECT 1) AS one LEFT JOIN idempotency_cache e ON e.message_id = $1"
    );
    let row = query_one(client, &sql, &[&id.as_str()]).await?;
    Ok((entry_of(&row, id)?, row.get(6)))
}

/// The entry in the first six columns of `row` (all null: none).
fn entry_of(row: &Row, id: &MessageId) -> Result<Option<Entry>, StoreError> {
    let Some(request_hash) = row.get::<_, Option<String>>(0) else {
        return Ok(None);
    };
    let status: i32 = row.get(1);
    let row = EntryRow {
        request_hash,
        status: u16::try_from(status).map_err(|_| StoreError::Corrupt {
            message_id: id.to_string(),
            detail: "response_status".into(),
        })?,
        headers: row.get(2),
        body: row.get(3),
        inserted_at: row.get(4),
        method: row.get(5),
    };
    row.decode(id).map(Some)
}

async fn delete_events(client: &impl GenericClient, key: &str) -> Result<(), StoreError> {
    execute(
        client,
        "DELETE FROM idempotency_stream_events WHERE message_id = $1",
        &[&key],
    )
    .await?;
    Ok(())
}

/// An open stream and its recorded events, in order; none for a record past its TTL, whose
/// events are not read (see [`OpenStream::expired`]).
async fn select_open_stream(
    client: &impl GenericClient,
    id: &MessageId,
    ttl: u64,
    now: u64,
) -> Result<Option<(OpenStream, Vec<Bytes>)>, StoreError> {
    let row = query_opt(
        client,
        "SELECT method, request_hash, jsonrpc_id, started_at
         FROM idempotency_open_streams WHERE message_id = $1",
        &[&id.as_str()],
    )
    .await?;
    let Some(row) = row else { return Ok(None) };
    let stream = OpenStreamRow {
        method: row.get(0),
        request_hash: row.get(1),
        jsonrpc_id: row.get(2),
        started_at: row.get(3),
    }
    .decode(id)?;
    if stream.expired(ttl, now) {
        return Ok(None);
    }
    let statement = client
        .prepare_cached(
            "SELECT event FROM idempotency_stream_events WHERE message_id = $1 ORDER BY seq",
        )
        .await?;
    let events = client
        .query(&statement, &[&id.as_str()])
        .await?
        .into_iter()
        .map(|row| Bytes::from(row.get::<_, Vec<u8>>(0)))
        .collect();
    Ok(Some((stream, events)))
}
