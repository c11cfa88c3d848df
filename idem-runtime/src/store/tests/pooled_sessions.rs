//! What a call's staged writes leave on the PostgreSQL session they ran on: undone before the
//! session serves another call, or the session closed (helper-90). One connection in the
//! pool, so that every call here runs on the session the one before it used.

use std::sync::Arc;
use std::time::Duration;

use crate::claim::{Claim, IdempotencyCache};
use crate::hash::request_hash;
use crate::store::tests::fixture::{Backend, Fixture};
use crate::store::tests::support::*;
use crate::store::{PostgresOptions, PostgresStore, SqlWrite, Store, StoreError};
use crate::IdempotencyConfig;

/// The session's settings that a staged write could change and later calls depend on.
const SETTINGS: &str = "SELECT current_setting('statement_timeout') || ' ' ||
    current_setting('idle_in_transaction_session_timeout') || ' ' ||
    current_setting('synchronous_commit') || ' ' ||
    current_setting('default_transaction_read_only') || ' ' ||
    current_setting('transaction_isolation') || ' ' || current_user || ' ' ||
    current_setting('application_name') || ' ' ||
    (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid())";

/// A store on `fx`'s database whose pool has one connection.
async fn one_session(fx: &Fixture) -> IdempotencyCache {
    let mut options = PostgresOptions::new(fx.url.clone().unwrap());
    options.pool_size = 1;
    let config = config(86_400, 1000);
    let store = PostgresStore::connect_with(options, &config, fx.clock.clone());
    let store: Arc<dyn Store> = Arc::new(store.await.unwrap());
    fx.create_effects(&store).await;
    IdempotencyCache::from_arc(store)
}

/// A staged write of `sql`, as one batch.
fn staged(sql: &'static str) -> SqlWrite {
    SqlWrite::postgres(move |tx| {
        Box::pin(async move {
            tx.batch_execute(sql).await?;
            Ok(())
        })
    })
}

/// A staged write that records the session's [`SETTINGS`] as an effect named `n:<settings>`.
fn recording_settings(n: u32) -> SqlWrite {
    SqlWrite::postgres(move |tx| {
        Box::pin(async move {
            let settings: String = tx.query_one(SETTINGS, &[]).await?.get(0);
            let name = format!("{n}:{settings}");
            tx.execute("INSERT INTO effects (name) VALUES ($1)", &[&name])
                .await?;
            Ok(())
        })
    })
}

/// Key `n`'s call, completed with `writes`.
async fn call(cache: &IdempotencyCache, n: u32, writes: Vec<SqlWrite>) -> Result<(), StoreError> {
    let hash = request_hash(b"{}").unwrap();
    let Claim::Execute(ticket) = cache.claim(&key(n), "message/send", &hash).await? else {
        panic!("key {n} is new: its claim wins");
    };
    ticket.complete_with(response("ok"), writes).await.map(drop)
}

/// The settings recorded by key `n`'s call.
async fn recorded(fx: &Fixture, n: u32) -> String {
    let prefix = format!("{n}:");
    let effects = fx.effects().await;
    let found = effects.iter().find_map(|e| e.strip_prefix(&prefix));
    found
        .unwrap_or_else(|| panic!("key {n} recorded nothing: {effects:?}"))
        .to_owned()
}

/// A plain `SET`, an advisory lock and a role, committed with a call, last for the session:
/// the next call of another key ran with `synchronous_commit = off` (its answered writes lost
/// in a crash), read-only (failed), or without the server's bounds. It runs as the first did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_calls_session_settings_do_not_reach_the_next_call() {
    let Some(fx) = Fixture::new(Backend::Postgres).await else {
        return;
    };
    let cache = one_session(&fx).await;
    call(&cache, 1, vec![recording_settings(1)]).await.unwrap();
    let lasting = "SET statement_timeout = 0; SET idle_in_transaction_session_timeout = 0;
        SET synchronous_commit = off; SET default_transaction_read_only = on;
        SET default_transaction_isolation = 'serializable'; SELECT pg_advisory_lock(42);
        SET application_name = 'hidden from the one-TTL check';
        CREATE TEMP TABLE scratch (n INT); PREPARE mine AS SELECT 1";
    call(&cache, 2, vec![staged(lasting)]).await.unwrap();
    call(&cache, 3, vec![recording_settings(3)]).await.unwrap();
    let before = recorded(&fx, 1).await;
    assert_eq!(recorded(&fx, 3).await, before, "as the pool made it");
    assert!(before.contains(" on off read committed "), "{before}");
    assert!(before.contains(" idem ttl="), "{before}");
    // Nothing of the call's own is undone: its writes and entry are there.
    call(&cache, 4, vec![staged("CREATE TEMP TABLE scratch (n INT)")])
        .await
        .expect("the temporary table went with the session's restore");
    assert_eq!(cached_body(&cache, &key(2)).await.unwrap(), b"ok");
}

