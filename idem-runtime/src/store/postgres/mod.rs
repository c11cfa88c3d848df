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
use deadpool_postgres::{GenericClient, Pool};

use crate::clock::{Clock, SystemClock};
use crate::config::IdempotencyConfig;
use crate::hash::RequestHash;
use crate::message_id::MessageId;
use crate::store::postgres::claims::{end_claim, fenced, held, lease_ms, JustWon};
use crate::store::postgres::listener::{Listener, CHANNEL};
use crate::store::postgres::one_ttl::named;
use crate::store::postgres::pool::{bound_the_link, pool_of, session_bounds};
use crate::store::postgres::renewer::Renewer;
use crate::store::postgres::rows::{
    delete_events, execute, expires_at, query_one, query_opt, select_after_claim, select_entry,
    select_open_stream, select_open_stream_alone, stored_ttl,
};
use crate::store::postgres::schema::create_schema;
use crate::store::{
    at_most, Acquired, Elsewhere, Entry, Found, Lease, OpenStream, ReadAt, ReadJob, Store,
    StoreError, StoreStats,
};
use crate::unit_of_work::SqlWrite;

/// The database's clock, in epoch milliseconds: what leases are timed by.
macro_rules! now_ms {
    () => {
        "(extract(epoch from clock_timestamp()) * 1000)::bigint"
    };
}
pub(crate) use now_ms;

/// SQL: whether the row, of a table with `expires_at` and the column `$inserted`, is past its
/// own expiry, `$now` being now (as [`ReadAt`] decides)...
macro_rules! expired_by_row {
    ($inserted:literal, $now:literal) => {
        concat!("expires_at < ", $now, " AND expires_at >= ", $inserted)
    };
}

/// ... or, stored by an earlier version (no `expires_at`, or one left behind), past the
/// reader's TTL, `$before` being its `expired_before`. Apart, each is a range on one index.
macro_rules! expired_by_ttl {
    ($inserted:literal, $before:literal) => {
        concat!(
            $inserted,
            " < ",
            $before,
            " AND ",
            $crate::store::postgres::expires_by_ttl!($inserted)
        )
    };
}
#[cfg(test)]
pub(crate) use expired_by_ttl;

/// SQL: whether the row expires by the reader's TTL rather than by its own `expires_at`
/// (the predicate of the index that the sweep's second pass reads, `schema.rs`).
macro_rules! expires_by_ttl {
    ($inserted:literal) => {
        concat!("(expires_at IS NULL OR expires_at < ", $inserted, ")")
    };
}
pub(crate) use expires_by_ttl;

/// The advisory lock key under which one replica at a time enforces the LRU bound (the
/// schema's is in `schema.rs`).
const BOUND_LOCK: i64 = 0x1de3_0002;

/// Most expired rows one sweep statement deletes: short transactions, no long-held locks.
const SWEEP_CHUNK: i64 = 500;

/// Most entries past the LRU bound one statement of the sweep evicts: well within the
/// statement bound, and a table millions of rows past the bound drained in minutes.
const EVICTION_CHUNK: i64 = 5_000;

/// How long a lease may have been expired before the sweep deletes its row.
const STALE_CLAIM_MS: i64 = 60_000;

// After `now_ms!` and the `expire*!` SQL, which they use.
mod claims;
mod pool;
mod renewer;
mod rows;
mod schema;
#[cfg(test)]
pub(crate) use schema::INDEX_LOCK;

