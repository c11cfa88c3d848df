//! How the file is opened: created readable by its owner only, its schema, and the settings
//! every connection to it runs with (the log, full syncs).

use std::path::Path;

use rusqlite::config::DbConfig;
use rusqlite::{ffi, Connection};

use crate::store::StoreError;

/// The table and index of spec §4.4, plus the columns the design needs; `message_id` is
/// unique without an index of its own.
pub(super) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS idempotency_cache (
    -- The rowid, named: VACUUM keeps it, so the rowids the key index holds stay true.
    entry_id         INTEGER PRIMARY KEY,
    -- One row per key, as the spec's PRIMARY KEY makes it; the writer keeps it so, and the
    -- key index finds a key's row in memory (key_index.rs says why not through this column).
    message_id       TEXT NOT NULL,
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
-- The LRU order, with the key: the key index loads from it at open, not from the rows. A new
-- row's cells go at its end (one batch shares one last_used_at), never on a random page.
CREATE INDEX IF NOT EXISTS idx_idempotency_last_used_at
    ON idempotency_cache(last_used_at, message_id);
-- Streams being recorded: their side effects are committed, their response is not finished.
-- A row left here by a process that died is closed as interrupted by the next claim.
CREATE TABLE IF NOT EXISTS idempotency_open_streams (
    message_id   TEXT NOT NULL PRIMARY KEY,
    method       TEXT NOT NULL,
    request_hash TEXT NOT NULL,
    jsonrpc_id   TEXT NOT NULL,
    -- When it started, then when its last event was recorded: left open, it expires a TTL
    -- after that.
    started_at   INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS idempotency_stream_events (
    message_id TEXT NOT NULL,
    seq        INTEGER NOT NULL,
    event      BLOB NOT NULL,
    PRIMARY KEY (message_id, seq)
) WITHOUT ROWID;
";

/// Creates the store's tables in `path` in one transaction, before any connection switches
/// the file to WAL: a file whose tables of these names are another schema's is refused as it
/// was, with SQLite's reason alone. Run as it came, the schema added the tables it could,
/// switched the file to WAL and printed its own 40 lines of SQL (helper-63).
pub(super) fn create_tables(path: &Path) -> Result<(), StoreError> {
    let mut conn = Connection::open(path)?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let created = tx
        .execute_batch(SCHEMA)
        .and_then(|()| tx.execute_batch(crate::store::settings::TABLE));
    if let Err(error) = created {
        let reason = match &error {
            rusqlite::Error::SqlInputError { msg, .. } => msg.clone(),
            other => other.to_string(),
        };
        return Err(StoreError::not_servable(
            path,
            format!(
                "its tables named idempotency_* are not this store's ({reason}): serve another \
                 file, or move those tables out of this one"
            ),
        ));
    }
    Ok(tx.commit()?)
}

/// How long a connection waits for another's lock on the file (an operator's purge, another
/// connection of the application's, a server's writer for the admin tool).
pub(crate) const BUSY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

pub(crate) fn connect(path: &Path) -> Result<Connection, StoreError> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    // The writer's statements (transaction control, entries, streams, sweep) all stay prepared.
    conn.set_prepared_statement_cache_capacity(64);
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    // The connection that starts the log over truncates it to this (see the checkpointer).
    conn.pragma_update(None, "journal_size_limit", 64 * 1024 * 1024)?;
    // Each write in a batch runs under a savepoint, whose undo copies of pages go to a
    // sub-journal: in memory, not in a temporary file (they never need to survive a crash).
    conn.pragma_update(None, "temp_store", "MEMORY")?;
    // The last connection to close would checkpoint and delete the log, by the index it
    // mapped: one deleted and replaced meanwhile (another process writing the log under the
    // new one) lost that process's writes (helper-75). The checkpointer's last checkpoint
    // copies the log back at closing instead, where the files are still the ones opened.
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true)?;
    Ok(conn)
}

