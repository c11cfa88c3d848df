//! The durable [`Store`] on PostgreSQL, for replicas that share one database.
//!
//! Every process keeps its own table of the calls it runs (`claim/in_flight.rs`), and the database
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
//!
//! Here: the store and its [`Store`] methods. Beside it, in the order a call meets them:
//! `pool.rs` (sessions and their bounds), `claims.rs` and `renewer.rs` (the claim's row and
//! its lease), `staged_writes.rs` (the application's writes in the call's transaction),
//! `entries.rs` (an entry read, or stored with the end of its claim), `lost_commit.rs` (a
//! commit whose answer was lost), `listener.rs` (ends announced), `lru.rs` and `sweep.rs`
//! (the bound and the sweep), `rows.rs` (statements and row decoding), `schema.rs` and
//! `replica_settings.rs` (the tables, and one TTL and key scoping per database).

mod listener;
mod replica_settings;

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use deadpool_postgres::{GenericClient, Pool};

use crate::clock::{Clock, SystemClock};
use crate::config::IdempotencyConfig;
use crate::hash::RequestHash;
use crate::message_id::MessageId;
use crate::store::postgres::claims::{end_claim, fenced, held, lease_ms, JustWon};
use crate::store::postgres::listener::Listener;
use crate::store::postgres::lost_commit::FencedCommit;
use crate::store::postgres::lru::EVICTION_CHUNK;
use crate::store::postgres::pool::{bound_the_link, pool_of, session_bounds, session_settings};
use crate::store::postgres::renewer::{Pools, Renewer};
use crate::store::postgres::replica_settings::{named, Serving};
use crate::store::postgres::rows::{
    delete_events, execute, expires_at, query_one, query_opt, select_after_claim,
    select_open_stream, select_open_stream_alone, stored_ttl,
};
use crate::store::postgres::schema::create_schema;
use crate::store::postgres::staged_writes::{
    apply_writes, discard, hand_back, restore_sql, the_staged_writes,
};
use crate::store::postgres::sweep::{delete_abandoned_streams, delete_stale_claims, SWEEP_CHUNK};
use crate::store::touches::Touches;
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

// After `now_ms!` and the `expire*!` SQL, which they use.
mod claims;
mod entries;
mod lost_commit;
mod lru;
mod pool;
mod renewer;
pub(crate) mod rows;
mod schema;
mod staged_writes;
mod sweep;
#[cfg(test)]
pub(crate) use schema::INDEX_LOCK;

pub use pool::PostgresOptions;
pub(crate) use sweep::delete_expired;

/// A wait past any a call makes (a century): what a deadline `Duration::MAX` away becomes.
const FOREVER: Duration = Duration::from_secs(100 * 365 * 86_400);

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
    touches: Touches,
    /// Rows as this process last counted them, plus its own inserts since: the LRU bound is
    /// checked against the database only once this nears it.
    rows: AtomicU64,
    /// Renews the leases of the claims this process holds.
    renewer: Renewer,
    /// How many claims this process has sent: a claim carries its number (see `acquire`).
    attempts: AtomicU64,
    /// What gives a session back as the pool made it, after staged writes ran on it.
    restore: Arc<str>,
}

impl PostgresStore {
    /// Connects to the database at `url`, on the system clock, and creates the tables. Fails
    /// with [`StoreError::TtlMismatch`] while a replica of another TTL serves the database,
    /// and [`StoreError::ScopingMismatch`] while one that scopes keys otherwise does.
    pub async fn connect(url: &str, config: &IdempotencyConfig) -> Result<Self, StoreError> {
        Self::connect_with(PostgresOptions::new(url), config, Arc::new(SystemClock)).await
    }