pub use pool::PostgresOptions;

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
        let mut listen = named(options.listen_url.as_ref().unwrap_or(&options.url), ttl)?;
        bound_the_link(&mut listen, lease);
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
    /// sessions' statement bound and their idle bound together (three leases, each bound at least
    /// 1 s, so at least 2 s).
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
    /// ([`StoreError::ClaimLost`]) or the database was out of reach. `storing`: the id of the
    /// transaction that stored the call's entry, whose commit ends the claim too: where the
    /// connection was lost after that `COMMIT` reached the database, PostgreSQL says it
    /// committed, and the call succeeded (found by helper-55: it was told another replica had
    /// taken its key; and by helper-57: an entry of the same bytes is no proof, a takeover
    /// may answer alike).
    async fn cut_off(
        &self,
        key: &MessageId,
        fence: i64,
        error: StoreError,
        storing: Option<i64>,
    ) -> Result<(), StoreError> {
        if !connection_lost(&error) {
            return Err(error);
        }
        let Ok(client) = self.client().await else {
            return Err(error);
        };
        // Asked first: a COMMIT still running when its connection dropped (waiting on a
        // synchronous standby, say) holds the claim as ours until it lands (helper-59).
        if let Some(transaction) = storing {
            match self.outcome_of(&client, transaction).await {
                Some(true) => return Ok(()),
                Some(false) => {} // rolled back: the claim says whether it was taken over
                None => return Err(error),
            }
        }
        let ours = "SELECT 1 FROM idempotency_claims
                    WHERE message_id = $1 AND fence = $2 AND owner = $3";
        match query_opt(&client, ours, &[&key.as_str(), &fence, &self.owner]).await {
            Ok(None) => Err(StoreError::ClaimLost(key.to_string())),
            Ok(Some(_)) | Err(_) => Err(match error {
                StoreError::Write(cause) => StoreError::Backend {
                    backend: "postgres",
                    cause,
                },
                other => other,
            }),
        }
    }

    /// Whether PostgreSQL committed `transaction` (`txid_status`), once it has ended: asked
    /// again while it is in progress, for at most a lease. `None` where it cannot say.
    async fn outcome_of(&self, client: &impl GenericClient, transaction: i64) -> Option<bool> {
        let deadline = tokio::time::Instant::now() + self.lease;
        loop {
            let status = query_one(client, "SELECT txid_status($1)", &[&transaction]).await;
            match status.ok()?.get::<_, Option<String>>(0)?.as_str() {
                "committed" => return Some(true),
                "aborted" => return Some(false),
                _ if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(20)).await
                }
                _ => return None,
            }
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

    /// The time rows are read at, and this replica's TTL (for rows stored without an expiry).
    fn read_at(&self) -> ReadAt {
        let (now, ttl) = (self.clock.now_seconds(), self.ttl_seconds);
        ReadAt { now, ttl }
    }

    /// `entry`, live (as its select found it), noting the use for the LRU bound.
    fn used(&self, entry: Option<Entry>) -> Option<Entry> {
        let entry = entry?;
        let mut touches = self.touches.lock().expect("touches lock");
        touches.insert(entry.message_id.to_string(), self.clock.now_millis());
        Some(entry)
    }

    async fn live_entry(
        &self,
        client: &impl GenericClient,
        key: &MessageId,
    ) -> Result<Option<Entry>, StoreError> {
        Ok(self.used(select_entry(client, key, self.read_at()).await?))
    }

    /// Writes the uses noted since the last flush, in `tx`.
    async fn flush_touches(&self, client: &impl GenericClient) -> Result<(), StoreError> {
        let touches = std::mem::take(&mut *self.touches.lock().expect("touches lock"));
        if touches.is_empty() {
            return Ok(());
        }
        let (ids, used): (Vec<String>, Vec<i64>) =
            touches.into_iter().map(|(k, v)| (k, v as i64)).unzip();
        // SKIP LOCKED: a use is a hint, and a row another session is writing is being used or
        // stored again anyway. Waiting for it, two replicas flushing the same keys in another
        // order could deadlock, and fail the call whose commit flushed.
        execute(
            client,
            "UPDATE idempotency_cache AS c SET last_used_at = GREATEST(c.last_used_at, t.used)
             FROM unnest($1::text[], $2::bigint[]) AS t(id, used) WHERE c.message_id = t.id
             AND c.message_id IN (SELECT message_id FROM idempotency_cache
                                  WHERE message_id = ANY($1) FOR UPDATE SKIP LOCKED)",
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
        stored: Option<&MessageId>,
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
            // SKIP LOCKED: a row another replica is writing (a key stored again past its TTL,
            // a touch) is not the least recently used any more; deleted after it committed,
            // the entry just answered would be gone. Nor is the entry this call just stored
            // (SKIP LOCKED skips no row of its own transaction), whatever its stamp says: a
            // replica's clock behind the others' would have it evicted as it commits, and its
            // retry run again. `ANY(ARRAY(..))`, not `IN`: the rows are chosen once. A join
            // may run an `IN` subquery again for each row, and each run skips the rows the
            // statement already deleted and takes the next ones past the bound.
            "DELETE FROM idempotency_cache WHERE message_id = ANY(ARRAY(
               SELECT message_id FROM idempotency_cache
               WHERE message_id IS DISTINCT FROM $3::text
               ORDER BY last_used_at, message_id
               LIMIT LEAST($2, GREATEST(0, (SELECT COUNT(*) FROM idempotency_cache) - $1))
               FOR UPDATE SKIP LOCKED))",
            &[&max, &at_most, &stored.map(MessageId::as_str)],
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

    /// [`store_entry`](Self::store_entry) in the transaction `tx`, and the LRU bound enforced
    /// there if that insert passed it; the id of the transaction.
    async fn store_in(
        &self,
        tx: &impl GenericClient,
        entry: &Entry,
        fence: i64,
        ttl_seconds: u64,
    ) -> Result<i64, StoreError> {
        let stored = self.store_entry(tx, entry, fence, ttl_seconds).await?;
        if stored.past_the_bound {
            self.enforce_bound(tx, SWEEP_CHUNK, Some(&entry.message_id))
                .await?;
        }
        Ok(stored.transaction)
    }

    /// Stores `entry` and ends its claim in one statement, fenced: nothing is stored unless
    /// the claim still carries `fence` ([`StoreError::ClaimLost`]). Announces the end at commit.
    async fn store_entry(
        &self,
        client: &impl GenericClient,
        entry: &Entry,
        fence: i64,
        ttl_seconds: u64,
    ) -> Result<Stored, StoreError> {
        let stored = query_one(
            client,
            "WITH claim AS (
               DELETE FROM idempotency_claims
               WHERE message_id = $1 AND fence = $2 AND owner = $11
               RETURNING message_id
             ), stored AS (
               INSERT INTO idempotency_cache
                 (message_id, request_hash, response_status, response_headers, response_body,
                  inserted_at, method, last_used_at, expires_at)
               SELECT message_id, $3, $4, $5, $6, $7, $8, $9, $12 FROM claim
               ON CONFLICT (message_id) DO UPDATE SET request_hash = EXCLUDED.request_hash,
                 response_status = EXCLUDED.response_status,
                 response_headers = EXCLUDED.response_headers,
                 response_body = EXCLUDED.response_body, inserted_at = EXCLUDED.inserted_at,
                 method = EXCLUDED.method, last_used_at = EXCLUDED.last_used_at,
                 expires_at = EXCLUDED.expires_at
               RETURNING (xmax = 0) AS inserted
             ), announced AS (
               SELECT pg_notify($10, message_id) FROM claim
             )
             SELECT (SELECT inserted FROM stored), (SELECT COUNT(*) FROM announced),
               txid_current()",
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
                &expires_at(entry.inserted_at, ttl_seconds),
            ],
        )
        .await?;
        let inserted: Option<bool> = stored.get(0);
        let past_the_bound = match inserted {
            None => return Err(StoreError::ClaimLost(entry.message_id.to_string())),
            Some(true) => self.rows.fetch_add(1, Ordering::Relaxed) + 1 > self.max_entries,
            Some(false) => false,
        };
        Ok(Stored {
            past_the_bound,
            transaction: stored.get(2),
        })
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
            let lease_ms = lease_ms(self.lease);
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
                    let won = JustWon::new(self, key, self.renewer.lease(key, row.get(0)));
                    // The entry may have been committed before the claim was won.
                    let (entry, open) = select_after_claim(&client, key, self.read_at()).await?;
                    if let Some(entry) = self.used(entry) {
                        end_claim(&client, id, won.fence(), &self.owner).await?;
                        drop(won.keep());
                        return Ok(Acquired::Entry(Arc::new(entry)));
                    }
                    let open = match open {
                        true => select_open_stream(&client, key, self.read_at()).await?,
                        false => None,
                    };
                    return Ok(match open {
                        Some((stream, events)) => Acquired::Interrupted(won.keep(), stream, events),
                        None => Acquired::Won(won.keep()),
                    });
                }
                if let Some((held_method, request_hash, _)) = held(&client, key).await? {
                    // Another payload's claim may be one that found the key's entry and is
                    // about to end (a claim is won before the entry is read): the entry, not
                    // that claim, answers this call (found by helper-48: a retry of the
                    // stored payload got the 422 of a payload never stored).
                    if (held_method.as_str(), &request_hash) != (method, hash) {
                        // Nor does a claim that is closing a stream a crash interrupted: the
                        // stream's outcome is the key's (found by helper-52). Read before the
                        // entry, which that close commits as it deletes the stream: one of the
                        // two reads sees it.
                        let open = select_open_stream_alone(&client, key, self.read_at());
                        if let Some(stream) = open.await? {
                            return Ok(Acquired::Held {
                                method: stream.method,
                                request_hash: stream.request_hash,
                            });
                        }
                        if let Some(entry) = self.live_entry(&client, key).await? {
                            return Ok(Acquired::Entry(Arc::new(entry)));
                        }
                    }
                    return Ok(Acquired::Held {
                        method: held_method,
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
                let (fence, ttl) = (lease.fence(), self.ttl_seconds);
                if self.store_entry(&client, &entry, fence, ttl).await?.past_the_bound {
                    let bound = async {
                        let tx = client.transaction().await?;
                        let stored = Some(&entry.message_id);
                        self.enforce_bound(&tx, SWEEP_CHUNK, stored).await?;
                        Ok::<_, StoreError>(tx.commit().await?)
                    };
                    // The entry is committed: the call succeeded, and the next commit or
                    // sweep enforces the bound instead.
                    if let Err(error) = bound.await {
                        tracing::warn!(%error, "the LRU bound could not be enforced after a commit");
                    }
                }
                return Ok(());
            }
            let mut transaction = None;
            let committed = async {
                let tx = client.transaction().await?;
                apply_writes(&tx, writes).await?;
                // Fenced last: if the claim was lost meanwhile, the writes roll back with it.
                let (fence, ttl) = (lease.fence(), self.ttl_seconds);
                transaction = Some(self.store_in(&tx, &entry, fence, ttl).await?);
                Ok(tx.commit().await?)
            };
            let fence = lease.fence();
            match committed.await.map_err(the_staged_writes) {
                Ok(()) => Ok(()),
                Err(error) => {
                    let key = &entry.message_id;
                    self.cut_off(key, fence, error, transaction).await
                }
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
                apply_writes(&tx, writes).await?;
                // Fenced after the writes, as `put` is: the claim's row stays unlocked while
                // they wait on the application's locks, so its lease is renewed meanwhile.
                fenced(&tx, &stream.message_id, lease, &self.owner).await?;
                let id = stream.message_id.as_str();
                execute(
                    &tx,
                    "INSERT INTO idempotency_open_streams
                       (message_id, method, request_hash, jsonrpc_id, started_at, expires_at)
                     VALUES ($1, $2, $3, $4, $5, $6)
                     ON CONFLICT (message_id) DO UPDATE SET method = EXCLUDED.method,
                       request_hash = EXCLUDED.request_hash, jsonrpc_id = EXCLUDED.jsonrpc_id,
                       started_at = EXCLUDED.started_at, expires_at = EXCLUDED.expires_at",
                    &[
                        &id,
                        &stream.method,
                        &stream.request_hash.as_str(),
                        &stream.jsonrpc_id,
                        &(stream.recorded_at as i64),
                        &expires_at(stream.recorded_at, self.ttl_seconds),
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
            match opened.await.map_err(the_staged_writes) {
                Ok(()) => Ok(()),
                // The claim outlives the stream's start: gone, it was taken over.
                Err(error) => {
                    let key = &stream.message_id;
                    self.cut_off(key, lease.fence(), error, None).await
                }
            }
        })
        .await
    }

    async fn append_events(
        &self,
        key: &MessageId,
        first_seq: u32,
        events: Vec<Bytes>,
        lease: &Lease,
    ) -> Result<(), StoreError> {
        let events: Vec<&[u8]> = events.iter().map(Bytes::as_ref).collect();
        self.in_time(async {
            let client = self.client().await?;
            let lease_ms = lease_ms(self.lease);
            let appended = execute(
                &client,
                // The claim's row is updated, not read: each event renews the lease, as the
                // renewer would (whose `SKIP LOCKED` passes over a row that events lock back to
                // back: a busy stream's lease ran out, and another replica took it over). A
                // takeover under way holds the row; the event waits for it and is then refused,
                // never recorded under a claim already taken. The record moves its expiry with
                // it (`OpenStream::recorded_at`), the claim's row locked first, as a close
                // locks them. A record the sweep took (the stream was quiet a whole TTL while
                // its lease lapsed) takes no more events: they would belong to no stream, and
                // never be swept (found by helper-53).
                concat!(
                    "WITH fenced AS (UPDATE idempotency_claims
                       SET lease_until = GREATEST(lease_until, ",
                    now_ms!(),
                    " + $7)
                       WHERE message_id = $1 AND fence = $4 AND owner = $5 RETURNING 1),
                     touched AS (UPDATE idempotency_open_streams
                       SET started_at = $6,
                           expires_at = expires_at + LEAST($6 - started_at, 9223372036854775807 - expires_at)
                       WHERE message_id = $1 AND EXISTS (SELECT 1 FROM fenced) RETURNING 1)
                     INSERT INTO idempotency_stream_events (message_id, seq, event)
                     SELECT $1, $2::integer + n::integer - 1, event FROM unnest($3::bytea[]) WITH ORDINALITY
                       AS batch(event, n)
                     WHERE EXISTS (SELECT 1 FROM touched)"
                ),
                &[
                    &key.as_str(),
                    &(first_seq as i32),
                    &events,
                    &lease.fence(),
                    &self.owner,
                    &(self.now_seconds() as i64),
                    &lease_ms,
                ],
            )
            .await?;
            match appended == events.len() as u64 {
                true => Ok(()),
                false => Err(StoreError::ClaimLost(key.to_string())),
            }
        })
        .await
    }

    // The claim is won before the open stream is read (`acquire`): for those round trips the
    // claim of another payload holds the key under its own hash (found by helper-53).
    async fn open_stream_binding(
        &self,
        key: &MessageId,
    ) -> Result<Option<(String, RequestHash)>, StoreError> {
        self.in_time(async {
            let client = self.client().await?;
            let open = select_open_stream_alone(&client, key, self.read_at()).await?;
            Ok(open.map(|stream| (stream.method, stream.request_hash)))
        })
        .await
    }

    async fn close_stream(&self, entry: Arc<Entry>, lease: &Lease) -> Result<(), StoreError> {
        self.in_time(async {
            lease.end();
            let mut client = self.client().await?;
            let mut transaction = None;
            let closed = async {
                let tx = client.transaction().await?;
                // The claim's row first, as `open_stream` locks it: two replicas closing and
                // opening one key take their locks in one order.
                fenced(&tx, &entry.message_id, lease, &self.owner).await?;
                let id = entry.message_id.as_str();
                let record = query_opt(
                    &tx,
                    "DELETE FROM idempotency_open_streams WHERE message_id = $1
                     RETURNING started_at, expires_at",
                    &[&id],
                )
                .await?;
                delete_events(&tx, id).await?;
                // The outcome keeps the TTL the stream started with: another replica's, when
                // this one closes it as interrupted (a probe's replica of 3 s closed one of
                // 24 h's, and a retry 5 s later ran the stream again).
                let started_with = record.and_then(|row| stored_ttl(row.get(0), row.get(1)));
                let ttl = started_with.unwrap_or(self.ttl_seconds);
                transaction = Some(self.store_in(&tx, &entry, lease.fence(), ttl).await?);
                Ok(tx.commit().await?)
            };
            match closed.await {
                Ok(()) => Ok(()),
                Err(error) => {
                    let key = &entry.message_id;
                    self.cut_off(key, lease.fence(), error, transaction).await
                }
            }
        })
        .await
    }

    async fn apply(&self, writes: Vec<SqlWrite>) -> Result<(), StoreError> {
        self.in_time(async {
            let mut client = self.client().await?;
            let committed = async {
                let tx = client.transaction().await?;
                apply_writes(&tx, writes).await?;
                // PostgreSQL answers the COMMIT of a transaction that an error aborted with
                // ROLLBACK, not an error: a write that swallowed its statement's error would
                // pass for committed (found by helper-55). A `put` learns it from its entry's
                // statement; here one statement asks.
                tx.batch_execute("SELECT 1").await?;
                Ok(tx.commit().await?)
            };
            committed.await.map_err(the_staged_writes)
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
        let at = self.read_at();
        self.flush_touches(&client).await?;
        let total = delete_expired(&client, at, SWEEP_CHUNK).await?;
        delete_abandoned_streams(&client, at).await?;
        delete_stale_claims(&client).await?;
        drop(client);
        if self.count().await? > self.max_entries {
            // Chunk after chunk, each counting the table once, until one comes back short:
            // the bound is met (or another replica holds its lock, and evicts).
            loop {
                let mut client = self.client().await?;
                let tx = client.transaction().await?;
                let evicted = self.enforce_bound(&tx, EVICTION_CHUNK, None).await?;
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

/// This process, as its claims name it.
fn owner() -> String {
    use std::hash::{BuildHasher, Hasher};
    let nonce = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    format!("pid {} ({nonce:016x})", std::process::id())
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

/// What storing an entry did.
struct Stored {
    /// This insert may have passed the LRU bound: [`PostgresStore::enforce_bound`] is due, in
    /// a transaction.
    past_the_bound: bool,
    /// The id of the transaction that stored it (`txid_current()`), to ask PostgreSQL whether
    /// it committed when the answer to its `COMMIT` is lost.
    transaction: i64,
}

/// `error`, as the staged writes' failure where it is theirs: a statement refused because one
/// of them swallowed its own error (the transaction aborted, 25P02), or a `COMMIT` that a
/// deferred constraint of theirs refused (class 23). Otherwise the store's, as it was.
fn the_staged_writes(error: StoreError) -> StoreError {
    let StoreError::Backend { cause, backend } = error else {
        return error;
    };
    let code = cause
        .downcast_ref::<tokio_postgres::Error>()
        .and_then(tokio_postgres::Error::code);
    match code {
        Some(code) if *code == tokio_postgres::error::SqlState::IN_FAILED_SQL_TRANSACTION => {
            StoreError::Write(
                format!(
                    "a staged write's statement failed and the write went on without returning \
                     its error, so the transaction was aborted ({})",
                    crate::store::error::causes(cause.as_ref())
                )
                .into(),
            )
        }
        Some(code) if code.code().starts_with("23") => StoreError::Write(cause),
        _ => StoreError::Backend { backend, cause },
    }
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

/// The entries expired at `at`, deleted in chunks of `chunk` rows; how many: the sweep's
/// first step, and the operator's `purge --expired`. Each statement is prepared anew, so that
/// PostgreSQL plans it for its bound (a cached one's generic plan read the whole table), and
/// finds its rows by key (`IN` joined the whole table). SKIP LOCKED: replicas sweeping at
/// once take disjoint rows, and none waits; a row a server is writing is a key stored again,
/// live, which would be gone once that commits.
pub(crate) async fn delete_expired(
    client: &tokio_postgres::Client,
    at: ReadAt,
    chunk: i64,
) -> Result<u64, StoreError> {
    macro_rules! chunk_where {
        ($expired:expr) => {
            concat!(
                "DELETE FROM idempotency_cache WHERE message_id = ANY(ARRAY(
                   SELECT message_id FROM idempotency_cache WHERE ",
                $expired,
                " LIMIT $2 FOR UPDATE SKIP LOCKED))"
            )
        };
    }
    let passes = [
        (
            chunk_where!(expired_by_row!("inserted_at", "$1")),
            at.now_param(),
        ),
        (
            chunk_where!(expired_by_ttl!("inserted_at", "$1")),
            at.before_param(),
        ),
    ];
    let mut total = 0;
    for (sql, bound) in passes {
        loop {
            let deleted = client.execute(sql, &[&bound, &chunk]).await?;
            total += deleted;
            if deleted < chunk as u64 {
                break;
            }
        }
    }
    Ok(total)
}

/// The open streams expired at `at` that no live claim records any more (their replica
/// died), with their events. An open stream whose claim is live is still running on
/// some replica: never swept, so that its retries attach (or, after a crash, get its
/// interrupted outcome). One statement: its record and events go together, or neither does.
async fn delete_abandoned_streams(
    client: &impl GenericClient,
    at: ReadAt,
) -> Result<(), StoreError> {
    execute(
        client,
        concat!(
            "WITH gone AS (
               DELETE FROM idempotency_open_streams o WHERE ((",
            expired_by_row!("started_at", "$2"),
            ") OR (",
            expired_by_ttl!("started_at", "$1"),
            ")) AND NOT EXISTS (SELECT 1 FROM idempotency_claims c
                               WHERE c.message_id = o.message_id AND c.lease_until > ",
            now_ms!(),
            ") RETURNING message_id)
             DELETE FROM idempotency_stream_events e USING gone
             WHERE e.message_id = gone.message_id"
        ),
        &[&at.before_param(), &at.now_param()],
    )
    .await?;
    Ok(())
}

/// Claims whose lease ran out long ago ([`STALE_CLAIM_MS`]): their replicas are gone.
async fn delete_stale_claims(client: &impl GenericClient) -> Result<(), StoreError> {
    execute(
        client,
        concat!(
            "DELETE FROM idempotency_claims WHERE lease_until + $1 < ",
            now_ms!()
        ),
        &[&STALE_CLAIM_MS],
    )
    .await?;
    Ok(())
}