/// Refuses what SQLite would open as another database than the file at `path`: a `file:` URI
/// (SQLite opens the file it names, while the lock and the private file are made at the
/// literal name: two processes served one file, each running the other's retries again:
/// helper-121), and `:memory:` or no name at all (a database of each connection's own,
/// kept nowhere).
pub(crate) fn a_file_path(path: &Path) -> Result<(), StoreError> {
    let refused = |reason: &str| StoreError::not_servable(path, reason);
    let name = path.to_string_lossy();
    if name.starts_with("file:") {
        return Err(refused(
            "a URI: give the database file's path, beside which its server keeps its lock \
             (`./file:...` for a file of that name)",
        ));
    }
    if name.is_empty() || name == ":memory:" {
        return Err(refused(
            "not a file: the cache must outlive the process; give a file's path \
             (`./:memory:` for a file of that name)",
        ));
    }
    Ok(())
}

/// Spec §7.6: the cache holds response bytes, so a new file is readable by its owner only.
/// SQLite gives the -wal and -shm files the permissions of the database file.
pub(super) fn create_private_file(path: &Path) -> std::io::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    match options.open(path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => match std::fs::metadata(path) {
            // A symlink to no file: `create_new` does not follow it, and the open failed
            // later with "No such file or directory" alone (found by helper-89).
            Err(missing) if missing.kind() == std::io::ErrorKind::NotFound => {
                let reason = "a symlink to a file that does not exist: create that file, or \
                              give its own path";
                Err(naming(path, std::io::Error::new(missing.kind(), reason)))
            }
            _ => Ok(()),
        },
        Err(e) => Err(naming(path, e)),
    }
}

/// `error`, naming the file it is about: "No such file or directory" or "Permission denied"
/// alone does not say which of the database, its log or its lock file.
pub(super) fn naming(path: &Path, error: std::io::Error) -> std::io::Error {
    std::io::Error::new(error.kind(), format!("{}: {error}", path.display()))
}

/// Undoes what an application's code may have changed on one of the store's connections
/// through its API rather than in SQL (which the writer's authorizer refuses): a statement
/// left running ([`statements_reset`]), the busy timeout (`busy_timeout(0)` in a write failed
/// every batch that met another connection's lock, an operator's purge: helper-93). Run by
/// the writer before each batch, and by a reader after each read.
pub(super) fn restored(conn: &Connection) {
    statements_reset(conn);
    if let Err(error) = conn.busy_timeout(BUSY_TIMEOUT) {
        tracing::error!(%error, "a store connection's busy timeout could not be set again");
    }
}

/// Resets what an application's code left running on one of the store's connections: a
/// statement stepped and never reset (its `Rows` forgotten) holds a read snapshot although
/// the connection reports autocommit, so every later lookup there missed newer entries and
/// stored keys ran again (helper-93), the writer could begin no batch, and no checkpoint
/// could copy the log back past it. Every statement of the connection's that still runs is
/// rewound, cached or not (one leaked outside the cache was out of reach: helper-96).
fn statements_reset(conn: &Connection) {
    if !conn.is_busy() {
        return;
    }
    tracing::warn!("an application's code left a statement running on a store connection: reset");
    // SAFETY: `handle` is this connection's, used on the one thread that runs it, between two
    // jobs: nothing else runs a statement of it meanwhile. `sqlite3_next_stmt` walks the
    // connection's own statements, each still prepared (a finalized one leaves the list), and
    // `sqlite3_reset` only rewinds one: a statement the application still holds stays valid,
    // and its next use starts it over, as rusqlite does before each use.
    unsafe {
        let db = conn.handle();
        let mut statement = ffi::sqlite3_next_stmt(db, std::ptr::null_mut());
        while !statement.is_null() {
            if ffi::sqlite3_stmt_busy(statement) != 0 {
                ffi::sqlite3_reset(statement);
            }
            statement = ffi::sqlite3_next_stmt(db, statement);
        }
    }
}
