//! The PostgreSQL store's lease renewals: one task renews every claim this process holds, in
//! one statement per third of a lease, so holding claims costs the same however many calls
//! are in flight. When each claim renewed itself (a statement and a pooled connection per
//! claim per tick), 2,000 calls in flight under a 600 ms lease took 11,000 statements a
//! second, and under a shorter one the renewals crowded the calls out of the pool.
//!
//! Renewals run on a connection of their own, not the calls' pool: with 1,000 calls committing
//! at once on the pool's 16 connections, a renewal queued behind them came after a 300 ms
//! lease had run out, and the other replica took healthy calls over. A claim row that another
//! transaction holds locked is passed over for that tick, never waited for: that is the call's
//! own commit (which ends the claim) or a takeover of it. Where that connection cannot be
//! opened (a database at `max_connections`, full of other clients' sessions), the renewal
//! goes through the calls' pool, whose connections are open: healthy calls' leases ran out
//! while the calls committed fine, and another replica ran them again (helper-114).
//!
//! Claims are told apart by an id of this process's, not by their fence: a fence sequence set
//! back (a database dropped and created again under a live replica) gave two live claims one
//! fence, and the first to end stopped the other's renewals (helper-114).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use deadpool_postgres::Pool;

use crate::message_id::MessageId;
use crate::store::postgres::claims::lease_ms;
use crate::store::{Lease, StoreError};

/// The claims being renewed, by an id of their own.
type Held = Arc<Mutex<HashMap<u64, Claimed>>>;

struct Claimed {
    key: String,
    fence: i64,
    /// Set when the call ends the claim itself: then a claim found gone was not taken over.
    ending: Arc<AtomicBool>,
}

/// Renews the leases of this process's claims until it is dropped: a dropped store, like a
/// dead process, keeps no claim alive.
pub(crate) struct Renewer {
    held: Held,
    ids: AtomicU64,
    task: tokio::task::JoinHandle<()>,
}

/// Where renewals run: their own connection, else the calls' pool.
pub(crate) struct Pools {
    pub(crate) own: Pool,
    pub(crate) calls: Pool,
}

impl Renewer {
    pub(crate) fn start(pools: Pools, owner: String, lease: Duration) -> Self {
        let held = Held::default();
        let task = tokio::spawn(renew(pools, owner, lease, Arc::downgrade(&held)));
        Self {
            held,
            ids: AtomicU64::new(0),
            task,
        }
    }

    /// The lease of the claim `fence` on `key`, renewed until it is dropped.
    pub(crate) fn lease(&self, key: &MessageId, fence: i64) -> Lease {
        let ending = Arc::new(AtomicBool::new(false));
        let claimed = Claimed {
            key: key.to_string(),
            fence,
            ending: ending.clone(),
        };
        let id = self.ids.fetch_add(1, Ordering::Relaxed);
        lock(&self.held).insert(id, claimed);
        let held = Arc::downgrade(&self.held);
        Lease::renewed(fence, ending, move || {
            if let Some(held) = held.upgrade() {
                lock(&held).remove(&id);
            }
        })
    }
}

impl Drop for Renewer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn lock(held: &Held) -> std::sync::MutexGuard<'_, HashMap<u64, Claimed>> {
    held.lock().expect("renewer lock")
}

async fn renew(
    pools: Pools,
    owner: String,
    lease: Duration,
    held: Weak<Mutex<HashMap<u64, Claimed>>>,
) {
    // After a failure, soon again: waiting a whole third of a lease twice over (a database
    // restart of a few seconds) let healthy calls' leases run out, and other replicas ran
    // them a second time.
    let (every, soon) = (lease / 3, (lease / 12).max(Duration::from_millis(50)));
    let mut failing = false;
    loop {
        tokio::time::sleep(if failing { soon } else { every }).await;
        let Some(held) = held.upgrade() else { return };
        let (mut ids, mut keys, mut fences) = (Vec::new(), Vec::new(), Vec::new());
        for (id, claimed) in lock(&held).iter() {
            ids.push(*id);
            keys.push(claimed.key.clone());
            fences.push(claimed.fence);
        }
        if ids.is_empty() {
            failing = false;
            continue;
        }
        match renew_in_time(&pools, &owner, lease, &keys, &fences).await {
            Ok(gone) => {
                if std::mem::take(&mut failing) {
                    tracing::info!(claims = ids.len(), "claim renewals resumed");
                }
                forget_lost(&held, gone.into_iter().map(|at| ids[at]));
            }
            Err(error) => {
                if !std::mem::replace(&mut failing, true) {
                    tracing::warn!(claims = ids.len(), %error, "claim renewal failed; trying again every {soon:?}");
                }
            }
        }
    }
}

