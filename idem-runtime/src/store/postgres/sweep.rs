//! The sweep's statements: expired entries, abandoned streams and stale claims deleted.

use deadpool_postgres::GenericClient;

use crate::store::postgres::rows::execute;
use crate::store::{ReadAt, StoreError};

/// Most expired rows one sweep statement deletes: short transactions, no long-held locks.
pub(super) const SWEEP_CHUNK: i64 = 500;

/// How long a lease may have been expired before the sweep deletes its row.
const STALE_CLAIM_MS: i64 = 60_000;

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
pub(super) async fn delete_abandoned_streams(
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
pub(super) async fn delete_stale_claims(client: &impl GenericClient) -> Result<(), StoreError> {
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
