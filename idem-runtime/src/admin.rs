//! The operator's view of a database that servers may be serving right now: its figures, one
//! entry, and purges. Used by the `idem-admin` tool.
//!
//! It opens its own connection, beside the servers', and takes none of their locks: a read
//! never blocks them, and a purge is one short transaction per key (or per chunk of expired
//! rows), ordered by the database's own write lock. It never touches a claim or a stream
//! being recorded. A SQLite server keeps entries in memory, so a purge there returns once the
//! serving process confirms it has forgotten them (`store/sqlite/purge_watch.rs`); a
//! PostgreSQL replica keeps none, so a purge there is seen by every replica at once.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! use idem_runtime::admin::Admin;
//! use idem_runtime::store::SqliteStore;
//! use idem_runtime::IdempotencyConfig;
//! let dir = tempfile::tempdir().unwrap();
//! let path = dir.path().join("a2a.db");
//! let config = IdempotencyConfig::default();
//! let _serving = SqliteStore::open(&path, &config).unwrap();
//! let admin = Admin::open(path.to_str().unwrap(), &config).await.unwrap();
//! assert_eq!(admin.stats().await.unwrap().entries, 0);
//! # }
//! ```

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rusqlite::{Connection, OpenFlags, OptionalExtension};

use crate::clock::{Clock, SystemClock};
use crate::config::IdempotencyConfig;
use crate::message_id::MessageId;
#[cfg(feature = "postgres")]
use crate::store::postgres::rows::column;
use crate::store::settings;
use crate::store::sqlite::{connection, file_lock, file_size_limit, purge_watch};
use crate::store::{ReadAt, StoreError, StoreStats};

/// One key as the database holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EntryInfo {
    /// The method the key is bound to.
    pub method: String,
    /// The request hash it is bound to (hex).
    pub request_hash: String,
    /// What holds the key.
    pub state: EntryState,
    /// Unix epoch seconds: when it was stored (or its stream started).
    pub inserted_at: u64,
    /// Unix epoch seconds: when a stored entry expires (on PostgreSQL, by the TTL of the
    /// replica that stored it; else by the one this tool counts with); none for a stream or a
    /// call still running.
    pub expires_at: Option<u64>,
    /// Bytes of the stored response body (of the events recorded, for an open stream).
    pub bytes: u64,
    /// The stored response body (the events recorded so far, for an open stream).
    pub body: Vec<u8>,
}

/// What holds a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryState {
    /// A live entry, answered to every retry; its HTTP status.
    Live(u16),
    /// An entry past its TTL: a miss, deleted by the next sweep.
    Expired(u16),
    /// A stream being recorded, or left open by a process that died (a retry within its TTL
    /// closes it as interrupted; past that it is expired); how many events it holds.
    OpenStream(u64),
    /// A call running on a replica (PostgreSQL: its claim's lease is live): nothing is stored
    /// yet; its outcome is, when it ends. `inserted_at` is when the lease runs out, unless
    /// renewed. A SQLite file's calls in flight are in its server's memory, not shown.
    Running,
}

/// A connection to a database the idempotency stores use.
pub struct Admin {
    db: Db,
    ttl_seconds: u64,
    /// Whether `ttl_seconds` is what the stores recorded (else the configuration's).
    ttl_recorded: bool,
    clock: Arc<dyn Clock>,
    /// How long a SQLite purge waits for the serving process to confirm it.
    purge_wait: Duration,
}

enum Db {
    Sqlite(Arc<Mutex<Connection>>, PathBuf),
    /// One session, one caller at a time: a read's snapshot is a transaction on it.
    #[cfg(feature = "postgres")]
    Postgres(tokio::sync::Mutex<tokio_postgres::Client>),
}

/// How many expired rows one purge transaction deletes: a served SQLite file's writer waits
/// for at most one such chunk.
const PURGE_CHUNK: i64 = 1000;

/// How long a purge of a served SQLite file waits for its server's confirmation: the server
/// looks every 250 ms, between checkpoints that may take seconds under load.
const PURGE_CONFIRMED_WITHIN: Duration = Duration::from_secs(10);

/// How often a purge asks whether the server has confirmed it.
const CONFIRMATION_POLL: Duration = Duration::from_millis(10);

