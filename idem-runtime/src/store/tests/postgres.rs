//! What only the PostgreSQL store has: replicas on one database, leases, fencing, wake-ups
//! by `NOTIFY`, sweeps that run on several replicas at once. Each replica here is a store and
//! cache of its own on the test's database, as a second process would have.

use std::time::Duration;

use crate::claim::{Claim, IdempotencyCache, Ticket, Waited};
use crate::hash::{request_hash, RequestHash};
use crate::message_id::MessageId;
use crate::store::StoreError;
use crate::IdempotencyConfig;

use crate::store::tests::fixture::{Backend, Fixture, T0_MS};
use crate::store::tests::stalling_proxy::StallingProxy;
use crate::store::tests::support::*;
use crate::store::{Acquired, PostgresOptions, PostgresStore, Store};

async fn fixture() -> Option<Fixture> {
    Fixture::new(Backend::Postgres).await
}

async fn two_replicas(fx: &Fixture, claim_lease: Duration) -> [IdempotencyCache; 2] {
    let replicas = fx.replicas(&leased(claim_lease), 2).await;
    replicas.try_into().ok().expect("two replicas")
}

fn leased(claim_lease: Duration) -> IdempotencyConfig {
    config(86_400, 1000).with(|c| c.claim_lease = claim_lease)
}

/// Claims keys `0..n` on `cache`, each one won, for `message/send` with `hash`.
async fn won_keys(cache: &IdempotencyCache, n: u32, hash: &RequestHash) -> Vec<Ticket> {
    let mut tickets = Vec::new();
    for n in 0..n {
        tickets.push(won(cache, &key(n), "message/send", hash).await);
    }
    tickets
}

/// Far more than a notification takes, far less than the wait bound and the lease: a waiter
/// that returns within it was woken, not timed out.
const WOKEN: Duration = Duration::from_secs(5);

/// Replica `a` runs a call of key 1; a duplicate on replica `b` waits on it (bound 60 s,
/// lease 120 s: only a wake-up ends the wait early).
struct Waiting {
    fx: Fixture,
    /// Kept: a dropped cache is a dead replica.
    _a: IdempotencyCache,
    b: IdempotencyCache,
    ticket: Ticket,
    waiting: tokio::task::JoinHandle<Waited>,
}

async fn held_on_a_awaited_on_b(fx: Fixture) -> Waiting {
    let [a, b] = two_replicas(&fx, Duration::from_secs(120)).await;
    let hash = request_hash(b"{}").unwrap();
    let ticket = won(&a, &key(1), "message/send", &hash).await;
    let Claim::InFlight(waiter) = b.claim(&key(1), "message/send", &hash).await.unwrap() else {
        panic!("the other replica sees the claim in flight")
    };
    assert!(waiter.matches("message/send", &hash));
    let waiting = tokio::spawn(waiter.wait(Duration::from_secs(60), false));
    Waiting {
        fx,
        _a: a,
        b,
        ticket,
        waiting,
    }
}

/// What the waiter saw, if it was woken within [`WOKEN`].
async fn woken(waiting: tokio::task::JoinHandle<Waited>) -> Option<Waited> {
    tokio::time::timeout(WOKEN, waiting)
        .await
        .ok()
        .map(Result::unwrap)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_on_another_replica_wakes_when_the_execution_stores_its_entry() {
    let Some(fx) = fixture().await else { return };
    let held = held_on_a_awaited_on_b(fx).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!held.waiting.is_finished(), "it waits for the outcome");
    held.ticket.complete(response("done")).await.unwrap();
    let Some(Waited::Done(entry)) = woken(held.waiting).await else {
        panic!("not woken by the end of the claim")
    };
    assert_eq!(entry.response.body, b"done");
}

/// The writes after one that failed are dropped on the call's task: a value one captured
/// whose `Drop` panics unwound through the guard, and the call went unanswered (found by
/// helper-88). The call fails as its write did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_left_after_a_failing_one_are_dropped_without_unwinding() {
    let Some(fx) = fixture().await else { return };
    let store = fx.store(&config(86_400, 100)).await;
    fx.create_effects(&store).await;
    struct PanicsOnDrop;
    impl Drop for PanicsOnDrop {
        fn drop(&mut self) {
            panic!("a bug in a value a staged write captured")
        }
    }
    let captured = PanicsOnDrop;
    let after = crate::store::SqlWrite::postgres(move |_| {
        let _ = &captured;
        Box::pin(async { Ok(()) })
    });
    let writes = vec![fx.effect("a"), fx.effect("a"), after];
    let applied = tokio::spawn(async move { store.apply(writes).await }).await;
    let refused = applied.expect("no panic unwinds into the caller");
    assert!(matches!(refused, Err(StoreError::Write(_))), "{refused:?}");
}

