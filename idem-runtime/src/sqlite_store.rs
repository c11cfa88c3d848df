//! The durable [`Store`] on SQLite: one file, WAL, `synchronous=FULL`, group commit.
//!
//! One writer thread owns the only writing connection and commits every queued write in one
//! transaction, so durability costs one fsync per batch instead of one per request. Reads use
//! their own connections on tokio's blocking pool: WAL lets them run while the writer commits,
//! and no SQLite call ever runs on an async worker thread.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use rusqlite::{params, Connection, OptionalExtension};
use tokio::sync::oneshot;

use crate::canonical_hash::RequestHash;
use crate::clock::{Clock, SystemClock};
use crate::config::IdempotencyConfig;
use crate::message_id::MessageId;
use crate::store::{Entry, Store, StoreError, StoredResponse};

/// The table and index of spec §4.4, plus two columns the design needs.
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS idempotency_cache (
    message_id       TEXT NOT NULL PRIMARY KEY,
    request_hash     TEXT NOT NULL,
    response_status  INTEGER NOT NULL,
    response_headers BLOB NOT NULL,
    response_body    BLOB NOT NULL,
    inserted_at      INTEGER NOT NULL,
    -- The method the key is bound to: the same messageId under another method is a collision.
    method           TEXT NOT NULL DEFAULT '',
    -- Last use in epoch milliseconds: the order in which the max_cache_entries bound evicts.
    last_used_at     INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS idx_idempotency_inserted_at ON idempotency_cache(inserted_at);
CREATE INDEX IF NOT EXISTS idx_idempotency_last_used_at ON idempotency_cache(last_used_at);
";

/// Read connections kept open between reads.
const MAX_IDLE_READERS: usize = 8;
/// Most writes committed in one transaction.
const MAX_BATCH: usize = 512;
/// Most expired rows one sweep step deletes, so a sweep never holds the writer for long.
const SWEEP_CHUNK: u64 = 1000;

/// The SQLite store.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use idem_runtime::{IdempotencyConfig, SqliteStore, Store};
/// let dir = tempfile::tempdir().unwrap();
/// let store = SqliteStore::open(dir.path().join("cache.db"), &IdempotencyConfig::default()).unwrap();
/// assert_eq!(store.row_count().await.unwrap(), 0);
/// # }
/// ```
pub struct SqliteStore {
    shared: Arc<Shared>,
    writer: Mutex<Option<mpsc::Sender<Write>>>,
    writer_thread: Mutex<Option<JoinHandle<()>>>,
}

/// What readers and the writer share.
struct Shared {
    path: PathBuf,
    ttl_seconds: u64,
    clock: Arc<dyn Clock>,
    readers: Mutex<Vec<Connection>>,
    /// LRU uses noted by reads, written with the next transaction: a replay costs no fsync.
    touches: Mutex<HashMap<String, u64>>,
}

enum Write {
    Put(Arc<Entry>, oneshot::Sender<Result<(), StoreError>>),
    Sweep(oneshot::Sender<Result<u64, StoreError>>),
}

impl SqliteStore {
    /// Opens (or creates, with mode 0600) the database at `path`, on the system clock.
    pub fn open(path: impl AsRef<Path>, config: &IdempotencyConfig) -> Result<Self, StoreError> {
        Self::open_with_clock(path, config, Arc::new(SystemClock))
    }

    /// Like [`open`](Self::open), with an injected clock.
    pub fn open_with_clock(
        path: impl AsRef<Path>,
        config: &IdempotencyConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, StoreError> {
        let path = path.as_ref().to_path_buf();
        create_private_file(&path)?;
        let conn = connect(&path)?;
        conn.execute_batch(SCHEMA)?;
        let shared = Arc::new(Shared {
            path,
            ttl_seconds: config.ttl_seconds,
            clock,
            readers: Mutex::new(Vec::new()),
            touches: Mutex::new(HashMap::new()),
        });
        let (tx, rx) = mpsc::channel();
        let writer = Writer {
            rows: count_rows(&conn)?,
            conn,
            shared: shared.clone(),
            max_entries: config.max_cache_entries,
        };
        let thread = std::thread::Builder::new()
            .name("idem-sqlite-writer".into())
            .spawn(move || writer.run(rx))?;
        Ok(Self {
            shared,
            writer: Mutex::new(Some(tx)),
            writer_thread: Mutex::new(Some(thread)),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.shared.path
    }

    /// Commits what is queued and stops the writer. Later calls fail with [`StoreError::Closed`].
    pub fn close(&self) {
        drop(self.writer.lock().expect("writer lock").take());
        if let Some(thread) = self.writer_thread.lock().expect("thread lock").take() {
            let _ = thread.join();
        }
        self.shared.readers.lock().expect("readers lock").clear();
    }

    fn send(&self, write: Write) -> Result<(), StoreError> {
        let writer = self.writer.lock().expect("writer lock");
        writer
            .as_ref()
            .ok_or(StoreError::Closed)?
            .send(write)
            .map_err(|_| StoreError::Closed)
    }

    /// Runs `f` with a read connection on the blocking pool.
    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let shared = self.shared.clone();
        tokio::task::spawn_blocking(move || {
            let pooled = shared.readers.lock().expect("readers lock").pop();
            let conn = match pooled {
                Some(conn) => conn,
                None => connect(&shared.path)?,
            };
            let result = f(&conn);
            let mut idle = shared.readers.lock().expect("readers lock");
            // Bursts may open many; keep a few for reuse, close the rest.
            if idle.len() < MAX_IDLE_READERS {
                idle.push(conn);
            }
            result
        })
        .await
        .map_err(|e| StoreError::Commit(format!("read task failed: {e}")))?
    }
}

impl Drop for SqliteStore {
    fn drop(&mut self) {
        self.close();
    }
}

#[async_trait::async_trait]
impl Store for SqliteStore {
    async fn get(&self, key: &MessageId) -> Result<Option<Entry>, StoreError> {
        let id = key.clone();
        let entry = self.read(move |conn| select_entry(conn, &id)).await?;
        let now = self.shared.clock.now_millis();
        match entry {
            Some(entry) if !is_expired(entry.inserted_at, self.shared.ttl_seconds, now / 1000) => {
                let mut touches = self.shared.touches.lock().expect("touches lock");
                touches.insert(key.as_str().to_owned(), now);
                Ok(Some(entry))
            }
            _ => Ok(None),
        }
    }

    async fn put(&self, entry: Arc<Entry>) -> Result<(), StoreError> {
        let (reply, done) = oneshot::channel();
        self.send(Write::Put(entry, reply))?;
        done.await.map_err(|_| StoreError::Closed)?
    }

    async fn sweep(&self) -> Result<u64, StoreError> {
        let mut total = 0;
        loop {
            let (reply, done) = oneshot::channel();
            self.send(Write::Sweep(reply))?;
            let deleted = done.await.map_err(|_| StoreError::Closed)??;
            total += deleted;
            if deleted < SWEEP_CHUNK {
                return Ok(total);
            }
        }
    }

    async fn row_count(&self) -> Result<u64, StoreError> {
        self.read(|conn| Ok(count_rows(conn)?)).await
    }

    fn now_seconds(&self) -> u64 {
        self.shared.clock.now_seconds()
    }
}

/// Spec §4.4: expired when `inserted_at + ttl_seconds < now`.
fn is_expired(inserted_at: u64, ttl_seconds: u64, now_seconds: u64) -> bool {
    inserted_at.saturating_add(ttl_seconds) < now_seconds
}

/// The writer thread's state.
struct Writer {
    conn: Connection,
    shared: Arc<Shared>,
    max_entries: u64,
    /// Rows in the table, kept up to date so the bound costs no `COUNT(*)` per commit.
    rows: u64,
}

impl Writer {
    fn run(mut self, rx: mpsc::Receiver<Write>) {
        while let Ok(first) = rx.recv() {
            let mut batch = vec![first];
            while batch.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(write) => batch.push(write),
                    Err(_) => break,
                }
            }
            self.commit(batch);
        }
    }

    /// Applies a batch in one transaction, then answers every write in it.
    fn commit(&mut self, batch: Vec<Write>) {
        let touches = std::mem::take(&mut *self.shared.touches.lock().expect("touches lock"));
        let now_ms = self.shared.clock.now_millis();
        let mut swept = Vec::new();
        let mut rows = self.rows;
        let result = (|| -> rusqlite::Result<()> {
            // IMMEDIATE takes the write lock up front, waiting on busy_timeout if the
            // application's own connection holds it. A deferred transaction that reads first
            // would fail at once with SQLITE_BUSY when it upgrades to write.
            let tx = self
                .conn
                .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            apply_touches(&tx, &touches)?;
            for write in &batch {
                match write {
                    Write::Put(entry, _) => rows += insert_entry(&tx, entry, now_ms)?,
                    Write::Sweep(_) => {
                        let n = sweep_chunk(&tx, self.shared.ttl_seconds, now_ms / 1000)?;
                        rows = rows.saturating_sub(n);
                        swept.push(n);
                    }
                }
            }
            rows -= evict_least_recently_used(&tx, rows, self.max_entries)?;
            tx.commit()
        })();
        self.rows = match result {
            Ok(()) => rows,
            Err(_) => count_rows(&self.conn).unwrap_or(self.rows),
        };
        let mut swept = swept.into_iter();
        for write in batch {
            let failed = || StoreError::Commit(format!("{:?}", result.as_ref().err()));
            match write {
                Write::Put(_, reply) => {
                    let _ = reply.send(result.as_ref().map(drop).map_err(|_| failed()));
                }
                Write::Sweep(reply) => {
                    let n = swept.next().unwrap_or(0);
                    let _ = reply.send(result.as_ref().map(|_| n).map_err(|_| failed()));
                }
            }
        }
    }
}

fn apply_touches(
    tx: &rusqlite::Transaction,
    touches: &HashMap<String, u64>,
) -> rusqlite::Result<()> {
    let mut stmt = tx.prepare_cached(
        "UPDATE idempotency_cache SET last_used_at = MAX(last_used_at, ?2) WHERE message_id = ?1",
    )?;
    for (key, at) in touches {
        stmt.execute(params![key, *at as i64])?;
    }
    Ok(())
}

/// Inserts or replaces; returns 1 when the key was new (the row count grew).
fn insert_entry(tx: &rusqlite::Transaction, entry: &Entry, now_ms: u64) -> rusqlite::Result<u64> {
    let existed = tx
        .prepare_cached("SELECT 1 FROM idempotency_cache WHERE message_id = ?1")?
        .exists([entry.message_id.as_str()])?;
    let headers = serde_json::to_vec(&headers_object(&entry.response.headers))
        .expect("a map of strings serializes");
    tx.prepare_cached(
        "INSERT OR REPLACE INTO idempotency_cache
           (message_id, request_hash, response_status, response_headers, response_body,
            inserted_at, method, last_used_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )?
    .execute(params![
        entry.message_id.as_str(),
        entry.request_hash.as_str(),
        entry.response.status,
        headers,
        entry.response.body,
        entry.inserted_at as i64,
        entry.method,
        now_ms as i64,
    ])?;
    Ok(u64::from(!existed))
}

fn sweep_chunk(tx: &rusqlite::Transaction, ttl: u64, now: u64) -> rusqlite::Result<u64> {
    let deleted = tx
        .prepare_cached(
            "DELETE FROM idempotency_cache WHERE rowid IN
               (SELECT rowid FROM idempotency_cache WHERE inserted_at + ?1 < ?2 LIMIT ?3)",
        )?
        .execute(params![ttl as i64, now as i64, SWEEP_CHUNK as i64])?;
    Ok(deleted as u64)
}

/// Keeps at most `max_entries` rows, enforced in the same transaction as the inserts;
/// returns how many rows it evicted.
fn evict_least_recently_used(
    tx: &rusqlite::Transaction,
    rows: u64,
    max_entries: u64,
) -> rusqlite::Result<u64> {
    if rows <= max_entries {
        return Ok(0);
    }
    let evicted = tx
        .prepare_cached(
            "DELETE FROM idempotency_cache WHERE rowid IN
               (SELECT rowid FROM idempotency_cache ORDER BY last_used_at, rowid LIMIT ?1)",
        )?
        .execute(params![(rows - max_entries) as i64])?;
    Ok(evicted as u64)
}

fn count_rows(conn: &Connection) -> rusqlite::Result<u64> {
    conn.prepare_cached("SELECT COUNT(*) FROM idempotency_cache")?
        .query_row([], |row| row.get::<_, i64>(0))
        .map(|n| n as u64)
}

fn select_entry(conn: &Connection, id: &MessageId) -> Result<Option<Entry>, StoreError> {
    let row = conn
        .prepare_cached(
            "SELECT request_hash, response_status, response_headers, response_body, inserted_at, method
             FROM idempotency_cache WHERE message_id = ?1",
        )?
        .query_row([id.as_str()], |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, u16>(1)?,
                row.get::<_, Vec<u8>>(2)?,
                row.get::<_, Vec<u8>>(3)?,
                row.get::<_, i64>(4)?,
                row.get::<_, String>(5)?,
            ))
        })
        .optional()?;
    let Some((hash, status, headers, body, inserted_at, method)) = row else {
        return Ok(None);
    };
    let corrupt = |detail: &str| StoreError::Corrupt {
        message_id: id.to_string(),
        detail: detail.to_owned(),
    };
    let request_hash = RequestHash::from_hex(&hash).ok_or_else(|| corrupt("request_hash"))?;
    let headers: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&headers).map_err(|_| corrupt("response_headers"))?;
    let headers = headers
        .into_iter()
        .map(|(k, v)| {
            Ok((
                k,
                v.as_str()
                    .ok_or_else(|| corrupt("response_headers"))?
                    .to_owned(),
            ))
        })
        .collect::<Result<_, StoreError>>()?;
    Ok(Some(Entry {
        message_id: id.clone(),
        method,
        request_hash,
        response: StoredResponse {
            status,
            headers,
            body,
        },
        inserted_at: inserted_at.max(0) as u64,
    }))
}

fn headers_object(headers: &[(String, String)]) -> serde_json::Map<String, serde_json::Value> {
    headers
        .iter()
        .map(|(k, v)| (k.clone(), v.clone().into()))
        .collect()
}

fn connect(path: &Path) -> Result<Connection, StoreError> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    Ok(conn)
}

/// Spec §7.6: the cache holds response bytes, so a new file is readable by its owner only.
/// SQLite gives the -wal and -shm files the permissions of the database file.
fn create_private_file(path: &Path) -> std::io::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    match options.open(path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}