    /// Like [`connect`](Self::connect), with every option and an injected clock.
    pub async fn connect_with(
        options: PostgresOptions,
        config: &IdempotencyConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, StoreError> {
        // The builders check too; a store connected on its own is held to the same values
        // (a lease of 10 ms ran out before its renewal: helper-94, helper-96).
        config.checked()?;
        let lease = config.claim_lease;
        let serving = Serving {
            ttl_seconds: config.ttl_seconds,
            scoped: config.scope_keys_by_principal,
        };
        let pool = pool_of(&options, options.pool_size, lease, serving)?;
        create_schema(&pool, serving).await?;
        let mut listen = named(options.listen_url.as_ref().unwrap_or(&options.url), serving)?;
        bound_the_link(&mut listen, lease);
        let owner = owner();
        let store = Self {
            listener: Listener::start(listen),
            // A connection of its own: renewals never queue behind the calls' commits.
            renewer: Renewer::start(
                Pools {
                    own: pool_of(&options, 1, lease, serving)?,
                    calls: pool.clone(),
                },
                owner.clone(),
                lease,
            ),
            owner,
            ttl_seconds: config.ttl_seconds,
            max_entries: config.max_cache_entries,
            lease: config.claim_lease,
            clock,
            touches: Touches::default(),
            rows: AtomicU64::new(0),
            attempts: AtomicU64::new(0),
            pool,
            restore: restore_sql(&session_settings(lease)),
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
        let bound = self.bound(wait);
        let answered = at_most(bound, operation).await;
        answered.unwrap_or_else(|| Err(self.no_answer(bound)))
    }

    /// [`in_time`](Self::in_time), for a commit fenced by its key's claim: one whose
    /// bound ran out answers as one whose connection was cut off does
    /// ([`cut_off`](Self::cut_off)), asked in one lease more. A replica frozen past the bound
    /// (SIGSTOP, a paused VM) finds its timers run out as it wakes, while another replica took
    /// its key over: it answered that the database had not answered (found by helper-104).
    async fn fenced_in_time(
        &self,
        commit: &FencedCommit<'_>,
        operation: impl Future<Output = Result<(), StoreError>>,
    ) -> Result<(), StoreError> {
        let bound = self.bound(Duration::ZERO);
        if let Some(answered) = at_most(bound, operation).await {
            return answered;
        }
        let asked = self.classify(commit, self.no_answer(bound));
        let answered = at_most(self.lease, asked).await;
        answered.unwrap_or_else(|| Err(self.no_answer(bound)))
    }

    /// That the database did not answer in `bound`. The operation dropped its connection back
    /// into the pool, its statement still unanswered: none of the idle ones is to be trusted
    /// with the next call.
    fn no_answer(&self, bound: Duration) -> StoreError {
        drop(self.pool.retain(|_, _| false));
        StoreError::Backend {
            backend: "postgres",
            cause: format!("no answer from the database in {} ms", bound.as_millis()).into(),
        }
    }

    /// How long an operation that may wait `wait` on purpose waits for the database: that,
    /// the sessions' statement bound and their idle bound.
    fn bound(&self, wait: Duration) -> Duration {
        let (idle, statement) = session_bounds(self.lease);
        // Saturating: `in_flight_wait` may be `Duration::MAX`, "as long as the original runs"
        // (it overflowed, and the waiting call's task panicked; found by helper-85).
        wait.saturating_add(statement).saturating_add(idle)
    }

    /// How long the server lets one of the sessions' statements run (two leases).
    fn statement_bound(&self) -> Duration {
        session_bounds(self.lease).1
    }

    /// The time rows are read at, and this replica's TTL (for rows stored without an expiry).
    fn read_at(&self) -> ReadAt {
        let (now, ttl) = (self.clock.now_seconds(), self.ttl_seconds);
        ReadAt { now, ttl }
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
            let deadline = tokio::time::Instant::now() + bound.min(FOREVER);
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
        let (alone, storing) = (writes.is_empty(), OnceLock::new());
        let commit = FencedCommit::new(&entry.message_id, lease, &storing);
        let stored = async {
            lease.end();
            let mut client = self.client().await?;
            if writes.is_empty() {
                // One statement, its own transaction; the bound, if due, in another.
                let (fence, ttl) = (commit.fence, self.ttl_seconds);
                if self
                    .store_entry(&client, &entry, fence, ttl)
                    .await?
                    .past_the_bound
                {
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
            let committed = async {
                let tx = client.transaction().await?;
                apply_writes(&tx, writes).await?;
                // Fenced last: if the claim was lost meanwhile, the writes roll back with it.
                let (fence, ttl) = (commit.fence, self.ttl_seconds);
                let _ = storing.set(self.store_in(&tx, &entry, fence, ttl).await?);
                Ok(tx.commit().await?)
            };
            match committed.await.map_err(the_staged_writes) {
                Ok(()) => {
                    hand_back(client, self.restore.clone(), self.statement_bound());
                    Ok(())
                }
                Err(error) => {
                    // Its slot back first: asking on another connection must not wait for
                    // the very one it holds (a full pool reported a landed commit as failed).
                    discard(client);
                    self.cut_off(&commit, error).await
                }
            }
        };
        // An entry stored alone ends its claim in its own statement, whose transaction has no
        // id to ask about: a claim gone is no proof that it was taken over.
        match alone {
            true => self.in_time(stored).await,
            false => self.fenced_in_time(&commit, stored).await,
        }
    }

    async fn open_stream(
        &self,
        stream: &OpenStream,
        first_event: Bytes,
        writes: Vec<SqlWrite>,
        lease: &Lease,
    ) -> Result<(), StoreError> {
        let storing = OnceLock::new();
        let commit = FencedCommit::new(&stream.message_id, lease, &storing);
        let opened = async {
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
                let first = query_one(
                    &tx,
                    "INSERT INTO idempotency_stream_events (message_id, seq, event) VALUES ($1, 0, $2)
                     RETURNING txid_current()",
                    &[&id, &first_event.as_ref()],
                )
                .await?;
                let _ = storing.set(first.get(0));
                Ok(tx.commit().await?)
            };
            match opened.await.map_err(the_staged_writes) {
                Ok(()) => {
                    hand_back(client, self.restore.clone(), self.statement_bound());
                    Ok(())
                }
                // The claim outlives the stream's start: gone, it was taken over. Asked as
                // `put` asks (a start that landed was reported as the store's failure).
                Err(error) => {
                    discard(client);
                    self.cut_off(&commit, error).await
                }
            }
        };
        self.fenced_in_time(&commit, opened).await
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
        let storing = OnceLock::new();
        let commit = FencedCommit::new(&entry.message_id, lease, &storing);
        let closed = async {
            lease.end();
            let mut client = self.client().await?;
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
                let _ = storing.set(self.store_in(&tx, &entry, commit.fence, ttl).await?);
                Ok(tx.commit().await?)
            };
            match closed.await {
                Ok(()) => Ok(()),
                Err(error) => {
                    drop(client);
                    self.cut_off(&commit, error).await
                }
            }
        };
        self.fenced_in_time(&commit, closed).await
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
        self.flush_all_touches(&client).await?;
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
