//! A call's commit whose connection was lost: whether it landed, whether another replica took
//! the key over meanwhile, or the database was out of reach.

use std::sync::OnceLock;
use std::time::Duration;

use deadpool_postgres::GenericClient;

use crate::message_id::MessageId;
use crate::store::postgres::rows::{query_one, query_opt};
use crate::store::postgres::PostgresStore;
use crate::store::{Lease, StoreError};

/// A call's commit, fenced by its key's claim.
pub(super) struct FencedCommit<'a> {
    pub key: &'a MessageId,
    /// The claim's fence.
    pub fence: i64,
    /// The id of the transaction that stores the call's entry, once it has one: its commit
    /// ends the claim too.
    pub storing: &'a OnceLock<i64>,
}

impl<'a> FencedCommit<'a> {
    pub(super) fn new(key: &'a MessageId, lease: &Lease, storing: &'a OnceLock<i64>) -> Self {
        let fence = lease.fence();
        Self {
            key,
            fence,
            storing,
        }
    }
}

impl PostgresStore {
    /// What a call's transaction that failed with `error` answers. One whose connection was
    /// cut off (the server ends the session of a replica frozen mid-commit, see [`pool_of`](super::pool::pool_of))
    /// failed as neither a staged write nor the database did: the claim, read again on another
    /// connection, tells whether another replica took the key over meanwhile
    /// ([`StoreError::ClaimLost`]) or the database was out of reach. Where the connection was
    /// lost after the `COMMIT` of the transaction storing the entry reached the database,
    /// PostgreSQL says it committed, and the call succeeded (found by helper-55: it was told
    /// another replica had taken its key; and by helper-57: an entry of the same bytes is no
    /// proof, a takeover may answer alike).
    pub(super) async fn cut_off(
        &self,
        commit: &FencedCommit<'_>,
        error: StoreError,
    ) -> Result<(), StoreError> {
        match connection_lost(&error) {
            true => self.classify(commit, error).await,
            false => Err(error),
        }
    }

    /// What a call's commit whose answer was lost (`error`) answers: committed, its claim
    /// taken over, or `error`, where the claim is still its own or cannot be read.
    pub(super) async fn classify(
        &self,
        commit: &FencedCommit<'_>,
        error: StoreError,
    ) -> Result<(), StoreError> {
        let Ok(client) = self.client().await else {
            return Err(error);
        };
        // Asked first: a COMMIT still running when its connection dropped (waiting on a
        // synchronous standby, say) holds the claim as ours until it lands (helper-59).
        if let Some(&transaction) = commit.storing.get() {
            match self.outcome_of(&client, transaction).await {
                Some(true) => return Ok(()),
                Some(false) => {} // rolled back: the claim says whether it was taken over
                None => return Err(error),
            }
        }
        let ours = "SELECT 1 FROM idempotency_claims
                    WHERE message_id = $1 AND fence = $2 AND owner = $3";
        let claim = [
            &commit.key.as_str() as _,
            &commit.fence as _,
            &self.owner as _,
        ];
        match query_opt(&client, ours, &claim).await {
            Ok(None) => Err(StoreError::ClaimLost(commit.key.to_string())),
            Ok(Some(_)) | Err(_) => Err(match error {
                StoreError::Write(cause) => StoreError::Backend {
                    backend: "postgres",
                    cause,
                },
                other => other,
            }),
        }
    }

    /// Whether PostgreSQL committed `transaction` (`txid_status`), once it has ended: asked
    /// again while it is in progress, for at most a lease. `None` where it cannot say.
    pub(super) async fn outcome_of(
        &self,
        client: &impl GenericClient,
        transaction: i64,
    ) -> Option<bool> {
        let deadline = tokio::time::Instant::now() + self.lease;
        loop {
            let status = query_one(client, "SELECT txid_status($1)", &[&transaction]).await;
            match status.ok()?.get::<_, Option<String>>(0)?.as_str() {
                "committed" => return Some(true),
                "aborted" => return Some(false),
                _ if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(20)).await
                }
                _ => return None,
            }
        }
    }
}

/// Whether `error` is a connection that closed, or a session the server ended, under a
/// transaction: a staged write's error is the application's, and may be either.
fn connection_lost(error: &StoreError) -> bool {
    let source: &(dyn std::error::Error + 'static) = match error {
        StoreError::Write(source) => source.as_ref(),
        StoreError::Backend { cause, .. } => cause.as_ref(),
        _ => return false,
    };
    let Some(error) = source.downcast_ref::<tokio_postgres::Error>() else {
        return false;
    };
    let ended = [
        tokio_postgres::error::SqlState::IDLE_IN_TRANSACTION_SESSION_TIMEOUT,
        tokio_postgres::error::SqlState::ADMIN_SHUTDOWN,
    ];
    error.is_closed() || error.code().is_some_and(|code| ended.contains(code))
}
