//! Statements on a claim's row: the fence a call's writes commit under, the end of a claim,
//! and who holds a key.

use std::time::Duration;

use deadpool_postgres::GenericClient;

use crate::hash::RequestHash;
use crate::message_id::MessageId;
use crate::store::postgres::listener::CHANNEL;
use crate::store::postgres::rows::{execute, query_one, query_opt};
use crate::store::{stored_hash, Lease, StoreError};

/// A claim's lease as its row counts it, in milliseconds.
pub(super) fn lease_ms(lease: Duration) -> i64 {
    lease.as_millis().min(i64::MAX as u128) as i64
}

/// Locks the claim row of `key` for the transaction, if it still carries `lease`'s fence:
/// else nothing of the transaction may commit. The lock holds off a takeover until commit.
pub(super) async fn fenced(
    tx: &deadpool_postgres::Transaction<'_>,
    key: &MessageId,
    lease: &Lease,
    owner: &str,
) -> Result<(), StoreError> {
    let row = query_opt(
        tx,
        "SELECT 1 FROM idempotency_claims
         WHERE message_id = $1 AND fence = $2 AND owner = $3 FOR UPDATE",
        &[&key.as_str(), &lease.fence(), &owner],
    )
    .await?;
    row.map(|_| ())
        .ok_or_else(|| StoreError::ClaimLost(key.to_string()))
}

/// Deletes the claim of `fence`, if it is still there, and announces its end.
pub(super) async fn end_claim(
    client: &impl GenericClient,
    key: &str,
    fence: i64,
    owner: &str,
) -> Result<(), StoreError> {
    execute(
        client,
        "DELETE FROM idempotency_claims WHERE message_id = $1 AND fence = $2 AND owner = $3",
        &[&key, &fence, &owner],
    )
    .await?;
    // Delivered when the transaction commits, and only then.
    query_one(client, "SELECT pg_notify($1, $2)", &[&CHANNEL, &key]).await?;
    Ok(())
}

/// The method, request hash and milliseconds left (negative: expired) of `key`'s claim.
pub(super) async fn held(
    client: &impl GenericClient,
    key: &MessageId,
) -> Result<Option<(String, RequestHash, i64)>, StoreError> {
    let row = query_opt(
        client,
        concat!(
            "SELECT method, request_hash, lease_until - ",
            now_ms!(),
            " FROM idempotency_claims WHERE message_id = $1"
        ),
        &[&key.as_str()],
    )
    .await?;
    let Some(row) = row else { return Ok(None) };
    let hash = stored_hash(key, "idempotency_claims.request_hash", row.get(1))?;
    Ok(Some((row.get(0), hash, row.get(2))))
}