/// An entry's row, and the SQL of its expiry: on PostgreSQL its own `expires_at` (null in a
/// row of an earlier version), on SQLite none (the TTL decides).
macro_rules! entry {
    ($expires_at:literal) => {
        concat!(
            "SELECT method, request_hash, response_status, inserted_at,
                    CAST(length(response_body) AS BIGINT), response_body, ",
            $expires_at,
            " FROM idempotency_cache WHERE message_id = $1"
        )
    };
}
const ENTRY: &str = entry!("NULL");
#[cfg(feature = "postgres")]
const POSTGRES_ENTRY: &str = entry!("expires_at");
const OPEN_STREAM: &str = "
SELECT method, request_hash, started_at FROM idempotency_open_streams WHERE message_id = $1";
const STREAM_EVENTS: &str =
    "SELECT event FROM idempotency_stream_events WHERE message_id = $1 ORDER BY seq";
#[cfg(feature = "postgres")]
const LIVE_CLAIM: &str = concat!(
    "SELECT method, request_hash, lease_until / 1000 FROM idempotency_claims
     WHERE message_id = $1 AND lease_until > ",
    crate::store::postgres::now_ms!()
);
const PURGE: &str = "DELETE FROM idempotency_cache WHERE message_id = $1";
/// `sql`, whose row is `WHERE message_id = $1`, as SQLite should run it: a file's table has
/// no index of keys since the key index keeps rowids (`store/sqlite/key_index.rs` says why), so
/// the key is looked for in the index on `(last_used_at, message_id)`, about 50 bytes a row,
/// instead of in the table's rows (a file of an earlier version uses its key index).
fn sqlite_by_key(sql: &str) -> String {
    let subquery = "rowid IN (SELECT rowid FROM idempotency_cache WHERE message_id = $1)";
    sql.replace("message_id = $1", subquery)
}

/// A chunk of the expired entries of a SQLite file (`$1`: `expired_before`): rows by rowid
/// (no index of keys there), found through the index on `inserted_at`.
const SQLITE_PURGE_EXPIRED: &str = "
DELETE FROM idempotency_cache WHERE rowid IN (
    SELECT rowid FROM idempotency_cache WHERE inserted_at < $1 LIMIT $2)";

impl Admin {
    /// Connects to `target`: a SQLite file that exists, or a `postgres://` URL. What counts
    /// as expired is the TTL the stores recorded when they opened the database (see
    /// [`ttl_seconds`](Self::ttl_seconds)); `config`'s only where none did.
    pub async fn open(target: &str, config: &IdempotencyConfig) -> Result<Self, StoreError> {
        let (db, recorded) =
            if target.starts_with("postgres://") || target.starts_with("postgresql://") {
                connect_postgres(target).await?
            } else {
                let conn = open_sqlite(Path::new(target))?;
                let recorded = recorded_ttl_sqlite(&conn)?;
                let conn = Arc::new(Mutex::new(conn));
                (Db::Sqlite(conn, PathBuf::from(target)), recorded)
            };
        Ok(Self {
            db,
            ttl_seconds: recorded.unwrap_or(config.ttl_seconds),
            ttl_recorded: recorded.is_some(),
            clock: Arc::new(SystemClock),
            purge_wait: PURGE_CONFIRMED_WITHIN,
        })
    }

    /// The TTL, in seconds, by which this tool counts entries expired, and whether it is the
    /// one the database's stores recorded (`false`: no store recorded one, and it is the
    /// configuration's). Entries expire by the serving stores' TTL, not by the shell's.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use idem_runtime::{admin::Admin, store::SqliteStore, IdempotencyConfig};
    /// let dir = tempfile::tempdir().unwrap();
    /// let path = dir.path().join("a2a.db");
    /// let serving = IdempotencyConfig::default().with(|c| c.ttl_seconds = 3600);
    /// let _store = SqliteStore::open(&path, &serving).unwrap();
    /// let shell = IdempotencyConfig::default().with(|c| c.ttl_seconds = 5);
    /// let admin = Admin::open(path.to_str().unwrap(), &shell).await.unwrap();
    /// assert_eq!(admin.ttl_seconds(), (3600, true));
    /// # }
    /// ```
    pub fn ttl_seconds(&self) -> (u64, bool) {
        (self.ttl_seconds, self.ttl_recorded)
    }

