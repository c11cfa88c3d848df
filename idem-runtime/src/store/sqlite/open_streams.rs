//! Streams being recorded: their rows and events, and which of them this process records.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use rusqlite::{params, Connection, OptionalExtension};

use crate::fingerprint::ByFingerprint;
use crate::message_id::MessageId;
use crate::store::sqlite::lock;
use crate::store::{OpenStream, OpenStreamRow, StoreError};

/// The keys whose stream this process records (see [`SqliteStore`](super::SqliteStore)'s field).
#[derive(Clone, Default)]
pub(super) struct LiveStreams(Arc<Mutex<HashSet<MessageId, ByFingerprint>>>);

impl LiveStreams {
    pub(super) fn start(&self, key: &MessageId) {
        self.keys().insert(key.clone());
    }

    pub(super) fn stop(&self, key: &MessageId) {
        self.keys().remove(key);
    }

    pub(super) fn holds(&self, key: &MessageId) -> bool {
        self.keys().contains(key)
    }

    fn keys(&self) -> std::sync::MutexGuard<'_, HashSet<MessageId, ByFingerprint>> {
        lock(&self.0)
    }
}

/// Returns whether the row is new. Unless `may_exist`, the key is known to have no row, and
/// is not looked for.
pub(super) fn insert_open_stream(
    conn: &Connection,
    stream: &OpenStream,
    may_exist: bool,
) -> rusqlite::Result<bool> {
    let existed = may_exist
        && conn
            .prepare_cached("SELECT 1 FROM idempotency_open_streams WHERE message_id = ?1")?
            .exists([stream.message_id.as_str()])?;
    conn.prepare_cached(
        "INSERT OR REPLACE INTO idempotency_open_streams
           (message_id, method, request_hash, jsonrpc_id, started_at)
         VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(params![
        stream.message_id.as_str(),
        stream.method,
        stream.request_hash.as_str(),
        stream.jsonrpc_id,
        stream.recorded_at as i64,
    ])?;
    // Events of an earlier recording under this key (one past its TTL) are not this one's.
    conn.prepare_cached("DELETE FROM idempotency_stream_events WHERE message_id = ?1")?
        .execute([stream.message_id.as_str()])?;
    Ok(!existed)
}

pub(super) fn insert_event(
    conn: &Connection,
    key: &MessageId,
    seq: u32,
    event: &[u8],
) -> Result<(), StoreError> {
    conn.prepare_cached(
        "INSERT INTO idempotency_stream_events (message_id, seq, event) VALUES (?1, ?2, ?3)",
    )?
    .execute(params![key.as_str(), seq, event])?;
    Ok(())
}

/// `key`'s stream recorded an event at `now`: its record, if its process dies, expires a TTL
/// from here ([`OpenStream::recorded_at`]).
pub(super) fn touch_open_stream(
    conn: &Connection,
    key: &MessageId,
    now: u64,
) -> Result<(), StoreError> {
    conn.prepare_cached(
        "UPDATE idempotency_open_streams SET started_at = ?2 WHERE message_id = ?1",
    )?
    .execute(params![key.as_str(), now as i64])?;
    Ok(())
}

/// Returns whether there was an open-stream row to delete.
pub(super) fn delete_open_stream(conn: &Connection, key: &str) -> Result<bool, StoreError> {
    conn.prepare_cached("DELETE FROM idempotency_stream_events WHERE message_id = ?1")?
        .execute([key])?;
    let deleted = conn
        .prepare_cached("DELETE FROM idempotency_open_streams WHERE message_id = ?1")?
        .execute([key])?;
    Ok(deleted > 0)
}

/// An open stream and its recorded events, in order; none for a record past its TTL, whose
/// events are not read (see [`OpenStream::expired`]).
pub(super) fn select_open_stream(
    conn: &Connection,
    id: &MessageId,
    ttl: u64,
    now: u64,
) -> Result<Option<(OpenStream, Vec<Bytes>)>, StoreError> {
    let row = conn
        .prepare_cached(
            "SELECT method, request_hash, jsonrpc_id, started_at
             FROM idempotency_open_streams WHERE message_id = ?1",
        )?
        .query_row([id.as_str()], |row| {
            Ok(OpenStreamRow {
                method: row.get(0)?,
                request_hash: row.get(1)?,
                jsonrpc_id: row.get(2)?,
                recorded_at: row.get(3)?,
            })
        })
        .optional()?;
    let Some(row) = row else {
        return Ok(None);
    };
    let stream = row.decode(id)?;
    if stream.expired(ttl, now) {
        return Ok(None);
    }
    let events = conn
        .prepare_cached(
            "SELECT event FROM idempotency_stream_events WHERE message_id = ?1 ORDER BY seq",
        )?
        .query_map([id.as_str()], |row| row.get::<_, Vec<u8>>(0))?
        .map(|event| event.map(Bytes::from))
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(Some((stream, events)))
}