/// `in_flight_wait = Duration::MAX`, "as long as the original runs": the wait for another
/// replica's call added the session's bounds to it, overflowed, and panicked (helper-85).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_without_a_bound_waits_for_another_replica_s_outcome() {
    let Some(fx) = fixture().await else { return };
    let [a, b] = two_replicas(&fx, Duration::from_secs(120)).await;
    let hash = request_hash(b"{}").unwrap();
    let ticket = won(&a, &key(1), "message/send", &hash).await;
    let Claim::InFlight(waiter) = b.claim(&key(1), "message/send", &hash).await.unwrap() else {
        panic!("the other replica sees the claim in flight")
    };
    let waiting = tokio::spawn(waiter.wait(Duration::MAX, false));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!waiting.is_finished(), "it waits for the outcome");
    ticket.complete(response("done")).await.unwrap();
    let Some(Waited::Done(entry)) = woken(waiting).await else {
        panic!("not woken by the end of the claim")
    };
    assert_eq!(entry.response.body, b"done");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_listener_lost_its_connection_is_not_stranded() {
    let Some(fx) = fixture().await else { return };
    // Every listening connection dies (a restart, a proxy's idle timeout), and the end of the
    // claim is announced while they are down: that notification is lost.
    let kill_listeners = "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
         WHERE query LIKE 'LISTEN%' AND datname = current_database()";
    let held = held_on_a_awaited_on_b(fx).await;
    held.fx.execute(kill_listeners).await;
    held.ticket.complete(response("done")).await.unwrap();
    let Some(Waited::Done(entry)) = woken(held.waiting).await else {
        panic!("stranded: the reconnect must make the waiter read again")
    };
    assert_eq!(entry.response.body, b"done");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_claim_wakes_waiters_on_another_replica_and_the_key_is_free() {
    let Some(fx) = fixture().await else { return };
    let held = held_on_a_awaited_on_b(fx).await;
    drop(held.ticket);
    let waited = woken(held.waiting).await;
    assert!(matches!(waited, Some(Waited::Released)), "woken");
    let hash = request_hash(b"{}").unwrap();
    assert!(wins(&held.b, &key(1), &hash).await, "the key is free");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_replica_sees_the_claim_and_the_422s_hashes() {
    let Some(fx) = fixture().await else { return };
    let [a, b] = two_replicas(&fx, Duration::from_secs(120)).await;
    let hash = request_hash(br#"{"a":1}"#).unwrap();
    let _ticket = won(&a, &key(1), "message/send", &hash).await;
    let other = request_hash(br#"{"a":2}"#).unwrap();
    let Claim::InFlight(flight) = b.claim(&key(1), "message/send", &other).await.unwrap() else {
        panic!()
    };
    assert_eq!(flight.request_hash(), &hash, "the running call's hash");
    let holder = b.holder(&key(1)).await.unwrap();
    assert_eq!(holder, Some(("message/send".to_owned(), hash)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_replicas_claim_is_taken_over_once_its_lease_expires() {
    let Some(fx) = fixture().await else { return };
    let config = leased(Duration::from_millis(600));
    let hash = request_hash(b"{}").unwrap();
    {
        let dead = fx.cache(&config).await;
        let ticket = won(&dead, &key(1), "message/send", &hash).await;
        // The process dies mid-execution: no completion, no release, no more renewals.
        std::mem::forget(ticket);
    }
    let b = fx.cache(&config).await;
    fx.create_effects(b.store()).await;
    let Claim::InFlight(waiter) = b.claim(&key(1), "message/send", &hash).await.unwrap() else {
        panic!("the lease still holds")
    };
    let waited = waiter.wait(Duration::from_secs(30), false).await;
    assert!(
        matches!(waited, Waited::Released),
        "the wait ends with the lease"
    );
    let Claim::Execute(ticket) = b.claim(&key(1), "message/send", &hash).await.unwrap() else {
        panic!("the next claim takes the expired lease over")
    };
    ticket
        .complete_with(response("b"), vec![fx.effect("b")])
        .await
        .unwrap();
    assert_eq!(fx.effects().await, vec!["b".to_owned()]);
    assert_eq!(cached_body(&b, &key(1)).await.unwrap(), b"b");
}

/// A replica frozen mid-commit (SIGSTOP, a paused VM) holds its claim's row lock: here a
/// transaction of its pool that locked the row and went idle. The server ends that session
/// after one lease idle in its transaction, so the retry on another replica takes the claim
/// over instead of waiting on the lock for as long as the frozen one stays frozen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_frozen_mid_commit_holds_its_claim_for_one_lease_only() {
    let Some(fx) = fixture().await else { return };
    let config = leased(Duration::from_millis(1500));
    let hash = request_hash(b"{}").unwrap();
    let frozen = fx.cache(&config).await;
    let ticket = won(&frozen, &key(1), "message/send", &hash).await;
    let pool = frozen.store().postgres_pool().expect("a PostgreSQL store");
    let mut session = pool.get().await.unwrap();
    let commit = session.transaction().await.unwrap();
    let lock = "SELECT 1 FROM idempotency_claims WHERE message_id = $1 FOR UPDATE";
    commit.execute(lock, &[&key(1).as_str()]).await.unwrap();
    // Frozen: no completion, no release, no more renewals; the transaction stays open.
    std::mem::forget(ticket);
    drop(frozen);

    let b = fx.cache(&config).await;
    let taken_over = async {
        loop {
            match b.claim(&key(1), "message/send", &hash).await.unwrap() {
                Claim::Execute(ticket) => return ticket,
                Claim::InFlight(waiter) => {
                    waiter.wait(Duration::from_secs(30), false).await;
                }
                _ => panic!("nothing was stored under the key"),
            }
        }
    };
    let ticket = tokio::time::timeout(Duration::from_secs(30), taken_over)
        .await
        .expect("the retry waited on the frozen replica's lock for ever");
    assert!(
        commit.commit().await.is_err(),
        "the frozen replica's session was ended, its transaction with it"
    );
    ticket.complete_with(response("b"), vec![]).await.unwrap();
    assert_eq!(cached_body(&b, &key(1)).await.unwrap(), b"b");
}

/// A commit whose session the server ended (idle in its transaction past the lease, as a
/// replica frozen mid-commit is) answers for what happened, not as if its staged write had
/// failed: the store out of reach while the claim is still its own; `ClaimLost` once another
/// replica took the key over, as a frozen replica's stopped renewals let it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_whose_session_was_ended_answers_for_what_happened() {
    let Some(fx) = fixture().await else { return };
    let [a, b] = two_replicas(&fx, Duration::from_millis(1500)).await;
    fx.create_effects(a.store()).await;
    let hash = request_hash(b"{}").unwrap();
    let idle_past_the_lease = || {
        crate::unit_of_work::SqlWrite::postgres(|tx| {
            Box::pin(async move {
                let write = "INSERT INTO effects (name) VALUES ('a')";
                tx.execute(write, &[]).await?;
                tokio::time::sleep(Duration::from_secs(4)).await;
                tx.execute(write, &[]).await?;
                Ok(())
            })
        })
    };

    let renewed = won(&a, &key(1), "message/send", &hash).await;
    let cut_off = renewed
        .complete_with(response("a"), vec![idle_past_the_lease()])
        .await;
    assert!(
        matches!(&cut_off, Err(StoreError::Backend { .. })),
        "{cut_off:?}"
    );
    let retry = won_once_released(&b, &key(1), "message/send", &hash).await;
    retry.complete_with(response("b"), vec![]).await.unwrap();

    let frozen = won(&a, &key(2), "message/send", &hash).await;
    let completing = tokio::spawn(frozen.complete_with(response("a"), vec![idle_past_the_lease()]));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let winner = taken_over(&fx, &b, &key(2), &hash).await;
    // The same answer as the frozen call's: that the key's entry holds its bytes is no proof
    // that its own commit landed (found by helper-57).
    winner
        .complete_with(response("a"), vec![fx.effect("b")])
        .await
        .unwrap();
    let woken = completing.await.unwrap();
    assert!(matches!(woken, Err(StoreError::ClaimLost(_))), "{woken:?}");
    assert_eq!(fx.effects().await, vec!["b".to_owned()], "nothing of a's");
    assert_eq!(cached_body(&a, &key(2)).await.unwrap(), b"a");
}

/// The same for a replica frozen past the bound of its commit (SIGSTOP, a paused VM): woken,
/// its timers have run out, and it answered that the database had not answered, though
/// another replica had taken its key over meanwhile (found by helper-104). Here its staged
/// write outlasts the bound (4.5 s at a lease of 1.5 s), idle in its transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_frozen_past_its_bound_answers_claim_lost_once_taken_over() {
    let Some(fx) = fixture().await else { return };
    let [a, b] = two_replicas(&fx, Duration::from_millis(1500)).await;
    fx.create_effects(a.store()).await;
    let hash = request_hash(b"{}").unwrap();
    let past_the_bound = crate::unit_of_work::SqlWrite::postgres(|tx| {
        Box::pin(async move {
            tx.execute("INSERT INTO effects (name) VALUES ('a')", &[])
                .await?;
            tokio::time::sleep(Duration::from_secs(7)).await;
            Ok(())
        })
    });
    let frozen = won(&a, &key(1), "message/send", &hash).await;
    let completing = tokio::spawn(frozen.complete_with(response("a"), vec![past_the_bound]));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let winner = taken_over(&fx, &b, &key(1), &hash).await;
    winner
        .complete_with(response("b"), vec![fx.effect("b")])
        .await
        .unwrap();
    let woken = completing.await.unwrap();
    assert!(matches!(woken, Err(StoreError::ClaimLost(_))), "{woken:?}");
    assert_eq!(fx.effects().await, vec!["b".to_owned()], "nothing of a's");
}

/// `key`'s claim, taken over by `b` from a frozen replica. Its renewals stop with the
/// replica: the lease runs out. (Here its renewer lives on, and may renew the claim once the
/// server has ended the frozen session: then again.)
async fn taken_over(
    fx: &Fixture,
    b: &IdempotencyCache,
    key: &MessageId,
    hash: &RequestHash,
) -> Ticket {
    loop {
        fx.execute("UPDATE idempotency_claims SET lease_until = 0")
            .await;
        if let Claim::Execute(ticket) = b.claim(key, "message/send", hash).await.unwrap() {
            return ticket;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_fenced_out_by_a_takeover_commits_nothing() {
    let Some(fx) = fixture().await else { return };
    let [a, b] = two_replicas(&fx, Duration::from_secs(120)).await;
    fx.create_effects(a.store()).await;
    let hash = request_hash(br#"{"s":1}"#).unwrap();
    let mut paused = won(&a, &key(1), "message/stream", &hash).await;
    let first = bytes_of("data: {}\n\n");
    paused
        .open_stream("1".into(), first, vec![fx.effect("a-opened")])
        .await
        .unwrap();
    // Replica a pauses past its lease (a GC pause, a partition): its lease runs out.
    fx.execute("UPDATE idempotency_claims SET lease_until = 0")
        .await;
    let Claim::Cached(interrupted) = b.claim(&key(1), "message/stream", &hash).await.unwrap()
    else {
        panic!("b takes the claim over and closes the stream as interrupted")
    };
    assert!(String::from_utf8_lossy(&interrupted.response.body)
        .contains("IDEMPOTENCY_STREAM_INTERRUPTED"));
    // Replica a wakes up and carries on: nothing it writes commits.
    let appended = paused
        .append_events(1, vec![bytes_of("data: {}\n\n")])
        .await;
    assert!(
        matches!(appended, Err(StoreError::ClaimLost(_))),
        "{appended:?}"
    );
    let closed = paused.close_stream(response("a")).await;
    assert!(
        matches!(closed, Err(StoreError::ClaimLost(_))),
        "{closed:?}"
    );
    assert_eq!(
        cached_body(&b, &key(1)).await.unwrap(),
        interrupted.response.body,
        "the outcome stays the one b stored"
    );
    assert_eq!(
        fx.effects().await,
        vec!["a-opened".to_owned()],
        "a's opened stream only"
    );

    // The same for a unary call: a's staged writes roll back with its entry.
    let paused = won(&a, &key(2), "message/send", &hash).await;
    fx.execute("UPDATE idempotency_claims SET lease_until = 0")
        .await;
    let winner = won(&b, &key(2), "message/send", &hash).await;
    let fenced = paused
        .complete_with(response("a"), vec![fx.effect("a")])
        .await;
    assert!(
        matches!(fenced, Err(StoreError::ClaimLost(_))),
        "{fenced:?}"
    );
    winner
        .complete_with(response("b"), vec![fx.effect("b")])
        .await
        .unwrap();
    assert_eq!(
        fx.effects().await,
        vec!["a-opened".to_owned(), "b".to_owned()]
    );
    assert_eq!(cached_body(&a, &key(2)).await.unwrap(), b"b");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_execution_keeps_its_claim_by_renewing_the_lease() {
    let Some(fx) = fixture().await else { return };
    // Renewed every 300 ms: a loaded CI machine still renews well within the lease.
    let [a, b] = two_replicas(&fx, Duration::from_millis(900)).await;
    let hash = request_hash(b"{}").unwrap();
    let ticket = won(&a, &key(1), "message/send", &hash).await;
    held_past_three_leases(&b, &key(1), &hash).await;
    ticket.complete(response("a")).await.unwrap();
    assert_eq!(cached_body(&b, &key(1)).await.unwrap(), b"a");
}

/// Waits three leases of 900 ms, which only renewals outlast, and asserts that the call of
/// `key` is still in flight as `other` sees it.
async fn held_past_three_leases(other: &IdempotencyCache, key: &MessageId, hash: &RequestHash) {
    tokio::time::sleep(Duration::from_millis(2700)).await;
    let claim = other.claim(key, "message/send", hash).await.unwrap();
    assert!(matches!(claim, Claim::InFlight(_)), "taken over");
}

/// Two live claims of one fence (a fence sequence set back, as a database created again
/// under a live replica sets it) are each renewed until their own call ends: the first to end
/// stopped the other's renewals, and another replica took a healthy call over (helper-114).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_of_one_fence_are_each_renewed_until_their_own_call_ends() {
    let Some(fx) = fixture().await else { return };
    let [a, b] = two_replicas(&fx, Duration::from_millis(900)).await;
    let hash = request_hash(b"{}").unwrap();
    let first = won(&a, &key(1), "message/send", &hash).await;
    fx.execute("SELECT setval('idempotency_fence', (SELECT fence FROM idempotency_claims), false)")
        .await;
    let second = won(&a, &key(2), "message/send", &hash).await;
    let fences = "SELECT COUNT(DISTINCT fence) FROM idempotency_claims";
    assert_eq!(fx.count(fences).await, 1, "one fence for both");
    first.complete(response("first")).await.unwrap();
    held_past_three_leases(&b, &key(2), &hash).await;
    second.complete(response("second")).await.unwrap();
    assert_eq!(cached_body(&b, &key(2)).await.unwrap(), b"second");
}

/// A database whose every connection slot other clients hold (`max_connections` reached):
/// the renewals, whose own connection cannot be opened, go through the calls' pool, whose
/// connections are open, and a healthy call keeps its claim. Its lease ran out, and another
/// replica ran it again (helper-114).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_out_of_connections_does_not_hold_the_renewals_back() {
    let Some(fx) = fixture().await else { return };
    let lease = Duration::from_millis(900);
    let (proxy, store) = behind_a_proxy(&fx, lease).await;
    let a = IdempotencyCache::from_arc(std::sync::Arc::new(store));
    let b = fx.cache(&leased(lease)).await;
    let hash = request_hash(b"{}").unwrap();
    // Sessions open in the pool before the database is full: the call and the renewals share
    // them (a call that found the only one busy with a renewal opened another, was refused,
    // and failed: a flaky test).
    let pool = crate::store::Database::new(a.store().clone())
        .postgres()
        .unwrap();
    drop(
        futures::future::try_join_all((0..3).map(|_| pool.get()))
            .await
            .unwrap(),
    );
    // Before the claim, so the renewer, which opens its session once it has a claim, cannot.
    // (Terminating that session after the claim, by its last statement, also took a pooled
    // session that had carried a renewal.)
    proxy.refuse_new_connections();
    let ticket = won(&a, &key(1), "message/send", &hash).await;
    held_past_three_leases(&b, &key(1), &hash).await;
    ticket.complete(response("a")).await.unwrap();
    assert_eq!(cached_body(&b, &key(1)).await.unwrap(), b"a");
}

/// Many calls in flight at once keep their claims under a short lease, and renewing them all
/// costs a statement per tick, not one per claim: the database's own count of transactions
/// says so. When each claim renewed itself, 2,000 claims under a 600 ms lease took some 11,000
/// statements a second (and under a 300 ms lease, with the calls competing for the pool, this
/// test took three minutes instead of seconds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_executions_in_flight_keep_their_claims_in_one_renewal_per_tick() {
    let Some(fx) = fixture().await else { return };
    let [a, b] = two_replicas(&fx, Duration::from_millis(600)).await;
    let hash = request_hash(b"{}").unwrap();
    let tickets = won_keys(&a, 2000, &hash).await;
    // PostgreSQL publishes a connection's counts within a second of its last transaction.
    let transactions =
        "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()";
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before = fx.count(transactions).await;
    tokio::time::sleep(Duration::from_millis(1800)).await;
    let during = fx.count(transactions).await - before;
    // 1.8 s of ticks every 200 ms, each one or two statements, and the counts' own reads.
    assert!(
        during < 100,
        "{during} transactions while 2,000 claims were held"
    );
    for n in 0..2000 {
        let claim = b.claim(&key(n), "message/send", &hash).await.unwrap();
        assert!(matches!(claim, Claim::InFlight(_)), "claim {n} was lost");
    }
    for ticket in tickets {
        ticket.complete(response("a")).await.unwrap();
    }
    assert_eq!(fx.count("SELECT COUNT(*) FROM idempotency_claims").await, 0);
}

/// A replica whose pool is busy (a burst of commits holds every connection) still renews its
/// leases: another replica that claims the keys again and again meanwhile never wins one.
/// When renewals queued on the calls' pool, a review saw a fifth of 1,000 calls under a 300 ms
/// lease lost to the other replica, which ran them a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_pool_does_not_hold_the_renewals_back() {
    let Some(fx) = fixture().await else { return };
    let [a, b] = two_replicas(&fx, Duration::from_millis(300)).await;
    let hash = request_hash(b"{}").unwrap();
    let tickets = won_keys(&a, 200, &hash).await;
    let pool = a.store().postgres_pool().expect("a PostgreSQL store");
    let mut busy = Vec::new();
    for _ in 0..pool.status().max_size {
        busy.push(pool.get().await.unwrap());
    }
    // Four leases long, every connection of a's pool taken.
    let until = std::time::Instant::now() + Duration::from_millis(1200);
    let mut taken = Vec::new();
    while std::time::Instant::now() < until {
        for n in 0..200 {
            if let Claim::Execute(ticket) = b.claim(&key(n), "message/send", &hash).await.unwrap() {
                taken.push(n);
                drop(ticket);
            }
        }
    }
    drop(busy);
    assert!(
        taken.is_empty(),
        "the other replica took {} claims over",
        taken.len()
    );
    for ticket in tickets {
        ticket.complete(response("a")).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_sweeping_at_once_delete_each_expired_row_once() {
    let Some(fx) = fixture().await else { return };
    let config = config(60, 100_000);
    let (a, b) = (fx.cache(&config).await, fx.cache(&config).await);
    fx.execute(
        "INSERT INTO idempotency_cache
           (message_id, request_hash, response_status, response_headers, response_body, inserted_at)
         SELECT 'k-' || n, repeat('0', 64), 200, '{}', 'x', 0 FROM generate_series(1, 3000) n",
    )
    .await;
    execute(&a, &key(1), "{}", "fresh").await;
    let (swept_a, swept_b) = tokio::join!(a.store().sweep(), b.store().sweep());
    assert_eq!(swept_a.unwrap() + swept_b.unwrap(), 3000);
    assert_eq!(a.store().row_count().await.unwrap(), 1);
    assert_eq!(cached_body(&b, &key(1)).await.unwrap(), b"fresh");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_inserting_at_once_keep_the_lru_bound_without_evicting_too_much() {
    let Some(fx) = fixture().await else { return };
    let config = config(86_400, 10);
    let replicas = fx.replicas(&config, 2).await;
    let inserts = (0..40).map(|n| {
        let cache = replicas[n as usize % 2].clone();
        async move { execute(&cache, &key(n), "{}", "x").await }
    });
    futures::future::join_all(inserts).await;
    let before = replicas[0].store().row_count().await.unwrap();
    assert!(before >= 10, "evicted past the bound: {before} rows");
    let (a, b) = tokio::join!(replicas[0].store().sweep(), replicas[1].store().sweep());
    a.unwrap();
    b.unwrap();
    assert_eq!(
        replicas[0].store().row_count().await.unwrap(),
        10,
        "exactly the bound"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_schema_is_the_spec_table_plus_the_sqlite_columns_and_an_expiry() {
    let Some(fx) = fixture().await else { return };
    let _cache = fx.cache(&config(86_400, 100)).await;
    let client = crate::store::tests::fixture::connect(fx.url.as_ref().unwrap()).await;
    let rows = client
        .query(
            "SELECT column_name, data_type, is_nullable FROM information_schema.columns
             WHERE table_name = 'idempotency_cache' ORDER BY ordinal_position",
            &[],
        )
        .await
        .unwrap();
    let columns: Vec<(String, String, String)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let expected = [
        ("message_id", "text"),
        ("request_hash", "text"),
        ("response_status", "integer"),
        ("response_headers", "bytea"),
        ("response_body", "bytea"),
        ("inserted_at", "bigint"),
        ("method", "text"),
        ("last_used_at", "bigint"),
        ("expires_at", "bigint"),
    ];
    let got: Vec<_> = columns
        .iter()
        .map(|(n, t, nullable)| {
            // Null in rows that replicas of an earlier version store.
            let may_be_null = n == "expires_at";
            assert_eq!(nullable, if may_be_null { "YES" } else { "NO" }, "{n}");
            (n.as_str(), t.as_str())
        })
        .collect();
    assert_eq!(got, expected);
    indexes_built(&fx).await;
    let index = fx
        .count(
            "SELECT COUNT(*) FROM pg_indexes WHERE indexname = 'idx_idempotency_inserted_at'
             AND indexdef LIKE '%(inserted_at)'",
        )
        .await;
    assert_eq!(index, 1);
}

#[tokio::test]
async fn a_server_that_is_not_there_is_an_error_not_a_hang() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("postgres://idem@127.0.0.1:{port}/none");
    let defaults = IdempotencyConfig::default();
    let connecting = crate::store::PostgresStore::connect(&url, &defaults);
    let outcome = tokio::time::timeout(Duration::from_secs(30), connecting).await;
    let Ok(Err(error)) = outcome else {
        panic!("no error within 30 s")
    };
    assert!(error.to_string().contains("postgres"), "{error}");
    let bad = crate::store::PostgresStore::connect("not a url", &defaults);
    assert!(bad.await.is_err());
}

/// Replicas on one database serve with one TTL: a replica of another TTL is refused while one
/// serves, and opens once none does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_of_another_ttl_is_refused_while_one_serves() {
    let Some(fx) = fixture().await else { return };
    let connect = |ttl: u64| {
        let options = PostgresOptions::new(fx.url.clone().unwrap());
        let clock = fx.clock.clone();
        async move { PostgresStore::connect_with(options, &config(ttl, 1000), clock).await }
    };
    let serving = connect(86_400).await.expect("the first replica");
    let agreeing = connect(86_400).await.expect("a replica of the same TTL");
    match connect(3).await {
        Err(StoreError::TtlMismatch { ours, theirs }) => assert_eq!((ours, theirs), (3, 86_400)),
        Err(other) => panic!("refused for another reason: {other}"),
        Ok(_) => panic!("a replica of another TTL served beside a live one"),
    }
    let entries = "SELECT COUNT(*) FROM idempotency_settings WHERE value = 3";
    assert_eq!(
        fx.count(entries).await,
        0,
        "the refused replica recorded nothing"
    );
    drop((serving, agreeing));
    // Their sessions end as they are dropped; PostgreSQL sees it within moments.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match connect(3).await {
            Ok(_) => break,
            Err(StoreError::TtlMismatch { .. }) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(error) => panic!("not served once the others stopped: {error}"),
        }
    }
}

/// A replica that would key calls otherwise than a live replica is refused, even before the
/// database holds a key: the two would key the same retry apart (helper-108). With the
/// setting kept, it serves; once the other has stopped, it serves with its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_keyed_otherwise_than_a_live_one_is_refused() {
    let Some(fx) = fixture().await else { return };
    let serving = scoped_replica(&fx, false, None).await.expect("the first");
    match scoped_replica(&fx, true, None).await {
        Err(StoreError::ScopingMismatch { scoped: true }) => {}
        Err(other) => panic!("refused for another reason: {other}"),
        Ok(_) => panic!("a replica keyed otherwise served beside a live one"),
    }
    // Once the refused one's sessions have ended: it drops them as it fails, and PostgreSQL
    // sees them go within moments.
    drop(admitted_once_the_others_end(&fx, false).await);
    drop(serving);
    drop(admitted_once_the_others_end(&fx, true).await);
}

/// A replica that would key entries otherwise than those the database holds were stored
/// with is refused, in a rolling restart too: the retries of the calls they answered would
/// find nothing and run again (helper-107). The replica here names its own sessions, so the
/// check of live replicas cannot see it: the keys it holds are what refuse the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_keyed_otherwise_is_refused_while_the_database_holds_entries() {
    let Some(fx) = fixture().await else { return };
    let hidden = Some("hidden-from-the-check");
    let serving = scoped_replica(&fx, false, hidden).await.expect("the first");
    let cache = IdempotencyCache::from_arc(std::sync::Arc::new(serving));
    let hash = request_hash(b"{}").unwrap();
    // A call running on it, the cache still empty: its claim is a key too (helper-108).
    let running = won(&cache, &key(1), "message/send", &hash).await;
    let refused = scoped_replica(&fx, true, None).await.err();
    assert!(
        matches!(refused, Some(StoreError::ScopingChanged { scoped: true })),
        "admitted beside a live replica's claim: {refused:?}"
    );
    running.complete(response("global")).await.unwrap();
    match scoped_replica(&fx, true, None).await {
        Err(StoreError::ScopingChanged { scoped: true }) => {}
        Err(other) => panic!("refused for another reason: {other}"),
        Ok(_) => panic!("a replica keyed otherwise served beside the entries"),
    }
    // Once the refused ones' sessions have ended (a flaky refusal under CI's load).
    drop(admitted_once_the_others_end(&fx, false).await);
    fx.execute("DELETE FROM idempotency_cache").await;
    drop(admitted_once_the_others_end(&fx, true).await);
}

/// A replica on the test's database that scopes keys by principal or not, its sessions
/// named `application_name` if given (then the others' check of live replicas cannot see it).
async fn scoped_replica(
    fx: &Fixture,
    scoped: bool,
    application_name: Option<&str>,
) -> Result<PostgresStore, StoreError> {
    let mut url = fx.url.clone().unwrap();
    if let Some(name) = application_name {
        url = format!("{url}?application_name={name}");
    }
    let config = config(86_400, 1000).with(|c| c.scope_keys_by_principal = scoped);
    PostgresStore::connect_with(PostgresOptions::new(url), &config, fx.clock.clone()).await
}

/// Waits for a replica keyed `scoped` to be admitted: the sessions of those just dropped end
/// within moments, as PostgreSQL sees them.
async fn admitted_once_the_others_end(fx: &Fixture, scoped: bool) -> PostgresStore {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match scoped_replica(fx, scoped, None).await {
            Ok(store) => return store,
            Err(StoreError::ScopingMismatch { .. }) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(error) => panic!("not served once the others stopped: {error}"),
        }
    }
}

/// Each entry, and each open stream, lives for the TTL of the replica that stored it, on
/// every replica: one of another TTL can still be admitted beside live ones (right after a
/// PostgreSQL outage, before their sessions are back; or beside one whose URL names its
/// sessions, as here), and its sweep must not delete, nor its lookups skip, what they promised
/// to replay. A probe's 3 s replica, started as a PostgreSQL restart ended, swept two 24 h
/// replicas' entries, and retries ran again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_lives_for_the_ttl_it_was_stored_with_on_every_replica() {
    let Some(fx) = fixture().await else { return };
    let replica = |ttl: u64| {
        let url = format!("{}?application_name=ttl-{ttl}", fx.url.as_ref().unwrap());
        let clock = fx.clock.clone();
        async move {
            let config = config(ttl, 1000);
            let store = PostgresStore::connect_with(PostgresOptions::new(url), &config, clock);
            IdempotencyCache::from_arc(std::sync::Arc::new(store.await.unwrap()))
        }
    };
    let (day, seconds) = (replica(86_400).await, replica(3).await);
    let hash = request_hash(b"{}").unwrap();
    let stored = won(&day, &key(1), "message/send", &hash).await;
    stored.complete(response("a day")).await.unwrap();
    let stored = won(&seconds, &key(2), "message/send", &hash).await;
    stored.complete(response("3 s")).await.unwrap();
    let mut streaming = won(&day, &key(3), "message/stream", &hash).await;
    let first = bytes_of("data: {}\n\n");
    streaming
        .open_stream("3".into(), first, Vec::new())
        .await
        .unwrap();
    drop(streaming);
    // The stream's replica died: its claim's lease ran out.
    fx.execute("UPDATE idempotency_claims SET lease_until = 0")
        .await;

    fx.clock.advance(Duration::from_secs(10));
    for cache in [&seconds, &day] {
        let stats = cache.store().stats().await.unwrap();
        assert_eq!(
            (stats.entries, stats.expired),
            (2, 1),
            "key 2 alone expired"
        );
    }
    for cache in [&seconds, &day] {
        cache.store().sweep().await.unwrap();
    }
    for cache in [&seconds, &day] {
        assert_eq!(cached_body(cache, &key(1)).await.unwrap(), b"a day");
        assert_eq!(cached_body(cache, &key(2)).await, None, "past its 3 s");
    }
    let Claim::Cached(interrupted) = seconds
        .claim(&key(3), "message/stream", &hash)
        .await
        .unwrap()
    else {
        panic!("a retry of the stream ran again on the replica of 3 s")
    };
    assert!(String::from_utf8_lossy(&interrupted.response.body)
        .contains("IDEMPOTENCY_STREAM_INTERRUPTED"));
    // The outcome the replica of 3 s stored keeps the TTL the stream started with.
    fx.clock.advance(Duration::from_secs(10));
    let Claim::Cached(again) = day.claim(&key(3), "message/stream", &hash).await.unwrap() else {
        panic!("the interrupted stream's outcome expired with the closing replica's TTL")
    };
    assert_eq!(again.response.body, interrupted.response.body);
    let Claim::Cached(replayed) = seconds.claim(&key(1), "message/send", &hash).await.unwrap()
    else {
        panic!("a retry of the day's entry ran again on the replica of 3 s")
    };
    assert_eq!(replayed.response.body, b"a day");
    assert_eq!(fx.count("SELECT COUNT(*) FROM idempotency_cache").await, 2);
}

/// A column whose type was changed under the store (widened by hand) makes its rows corrupt,
/// answered as such: reading one panicked, and the client's connection closed unanswered
/// (helper-114).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_column_of_another_type_is_a_corrupt_row_not_a_panic() {
    let Some(fx) = fixture().await else { return };
    let a = fx.cache(&config(86_400, 1000)).await;
    execute(&a, &key(1), "{}", "stored").await;
    indexes_built(&fx).await; // the build's lock and the ALTER's would deadlock
    let widen = "ALTER TABLE idempotency_cache ALTER COLUMN response_status TYPE bigint";
    fx.execute(widen).await;
    // A replica started since: none of its statements were prepared before.
    let b = fx.cache(&config(86_400, 1000)).await;
    let hash = request_hash(b"{}").unwrap();
    match b.claim(&key(1), "message/send", &hash).await {
        Err(StoreError::Corrupt { detail, .. }) => assert!(detail.contains("response_status")),
        Err(other) => panic!("another error: {other}"),
        Ok(_) => panic!("read as if its type were the one this version reads"),
    }
    // The operator's tool reads the row too (helper-118).
    let url = fx.url.clone().unwrap();
    let admin = crate::admin::Admin::open(&url, &config(86_400, 1000)).await;
    match admin.unwrap().show(&key(1)).await {
        Err(StoreError::Corrupt { detail, .. }) => assert!(detail.contains("response_status")),
        Err(other) => panic!("another error: {other}"),
        Ok(_) => panic!("shown as if its type were the one this version reads"),
    }
}

/// PostgreSQL's own words reach the error: "db error" alone does not say the database is
/// missing.
#[tokio::test]
async fn a_missing_database_is_named_by_postgres_s_own_message() {
    let Some(fx) = fixture().await else { return };
    let url = fx.url.clone().unwrap();
    let (base, _) = url.rsplit_once('/').unwrap();
    let missing = format!("{base}/idem_no_such_database");
    let defaults = IdempotencyConfig::default();
    let Err(error) = crate::store::PostgresStore::connect(&missing, &defaults).await else {
        panic!("a database that does not exist was served")
    };
    let text = error.to_string();
    assert!(text.contains("idem_no_such_database"), "{text}");
    assert!(text.contains("does not exist"), "{text}");
}

/// A table another session holds locked cancels the call's statement after two leases: the
/// call fails with a store error instead of waiting for as long as the lock is held, and once
/// the lock is gone the same key is claimed and stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_locked_by_another_session_fails_the_call_instead_of_hanging_it() {
    let Some(fx) = fixture().await else { return };
    let cache = fx.cache(&leased(Duration::from_millis(600))).await;
    indexes_built(&fx).await; // a build under way would hold the lock back
    let hash = request_hash(b"{}").unwrap();
    let locker = crate::store::tests::fixture::connect(fx.url.as_ref().unwrap()).await;
    locker
        .batch_execute("BEGIN; LOCK TABLE idempotency_cache IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let claimed = tokio::time::timeout(
        Duration::from_secs(30),
        cache.claim(&key(1), "message/send", &hash),
    )
    .await
    .expect("the statement was cancelled, not left waiting on the lock");
    match claimed {
        Err(StoreError::Backend { .. }) => {}
        Err(other) => panic!("another error: {other}"),
        Ok(_) => panic!("claimed through the lock"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    locker.batch_execute("COMMIT").await.unwrap();
    let ticket = won(&cache, &key(1), "message/send", &hash).await;
    ticket.complete(response("after the lock")).await.unwrap();
    assert_eq!(
        cached_body(&cache, &key(1)).await.unwrap(),
        b"after the lock"
    );
}

/// A store with a lease of `lease` on `fx`'s database through a [`StallingProxy`].
async fn behind_a_proxy(fx: &Fixture, lease: Duration) -> (StallingProxy, PostgresStore) {
    behind_a_proxy_of(fx, lease, PostgresOptions::new(String::new()).pool_size).await
}

/// The same, with a pool of `pool_size` connections.
async fn behind_a_proxy_of(
    fx: &Fixture,
    lease: Duration,
    pool_size: usize,
) -> (StallingProxy, PostgresStore) {
    let proxy = StallingProxy::start(fx.url.as_ref().unwrap()).await;
    let mut options = PostgresOptions::new(proxy.url.clone());
    options.pool_size = pool_size;
    let config = leased(lease);
    let store = PostgresStore::connect_with(options, &config, fx.clock.clone());
    (proxy, store.await.unwrap())
}

/// A database process stopped while its host still answers TCP (SIGSTOP; here, a proxy that
/// holds every byte) ends no statement, and no TCP timeout fires: the call fails after three
/// leases instead of waiting until the database runs again, and once it does, the retry runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_that_stops_answering_fails_the_call_in_bounded_time() {
    let Some(fx) = fixture().await else { return };
    let (proxy, store) = behind_a_proxy(&fx, Duration::from_millis(600)).await;
    let store = std::sync::Arc::new(store);
    let cache = IdempotencyCache::from_arc(store.clone());
    let hash = request_hash(b"{}").unwrap();
    let ticket = won(&cache, &key(1), "message/send", &hash).await;
    ticket
        .complete(response("through the proxy"))
        .await
        .unwrap();

    proxy.stall(true);
    let started = std::time::Instant::now();
    let claimed = tokio::time::timeout(
        Duration::from_secs(30),
        cache.claim(&key(2), "message/send", &hash),
    )
    .await
    .expect("the call failed in bounded time, not left waiting on the database");
    match claimed {
        Err(StoreError::Backend { cause, .. }) => {
            assert!(cause.to_string().contains("no answer"), "{cause}")
        }
        Err(other) => panic!("another error: {other}"),
        Ok(_) => panic!("claimed from a database that answers nothing"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    let pooled = store.pool().status().size;
    assert_eq!(
        pooled, 0,
        "no connection that went unanswered serves another call"
    );

    proxy.stall(false);
    let ticket = won_once_released(&cache, &key(2), "message/send", &hash).await;
    ticket.complete(response("once it answers")).await.unwrap();
    assert_eq!(
        cached_body(&cache, &key(2)).await.unwrap(),
        b"once it answers"
    );

    // A call whose commit the database never answered: its staged writes were still
    // uncommitted when it gave up, so they roll back, and its retry runs them once.
    fx.create_effects(cache.store()).await;
    let ticket = won(&cache, &key(3), "message/send", &hash).await;
    proxy.stall(true);
    let stored = tokio::time::timeout(
        Duration::from_secs(30),
        ticket.complete_with(response("first"), vec![fx.effect("first")]),
    )
    .await
    .expect("the commit failed in bounded time");
    assert!(
        matches!(stored, Err(StoreError::Backend { .. })),
        "{stored:?}"
    );
    proxy.stall(false);
    let ticket = won_once_released(&cache, &key(3), "message/send", &hash).await;
    let second = vec![fx.effect("second")];
    ticket
        .complete_with(response("second"), second)
        .await
        .unwrap();
    // What the first attempt had sent reaches the database once the proxy passes it on.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(fx.effects().await, vec!["second".to_owned()]);
    assert_eq!(cached_body(&cache, &key(3)).await.unwrap(), b"second");
}

/// A claim that the stopped database takes late (its statement was sent before the call gave
/// up) never replaces the claim a retry in the same process won meanwhile: the retry commits,
/// instead of answering `IDEMPOTENCY_CLAIM_LOST` because its own process's earlier attempt
/// landed over it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_claim_of_an_earlier_attempt_never_replaces_a_retry_s() {
    let Some(fx) = fixture().await else { return };
    let (proxy, store) = behind_a_proxy(&fx, Duration::from_millis(600)).await;
    let hash = request_hash(b"{}").unwrap();
    // A claim and its end on the pool's connection: the claim's statement is prepared there,
    // so the next claim on it sends its INSERT at once.
    let lease = acquired(&store, 0, &hash).await;
    let entry = |n: u32, body: &str| {
        std::sync::Arc::new(crate::store::Entry {
            message_id: key(n),
            method: "message/send".into(),
            request_hash: hash.clone(),
            response: response(body),
            inserted_at: store.now_seconds(),
        })
    };
    store
        .put(entry(0, "warm"), Vec::new(), &lease)
        .await
        .unwrap();

    proxy.stall(true);
    let first = store.acquire(&key(1), "message/send", &hash, false).await;
    assert!(
        matches!(first, Err(StoreError::Backend { .. })),
        "{first:?}"
    );
    proxy.pass_new_connections();
    // The retry wins the key: the first claim has not reached the database.
    let retry = acquired(&store, 1, &hash).await;
    // The first attempt's INSERT reaches the database now, over the retry's claim, and runs.
    proxy.resume_until_answered().await;
    let stored = store.put(entry(1, "the retry's"), Vec::new(), &retry).await;
    stored.expect("the retry's claim stands");
    let found = store.get(&key(1)).await.unwrap().expect("stored");
    assert_eq!(found.response.body, b"the retry's");
}

/// A claim won by a call whose next read fails (here, an entry row that another writer left
/// corrupt) is released at once: it does not hold the key from the other replicas for the
/// minute of its lease, for a call that never runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_won_by_a_call_that_then_fails_is_released() {
    let Some(fx) = fixture().await else { return };
    let store = fx.store(&leased(Duration::from_secs(60))).await;
    let hash = request_hash(b"{}").unwrap();
    fx.execute(&format!(
        "INSERT INTO idempotency_cache
             (message_id, request_hash, response_status, response_headers, response_body,
              inserted_at, method)
         VALUES ('{}', '{}', 70000, '\\x', 'corrupt', {}, 'message/send')",
        key(1),
        hash.as_str(),
        T0_MS / 1000,
    ))
    .await;
    let failed = store.acquire(&key(1), "message/send", &hash, false).await;
    assert!(
        matches!(failed, Err(StoreError::Corrupt { .. })),
        "{failed:?}"
    );
    let claims = "SELECT COUNT(*) FROM idempotency_claims";
    for _ in 0..100 {
        if fx.count(claims).await == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the failed call's claim still holds its key");
}

/// A claim of another payload on a key whose entry is stored is one that found the entry and
/// is about to end (a claim is won before the entry is read): the stored payload's retry on
/// another replica gets the entry in that window, not the other payload's claim (found by
/// helper-48: 26 of 60 trials of two replicas answered it a 422 naming a payload never
/// stored). The other payload's own duplicate still sees its claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_passing_claim_of_another_payload_hides_no_stored_entry() {
    let Some(fx) = fixture().await else { return };
    let cache = fx.cache(&leased(Duration::from_secs(60))).await;
    let (stored, other) = (request_hash(b"{}").unwrap(), request_hash(b"[]").unwrap());
    let ticket = won(&cache, &key(1), "message/send", &stored).await;
    ticket.complete(response("stored")).await.unwrap();
    fx.execute(&format!(
        "INSERT INTO idempotency_claims
             (message_id, method, request_hash, owner, fence, lease_until)
         VALUES ('{}', 'message/send', '{}', 'another replica', nextval('idempotency_fence'),
                 9223372036854775807)",
        key(1),
        other.as_str(),
    ))
    .await;
    let store = cache.store();
    let retry = store.acquire(&key(1), "message/send", &stored, false).await;
    let Ok(Acquired::Entry(entry)) = retry else {
        panic!("the stored entry answers its retry: {retry:?}")
    };
    assert_eq!(entry.response.body, b"stored");
    let duplicate = store.acquire(&key(1), "message/send", &other, false).await;
    assert!(
        matches!(duplicate, Ok(Acquired::Held { .. })),
        "{duplicate:?}"
    );
}

/// A claim of another payload that is closing a stream a crash interrupted is no collision
/// for the stream's own retry on another replica: the stream's outcome is the key's, and the
/// retry waits for it (found by helper-52: it got a 422 naming the other payload). That
/// payload's own duplicate still sees its claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_closing_an_interrupted_stream_holds_the_key_in_the_stream_s_name() {
    let Some(fx) = fixture().await else { return };
    let cache = fx.cache(&leased(Duration::from_secs(60))).await;
    let (stream, other) = (request_hash(b"{}").unwrap(), request_hash(b"[]").unwrap());
    std::mem::forget(opened_stream(&cache, &key(1), &stream).await); // its process dies
    fx.execute(&format!(
        "UPDATE idempotency_claims SET request_hash = '{}', owner = 'another replica',
             fence = nextval('idempotency_fence'), lease_until = 9223372036854775807",
        other.as_str(),
    ))
    .await;
    let store = cache.store();
    let retry = store
        .acquire(&key(1), "message/stream", &stream, false)
        .await;
    let Ok(Acquired::Held {
        method,
        request_hash,
    }) = retry
    else {
        panic!("the key is held while the stream is closed: {retry:?}")
    };
    assert_eq!(
        (method.as_str(), &request_hash),
        ("message/stream", &stream)
    );
    let duplicate = store
        .acquire(&key(1), "message/stream", &other, false)
        .await;
    assert!(
        matches!(&duplicate, Ok(Acquired::Held { request_hash, .. }) if *request_hash == other),
        "{duplicate:?}"
    );
}