    /// A shorter wait for a purge's confirmation, for the tests of its refusal.
    // Only the store suite, which runs on both backends, calls it.
    #[cfg(all(test, feature = "postgres"))]
    pub(crate) fn set_purge_wait(&mut self, wait: Duration) {
        self.purge_wait = wait;
    }

    /// The stores' test clock, for the tests of what expiry shows.
    // Only the PostgreSQL suite calls it.
    #[cfg(all(test, feature = "postgres"))]
    pub(crate) fn set_clock(&mut self, clock: Arc<dyn Clock>) {
        self.clock = clock;
    }

    /// The database's figures.
    pub async fn stats(&self) -> Result<StoreStats, StoreError> {
        let (now, ttl) = (self.clock.now_seconds(), self.ttl_seconds);
        match &self.db {
            Db::Sqlite(conn, _) => {
                let read = move |c: &Connection| Ok(StoreStats::read_sqlite(c, now, ttl)?);
                sqlite(conn, move |c| at_one_moment(c, read)).await
            }
            #[cfg(feature = "postgres")]
            Db::Postgres(client) => {
                let mut client = client.lock().await;
                let snapshot = at_one_moment_postgres(&mut client).await?;
                let stats = StoreStats::read_postgres(&snapshot, now, ttl).await?;
                snapshot.commit().await?;
                Ok(stats)
            }
        }
    }

    /// What holds `key`, if anything.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::sync::Arc;
    /// use idem_runtime::admin::{Admin, EntryState};
    /// use idem_runtime::hash::request_hash;
    /// use idem_runtime::message_id::MessageId;
    /// use idem_runtime::store::{Entry, Lease, SqliteStore, Store, StoredResponse};
    /// use idem_runtime::IdempotencyConfig;
    /// let dir = tempfile::tempdir().unwrap();
    /// let path = dir.path().join("a2a.db");
    /// let config = IdempotencyConfig::default();
    /// let store = SqliteStore::open(&path, &config).unwrap();
    /// let key = MessageId::parse_str("0190b5a4-7c3e-7d2a-9f11-2b3c4d5e6f70").unwrap();
    /// let entry = Entry {
    ///     message_id: key.clone(),
    ///     method: "message/send".into(),
    ///     request_hash: request_hash(b"{}").unwrap(),
    ///     response: StoredResponse { status: 200, headers: vec![], body: b"{}".to_vec() },
    ///     inserted_at: store.now_seconds(),
    /// };
    /// store.put(Arc::new(entry), vec![], &Lease::exclusive()).await.unwrap();
    ///
    /// let admin = Admin::open(path.to_str().unwrap(), &config).await.unwrap();
    /// let info = admin.show(&key).await.unwrap().expect("stored");
    /// assert_eq!((info.method.as_str(), info.state), ("message/send", EntryState::Live(200)));
    /// store.close(); // no process serves the file now: the purge waits for no confirmation
    /// assert!(admin.purge(&key).await.unwrap());
    /// assert!(admin.show(&key).await.unwrap().is_none());
    /// assert_eq!(admin.purge_expired().await.unwrap(), 0);
    /// # }
    /// ```
    pub async fn show(&self, key: &MessageId) -> Result<Option<EntryInfo>, StoreError> {
        let now = self.clock.now_seconds();
        let ttl = self.ttl_seconds;
        let key = key.as_str().to_owned();
        let read = key.clone();
        let (entry, stream) = match &self.db {
            Db::Sqlite(conn, _) => {
                sqlite(conn, move |c| at_one_moment(c, |c| read_sqlite(c, &read))).await?
            }
            #[cfg(feature = "postgres")]
            Db::Postgres(client) => {
                let mut client = client.lock().await;
                let snapshot = at_one_moment_postgres(&mut client).await?;
                let shown = read_postgres(&snapshot, &read).await?;
                snapshot.commit().await?;
                shown
            }
        };
        // An expired row not swept yet says less than what holds the key again: its open
        // stream, or its call running on a replica (it was shown as expired, and purged while
        // the key was held: helper-94).
        let stored = entry.map(|row| row.info(ttl, now));
        if stored
            .as_ref()
            .is_some_and(|info| !matches!(info.state, EntryState::Expired(_)))
        {
            return Ok(stored);
        }
        Ok(match stream {
            Some((stream, events)) => Some(stream.info(events)),
            None => self.running(&key).await?.or(stored),
        })
    }

