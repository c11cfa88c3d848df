//! Statements on a claim's row: the fence a call's writes commit under, the end of a claim,
//! and who holds a key.

use std::time::Duration;

use deadpool_postgres::GenericClient;

use crate::hash::RequestHash;
use crate::message_id::MessageId;
use crate::store::postgres::listener::CHANNEL;
use crate::store::postgres::rows::{execute, query_one, query_opt};
use crate::store::postgres::PostgresStore;
use crate::store::{stored_hash, Lease, Store, StoreError};

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

/// A claim that `acquire` has won but not yet handed to its call. Should the reads after the
/// win fail, or the call's deadline drop them, the claim is released: else it would hold the
/// key from every other replica until its lease ran out, for a call that never runs.
pub(super) struct JustWon<'a> {
    store: &'a PostgresStore,
    key: &'a MessageId,
    lease: Option<Lease>,
}

impl<'a> JustWon<'a> {
    pub(super) fn new(store: &'a PostgresStore, key: &'a MessageId, lease: Lease) -> Self {
        let lease = Some(lease);
        Self { store, key, lease }
    }

    pub(super) fn fence(&self) -> i64 {
        self.lease.as_ref().map_or(0, Lease::fence)
    }

    /// The lease, now the caller's to end.
    pub(super) fn keep(mut self) -> Lease {
        self.lease.take().expect("a lease until kept")
    }
}

impl Drop for JustWon<'_> {
    fn drop(&mut self) {
        if let Some(lease) = self.lease.take() {
            self.store.release(self.key, lease);
        }
    }
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