/// A write's own `PREPARE`, and its sequences' `currval`, outlasted the restore: the same
/// write failed on the session's next call ("prepared statement already exists"), and
/// another call saw the sequence's value of this one (helper-96).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writes_prepared_statements_and_sequences_do_not_reach_the_next_call() {
    let Some(fx) = Fixture::new(Backend::Postgres).await else {
        return;
    };
    let cache = one_session(&fx).await;
    fx.execute("CREATE SEQUENCE numbers").await;
    let preparing = |n: u32| {
        SqlWrite::postgres(move |tx| {
            Box::pin(async move {
                // `currval` fails where this session took no number of the sequence yet.
                tx.batch_execute("SAVEPOINT probe").await?;
                let seen = tx.query("SELECT currval('numbers')", &[]).await.is_ok();
                tx.batch_execute(match seen {
                    true => "RELEASE probe",
                    false => "ROLLBACK TO probe",
                })
                .await?;
                tx.batch_execute("PREPARE ins(text) AS INSERT INTO effects (name) VALUES ($1)")
                    .await?;
                let name = format!("{n}: currval seen {seen}");
                tx.batch_execute(&format!("EXECUTE ins('{name}')")).await?;
                tx.query_one("SELECT nextval('numbers')", &[]).await?;
                Ok(())
            })
        })
    };
    call(&cache, 1, vec![preparing(1)]).await.unwrap();
    call(&cache, 2, vec![preparing(2)]).await.unwrap();
    let effects = fx.effects().await;
    assert!(
        effects[1].starts_with("2: currval seen false"),
        "{effects:?}"
    );
}

/// `DEALLOCATE ALL` in a staged write takes the statements the store prepared on the
/// session: its own call fails (the store's next statement is gone), and the rollback keeps
/// the `DEALLOCATE`, so every later call on the session failed too ("prepared statement does
/// not exist") until a restart. The session is closed instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_whose_statements_were_deallocated_serves_no_other_call() {
    let Some(fx) = Fixture::new(Backend::Postgres).await else {
        return;
    };
    let cache = one_session(&fx).await;
    call(&cache, 1, vec![fx.effect("1")]).await.unwrap();
    let deallocating = staged("INSERT INTO effects (name) VALUES ('2'); DEALLOCATE ALL");
    assert!(call(&cache, 2, vec![deallocating]).await.is_err());
    for n in 3..6 {
        call(&cache, n, vec![fx.effect(&n.to_string())])
            .await
            .unwrap();
    }
    assert_eq!(fx.effects().await, ["1", "3", "4", "5"]);
}

/// An advisory lock taken by a write whose call failed outlasts the rollback; the session is
/// closed, so the lock is not held for the life of the process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_calls_session_is_closed_with_what_it_held() {
    let Some(fx) = Fixture::new(Backend::Postgres).await else {
        return;
    };
    let cache = one_session(&fx).await;
    call(&cache, 1, vec![fx.effect("1")]).await.unwrap();
    let failing = staged("SELECT pg_advisory_lock(7); INSERT INTO effects (name) VALUES ('1')");
    assert!(call(&cache, 2, vec![failing]).await.is_err());
    let free = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = 7";
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while fx.count(free).await > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the lock is still held"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    call(&cache, 3, vec![recording_settings(3)]).await.unwrap();
}

/// A database whose default isolation is SERIALIZABLE: the claims' statements and the lease
/// renewals conflicted, and 223 of 300 keys' calls failed with two replicas (helper-90). The
/// store's sessions run READ COMMITTED whatever the database's default.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_serializable_database_default_fails_no_call() {
    let Some(fx) = Fixture::new(Backend::Postgres).await else {
        return;
    };
    fx.execute(
        "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET default_transaction_isolation = \
         ''serializable''', current_database()); END $$",
    )
    .await;
    let config =
        config(86_400, 100_000).with(|c| c.claim_lease = IdempotencyConfig::MIN_CLAIM_LEASE);
    let replicas = fx.replicas(&config, 2).await;
    let hash = request_hash(b"{}").unwrap();
    let mut calls = Vec::new();
    for n in 0..100u32 {
        for caller in 0..4usize {
            let cache = replicas[caller % 2].clone();
            let hash = hash.clone();
            calls.push(tokio::spawn(async move {
                match cache.claim(&key(n), "message/send", &hash).await? {
                    Claim::Execute(ticket) => ticket.complete(response("ok")).await.map(drop),
                    _ => Ok(()),
                }
            }));
        }
    }
    for outcome in futures::future::join_all(calls).await {
        outcome.unwrap().expect("no call fails");
    }
    for n in 0..100 {
        assert_eq!(cached_body(&replicas[0], &key(n)).await.unwrap(), b"ok");
    }
}