    /// The call that holds `key` on a replica, if one does.
    #[cfg(not(feature = "postgres"))]
    async fn running(&self, _key: &str) -> Result<Option<EntryInfo>, StoreError> {
        Ok(None)
    }

    /// The call that holds `key` on a replica, if one does.
    #[cfg(feature = "postgres")]
    async fn running(&self, key: &str) -> Result<Option<EntryInfo>, StoreError> {
        let Db::Postgres(client) = &self.db else {
            return Ok(None);
        };
        let claim = client.lock().await.query_opt(LIVE_CLAIM, &[&key]).await?;
        let Some(row) = claim else { return Ok(None) };
        Ok(Some(EntryInfo {
            method: column(&row, 0, &key)?,
            request_hash: column(&row, 1, &key)?,
            state: EntryState::Running,
            inserted_at: column::<i64>(&row, 2, &key)?.max(0) as u64,
            expires_at: None,
            bytes: 0,
            body: Vec::new(),
        }))
    }

    /// Deletes `key`'s entry, so that the key executes again; `false` if it had none. An open
    /// stream is not touched (its server, or the next retry, closes it). On SQLite it returns
    /// once no process serves the file, or the one that does has confirmed that it forgot the
    /// entries it holds in memory; [`StoreError::PurgeUnconfirmed`] if it did not within 10 s
    /// (the row is deleted all the same).
    pub async fn purge(&self, key: &MessageId) -> Result<bool, StoreError> {
        let key = key.as_str().to_owned();
        let deleted = match &self.db {
            Db::Sqlite(conn, path) => {
                let purged = sqlite(conn, move |c| purge_sqlite(c, &key)).await?;
                if let Some(generation) = purged {
                    self.confirmed(conn, path, generation).await?;
                }
                u64::from(purged.is_some())
            }
            #[cfg(feature = "postgres")]
            Db::Postgres(client) => client.lock().await.execute(PURGE, &[&key]).await?,
        };
        Ok(deleted > 0)
    }

    /// Deletes every expired entry (what the servers' sweep would); returns how many. On a
    /// served SQLite file it returns, as [`purge`](Self::purge) does, once the serving
    /// process has forgotten what it held in memory.
    pub async fn purge_expired(&self) -> Result<u64, StoreError> {
        let (now, ttl) = (self.clock.now_seconds(), self.ttl_seconds);
        let at = ReadAt { now, ttl };
        match &self.db {
            Db::Sqlite(conn, path) => {
                let (mut total, mut last_generation) = (0, None);
                loop {
                    let chunk = move |c: &Connection| purge_expired_sqlite(c, at.before_param());
                    let (deleted, generation) = sqlite(conn, chunk).await?;
                    last_generation = generation.or(last_generation);
                    total += deleted;
                    if deleted < PURGE_CHUNK as u64 {
                        break;
                    }
                }
                if let Some(generation) = last_generation {
                    self.confirmed(conn, path, generation).await?;
                }
                Ok(total)
            }
            #[cfg(feature = "postgres")]
            Db::Postgres(client) => {
                let client = client.lock().await;
                crate::store::postgres::delete_expired(&client, at, PURGE_CHUNK).await
            }
        }
    }

    /// Waits until the process serving `path`, if any, has forgotten what it held in memory
    /// when the purge of `generation` committed.
    async fn confirmed(
        &self,
        conn: &Arc<Mutex<Connection>>,
        path: &Path,
        generation: i64,
    ) -> Result<(), StoreError> {
        let started = Instant::now();
        loop {
            if sqlite(conn, move |c| Ok(purge_watch::forgotten(c, generation)?)).await? {
                return Ok(());
            }
            // A server that starts later holds nothing in memory yet.
            let Some(pid) = file_lock::holder(path)? else {
                return Ok(());
            };
            if started.elapsed() >= self.purge_wait {
                return Err(StoreError::PurgeUnconfirmed {
                    path: path.to_path_buf(),
                    pid,
                    waited: self.purge_wait,
                });
            }
            tokio::time::sleep(CONFIRMATION_POLL).await;
        }
    }
}

