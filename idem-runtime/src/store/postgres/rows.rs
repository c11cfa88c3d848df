//! Statements through the connection's prepared-statement cache, and the rows they read:
//! entries and open streams.

use bytes::Bytes;
use deadpool_postgres::GenericClient;
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

use crate::message_id::MessageId;
use crate::store::{Entry, EntryRow, OpenStream, OpenStreamRow, StoreError};

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

/// The columns of an entry, as `select_entry` and `select_after_claim` read them.
const ENTRY_COLUMNS: &str =
    "e.request_hash, e.response_status, e.response_headers, e.response_body, e.inserted_at, e.method";

pub(super) async fn select_entry(
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
pub(super) async fn select_after_claim(
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
pub(super) fn entry_of(row: &Row, id: &MessageId) -> Result<Option<Entry>, StoreError> {
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

/// An open stream and its recorded events, in order; none for a record past its TTL, whose
/// events are not read (see [`OpenStream::expired`]).
pub(super) async fn select_open_stream(
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