/// On the replica itself whose claim of another payload is closing an interrupted stream, the
/// stream's retry is no collision either: the claim is won before the stream is read, and for
/// those round trips (here held up by a lock on the claim's row) the key was held under the
/// other payload's hash (found by helper-53). The retry waits, and gets the stream's outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_replica_closing_an_interrupted_stream_holds_it_in_the_stream_s_name() {
    let Some(fx) = fixture().await else { return };
    let config = leased(Duration::from_secs(60));
    let (stream, other) = (request_hash(b"{}").unwrap(), request_hash(b"[]").unwrap());
    std::mem::forget(opened_stream(&fx.cache(&config).await, &key(1), &stream).await);
    fx.execute("UPDATE idempotency_claims SET lease_until = 0")
        .await;
    let cache = fx.cache(&config).await;
    let locker = crate::store::tests::fixture::connect(fx.url.as_ref().unwrap()).await;
    let lock = "BEGIN; SELECT 1 FROM idempotency_claims FOR UPDATE";
    locker.batch_execute(lock).await.unwrap();
    let closing = {
        let (cache, other) = (cache.clone(), other.clone());
        tokio::spawn(async move { cache.claim(&key(1), "message/stream", &other).await })
    };
    while cache.holder(&key(1)).await.unwrap() != Some(("message/stream".into(), other.clone())) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let Claim::InFlight(flight) = cache
        .claim(&key(1), "message/stream", &stream)
        .await
        .unwrap()
    else {
        panic!("the key is held while the stream is closed")
    };
    assert_eq!(
        flight.request_hash(),
        &stream,
        "the stream's, not the other payload's"
    );
    locker.batch_execute("COMMIT").await.unwrap();
    let Ok(Claim::Cached(closed)) = closing.await.unwrap() else {
        panic!("the other payload finds the interrupted stream's outcome")
    };
    assert_eq!(closed.request_hash, stream);
    let entry = outcome_after(flight, &cache, &key(1), "message/stream", &stream).await;
    let body = String::from_utf8_lossy(&entry.response.body).into_owned();
    assert!(body.contains("IDEMPOTENCY_STREAM_INTERRUPTED"), "{body}");
}