/// An entry's row, as [`ENTRY`] reads it.
struct EntryRow {
    method: String,
    request_hash: String,
    status: i64,
    inserted_at: i64,
    bytes: i64,
    body: Vec<u8>,
    expires_at: Option<i64>,
}

impl EntryRow {
    fn info(self, ttl: u64, now: u64) -> EntryInfo {
        let inserted_at = self.inserted_at.max(0) as u64;
        let status = self.status.clamp(0, u16::MAX.into()) as u16;
        let at = ReadAt { now, ttl };
        let state = if at.expired(self.expires_at, inserted_at) {
            EntryState::Expired(status)
        } else {
            EntryState::Live(status)
        };
        EntryInfo {
            method: self.method,
            request_hash: self.request_hash,
            state,
            inserted_at,
            expires_at: Some(at.expiry(self.expires_at, inserted_at)),
            bytes: self.bytes.max(0) as u64,
            body: self.body,
        }
    }
}

/// An open stream's row, as [`OPEN_STREAM`] reads it.
struct StreamRow {
    method: String,
    request_hash: String,
    started_at: i64,
}

impl StreamRow {
    fn info(self, events: Vec<Vec<u8>>) -> EntryInfo {
        let body = events.concat();
        EntryInfo {
            method: self.method,
            request_hash: self.request_hash,
            state: EntryState::OpenStream(events.len() as u64),
            // When it last recorded an event (its start, before the second): what its
            // expiry counts from (`OpenStream::recorded_at`).
            inserted_at: self.started_at.max(0) as u64,
            expires_at: None,
            bytes: body.len() as u64,
            body,
        }
    }
}

type Shown = (Option<EntryRow>, Option<(StreamRow, Vec<Vec<u8>>)>);

/// Opens an existing SQLite file (never creates one: a mistyped path is an error), waiting
/// for the servers' write lock as they wait for each other.
/// The served file, by the one name its server's lock sits beside: a purge waits for that
/// server's confirmation, which it finds by the lock.
fn open_sqlite(path: &Path) -> Result<Connection, StoreError> {
    let refused = |reason: &str| StoreError::not_servable(path, reason);
    connection::a_file_path(path)?;
    file_lock::refuse_hard_links(path)?;
    if file_lock::served_unseen(path)? {
        return Err(refused(
            "a process serves this file, but no lock file beside this name says so: the file \
             was renamed while served, or its lock file deleted, and this tool could neither \
             read that process's log nor wait for it to forget a purged key: give the name it \
             serves, or stop it first",
        ));
    }
    // A purge writes the log as a server does.
    file_size_limit::ignore_the_signal();
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags)?;
    conn.busy_timeout(connection::BUSY_TIMEOUT)?;
    let table = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1";
    let has = |name: &str| conn.prepare(table)?.exists([name]);
    if !has("idempotency_cache")? {
        return Err(refused(
            "holds no idempotency cache (no table idempotency_cache): give the file a server \
             serves (a server creates the table when it first opens the file)",
        ));
    }
    if !has("idempotency_open_streams")? {
        return Err(refused(
            "holds the tables of an earlier version (no idempotency_open_streams): start a \
             server of this version on the file first, which adds them, or use the admin \
             tool of that version",
        ));
    }
    Ok(conn)
}

/// `read`'s queries, in one read transaction: what they print agrees (the totals and the top
/// methods; a stream's record and its events), however the servers write meanwhile.
fn at_one_moment<T>(
    conn: &Connection,
    read: impl FnOnce(&Connection) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    let snapshot = conn.unchecked_transaction()?;
    let value = read(&snapshot)?;
    snapshot.finish()?;
    Ok(value)
}

/// [`at_one_moment`] on PostgreSQL: a read-only transaction of one snapshot (repeatable
/// read), rolled back if dropped before its commit.
#[cfg(feature = "postgres")]
async fn at_one_moment_postgres(
    client: &mut tokio_postgres::Client,
) -> Result<tokio_postgres::Transaction<'_>, StoreError> {
    let snapshot = client
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .read_only(true);
    Ok(snapshot.start().await?)
}

