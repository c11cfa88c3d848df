//! The rows of `idempotency_cache`, addressed by rowid: the key index (`key_index.rs`) says
//! which rowids may hold a key, and every statement here checks `message_id` as well, so a
//! rowid that another row took since is never taken for the key's.
//!
//! The writer stores a key with a plain `INSERT` when the key index and the batch know of no
//! row of it (or only of rows an operator's purge deleted since), and a stored one by `UPDATE`
//! of its row, in place. A file created by an earlier version still has the spec's `PRIMARY
//! KEY` index on `message_id`; the same statements work on it, and its unique index turns a
//! row the key index missed into an error instead of a second row.

use std::sync::Arc;

use rusqlite::{params, Connection, OptionalExtension};

use crate::message_id::MessageId;
use crate::store::sqlite::batch::{Batch, Change};
use crate::store::sqlite::key_index::KeyIndex;
use crate::store::{Entry, EntryRow, StoreError};

/// Every entry's rowid and key, for the key index at open: a scan of the index on
/// `(last_used_at, message_id)` (or of an earlier version's key index), not of the table.
pub(crate) fn all_keys(conn: &Connection) -> rusqlite::Result<Vec<(i64, String)>> {
    let mut keys = conn.prepare("SELECT rowid, message_id FROM idempotency_cache")?;
    let keys = keys.query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?;
    keys.collect()
}

/// Stores `entry` in the batch: replaces its key's row, or inserts one.
pub(crate) fn store(
    conn: &Connection,
    batch: &mut Batch,
    entry: Arc<Entry>,
) -> Result<(), StoreError> {
    let existing = find(conn, batch, &entry.message_id)?;
    let rowid = write(conn, &entry, batch.now_ms, existing)?;
    let new = existing.is_none();
    batch.rows += u64::from(new);
    batch.stored(entry, rowid, new);
    Ok(())
}

/// The rowid of `key`'s row, if it has one. A fresh key (the common case) reads nothing. A
/// candidate whose row is gone, or holds a key of another fingerprint (an operator's purge
/// deleted it, and SQLite may have given its rowid to a new row), leaves the key index.
fn find(conn: &Connection, batch: &mut Batch, key: &MessageId) -> rusqlite::Result<Option<i64>> {
    if !batch.may_hold(key) {
        return Ok(None);
    }
    let mut found = None;
    for rowid in batch.entry_rows(key) {
        match holder(conn, rowid)? {
            Some(holder) if holder == key.as_str() => found = Some(rowid),
            // Another key of the same fingerprint: its row, not a stale one.
            Some(holder) if batch.same_fingerprint(&holder, key) => {}
            _ => batch.changes.push(Change::Deleted {
                key: key.clone(),
                rowid,
            }),
        }
    }
    Ok(found)
}

/// The key of the row at `rowid`, if there is one.
fn holder(conn: &Connection, rowid: i64) -> rusqlite::Result<Option<String>> {
    conn.prepare_cached("SELECT message_id FROM idempotency_cache WHERE rowid = ?1")?
        .query_row([rowid], |row| row.get(0))
        .optional()
}

/// Writes `entry` over the row at `rowid` (its key's), or as a new row when `None` (SQLite
/// then picks the rowid); returns the row's rowid.
fn write(
    conn: &Connection,
    entry: &Entry,
    now_ms: u64,
    rowid: Option<i64>,
) -> rusqlite::Result<i64> {
    let sql = match rowid {
        Some(_) => {
            "UPDATE idempotency_cache SET request_hash = ?2, response_status = ?3,
               response_headers = ?4, response_body = ?5, inserted_at = ?6, method = ?7,
               last_used_at = ?8
             WHERE rowid = ?9 AND message_id = ?1"
        }
        None => {
            "INSERT INTO idempotency_cache
               (message_id, request_hash, response_status, response_headers, response_body,
                inserted_at, method, last_used_at, rowid)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)"
        }
    };
    conn.prepare_cached(sql)?.execute(params![
        entry.message_id.as_str(),
        entry.request_hash.as_str(),
        entry.response.status,
        entry.response.headers_json(),
        entry.response.body,
        entry.inserted_at as i64,
        entry.method,
        now_ms as i64,
        rowid,
    ])?;
    Ok(rowid.unwrap_or_else(|| conn.last_insert_rowid()))
}

/// `key`'s entry, from the first of `rowids` that holds it.
pub(crate) fn select(
    conn: &Connection,
    key: &MessageId,
    rowids: &[i64],
) -> Result<Option<Entry>, StoreError> {
    let mut statement = conn.prepare_cached(
        "SELECT request_hash, response_status, response_headers, response_body, inserted_at, method
         FROM idempotency_cache WHERE rowid = ?1 AND message_id = ?2",
    )?;
    for rowid in rowids {
        let row = statement
            .query_row(params![rowid, key.as_str()], |row| {
                Ok(EntryRow {
                    request_hash: row.get(0)?,
                    status: row.get(1)?,
                    headers: row.get(2)?,
                    body: row.get(3)?,
                    inserted_at: row.get(4)?,
                    method: row.get(5)?,
                })
            })
            .optional()?;
        if let Some(row) = row {
            return row.decode(key).map(Some);
        }
    }
    Ok(None)
}

/// Notes a use of `key` at `at_ms` (epoch ms) for the LRU bound; nothing if it has no row.
pub(crate) fn touch(
    conn: &Connection,
    index: &KeyIndex,
    key: &str,
    at_ms: u64,
) -> rusqlite::Result<()> {
    let mut statement = conn.prepare_cached(
        "UPDATE idempotency_cache SET last_used_at = MAX(last_used_at, ?3)
         WHERE rowid = ?1 AND message_id = ?2",
    )?;
    for rowid in index.entry_rows(key) {
        statement.execute(params![rowid, key, at_ms as i64])?;
    }
    Ok(())
}

/// Runs a `DELETE ... RETURNING rowid, message_id` of entries; returns what it deleted, as
/// the changes that tell the key index and the memory tier.
pub(crate) fn delete(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
) -> rusqlite::Result<Vec<Change>> {
    let mut delete = conn.prepare_cached(sql)?;
    let rows = delete.query_map(params, |row| {
        Ok(Change::Deleted {
            rowid: row.get(0)?,
            key: MessageId::from_stored(row.get(1)?),
        })
    })?;
    rows.collect()
}

pub(crate) fn count(conn: &Connection) -> rusqlite::Result<u64> {
    conn.prepare_cached("SELECT COUNT(*) FROM idempotency_cache")?
        .query_row([], |row| row.get::<_, i64>(0))
        .map(|n| n as u64)
}