/// The connection lost after `COMMIT` reached the database, before its answer came back: the
/// commit lands and ends the claim, and nobody takes the key over. The call succeeds (its
/// after-commit work runs), where it was told `IDEMPOTENCY_CLAIM_LOST`, "nothing of it was
/// stored" (found by helper-55). So does one whose `COMMIT` still runs when its connection
/// drops (here a deferred trigger makes it take a second, as a wait on a synchronous standby
/// would), which was answered `IDEMPOTENCY_STORE_UNAVAILABLE` while the claim still held
/// (found by helper-59). A takeover that stores the same bytes is no such proof:
/// `a_commit_whose_session_was_ended_answers_for_what_happened`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_whose_answer_is_lost_but_which_landed_is_the_call_s_success() {
    let Some(fx) = fixture().await else { return };
    let (proxy, store) = behind_a_proxy(&fx, Duration::from_secs(5)).await;
    let cache = IdempotencyCache::from_arc(std::sync::Arc::new(store));
    fx.create_effects(cache.store()).await;
    let hash = request_hash(b"{}").unwrap();
    let slow_commit = "CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS
            $$ BEGIN PERFORM pg_sleep(1); RETURN NULL; END $$;
        CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON effects
            DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit()";
    for n in [1, 2] {
        if n == 2 {
            fx.execute(slow_commit).await;
        }
        let ticket = won(&cache, &key(n), "message/send", &hash).await;
        proxy.cut_at_next_commit();
        let effect = fx.effect(&format!("e{n}"));
        let put = ticket.complete_with(response("first"), vec![effect]).await;
        assert!(put.is_ok(), "key {n}: {put:?}");
        assert_eq!(cached_body(&cache, &key(n)).await.unwrap(), b"first");
    }
    assert_eq!(fx.effects().await, ["e1", "e2"]);
}