/// Runs `job` on the SQLite connection, off the async workers.
async fn sqlite<T: Send + 'static>(
    conn: &Arc<Mutex<Connection>>,
    job: impl FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    let conn = conn.clone();
    tokio::task::spawn_blocking(move || job(&conn.lock().expect("admin connection lock")))
        .await
        .map_err(|e| StoreError::Commit(e.to_string()))?
}

/// The key's row deleted, and the purge recorded for the serving process, in one
/// transaction; the purge's generation, or `None` if the key had no row.
fn purge_sqlite(conn: &Connection, key: &str) -> Result<Option<i64>, StoreError> {
    let tx = conn.unchecked_transaction()?;
    let deleted = tx.execute(&sqlite_by_key(PURGE), [key])? > 0;
    let generation = if deleted {
        Some(purge_watch::bump(&tx)?)
    } else {
        None
    };
    tx.commit()?;
    Ok(generation)
}

/// One chunk of expired rows deleted, and the purge recorded for the serving process where
/// it deleted any, in one transaction: how many, and the purge's generation.
fn purge_expired_sqlite(conn: &Connection, before: i64) -> Result<(u64, Option<i64>), StoreError> {
    let tx = conn.unchecked_transaction()?;
    let named = rusqlite::named_params! {"$1": before, "$2": PURGE_CHUNK};
    let deleted = tx.execute(SQLITE_PURGE_EXPIRED, named)? as u64;
    let generation = match deleted {
        0 => None,
        _ => Some(purge_watch::bump(&tx)?),
    };
    tx.commit()?;
    Ok((deleted, generation))
}

/// The TTL the file's stores recorded, if one did (a file of an earlier version has no table).
fn recorded_ttl_sqlite(conn: &Connection) -> Result<Option<u64>, StoreError> {
    let table =
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'idempotency_settings'";
    if !conn.prepare(table)?.exists([])? {
        return Ok(None);
    }
    let ttl = conn
        .query_row(settings::RECORDED_TTL, [], |row| row.get::<_, i64>(0))
        .optional()?;
    Ok(ttl.map(|seconds| seconds.max(0) as u64))
}

fn read_sqlite(conn: &Connection, key: &str) -> Result<Shown, StoreError> {
    let entry = conn
        .query_row(&sqlite_by_key(ENTRY), [key], |row| {
            Ok(EntryRow {
                method: row.get(0)?,
                request_hash: row.get(1)?,
                status: row.get(2)?,
                inserted_at: row.get(3)?,
                bytes: row.get(4)?,
                body: row.get(5)?,
                expires_at: row.get(6)?,
            })
        })
        .optional()?;
    let stream = conn
        .query_row(OPEN_STREAM, [key], |row| {
            Ok(StreamRow {
                method: row.get(0)?,
                request_hash: row.get(1)?,
                started_at: row.get(2)?,
            })
        })
        .optional()?;
    let stream = match stream {
        None => None,
        Some(stream) => {
            let mut events = conn.prepare(STREAM_EVENTS)?;
            let events = events
                .query_map([key], |row| row.get(0))?
                .collect::<rusqlite::Result<_>>()?;
            Some((stream, events))
        }
    };
    Ok((entry, stream))
}

