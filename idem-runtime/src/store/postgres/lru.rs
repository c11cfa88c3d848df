//! The LRU bound (`max_cache_entries`): the row count this replica estimates, the uses reads
//! note, and the eviction of the least recently used entries past the bound.

use std::sync::atomic::Ordering;

use deadpool_postgres::GenericClient;

use crate::message_id::MessageId;
use crate::store::postgres::rows::{execute, query_one};
use crate::store::postgres::PostgresStore;
use crate::store::touches::PER_WRITE;
use crate::store::StoreError;

/// The advisory lock key under which one replica at a time enforces the LRU bound (the
/// schema's is in `schema.rs`).
const BOUND_LOCK: i64 = 0x1de3_0002;

/// Most entries past the LRU bound one statement of the sweep evicts: well within the
/// statement bound, and a table millions of rows past the bound drained in minutes.
pub(super) const EVICTION_CHUNK: i64 = 5_000;

impl PostgresStore {
    /// Counts the rows, for the bound's estimate.
    pub(super) async fn count(&self) -> Result<u64, StoreError> {
        let client = self.client().await?;
        let n: i64 = query_one(&client, "SELECT COUNT(*) FROM idempotency_cache", &[])
            .await?
            .get(0);
        self.rows.store(n.max(0) as u64, Ordering::Relaxed);
        Ok(n.max(0) as u64)
    }

    /// Writes at most `most` of the uses noted and not yet written; how many it took.
    async fn flush_touches(
        &self,
        client: &impl GenericClient,
        most: usize,
    ) -> Result<usize, StoreError> {
        let touches = self.touches.take(most);
        if touches.is_empty() {
            return Ok(0);
        }
        let taken = touches.len();
        let (ids, used): (Vec<String>, Vec<i64>) =
            touches.into_iter().map(|(k, v)| (k, v as i64)).unzip();
        // SKIP LOCKED: a use is a hint, and a row another session is writing is being used or
        // stored again anyway. Waiting for it, two replicas flushing the same keys in another
        // order could deadlock, and fail the call whose commit flushed.
        execute(
            client,
            "UPDATE idempotency_cache AS c SET last_used_at = GREATEST(c.last_used_at, t.used)
             FROM unnest($1::text[], $2::bigint[]) AS t(id, used) WHERE c.message_id = t.id
             AND c.message_id IN (SELECT message_id FROM idempotency_cache
                                  WHERE message_id = ANY($1) FOR UPDATE SKIP LOCKED)",
            &[&ids, &used],
        )
        .await?;
        Ok(taken)
    }

    /// Writes the uses waiting when it starts (those noted meanwhile may wait for the next
    /// sweep), [`EVICTION_CHUNK`] a statement: the sweep's, which no call waits for.
    pub(super) async fn flush_all_touches(
        &self,
        client: &impl GenericClient,
    ) -> Result<(), StoreError> {
        let mut left = self.touches.waiting();
        while left > 0 {
            let taken = self.flush_touches(client, EVICTION_CHUNK as usize).await?;
            if taken == 0 {
                break;
            }
            left = left.saturating_sub(taken);
        }
        Ok(())
    }

    /// Evicts the least recently used entries past the bound, `at_most` of them, if this
    /// process is the one doing it now (the others skip: no convoy, no entry counted twice).
    /// Chunked: a table far past its bound (the bound lowered on a restart) evicted in one
    /// statement outran the sessions' statement bound, was cancelled, and failed every call
    /// that tried it again; a call's commit evicts [`SWEEP_CHUNK`](super::sweep::SWEEP_CHUNK), the sweep chunk after chunk.
    pub(super) async fn enforce_bound(
        &self,
        client: &impl GenericClient,
        at_most: i64,
        stored: Option<&MessageId>,
    ) -> Result<u64, StoreError> {
        let locked: bool = query_one(
            client,
            "SELECT pg_try_advisory_xact_lock($1)",
            &[&BOUND_LOCK],
        )
        .await?
        .get(0);
        if !locked {
            return Ok(0);
        }
        self.flush_touches(client, PER_WRITE).await?;
        let max = self.max_entries.min(i64::MAX as u64) as i64;
        let evicted = execute(
            client,
            // SKIP LOCKED: a row another replica is writing (a key stored again past its TTL,
            // a touch) is not the least recently used any more; deleted after it committed,
            // the entry just answered would be gone. Nor is the entry this call just stored
            // (SKIP LOCKED skips no row of its own transaction), whatever its stamp says: a
            // replica's clock behind the others' would have it evicted as it commits, and its
            // retry run again. `ANY(ARRAY(..))`, not `IN`: the rows are chosen once. A join
            // may run an `IN` subquery again for each row, and each run skips the rows the
            // statement already deleted and takes the next ones past the bound.
            "DELETE FROM idempotency_cache WHERE message_id = ANY(ARRAY(
               SELECT message_id FROM idempotency_cache
               WHERE message_id IS DISTINCT FROM $3::text
               ORDER BY last_used_at, message_id
               LIMIT LEAST($2, GREATEST(0, (SELECT COUNT(*) FROM idempotency_cache) - $1))
               FOR UPDATE SKIP LOCKED))",
            &[&max, &at_most, &stored.map(MessageId::as_str)],
        )
        .await?;
        crate::telemetry::evicted("lru", evicted);
        // Saturating in one step: two evictions at once must not wrap the estimate around.
        let _ = self
            .rows
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |rows| {
                Some(rows.saturating_sub(evicted))
            });
        Ok(evicted)
    }
}