/// The same with every pooled connection taken: the question went to a second connection
/// while the call still held its dead one, waited out the pool's 5 s, and the landed commit
/// was reported as the store's failure (found by helper-73).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_landed_commit_is_the_call_s_success_when_its_pool_is_full() {
    let Some(fx) = fixture().await else { return };
    let (proxy, store) = behind_a_proxy_of(&fx, Duration::from_secs(5), 1).await;
    let cache = IdempotencyCache::from_arc(std::sync::Arc::new(store));
    fx.create_effects(cache.store()).await;
    let hash = request_hash(b"{}").unwrap();
    let ticket = won(&cache, &key(1), "message/send", &hash).await;
    proxy.cut_at_next_commit();
    let put = ticket
        .complete_with(response("first"), vec![fx.effect("e1")])
        .await;
    assert!(put.is_ok(), "{put:?}");
    assert_eq!(cached_body(&cache, &key(1)).await.unwrap(), b"first");
    assert_eq!(fx.effects().await, ["e1"]);
}

/// A stream's start whose answer is lost but which landed is its success, as a call's
/// commit is: it was reported as the store's failure, with its staged writes committed and
/// their after-commit work dropped (found by helper-73).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_start_whose_answer_is_lost_but_which_landed_is_its_success() {
    let Some(fx) = fixture().await else { return };
    let (proxy, store) = behind_a_proxy(&fx, Duration::from_secs(5)).await;
    let cache = IdempotencyCache::from_arc(std::sync::Arc::new(store));
    fx.create_effects(cache.store()).await;
    let hash = request_hash(b"{}").unwrap();
    let mut ticket = won(&cache, &key(1), "message/stream", &hash).await;
    proxy.cut_at_next_commit();
    let first = bytes::Bytes::from_static(b"data: first\n\n");
    let effect = fx.effect("task created");
    let opened = ticket.open_stream("1".into(), first, vec![effect]).await;
    assert!(opened.is_ok(), "{opened:?}");
    assert_eq!(fx.effects().await, ["task created"]);
    let open = "SELECT COUNT(*) FROM idempotency_open_streams";
    assert_eq!(fx.count(open).await, 1);
}

