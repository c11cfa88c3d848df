//! Entries: read live (noting the use for the LRU bound), and stored with the end of their
//! claim, fenced, in one statement.

use std::sync::atomic::Ordering;

use deadpool_postgres::GenericClient;

use crate::message_id::MessageId;
use crate::store::postgres::listener::CHANNEL;
use crate::store::postgres::rows::{expires_at, query_one, select_entry};
use crate::store::postgres::sweep::SWEEP_CHUNK;
use crate::store::postgres::PostgresStore;
use crate::store::{Entry, StoreError};

impl PostgresStore {
    /// `entry`, live (as its select found it), noting the use for the LRU bound.
    pub(super) fn used(&self, entry: Option<Entry>) -> Option<Entry> {
        let entry = entry?;
        // No write is asked for: the uses wait for a commit that enforces the bound, or the
        // sweep.
        self.touches
            .note(entry.message_id.as_str(), self.clock.now_millis());
        Some(entry)
    }

    pub(super) async fn live_entry(
        &self,
        client: &impl GenericClient,
        key: &MessageId,
    ) -> Result<Option<Entry>, StoreError> {
        Ok(self.used(select_entry(client, key, self.read_at()).await?))
    }

    /// [`store_entry`](Self::store_entry) in the transaction `tx`, and the LRU bound enforced
    /// there if that insert passed it; the id of the transaction.
    pub(super) async fn store_in(
        &self,
        tx: &impl GenericClient,
        entry: &Entry,
        fence: i64,
        ttl_seconds: u64,
    ) -> Result<i64, StoreError> {
        let stored = self.store_entry(tx, entry, fence, ttl_seconds).await?;
        if stored.past_the_bound {
            self.enforce_bound(tx, SWEEP_CHUNK, Some(&entry.message_id))
                .await?;
        }
        Ok(stored.transaction)
    }

    /// Stores `entry` and ends its claim in one statement, fenced: nothing is stored unless
    /// the claim still carries `fence` ([`StoreError::ClaimLost`]). Announces the end at commit.
    pub(super) async fn store_entry(
        &self,
        client: &impl GenericClient,
        entry: &Entry,
        fence: i64,
        ttl_seconds: u64,
    ) -> Result<Stored, StoreError> {
        let stored = query_one(
            client,
            "WITH claim AS (
               DELETE FROM idempotency_claims
               WHERE message_id = $1 AND fence = $2 AND owner = $11
               RETURNING message_id
             ), stored AS (
               INSERT INTO idempotency_cache
                 (message_id, request_hash, response_status, response_headers, response_body,
                  inserted_at, method, last_used_at, expires_at)
               SELECT message_id, $3, $4, $5, $6, $7, $8, $9, $12 FROM claim
               ON CONFLICT (message_id) DO UPDATE SET request_hash = EXCLUDED.request_hash,
                 response_status = EXCLUDED.response_status,
                 response_headers = EXCLUDED.response_headers,
                 response_body = EXCLUDED.response_body, inserted_at = EXCLUDED.inserted_at,
                 method = EXCLUDED.method, last_used_at = EXCLUDED.last_used_at,
                 expires_at = EXCLUDED.expires_at
               RETURNING (xmax = 0) AS inserted
             ), announced AS (
               SELECT pg_notify($10, message_id) FROM claim
             )
             SELECT (SELECT inserted FROM stored), (SELECT COUNT(*) FROM announced),
               txid_current()",
            &[
                &entry.message_id.as_str(),
                &fence,
                &entry.request_hash.as_str(),
                &i32::from(entry.response.status),
                &entry.response.headers_json(),
                &entry.response.body,
                &(entry.inserted_at as i64),
                &entry.method,
                &(self.clock.now_millis() as i64),
                &CHANNEL,
                &self.owner,
                &expires_at(entry.inserted_at, ttl_seconds),
            ],
        )
        .await?;
        let inserted: Option<bool> = stored.get(0);
        let past_the_bound = match inserted {
            None => return Err(StoreError::ClaimLost(entry.message_id.to_string())),
            Some(true) => self.rows.fetch_add(1, Ordering::Relaxed) + 1 > self.max_entries,
            Some(false) => false,
        };
        Ok(Stored {
            past_the_bound,
            transaction: stored.get(2),
        })
    }
}

/// What storing an entry did.
pub(super) struct Stored {
    /// This insert may have passed the LRU bound: [`PostgresStore::enforce_bound`] is due, in
    /// a transaction.
    pub(super) past_the_bound: bool,
    /// The id of the transaction that stored it (`txid_current()`), to ask PostgreSQL whether
    /// it committed when the answer to its `COMMIT` is lost.
    pub(super) transaction: i64,
}