/// Stops renewing claims that are no longer this process's; a takeover is worth a warning.
fn forget_lost(held: &Held, gone: impl Iterator<Item = u64>) {
    let mut held = lock(held);
    for id in gone {
        let Some(claimed) = held.remove(&id) else {
            continue; // its call ended meanwhile
        };
        if !claimed.ending.load(Ordering::Relaxed) {
            let (key, fence) = (&claimed.key, claimed.fence);
            tracing::warn!(message_id = %key, fence, "claim lost: another process took it over");
        }
    }
}

/// [`renew_all`], its connection taken from a pool included, within a third of a lease.
/// One that takes longer hangs on a connection that no longer answers (a failover, a dropped
/// NAT entry): that connection is closed, not put back, and the next try, soon, opens
/// another; waiting on it for TCP to give up would let every claim of this replica lapse,
/// and other replicas run its calls again.
async fn renew_in_time(
    pools: &Pools,
    owner: &str,
    lease: Duration,
    keys: &[String],
    fences: &[i64],
) -> Result<Vec<usize>, StoreError> {
    let now = tokio::time::Instant::now();
    let deadline = now + lease / 3;
    let late = || StoreError::Backend {
        backend: "postgres",
        cause: "the renewal took more than a third of a lease".into(),
    };
    // Half the time for its own connection, the rest for the calls' pool.
    let client = match tokio::time::timeout_at(now + lease / 6, pools.own.get()).await {
        Ok(Ok(client)) => client,
        Ok(Err(_)) | Err(_) => match tokio::time::timeout_at(deadline, pools.calls.get()).await {
            Ok(client) => client?,
            Err(_) => return Err(late()),
        },
    };
    match tokio::time::timeout_at(deadline, renew_all(&client, owner, lease, keys, fences)).await {
        Ok(renewed) => renewed,
        Err(_) => {
            drop(deadpool_postgres::Object::take(client)); // closed, not put back
            Err(late())
        }
    }
}

/// Extends the leases of the claims `keys`/`fences` that still carry this owner's fence;
/// returns the places, in them, of the claims that are gone (ended, or taken over). A claim
/// locked by another transaction is neither renewed nor gone: the next tick tries it again.
async fn renew_all(
    client: &deadpool_postgres::Client,
    owner: &str,
    lease: Duration,
    keys: &[String],
    fences: &[i64],
) -> Result<Vec<usize>, StoreError> {
    let lease_ms = lease_ms(lease);
    let renewed = client
        .query(
            concat!(
                "UPDATE idempotency_claims SET lease_until = ",
                now_ms!(),
                " + $3 WHERE (message_id, fence) IN (
                   SELECT c.message_id, c.fence FROM idempotency_claims c
                   JOIN unnest($1::text[], $2::bigint[]) AS h(message_id, fence)
                     ON c.message_id = h.message_id AND c.fence = h.fence
                   WHERE c.owner = $4
                   FOR UPDATE OF c SKIP LOCKED)
                 RETURNING fence"
            ),
            &[&keys, &fences, &lease_ms, &owner],
        )
        .await?;
    if renewed.len() == fences.len() {
        return Ok(Vec::new());
    }
    let present = client
        .query(
            "SELECT c.message_id, c.fence FROM idempotency_claims c
             JOIN unnest($1::text[], $2::bigint[]) AS h(message_id, fence)
               ON c.message_id = h.message_id AND c.fence = h.fence
             WHERE c.owner = $3",
            &[&keys, &fences, &owner],
        )
        .await?;
    let present: std::collections::HashSet<(&str, i64)> =
        present.iter().map(|row| (row.get(0), row.get(1))).collect();
    Ok((0..keys.len())
        .filter(|&at| !present.contains(&(keys[at].as_str(), fences[at])))
        .collect())
}