/// A staged write of plain SQL, for the tests below.
fn sql(text: &'static str) -> crate::store::SqlWrite {
    crate::store::SqlWrite::postgres(move |tx| {
        Box::pin(async move {
            tx.batch_execute(text).await?;
            Ok(())
        })
    })
}

/// A staged write that leaves a deferred foreign key unresolved fails at `COMMIT`: that is
/// the write's failure (`IDEMPOTENCY_WRITE_FAILED`), as on SQLite, not the store's, for a
/// call, a stream's start and an undeduplicated call alike (found by helper-55).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deferred_constraint_failing_at_commit_is_the_staged_write_s_failure() {
    let Some(fx) = fixture().await else { return };
    let cache = fx.cache(&config(86_400, 100)).await;
    let tables = "CREATE TABLE parent (id INTEGER PRIMARY KEY);
        CREATE TABLE child (parent INTEGER REFERENCES parent (id) DEFERRABLE INITIALLY DEFERRED)";
    cache.store().apply(vec![sql(tables)]).await.unwrap();
    let orphan = || sql("INSERT INTO child VALUES (999)");
    let hash = request_hash(b"{}").unwrap();
    let ticket = won(&cache, &key(1), "message/send", &hash).await;
    let put = ticket.complete_with(response("a"), vec![orphan()]).await;
    let mut ticket = won(&cache, &key(2), "message/stream", &hash).await;
    let opened = ticket
        .open_stream("1".into(), stream_event(0), vec![orphan()])
        .await;
    drop(ticket);
    let alone = cache.store().apply(vec![orphan()]).await;
    for (what, outcome) in [
        ("put", put.map(drop)),
        ("open_stream", opened),
        ("apply", alone),
    ] {
        assert!(
            matches!(outcome, Err(StoreError::Write(_))),
            "{what}: {outcome:?}"
        );
    }
    assert_eq!(fx.count("SELECT COUNT(*) FROM child").await, 0);
    assert!(cached_body(&cache, &key(1)).await.is_none());
}

/// A staged write that swallows its statement's error leaves PostgreSQL's transaction
/// aborted, whose `COMMIT` is answered `ROLLBACK` and no error: an undeduplicated call was
/// told its writes committed (and its after-commit hooks ran) with none of them, and a call's
/// failure was the store's. Both are now the write's failure (found by helper-55).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_staged_write_that_swallows_its_error_fails_the_call_as_its_own() {
    let Some(fx) = fixture().await else { return };
    let cache = fx.cache(&config(86_400, 100)).await;
    fx.create_effects(cache.store()).await;
    cache.store().apply(vec![fx.effect("taken")]).await.unwrap();
    let swallowing = || {
        crate::store::SqlWrite::postgres(|tx| {
            Box::pin(async move {
                let taken = "INSERT INTO effects (name) VALUES ('taken')";
                let _ = tx.execute(taken, &[]).await;
                Ok(())
            })
        })
    };
    let hash = request_hash(b"{}").unwrap();
    let ticket = won(&cache, &key(1), "message/send", &hash).await;
    let put = ticket
        .complete_with(response("a"), vec![fx.effect("mine"), swallowing()])
        .await;
    let alone = cache
        .store()
        .apply(vec![fx.effect("mine too"), swallowing()])
        .await;
    for (what, outcome) in [("put", put.map(drop)), ("apply", alone)] {
        assert!(
            matches!(&outcome, Err(StoreError::Write(_))),
            "{what}: {outcome:?}"
        );
        let said = outcome.unwrap_err().to_string();
        assert!(
            said.contains("without returning its error"),
            "{what}: {said}"
        );
    }
    assert_eq!(fx.effects().await, ["taken"]);
}

/// The store's claim of key `n`, straight (no lookup first); panics unless it is won.
async fn acquired(store: &PostgresStore, n: u32, hash: &RequestHash) -> crate::store::Lease {
    match store.acquire(&key(n), "message/send", hash, false).await {
        Ok(Acquired::Won(lease)) => lease,
        _ => panic!("a free key is won"),
    }
}

/// A database whose claims table predates the `attempt` column (an earlier version made it)
/// is served: the column is added at connect, and a claim left in it by that version still
/// holds its key against every other process until its lease runs out.
#[tokio::test]
async fn a_claims_table_of_an_earlier_version_is_served() {
    let Some(fx) = fixture().await else { return };
    fx.execute(
        "CREATE TABLE idempotency_claims (
             message_id TEXT NOT NULL PRIMARY KEY, method TEXT NOT NULL,
             request_hash TEXT NOT NULL, owner TEXT NOT NULL, fence BIGINT NOT NULL,
             lease_until BIGINT NOT NULL);
         INSERT INTO idempotency_claims VALUES
             ('9b2e7c1a-3f4d-4e5a-8b6c-000000000001', 'message/send',
              '44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a',
              'an earlier process', 1, 9223372036854775807)",
    )
    .await;
    let cache = fx.cache(&leased(Duration::from_secs(10))).await;
    let hash = request_hash(b"{}").unwrap();
    let Claim::InFlight(held) = cache.claim(&key(1), "message/send", &hash).await.unwrap() else {
        panic!("the earlier process's claim holds the key")
    };
    assert!(held.matches("message/send", &hash));
    let ticket = won(&cache, &key(2), "message/send", &hash).await;
    ticket.complete(response("served")).await.unwrap();
    assert_eq!(cached_body(&cache, &key(2)).await.unwrap(), b"served");
}

/// A database whose entries predate their `expires_at` (an earlier version made them, or
/// still stores them beside this one) is served: the column is added at connect, and such a
/// row expires by the reading replica's TTL, on lookup, in the stats and in the sweep.
#[tokio::test]
async fn entries_of_an_earlier_version_expire_by_the_reader_s_ttl() {
    let Some(fx) = fixture().await else { return };
    fx.execute(&format!(
        "CREATE TABLE idempotency_cache (
             message_id TEXT NOT NULL PRIMARY KEY, request_hash TEXT NOT NULL,
             response_status INTEGER NOT NULL, response_headers BYTEA NOT NULL,
             response_body BYTEA NOT NULL, inserted_at BIGINT NOT NULL,
             method TEXT NOT NULL DEFAULT '', last_used_at BIGINT NOT NULL DEFAULT 0);
         CREATE TABLE idempotency_open_streams (
             message_id TEXT NOT NULL PRIMARY KEY, method TEXT NOT NULL,
             request_hash TEXT NOT NULL, jsonrpc_id TEXT NOT NULL, started_at BIGINT NOT NULL);
         INSERT INTO idempotency_cache VALUES ('{}', '{}', 200, '\\x7b7d', 'earlier', {}, 'message/send', 0)",
        key(1),
        request_hash(b"{}").unwrap().as_str(),
        T0_MS / 1000,
    ))
    .await;
    let url = fx.url.as_ref().unwrap();
    let Err(refused) = crate::admin::Admin::open(url, &config(60, 100)).await else {
        panic!("the admin tool read expiries off a table that has none")
    };
    assert!(refused.to_string().contains("earlier version"), "{refused}");
    let cache = fx.cache(&config(60, 100)).await;
    crate::admin::Admin::open(url, &config(60, 100))
        .await
        .unwrap();
    indexes_built(&fx).await;
    assert_eq!(cached_body(&cache, &key(1)).await.unwrap(), b"earlier");
    fx.clock.advance(Duration::from_secs(61));
    assert_eq!(
        cached_body(&cache, &key(1)).await,
        None,
        "past the reader's TTL"
    );
    cache.store().sweep().await.unwrap();
    assert_eq!(fx.count("SELECT COUNT(*) FROM idempotency_cache").await, 0);

    // An earlier version stores a key again over the row this one stored, expired: that
    // row's expires_at stays behind, older than the entry, which is live all the same.
    let stored = won(
        &cache,
        &key(2),
        "message/send",
        &request_hash(b"{}").unwrap(),
    )
    .await;
    stored.complete(response("first")).await.unwrap();
    fx.clock.advance(Duration::from_secs(61));
    let now = crate::clock::Clock::now_seconds(&*fx.clock);
    fx.execute(&format!(
        "UPDATE idempotency_cache SET inserted_at = {now}, response_body = 'again'
         WHERE message_id = '{}'",
        key(2)
    ))
    .await;
    assert_eq!(cached_body(&cache, &key(2)).await.unwrap(), b"again");
    assert_eq!(cache.store().stats().await.unwrap().expired, 0);
    cache.store().sweep().await.unwrap();
    assert_eq!(fx.count("SELECT COUNT(*) FROM idempotency_cache").await, 1);
}

/// After the TTL was lowered on a large table, the sweep's second pass (the rows that expire
/// by the reader's TTL, an earlier version's) reads those rows alone, not every row of the
/// longer expiry that is older than the new TTL and still live by its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweep_reads_no_live_row_of_a_longer_ttl_to_find_an_earlier_version_s() {
    let Some(fx) = fixture().await else { return };
    drop(fx.cache(&config(86_400, 1_000_000)).await); // the schema
    indexes_built(&fx).await;
    fx.stores_gone().await;
    let hour_ago = T0_MS / 1000 - 3600;
    fx.execute(&format!(
        "INSERT INTO idempotency_cache (message_id, request_hash, response_status,
           response_headers, response_body, inserted_at, method, last_used_at, expires_at)
         SELECT 'day-' || n, '{hash}', 200, '', '', {hour_ago}, 'message/send', 0,
                CASE WHEN n <= 3 THEN NULL ELSE {hour_ago} + 86400 END
         FROM generate_series(1, 20000) AS n;
         ANALYZE idempotency_cache",
        hash = "0".repeat(64),
    ))
    .await;
    let client = crate::store::tests::fixture::connect(fx.url.as_ref().unwrap()).await;
    let second_pass = concat!(
        "EXPLAIN SELECT message_id FROM idempotency_cache WHERE ",
        crate::store::postgres::expired_by_ttl!("inserted_at", "9999999999"),
        " LIMIT 500"
    );
    let plan: Vec<String> = client
        .query(second_pass, &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(
        plan.iter()
            .any(|line| line.contains("idx_idempotency_expiring_by_ttl")),
        "{plan:#?}"
    );
    let minute = fx.cache(&config(60, 1_000_000)).await;
    assert_eq!(
        minute.store().sweep().await.unwrap(),
        3,
        "the earlier version's rows"
    );
    let count = "SELECT COUNT(*) FROM idempotency_cache";
    assert_eq!(fx.count(count).await, 19_997, "live by their own expiry");
}

/// An index that is missing, or that a killed concurrent build left invalid, is built at the
/// next connect, while a replica serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_or_invalid_index_is_built_again_at_connect() {
    let Some(fx) = fixture().await else { return };
    let serving = fx.cache(&config(86_400, 100)).await;
    indexes_built(&fx).await;
    fx.execute(
        "DROP INDEX idx_idempotency_last_used_at;
         UPDATE pg_index SET indisvalid = false
         WHERE indexrelid = 'idx_idempotency_expires_at'::regclass",
    )
    .await;
    let _another = fx.cache(&config(86_400, 100)).await;
    indexes_built(&fx).await;
    execute(&serving, &key(1), "{}", "served").await;
}

