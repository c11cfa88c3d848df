//! Statements through the connection's prepared-statement cache, and the rows they read:
//! entries and open streams.

use bytes::Bytes;
use deadpool_postgres::GenericClient;
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

use crate::message_id::MessageId;
use crate::store::{Entry, EntryRow, OpenStream, OpenStreamRow, ReadAt, StoreError};

pub(super) async fn query_opt(
    client: &impl GenericClient,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Option<Row>, StoreError> {
    let statement = client.prepare_cached(sql).await?;
    Ok(client.query_opt(&statement, params).await?)
}

pub(super) async fn query_one(
    client: &impl GenericClient,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Row, StoreError> {
    let statement = client.prepare_cached(sql).await?;
    Ok(client.query_one(&statement, params).await?)
}

pub(super) async fn execute(
    client: &impl GenericClient,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<u64, StoreError> {
    let statement = client.prepare_cached(sql).await?;
    Ok(client.execute(&statement, params).await?)
}

/// When a row stored at `inserted_at` by a replica of `ttl_seconds` expires: its
/// `expires_at`, which every replica honours, whatever its own TTL (see `replica_settings.rs`).
pub(super) fn expires_at(inserted_at: u64, ttl_seconds: u64) -> i64 {
    i64::try_from(inserted_at.saturating_add(ttl_seconds)).unwrap_or(i64::MAX)
}

/// The TTL a row stored at `inserted_at` with `expires_at` was stored with; none where its
/// `expires_at` does not count (see [`ReadAt::expired`]).
pub(super) fn stored_ttl(inserted_at: i64, expires_at: Option<i64>) -> Option<u64> {
    let ttl = expires_at?.checked_sub(inserted_at.max(0))?;
    u64::try_from(ttl).ok()
}

/// The columns of an entry, as `select_entry` and `select_after_claim` read them.
const ENTRY_COLUMNS: &str = "e.request_hash, e.response_status, e.response_headers, \
     e.response_body, e.inserted_at, e.method, e.expires_at";

/// `id`'s entry, if it is live at `at`.
pub(super) async fn select_entry(
    client: &impl GenericClient,
    id: &MessageId,
    at: ReadAt,
) -> Result<Option<Entry>, StoreError> {
    let sql = format!("SELECT {ENTRY_COLUMNS} FROM idempotency_cache e WHERE message_id = $1");
    let row = query_opt(client, &sql, &[&id.as_str()]).await?;
    row.map(|row| entry_of(&row, id, at))
        .transpose()
        .map(Option::flatten)
}

/// What a claim just won finds, in one round trip: the entry, if any is live at `at`, and
/// whether a stream of the key is open.
pub(super) async fn select_after_claim(
    client: &impl GenericClient,
    id: &MessageId,
    at: ReadAt,
) -> Result<(Option<Entry>, bool), StoreError> {
    let sql = format!(
        "SELECT {ENTRY_COLUMNS},
           EXISTS (SELECT 1 FROM idempotency_open_streams WHERE message_id = $1)
         FROM (SELECT 1) AS one LEFT JOIN idempotency_cache e ON e.message_id = $1"
    );
    let row = query_one(client, &sql, &[&id.as_str()]).await?;
    Ok((entry_of(&row, id, at)?, column(&row, 7, id)?))
}

/// The entry in the first seven columns of `row`, if it is live at `at` (all null: none).
fn entry_of(row: &Row, id: &MessageId, at: ReadAt) -> Result<Option<Entry>, StoreError> {
    let Some(request_hash) = column::<Option<String>>(row, 0, id)? else {
        return Ok(None);
    };
    let inserted_at: i64 = column(row, 4, id)?;
    if at.expired(column(row, 6, id)?, inserted_at.max(0) as u64) {
        return Ok(None);
    }
    let status: i32 = column(row, 1, id)?;
    let row = EntryRow {
        request_hash,
        status: u16::try_from(status).map_err(|_| StoreError::Corrupt {
            message_id: id.to_string(),
            detail: "response_status".into(),
        })?,
        headers: column(row, 2, id)?,
        body: column(row, 3, id)?,
        inserted_at,
        method: column(row, 5, id)?,
    };
    row.decode(id).map(Some)
}

/// Column `at` of the row of `id`, of the type this version reads: a column whose type was
/// changed under it (widened by hand) is a corrupt row, answered as one; it panicked, and the
/// client's connection closed with no answer (helper-114), and so did the admin tool
/// (helper-118).
pub(crate) fn column<'a, T: tokio_postgres::types::FromSql<'a>>(
    row: &'a Row,
    at: usize,
    id: &impl std::fmt::Display,
) -> Result<T, StoreError> {
    row.try_get(at).map_err(|error| StoreError::Corrupt {
        message_id: id.to_string(),
        detail: format!("column {}: {error}", row.columns()[at].name()),
    })
}

/// A live open stream of `id`, without its events: what it is bound to (method, hash).
pub(super) async fn select_open_stream_alone(
    client: &impl GenericClient,
    id: &MessageId,
    at: ReadAt,
) -> Result<Option<OpenStream>, StoreError> {
    let statement = client
        .prepare_cached(
            "SELECT method, request_hash, jsonrpc_id, started_at, expires_at
             FROM idempotency_open_streams WHERE message_id = $1",
        )
        .await?;
    match client.query_opt(&statement, &[&id.as_str()]).await? {
        Some(row) => live_open_stream(&row, id, at),
        None => Ok(None),
    }
}

/// The open stream a row's first five columns hold; none for a record expired at `at`.
fn live_open_stream(
    row: &Row,
    id: &MessageId,
    at: ReadAt,
) -> Result<Option<OpenStream>, StoreError> {
    let stream = OpenStreamRow {
        method: column(row, 0, id)?,
        request_hash: column(row, 1, id)?,
        jsonrpc_id: column(row, 2, id)?,
        recorded_at: column(row, 3, id)?,
    }
    .decode(id)?;
    Ok((!at.expired(column(row, 4, id)?, stream.recorded_at)).then_some(stream))
}

pub(super) async fn delete_events(
    client: &impl GenericClient,
    key: &str,
) -> Result<(), StoreError> {
    execute(
        client,
        "DELETE FROM idempotency_stream_events WHERE message_id = $1",
        &[&key],
    )
    .await?;
    Ok(())
}

/// An open stream and its recorded events, in order; none for a record expired at `at`.
/// One statement, so one snapshot: a sweep of the stream between two reads would leave its
/// record without its events, and the retry would store it as interrupted with none of them.
pub(super) async fn select_open_stream(
    client: &impl GenericClient,
    id: &MessageId,
    at: ReadAt,
) -> Result<Option<(OpenStream, Vec<Bytes>)>, StoreError> {
    let statement = client
        .prepare_cached(
            "SELECT o.method, o.request_hash, o.jsonrpc_id, o.started_at, o.expires_at, e.event
             FROM idempotency_open_streams o
             LEFT JOIN idempotency_stream_events e ON e.message_id = o.message_id
             WHERE o.message_id = $1 ORDER BY e.seq",
        )
        .await?;
    let rows = client.query(&statement, &[&id.as_str()]).await?;
    let Some(stream) = rows.first().map(|row| live_open_stream(row, id, at)) else {
        return Ok(None);
    };
    let Some(stream) = stream? else {
        return Ok(None);
    };
    let events = rows.iter().map(|row| column::<Option<Vec<u8>>>(row, 5, id));
    let events: Vec<Option<Vec<u8>>> = events.collect::<Result<_, _>>()?;
    let events = events.into_iter().flatten().map(Bytes::from).collect();
    Ok(Some((stream, events)))
}