#[cfg(feature = "postgres")]
/// The connection, and the TTL the database's replicas recorded, if one did.
async fn connect_postgres(url: &str) -> Result<(Db, Option<u64>), StoreError> {
    let mut config: tokio_postgres::Config = url.parse()?;
    // A host that drops packets, or a server that accepts and never answers (a stopped
    // process), would hold the tool for minutes or for ever: the URL's `connect_timeout`, or
    // 10 s, bounds the connection and its start-up.
    let bound = config.get_connect_timeout().copied();
    let bound = bound.unwrap_or(Duration::from_secs(10));
    config.connect_timeout(bound);
    // Each host of a URL that names several is tried in turn, each for the bound.
    let hosts = config.get_hosts().len().max(1) as u32;
    let connect = config.connect(tokio_postgres::NoTls);
    let Ok(connected) = tokio::time::timeout(bound * hosts, connect).await else {
        return Err(StoreError::Backend {
            backend: "postgres",
            cause: format!(
                "the database did not answer within {} s",
                bound.as_secs_f32()
            )
            .into(),
        });
    };
    let (client, connection) = connected?;
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            tracing::warn!(%error, "idem-admin: the PostgreSQL connection ended");
        }
    });
    // A lock another session holds on a table (a long transaction, or an `ALTER TABLE`
    // queued behind one) held the tool for as long, for ever at worst (helper-114): its
    // waits for locks have the same bound, unless the URL's options set one.
    if !config.get_options().unwrap_or("").contains("lock_timeout") {
        let bounded = format!("SET lock_timeout = {}", bound.as_millis());
        client.batch_execute(&bounded).await?;
    }
    if client.query_one(EARLIER_VERSION, &[]).await?.get(0) {
        return Err(StoreError::Backend {
            backend: "postgres",
            cause: "the entries' table is an earlier version's (no expires_at column): start a \
                    server of this version on the database first, which adds it, or use the \
                    admin tool of that version"
                .into(),
        });
    }
    let table = "SELECT to_regclass('idempotency_settings') IS NOT NULL";
    let has_table: bool = client.query_one(table, &[]).await?.get(0);
    let recorded = match has_table {
        true => client.query_opt(settings::RECORDED_TTL, &[]).await?,
        false => None,
    };
    let ttl = recorded.map(|row| row.get::<_, i64>(0).max(0) as u64);
    Ok((Db::Postgres(tokio::sync::Mutex::new(client)), ttl))
}

#[cfg(not(feature = "postgres"))]
async fn connect_postgres(_url: &str) -> Result<(Db, Option<u64>), StoreError> {
    Err(StoreError::Backend {
        backend: "postgres",
        cause: "built without the postgres feature".into(),
    })
}

/// Whether the entries' table lacks `expires_at`, which every expiry here reads: an earlier
/// version made it, and no server of this one opened it since.
#[cfg(feature = "postgres")]
const EARLIER_VERSION: &str = "
SELECT to_regclass('idempotency_cache') IS NOT NULL AND NOT EXISTS (
    SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass('idempotency_cache')
    AND attname = 'expires_at' AND NOT attisdropped)";

#[cfg(feature = "postgres")]
async fn read_postgres(
    client: &impl tokio_postgres::GenericClient,
    key: &str,
) -> Result<Shown, StoreError> {
    let entry = match client.query_opt(POSTGRES_ENTRY, &[&key]).await? {
        None => None,
        Some(row) => Some(EntryRow {
            method: column(&row, 0, &key)?,
            request_hash: column(&row, 1, &key)?,
            status: i64::from(column::<i32>(&row, 2, &key)?),
            inserted_at: column(&row, 3, &key)?,
            bytes: column(&row, 4, &key)?,
            body: column(&row, 5, &key)?,
            expires_at: column(&row, 6, &key)?,
        }),
    };
    let stream = match client.query_opt(OPEN_STREAM, &[&key]).await? {
        None => None,
        Some(row) => {
            let stream = StreamRow {
                method: column(&row, 0, &key)?,
                request_hash: column(&row, 1, &key)?,
                started_at: column(&row, 2, &key)?,
            };
            let events = client.query(STREAM_EVENTS, &[&key]).await?;
            let events = events.iter().map(|row| column(row, 0, &key));
            Some((stream, events.collect::<Result<_, _>>()?))
        }
    };
    Ok((entry, stream))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A purge holds the served file's write lock: it must not read every row to find some.
    #[test]
    fn sqlite_finds_rows_without_reading_the_table() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a2a.db");
        let _store = crate::store::SqliteStore::open(&path, &IdempotencyConfig::default()).unwrap();
        let conn = open_sqlite(&path).unwrap();
        let plan = |sql: &str, params: &[&dyn rusqlite::ToSql]| {
            let mut explain = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
            let rows = explain
                .query_map(params, |row| row.get::<_, String>(3))
                .unwrap();
            rows.collect::<Result<Vec<_>, _>>().unwrap().join("; ")
        };
        for sql in [ENTRY, PURGE] {
            let plan = plan(&sqlite_by_key(sql), &[&"k"]);
            assert!(
                plan.contains("COVERING INDEX idx_idempotency_last_used_at"),
                "{plan}"
            );
        }
        let plan = plan(SQLITE_PURGE_EXPIRED, &[&0, &0]);
        assert!(plan.contains("INDEX idx_idempotency_inserted_at"), "{plan}");
    }
}