/// A transaction older than a replica's start holds neither the start nor the index build:
/// the replica serves at once, the build, which waits for every older transaction, gives up
/// after its lock wait, and the next start builds the index.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_transaction_holds_no_start_up_for_an_index() {
    let Some(fx) = fixture().await else { return };
    expiry_index_dropped(&fx).await;
    let long = crate::store::tests::fixture::connect(fx.url.as_ref().unwrap()).await;
    let report = "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT COUNT(*) FROM idempotency_cache";
    long.batch_execute(report).await.unwrap();
    let config = config(86_400, 100);
    let Ok(cache) = tokio::time::timeout(Duration::from_secs(60), fx.cache(&config)).await else {
        panic!("the start waited on the application's transaction")
    };
    execute(&cache, &key(1), "{}", "served").await;
    // The build holds its lock while it waits on the transaction, and gives up.
    let index_lock = format!(
        "SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = {}",
        crate::store::postgres::INDEX_LOCK
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while fx.count(&index_lock).await == 0 {
        assert!(std::time::Instant::now() < deadline, "no build started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    while fx.count(&index_lock).await > 0 {
        assert!(std::time::Instant::now() < deadline, "the build waits on");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(valid_indexes(&fx).await, 3, "the build gave up");
    long.batch_execute("COMMIT").await.unwrap();
    drop(fx.cache(&config).await);
    indexes_built(&fx).await;
}

/// A replica that finds another building the indexes (the build's lock held) serves without
/// waiting for that build, and leaves it to that replica; a later start builds what is still
/// missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_finds_the_indexes_being_built_serves_without_waiting() {
    let Some(fx) = fixture().await else { return };
    expiry_index_dropped(&fx).await;
    let building = crate::store::tests::fixture::connect(fx.url.as_ref().unwrap()).await;
    let lock = crate::store::postgres::INDEX_LOCK;
    building
        .execute("SELECT pg_advisory_lock($1)", &[&lock])
        .await
        .unwrap();
    let config = config(86_400, 100);
    let Ok(cache) = tokio::time::timeout(Duration::from_secs(60), fx.cache(&config)).await else {
        panic!("the start waited for another replica's index build")
    };
    execute(&cache, &key(1), "{}", "served").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(valid_indexes(&fx).await, 3, "left to the lock's holder");
    building
        .execute("SELECT pg_advisory_unlock($1)", &[&lock])
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(valid_indexes(&fx).await, 3, "no build waited for the lock");
    drop(fx.cache(&config).await);
    indexes_built(&fx).await;
}

/// A database whose schema a store made, its index by expiry dropped since.
async fn expiry_index_dropped(fx: &Fixture) {
    drop(fx.cache(&config(86_400, 100)).await);
    indexes_built(fx).await;
    fx.execute("DROP INDEX idx_idempotency_expires_at").await;
}

/// How many of the store's indexes are valid.
async fn valid_indexes(fx: &Fixture) -> i64 {
    let valid = "SELECT COUNT(*) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
                 WHERE c.relname LIKE 'idx_idempotency_%' AND i.indisvalid";
    fx.count(valid).await
}

/// Waits until every index of the store is built and valid (in the background of a start):
/// by age, by use, by expiry, by the reader's TTL.
async fn indexes_built(fx: &Fixture) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while valid_indexes(fx).await < 4 {
        assert!(std::time::Instant::now() < deadline, "indexes left unbuilt");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A table of an earlier version, held by a long transaction (a `pg_dump` reads under ACCESS
/// SHARE): the column it lacks is not added behind the wait for ever, with every replica's
/// calls queued behind it; the start is refused, saying why, and the next one adds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_column_added_waits_no_longer_than_its_bound_for_a_held_table() {
    let Some(fx) = fixture().await else { return };
    drop(fx.cache(&config(86_400, 100)).await);
    fx.stores_gone().await;
    fx.execute("ALTER TABLE idempotency_cache DROP COLUMN expires_at")
        .await;
    let dump = crate::store::tests::fixture::connect(fx.url.as_ref().unwrap()).await;
    let read = "BEGIN; LOCK TABLE idempotency_cache IN ACCESS SHARE MODE";
    dump.batch_execute(read).await.unwrap();
    let options = PostgresOptions::new(fx.url.clone().unwrap());
    let day = config(86_400, 100);
    let open = PostgresStore::connect_with(options, &day, fx.clock.clone());
    let Ok(opened) = tokio::time::timeout(Duration::from_secs(60), open).await else {
        panic!("the start waited on the held table")
    };
    let refused = opened.err().expect("a start that could not add the column");
    assert!(
        refused.to_string().contains("held them for 5 s"),
        "{refused}"
    );
    dump.batch_execute("COMMIT").await.unwrap();
    let cache = fx.cache(&day).await;
    execute(&cache, &key(1), "{}", "served").await;
    let column = "SELECT COUNT(*) FROM information_schema.columns
                  WHERE table_name = 'idempotency_cache' AND column_name = 'expires_at'";
    assert_eq!(fx.count(column).await, 1, "added by the next start");
}

/// A table far past its bound (the bound lowered on a restart) is evicted in chunks: a call's
/// commit evicts one and stores its entry, and the sweep drains the rest to the bound exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_far_past_its_bound_is_evicted_in_chunks() {
    let Some(fx) = fixture().await else { return };
    drop(fx.cache(&config(86_400, 100)).await); // the schema
    fx.execute(&format!(
        "INSERT INTO idempotency_cache (message_id, request_hash, response_status,
           response_headers, response_body, inserted_at, method, last_used_at)
         SELECT 'old-' || n, '{}', 200, '', '', {now}, 'message/send', n
         FROM generate_series(1, 12000) AS n",
        "0".repeat(64),
        now = T0_MS / 1000,
    ))
    .await;
    let cache = fx.cache(&config(86_400, 100)).await;
    let count = "SELECT COUNT(*) FROM idempotency_cache";
    let hash = request_hash(b"{}").unwrap();
    let ticket = won(&cache, &key(1), "message/send", &hash).await;
    ticket.complete(response("new")).await.unwrap();
    assert_eq!(cached_body(&cache, &key(1)).await.unwrap(), b"new");
    assert!(
        fx.count(count).await <= 12_001 - 500,
        "the commit evicted a chunk"
    );
    cache.store().sweep().await.unwrap();
    assert_eq!(
        fx.count(count).await,
        100,
        "the sweep drained it to the bound"
    );
    assert!(
        cached_body(&cache, &key(1)).await.is_some(),
        "the newest entry kept"
    );
}

/// The LRU bound evicts what is past it and no more, whatever plan PostgreSQL picks. With
/// statistics that said the table held one row (an index built, or an `ANALYZE`, when it did),
/// a nested loop ran the eviction's subquery again for each row, and each run skipped the rows
/// the statement had deleted and took the next: 3 entries evicted where 1 was due, and their
/// retries ran again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lru_bound_evicts_no_more_than_is_past_it_whatever_the_plan() {
    let Some(fx) = fixture().await else { return };
    let cache = fx.cache(&config(86_400, 3)).await;
    indexes_built(&fx).await;
    execute(&cache, &key(1), "{}", "oldest").await;
    fx.execute("ANALYZE idempotency_cache").await;
    for n in 2..=4 {
        fx.clock.advance(Duration::from_millis(10));
        execute(&cache, &key(n), "{}", "newer").await;
    }
    assert_eq!(cache.store().row_count().await.unwrap(), 3);
    assert_eq!(cached_body(&cache, &key(1)).await, None, "past the bound");
    for n in 2..=4 {
        assert!(cached_body(&cache, &key(n)).await.is_some(), "key {n} kept");
    }
}

/// A stream whose staged writes wait on the application's locks for longer than a lease keeps
/// its claim: the claim's row is not locked while they wait, so its lease is renewed, and a
/// retry on another replica finds the stream running instead of taking it over (and storing
/// it as interrupted) the moment the writes commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_whose_writes_wait_past_its_lease_keeps_its_claim() {
    let Some(fx) = fixture().await else { return };
    let [a, b] = two_replicas(&fx, Duration::from_millis(1000)).await;
    fx.create_effects(a.store()).await;
    let hash = request_hash(b"{}").unwrap();
    let mut ticket = won(&a, &key(1), "message/stream", &hash).await;
    // Another session holds the row the stream's write inserts, for one and a half leases.
    let locker = crate::store::tests::fixture::connect(fx.url.as_ref().unwrap()).await;
    locker
        .batch_execute("BEGIN; INSERT INTO effects (name) VALUES ('held')")
        .await
        .unwrap();
    let write = fx.effect("held");
    let opening = tokio::spawn(async move {
        let opened = ticket
            .open_stream("5".into(), bytes_of("event 0"), vec![write])
            .await;
        (ticket, opened)
    });
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let retried = b.claim(&key(1), "message/stream", &hash).await.unwrap();
    assert!(
        matches!(retried, Claim::InFlight(_)),
        "the stream's claim was taken past its renewals"
    );
    locker.batch_execute("ROLLBACK").await.unwrap();
    let (ticket, opened) = opening.await.unwrap();
    opened.expect("the stream opened under its claim");
    ticket
        .append_events(1, vec![bytes_of("event 1")])
        .await
        .expect("the claim is still the stream's");
    assert_eq!(fx.effects().await, ["held"]);
}

/// A call whose entry committed succeeds even when the LRU bound, enforced after it in a
/// transaction of its own, cannot be (here the row to evict is locked past the statement
/// bound): its answer is stored, and the next commit or sweep evicts instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bound_that_cannot_be_enforced_after_a_commit_fails_no_call() {
    let Some(fx) = fixture().await else { return };
    let config = config(86_400, 2).with(|c| c.claim_lease = Duration::from_millis(600));
    let cache = fx.cache(&config).await;
    execute(&cache, &key(0), "{}", "oldest").await;
    execute(&cache, &key(1), "{}", "newer").await;
    let locker = crate::store::tests::fixture::connect(fx.url.as_ref().unwrap()).await;
    let lock_oldest = format!(
        "BEGIN; SELECT * FROM idempotency_cache WHERE message_id = '{}' FOR UPDATE",
        key(0)
    );
    locker.batch_execute(&lock_oldest).await.unwrap();
    let hash = request_hash(b"{}").unwrap();
    let ticket = won(&cache, &key(2), "message/send", &hash).await;
    let stored = ticket.complete(response("past the bound")).await;
    locker.batch_execute("ROLLBACK").await.unwrap();
    stored.expect("the entry committed: the call succeeded");
    assert_eq!(
        cached_body(&cache, &key(2)).await.unwrap(),
        b"past the bound"
    );
}

/// A session of its own that holds, until [`release`](Held::release), the row locks `sql`
/// takes: a replica's commit under way, as another replica or the operator's tool meets it.
struct Held(tokio_postgres::Client);

impl Held {
    async fn take(fx: &Fixture, sql: &str) -> Self {
        let client = crate::store::tests::fixture::connect(fx.url.as_ref().unwrap()).await;
        client
            .batch_execute(&format!("BEGIN; {sql}"))
            .await
            .unwrap();
        Self(client)
    }

    /// Commits, a moment after whatever meets the locks has started waiting on them.
    async fn release(self) {
        tokio::time::sleep(Duration::from_millis(300)).await;
        self.0.batch_execute("COMMIT").await.unwrap();
    }
}

/// The LRU eviction passes over a row another replica is writing: that row (here a use of
/// the least recently used entry, as a key stored again would be) is not the least recently
/// used once it commits, and deleted then, the entry just answered would be gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lru_bound_passes_over_an_entry_being_written() {
    let Some(fx) = fixture().await else { return };
    let cache = fx.cache(&config(86_400, 2)).await;
    execute(&cache, &key(0), "{}", "least recently used").await;
    fx.clock.advance(Duration::from_secs(1));
    execute(&cache, &key(1), "{}", "next").await;
    let used = format!(
        "UPDATE idempotency_cache SET last_used_at = 9000000000000 WHERE message_id = '{}'",
        key(0)
    );
    let held = Held::take(&fx, &used).await;
    let new = key(2);
    let (_, stored) = tokio::join!(held.release(), execute(&cache, &new, "{}", "new"));
    assert_eq!(stored.response.body, b"new");
    assert!(cached_body(&cache, &key(0)).await.is_some(), "used: kept");
    assert!(
        cached_body(&cache, &key(1)).await.is_none(),
        "now the least recently used"
    );
}

/// The operator's `purge --expired` passes over an expired row a server is storing again
/// (a new call of the key past its TTL): deleted once that commits, the live entry would go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_expired_passes_over_an_entry_being_stored_again() {
    let Some(fx) = fixture().await else { return };
    let cache = fx.cache(&config(60, 100)).await;
    execute(&cache, &key(1), "{}", "first").await;
    execute(&cache, &key(2), "{}", "a replica's of a longer TTL").await;
    // Expired by the wall clock, which the admin tool reads; key 2 stored by a replica whose
    // TTL has not run out.
    fx.execute("UPDATE idempotency_cache SET inserted_at = 1000, expires_at = 1060")
        .await;
    let longer = format!(
        "UPDATE idempotency_cache SET expires_at = 9000000000 WHERE message_id = '{}'",
        key(2)
    );
    fx.execute(&longer).await;
    let stored_again = format!(
        "UPDATE idempotency_cache SET inserted_at = 9000000000, expires_at = 9000000060
         WHERE message_id = '{}'",
        key(1)
    );
    let held = Held::take(&fx, &stored_again).await;
    let admin = crate::admin::Admin::open(fx.url.as_ref().unwrap(), &config(60, 100))
        .await
        .unwrap();
    let (_, purged) = tokio::join!(held.release(), admin.purge_expired());
    assert_eq!(purged.unwrap(), 0);
    let live = "SELECT COUNT(*) FROM idempotency_cache WHERE inserted_at = 9000000000";
    assert_eq!(fx.count(live).await, 1, "the entry stored again is live");
    let longer = "SELECT COUNT(*) FROM idempotency_cache WHERE expires_at = 9000000000";
    assert_eq!(fx.count(longer).await, 1, "the longer TTL's entry is kept");
}

/// A stream's event meets a takeover under way (its claim's row locked by the replica taking
/// it over): it waits for it and is refused, never recorded under a claim already taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_event_waits_out_a_takeover_under_way_and_is_refused() {
    let Some(fx) = fixture().await else { return };
    let cache = fx.cache(&config(86_400, 100)).await;
    let hash = request_hash(b"{}").unwrap();
    let ticket = opened_stream(&cache, &key(1), &hash).await;
    let takeover = "UPDATE idempotency_claims SET fence = fence + 1000000, owner = 'another'";
    let held = Held::take(&fx, takeover).await;
    let (_, appended) = tokio::join!(
        held.release(),
        ticket.append_events(1, vec![bytes_of("event 1")])
    );
    assert!(
        matches!(appended, Err(StoreError::ClaimLost(_))),
        "{appended:?}"
    );
    let events = "SELECT COUNT(*) FROM idempotency_stream_events";
    assert_eq!(fx.count(events).await, 1, "only the event recorded before");
}

/// Each event renews its claim's lease, as the renewer would (found by helper-43: events back
/// to back kept the claim's row locked, the renewer's `SKIP LOCKED` passed over it, the lease
/// ran out, and another replica took a healthy stream over).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_event_renews_its_lease() {
    let Some(fx) = fixture().await else { return };
    let cache = fx.cache(&config(86_400, 100)).await;
    let hash = request_hash(b"{}").unwrap();
    let ticket = opened_stream(&cache, &key(1), &hash).await;
    // As if no renewal had come through: run out, not yet taken over.
    fx.execute("UPDATE idempotency_claims SET lease_until = 0")
        .await;
    ticket
        .append_events(1, vec![bytes_of("event 1")])
        .await
        .unwrap();
    let live = "SELECT COUNT(*) FROM idempotency_claims
        WHERE lease_until > (extract(epoch from clock_timestamp()) * 1000)::bigint";
    assert_eq!(fx.count(live).await, 1, "the event renewed the lease");
}

/// A stream quiet for a whole TTL while its lease lapsed has its record swept, as a dead
/// one's: an event it records after that is refused (`ClaimLost`), never kept under no record
/// where no sweep would ever take it (found by helper-53).
#[tokio::test]
async fn an_event_after_the_sweep_took_its_stream_is_refused_not_orphaned() {
    let Some(fx) = fixture().await else { return };
    let cache = fx.cache(&config(60, 100)).await;
    let hash = request_hash(b"{}").unwrap();
    let ticket = opened_stream(&cache, &key(1), &hash).await;
    // Lapsed a moment ago (not long enough for the sweep to take the claim itself), as a late
    // renewal leaves it; the record quiet for two TTLs.
    fx.execute(
        "UPDATE idempotency_claims
         SET lease_until = (extract(epoch from clock_timestamp()) * 1000)::bigint - 1000",
    )
    .await;
    fx.clock.advance(Duration::from_secs(120));
    cache.store().sweep().await.unwrap();
    assert_eq!(
        fx.count("SELECT COUNT(*) FROM idempotency_open_streams")
            .await,
        0
    );
    let appended = ticket.append_events(1, vec![bytes_of("event 1")]).await;
    assert!(
        matches!(appended, Err(StoreError::ClaimLost(_))),
        "{appended:?}"
    );
    let events = fx
        .count("SELECT COUNT(*) FROM idempotency_stream_events")
        .await;
    assert_eq!(events, 0, "no event kept without its stream");
}

/// Uses are written without waiting on a row another session is writing: two replicas
/// flushing the same keys in other orders cannot deadlock (and fail the call whose commit
/// flushed), and the sweep never waits on a commit under way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uses_are_written_without_waiting_on_a_row_being_written() {
    let Some(fx) = fixture().await else { return };
    let cache = fx.cache(&config(86_400, 100)).await;
    execute(&cache, &key(1), "{}", "used").await;
    execute(&cache, &key(2), "{}", "used too").await;
    fx.clock.advance(Duration::from_secs(1));
    cache.store().get(&key(1)).await.unwrap().unwrap();
    cache.store().get(&key(2)).await.unwrap().unwrap();
    let writing = format!(
        "UPDATE idempotency_cache SET response_status = 200 WHERE message_id = '{}'",
        key(1)
    );
    let held = Held::take(&fx, &writing).await;
    let swept = tokio::time::timeout(Duration::from_secs(5), cache.store().sweep()).await;
    held.release().await;
    assert_eq!(swept.expect("the sweep did not wait").unwrap(), 0);
    let used = format!(
        "SELECT last_used_at FROM idempotency_cache WHERE message_id = '{}'",
        key(2)
    );
    assert_eq!(
        fx.count(&used).await as u64,
        T0_MS + 1000,
        "the other use was written"
    );
}

/// A key whose entry expired, not swept yet, and whose call runs again on a replica: the
/// admin tool shows the call, not the expired entry (it said "expired", and `idem-admin
/// purge` deleted the row, "purged", while the call went on: helper-94).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_tool_shows_the_call_that_holds_a_key_again_not_its_expired_entry() {
    use crate::admin::{Admin, EntryState};

    let Some(fx) = fixture().await else { return };
    let config = config(10, 100);
    let cache = fx.cache(&config).await;
    execute(&cache, &key(1), "{}", "first").await;
    let mut admin = Admin::open(fx.url.as_ref().unwrap(), &config)
        .await
        .unwrap();
    admin.set_clock(fx.clock.clone());
    let state = |info: Option<crate::admin::EntryInfo>| info.map(|info| info.state);
    fx.clock.advance(Duration::from_secs(11));
    assert_eq!(
        state(admin.show(&key(1)).await.unwrap()),
        Some(EntryState::Expired(200))
    );
    let hash = request_hash(b"{}").unwrap();
    let ticket = won(&cache, &key(1), "message/send", &hash).await;
    assert_eq!(
        state(admin.show(&key(1)).await.unwrap()),
        Some(EntryState::Running)
    );
    ticket.complete(response("again")).await.unwrap();
    assert_eq!(
        state(admin.show(&key(1)).await.unwrap()),
        Some(EntryState::Live(200))
    );
}

/// The uses of many replays: a call's commit that enforces the bound writes at most a
/// batch's worth of them, and the sweep, which no call waits for, the rest. A commit wrote
/// them all, in the call's own transaction (helper-122).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_writes_a_batchs_worth_of_waiting_uses_and_the_sweep_the_rest() {
    use crate::clock::Clock;
    use crate::store::touches::PER_WRITE;

    let Some(fx) = fixture().await else { return };
    let replayed = (PER_WRITE * 3) as u32;
    let cache = fx.cache(&config(86_400, u64::from(replayed))).await;
    let keys: Vec<_> = (0..replayed).map(key).collect();
    for chunk in keys.chunks(32) {
        futures::future::join_all(chunk.iter().map(|k| execute(&cache, k, "{}", "old"))).await;
    }
    fx.clock.advance(Duration::from_secs(5));
    let used_at = fx.clock.now_millis();
    for k in &keys {
        cache.store().get(k).await.unwrap().unwrap();
    }
    execute(&cache, &key(replayed), "{}", "past the bound").await;
    let written = format!(
        "SELECT COUNT(*) FROM idempotency_cache WHERE last_used_at >= {used_at}
         AND message_id != '{}'",
        key(replayed)
    );
    let by_the_commit = fx.count(&written).await;
    assert!(
        0 < by_the_commit && by_the_commit <= PER_WRITE as i64,
        "{by_the_commit} uses of {replayed} written by one call's commit"
    );
    cache.store().sweep().await.unwrap();
    // All but the entry the bound evicted: one whose use the commit had not written.
    assert_eq!(fx.count(&written).await, i64::from(replayed) - 1);
}
