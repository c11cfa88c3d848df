//! What every backend must do alike: each test here runs on SQLite and on PostgreSQL
//! (`on_both_backends!` at the end).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::claim::{Claim, Waited};
use crate::hash::request_hash;

use crate::store::tests::fixture::{Backend, Fixture, T0_MS};
use crate::store::tests::support::*;
use crate::store::StoredResponse;

pub async fn round_trip_keeps_every_field(fx: Fixture) {
    let cache = fx.cache(&config(86_400, 100)).await;
    execute(
        &cache,
        &key(1),
        r#"{"a":1}"#,
        r#"{"jsonrpc":"2.0","id":1,"result":"ok"}"#,
    )
    .await;
    let entry = cache.store().get(&key(1)).await.unwrap().unwrap();
    assert_eq!(entry.message_id, key(1));
    assert_eq!(entry.method, "message/send");
    assert_eq!(entry.request_hash, request_hash(br#"{"a":1}"#).unwrap());
    assert_eq!(
        entry.response,
        response(r#"{"jsonrpc":"2.0","id":1,"result":"ok"}"#)
    );
    assert_eq!(entry.inserted_at, T0_MS / 1000);
    assert!(cache.store().get(&key(2)).await.unwrap().is_none());
}

pub async fn entries_survive_close_and_reopen(fx: Fixture) {
    {
        let cache = fx.cache(&config(86_400, 100)).await;
        execute(&cache, &key(1), "{}", "first").await;
    } // the store closes here: writer joined, connections dropped
    let reopened = fx.cache(&config(86_400, 100)).await;
    assert_eq!(cached_body(&reopened, &key(1)).await.unwrap(), b"first");
    let hash = request_hash(b"{}").unwrap();
    assert!(matches!(
        reopened
            .claim(&key(1), "message/send", &hash)
            .await
            .unwrap(),
        Claim::Cached(_)
    ));
}

pub async fn ttl_expiry_is_a_miss_and_reinsert_replaces_the_stale_row(fx: Fixture) {
    let cache = fx.cache(&config(60, 100)).await;
    execute(&cache, &key(1), r#"{"v":1}"#, "old").await;

    fx.clock.advance(Duration::from_secs(60));
    assert_eq!(
        cached_body(&cache, &key(1)).await.unwrap(),
        b"old",
        "at exactly T0+ttl it is live"
    );

    fx.clock.advance(Duration::from_secs(1));
    assert!(
        cached_body(&cache, &key(1)).await.is_none(),
        "past the TTL it is a miss"
    );
    assert_eq!(
        cache.store().row_count().await.unwrap(),
        1,
        "lazy: the row is still there"
    );

    // AC-3: the same key, any body, is a new request and replaces the stale row.
    execute(&cache, &key(1), r#"{"v":2}"#, "new").await;
    let entry = cache.store().get(&key(1)).await.unwrap().unwrap();
    assert_eq!(entry.response.body, b"new");
    assert_eq!(entry.inserted_at, T0_MS / 1000 + 61);
    assert_eq!(entry.request_hash, request_hash(br#"{"v":2}"#).unwrap());
    assert_eq!(cache.store().row_count().await.unwrap(), 1);
}

pub async fn sweep_deletes_only_expired_rows(fx: Fixture) {
    let cache = fx.cache(&config(60, 10_000)).await;
    for n in 0..2500 {
        execute(&cache, &key(n), "{}", "old").await;
    }
    fx.clock.advance(Duration::from_secs(61));
    execute(&cache, &key(9999), "{}", "fresh").await;
    assert_eq!(
        cache.store().sweep().await.unwrap(),
        2500,
        "in chunks, all of them"
    );
    assert_eq!(cache.store().row_count().await.unwrap(), 1);
    assert_eq!(cached_body(&cache, &key(9999)).await.unwrap(), b"fresh");
}

/// A TTL past any date (in code, `u64::MAX`; from the environment, up to 2^63 - 1) keeps
/// every entry: the sweep deletes none, and the figures count none as expired. Spec §4.4's
/// `inserted_at + ttl < now` never holds; in SQL, as a sum, it overflowed or wrapped around.
pub async fn a_ttl_past_any_date_expires_nothing(fx: Fixture) {
    for (n, ttl) in [u64::MAX, i64::MAX as u64].into_iter().enumerate() {
        // One store at a time: a second TTL beside a serving store is refused.
        let cache = fx.cache(&config(ttl, 100)).await;
        execute(&cache, &key(n as u32), "{}", "kept").await;
        fx.clock.advance(Duration::from_secs(86_400 * 365));
        assert_eq!(cache.store().sweep().await.unwrap(), 0, "ttl {ttl}");
        assert_eq!(cached_body(&cache, &key(0)).await.unwrap(), b"kept");
        let stats = cache.store().stats().await.unwrap();
        assert_eq!(
            (stats.entries, stats.expired),
            (n as u64 + 1, 0),
            "ttl {ttl}"
        );
        // A stream's events move its record's expiry, which stays past any date (found by
        // helper-41: on PostgreSQL the move overflowed `bigint` at the second event).
        let hash = request_hash(br#"{"s":1}"#).unwrap();
        let stream = key(100 + n as u32);
        let ticket = opened_stream(&cache, &stream, &hash).await;
        fx.clock.advance(Duration::from_secs(2));
        ticket
            .append_events(1, vec![stream_event(1)])
            .await
            .unwrap();
        std::mem::forget(ticket);
        drop(cache);
        fx.stores_gone().await;
    }
}

pub async fn lru_bound_evicts_least_recently_used_on_insert(fx: Fixture) {
    let cache = fx.cache(&config(86_400, 3)).await;
    for n in 1..=3 {
        execute(&cache, &key(n), "{}", "x").await;
        fx.clock.advance(Duration::from_millis(10));
    }
    // Use key 1, so key 2 becomes the least recently used.
    assert!(cached_body(&cache, &key(1)).await.is_some());
    fx.clock.advance(Duration::from_millis(10));
    execute(&cache, &key(4), "{}", "x").await;
    assert_eq!(
        cache.store().row_count().await.unwrap(),
        3,
        "bound enforced as entries are inserted"
    );
    assert!(
        cached_body(&cache, &key(2)).await.is_none(),
        "evicted key is a miss"
    );
    for n in [1, 3, 4] {
        assert!(cached_body(&cache, &key(n)).await.is_some(), "key {n} kept");
    }
}

/// The entry a call stores is never the one the bound evicts in its own commit, whatever
/// its stamp says: after the clock stepped back it is the oldest, and evicted at once its
/// retry would run the call again.
pub async fn the_bound_never_evicts_the_entry_being_stored(fx: Fixture) {
    let cache = fx.cache(&config(86_400, 2)).await;
    for n in 1..=2 {
        execute(&cache, &key(n), "{}", "x").await;
        fx.clock.advance(Duration::from_millis(10));
    }
    fx.clock.step_back(Duration::from_secs(3600));
    execute(&cache, &key(3), "{}", "stored behind the others").await;
    assert_eq!(
        cached_body(&cache, &key(3)).await.as_deref(),
        Some(&b"stored behind the others"[..])
    );
    assert!(
        cached_body(&cache, &key(1)).await.is_none(),
        "the oldest other"
    );
    assert_eq!(cache.store().row_count().await.unwrap(), 2);
}

pub async fn bound_holds_across_reopen(fx: Fixture) {
    {
        let cache = fx.cache(&config(86_400, 10)).await;
        for n in 0..10 {
            execute(&cache, &key(n), "{}", "x").await;
        }
    }
    let cache = fx.cache(&config(86_400, 10)).await;
    execute(&cache, &key(100), "{}", "x").await;
    assert_eq!(cache.store().row_count().await.unwrap(), 10);
}

pub async fn dropped_ticket_releases_the_key_to_waiters(fx: Fixture) {
    let cache = fx.cache(&config(86_400, 100)).await;
    let hash = request_hash(b"{}").unwrap();
    let Claim::Execute(ticket) = cache.claim(&key(1), "message/send", &hash).await.unwrap() else {
        panic!()
    };
    let Claim::InFlight(waiter) = cache.claim(&key(1), "message/send", &hash).await.unwrap() else {
        panic!()
    };
    assert!(waiter.matches("message/send", &hash));
    assert!(!waiter.matches("SendMessage", &hash));
    let wait = tokio::spawn(waiter.wait(Duration::from_secs(5), false));
    drop(ticket);
    let waited = wait.await.unwrap();
    assert!(
        matches!(waited, Waited::Released),
        "released without an outcome"
    );
    assert!(wins(&cache, &key(1), &hash).await);
}

pub async fn wait_past_the_bound_reports_still_running(fx: Fixture) {
    let cache = fx.cache(&config(86_400, 100)).await;
    let hash = request_hash(b"{}").unwrap();
    let Claim::Execute(_ticket) = cache.claim(&key(1), "message/send", &hash).await.unwrap() else {
        panic!()
    };
    let Claim::InFlight(waiter) = cache.claim(&key(1), "message/send", &hash).await.unwrap() else {
        panic!()
    };
    let waited = waiter.wait(Duration::from_millis(20), false).await;
    assert!(matches!(waited, Waited::StillRunning));
}

pub async fn attaching_waiters_wake_on_progress_and_others_on_the_outcome(fx: Fixture) {
    let cache = fx.cache(&config(86_400, 100)).await;
    let hash = request_hash(b"{}").unwrap();
    let Claim::Execute(ticket) = cache.claim(&key(1), "message/stream", &hash).await.unwrap()
    else {
        panic!()
    };
    let stream_key = key(1);
    let claim = || cache.claim(&stream_key, "message/stream", &hash);
    let Claim::InFlight(attacher) = claim().await.unwrap() else {
        panic!()
    };
    let Claim::InFlight(waiter) = claim().await.unwrap() else {
        panic!()
    };
    let attaching = tokio::spawn(attacher.wait(Duration::from_secs(5), true));
    let waiting = tokio::spawn(waiter.wait(Duration::from_secs(5), false));
    tokio::task::yield_now().await;
    ticket.set_progress(Arc::new(42_u32));
    let Waited::Progressing(progress) = attaching.await.unwrap() else {
        panic!("no progress")
    };
    assert_eq!(progress.downcast_ref::<u32>(), Some(&42));
    assert!(
        !waiting.is_finished(),
        "a waiter that does not attach waits for the outcome"
    );
    ticket.complete(response("done")).await.unwrap();
    let Waited::Done(entry) = waiting.await.unwrap() else {
        panic!("no outcome")
    };
    assert_eq!(entry.response.body, b"done");
}

pub async fn quiesce_waits_for_executions_in_flight(fx: Fixture) {
    let cache = fx.cache(&config(86_400, 100)).await;
    assert!(
        cache.quiesce(Duration::from_millis(10)).await,
        "nothing in flight"
    );
    let hash = request_hash(b"{}").unwrap();
    let Claim::Execute(ticket) = cache.claim(&key(1), "message/send", &hash).await.unwrap() else {
        panic!()
    };
    assert!(
        !cache.quiesce(Duration::from_millis(20)).await,
        "one in flight"
    );
    let quiet = tokio::spawn({
        let cache = cache.clone();
        async move { cache.quiesce(Duration::from_secs(5)).await }
    });
    ticket.complete(response("x")).await.unwrap();
    assert!(quiet.await.unwrap());
}

/// 64 concurrent claims of one key, spread over two processes where the backend lets two
/// serve it: exactly one executes; every other call gets its outcome.
pub async fn sixty_four_concurrent_claims_one_winner(fx: Fixture) {
    let caches = fx.replicas(&config(86_400, 100), 2).await;
    let hash = request_hash(b"{}").unwrap();
    let winners = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(tokio::sync::Barrier::new(64));
    let calls = (0..64).map(|n| {
        let (cache, hash, winners, barrier) = (
            caches[n % caches.len()].clone(),
            hash.clone(),
            winners.clone(),
            barrier.clone(),
        );
        tokio::spawn(async move {
            barrier.wait().await;
            // As the guard does: a call whose holder gave up without an outcome (here, a
            // call of this process that found the key held by the other) claims again.
            loop {
                match cache.claim(&key(7), "message/send", &hash).await.unwrap() {
                    Claim::Execute(ticket) => {
                        winners.fetch_add(1, Ordering::SeqCst);
                        // Hold the key a moment so the others see it in flight.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        ticket.complete(response("won")).await.unwrap();
                        return "execute";
                    }
                    Claim::InFlight(f) => match f.wait(Duration::from_secs(20), false).await {
                        Waited::Done(entry) => {
                            assert_eq!(entry.response.body, b"won");
                            return "waited";
                        }
                        Waited::Released => continue,
                        _ => panic!("a waiter saw no outcome"),
                    },
                    Claim::Cached(entry) => {
                        assert_eq!(entry.response.body, b"won");
                        return "cached";
                    }
                }
            }
        })
    });
    let outcomes: Vec<_> = futures::future::join_all(calls)
        .await
        .into_iter()
        .map(|outcome| outcome.unwrap())
        .collect();
    assert_eq!(winners.load(Ordering::SeqCst), 1, "{outcomes:?}");
    assert_eq!(outcomes.iter().filter(|o| **o == "execute").count(), 1);
}

pub async fn staged_writes_commit_with_their_entry_and_a_failing_one_fails_alone(fx: Fixture) {
    let cache = fx.cache(&config(86_400, 100)).await;
    fx.create_effects(cache.store()).await;
    let hash = request_hash(b"{}").unwrap();
    let mut tickets = Vec::new();
    for n in 0..20 {
        let Claim::Execute(ticket) = cache.claim(&key(n), "message/send", &hash).await.unwrap()
        else {
            panic!()
        };
        tickets.push(ticket);
    }
    // Concurrent completions (on SQLite they share the writer's batches); call 7 writes a
    // name twice, and call 11's second write panics.
    let completions = tickets.into_iter().enumerate().map(|(n, ticket)| {
        let mut writes = vec![fx.effect(&format!("row-{n:02}"))];
        match n {
            7 => writes.push(fx.effect("row-07")),
            11 => writes.push(fx.panicking()),
            _ => {}
        }
        ticket.complete_with(response(&format!("body-{n}")), writes)
    });
    let outcomes = futures::future::join_all(completions).await;
    for (n, outcome) in outcomes.iter().enumerate() {
        match (n, outcome) {
            (7, Err(crate::store::StoreError::Write(_))) => {}
            (11, Err(crate::store::StoreError::Write(panic))) => {
                assert!(panic.to_string().contains("panicked: a bug"), "{panic}")
            }
            _ => assert!(outcome.is_ok(), "{n}: {outcome:?}"),
        }
    }
    let expected: Vec<String> = (0..20)
        .filter(|n| *n != 7 && *n != 11)
        .map(|n| format!("row-{n:02}"))
        .collect();
    assert_eq!(
        fx.effects().await,
        expected,
        "call 7's and call 11's first rows were undone with them"
    );
    for failed in [7, 11] {
        assert!(cached_body(&cache, &key(failed)).await.is_none());
        // Its key was released: a retry claims it and executes.
        assert!(wins(&cache, &key(failed), &hash).await);
    }
    assert_eq!(cached_body(&cache, &key(8)).await.unwrap(), b"body-8");
}

pub async fn a_stream_left_open_by_a_dead_process_is_closed_as_interrupted_by_the_next_claim(
    fx: Fixture,
) {
    let hash = request_hash(br#"{"s":1}"#).unwrap();
    {
        let cache = fx.cache(&config(86_400, 100)).await;
        let Claim::Execute(mut ticket) =
            cache.claim(&key(1), "message/stream", &hash).await.unwrap()
        else {
            panic!()
        };
        let first = bytes_of("data: {\"jsonrpc\":\"2.0\",\"id\":5,\"result\":0}\n\n");
        ticket
            .open_stream("5".into(), first, Vec::new())
            .await
            .unwrap();
        let second = bytes_of("data: {\"jsonrpc\":\"2.0\",\"id\":5,\"result\":1}\n\n");
        ticket.append_events(1, vec![second]).await.unwrap();
        // The process "dies": the ticket is never completed; the store is closed under it.
        std::mem::forget(ticket);
    }
    if fx.backend == Backend::Postgres {
        // ... and its lease runs out, as a dead process's does.
        fx.execute("UPDATE idempotency_claims SET lease_until = 0")
            .await;
    }
    fx.clock.advance(Duration::from_secs(5));
    let cache = fx.cache(&config(86_400, 100)).await;
    assert!(cache.store().get(&key(1)).await.unwrap().is_none());
    let Claim::Cached(entry) = cache.claim(&key(1), "message/stream", &hash).await.unwrap() else {
        panic!("an interrupted stream must never execute again")
    };
    let body = String::from_utf8(entry.response.body.clone()).unwrap();
    let events: Vec<&str> = body.split_terminator("\n\n").collect();
    assert_eq!(events.len(), 3, "{body}");
    assert_eq!(
        events[0],
        "data: {\"jsonrpc\":\"2.0\",\"id\":5,\"result\":0}"
    );
    assert_eq!(
        events[1],
        "data: {\"jsonrpc\":\"2.0\",\"id\":5,\"result\":1}"
    );
    assert!(events[2].contains("\"id\":5"), "{body}");
    assert!(
        events[2].contains("IDEMPOTENCY_STREAM_INTERRUPTED"),
        "{body}"
    );
    assert_eq!(
        entry.inserted_at,
        T0_MS / 1000 + 5,
        "inserted when it was closed (spec §4.3: on completion), not when it started"
    );
    assert_eq!(
        entry.response.headers,
        vec![("content-type".into(), "text/event-stream".into())]
    );
    // From now on this is the cached outcome, and the open record is gone.
    let again = cache.store().get(&key(1)).await.unwrap().unwrap();
    assert_eq!(again.response.body, entry.response.body);
    let open = fx
        .count("SELECT COUNT(*) FROM idempotency_open_streams")
        .await;
    let events = fx
        .count("SELECT COUNT(*) FROM idempotency_stream_events")
        .await;
    assert_eq!((open, events), (0, 0));
}

/// A record a dead process left open past its TTL is expired before the sweep reaches it: the
/// retry runs again, as the retry of any expired key does, and records a stream of its own.
pub async fn a_stream_left_open_past_its_ttl_runs_again_before_any_sweep(fx: Fixture) {
    let config = config(10, 100);
    let hash = request_hash(br#"{"s":1}"#).unwrap();
    {
        let cache = fx.cache(&config).await;
        let ticket = opened_stream(&cache, &key(1), &hash).await;
        ticket
            .append_events(1, vec![stream_event(1)])
            .await
            .unwrap();
        std::mem::forget(ticket); // its process dies
    }
    if fx.backend == Backend::Postgres {
        fx.execute("UPDATE idempotency_claims SET lease_until = 0")
            .await;
    }
    fx.clock.advance(Duration::from_secs(11));
    let cache = fx.cache(&config).await;
    let open_streams = "SELECT COUNT(*) FROM idempotency_open_streams";
    assert_eq!(fx.count(open_streams).await, 1, "no sweep has run");
    let mut retry = won(&cache, &key(1), "message/stream", &hash).await;
    retry
        .open_stream("5".into(), stream_event(2), Vec::new())
        .await
        .unwrap();
    let sse = vec![("content-type".into(), "text/event-stream".into())];
    retry
        .close_stream(StoredResponse {
            status: 200,
            headers: sse,
            body: stream_event(2).to_vec(),
        })
        .await
        .unwrap();
    let stored = cache.store().get(&key(1)).await.unwrap().unwrap();
    assert_eq!(
        stored.response.body,
        stream_event(2).to_vec(),
        "the retry's own outcome"
    );
    assert_eq!(fx.count(open_streams).await, 0);
    let events = fx
        .count("SELECT COUNT(*) FROM idempotency_stream_events")
        .await;
    assert_eq!(events, 0, "the dead recording's events went with it");
}

/// A stream that ran past the TTL, then died: its record expires a TTL after its last event,
/// not after its start, so neither the sweep nor the retry that follows the crash takes it for
/// gone, and the stream never runs again (found by helper-39: counted from the start, the
/// retry right after the restart ran it a second time).
pub async fn a_stream_that_ran_past_its_ttl_then_died_is_closed_as_interrupted(fx: Fixture) {
    let config = config(10, 100);
    let hash = request_hash(br#"{"s":1}"#).unwrap();
    {
        let cache = fx.cache(&config).await;
        let ticket = opened_stream(&cache, &key(1), &hash).await;
        for n in 1..=2 {
            fx.clock.advance(Duration::from_secs(8));
            ticket
                .append_events(n, vec![stream_event(n)])
                .await
                .unwrap();
        }
        std::mem::forget(ticket); // its process dies, 16 s after the stream started
    }
    if fx.backend == Backend::Postgres {
        fx.execute("UPDATE idempotency_claims SET lease_until = 0")
            .await;
    }
    fx.clock.advance(Duration::from_secs(5)); // 21 s after its start, 5 after its last event
    let cache = fx.cache(&config).await;
    cache.store().sweep().await.unwrap();
    let open_streams = "SELECT COUNT(*) FROM idempotency_open_streams";
    assert_eq!(fx.count(open_streams).await, 1, "the sweep spares it");
    let Claim::Cached(entry) = cache.claim(&key(1), "message/stream", &hash).await.unwrap() else {
        panic!("a stream that died must never execute again")
    };
    let body = String::from_utf8(entry.response.body.clone()).unwrap();
    assert_eq!(body.split_terminator("\n\n").count(), 4, "{body}");
    assert!(body.contains("IDEMPOTENCY_STREAM_INTERRUPTED"), "{body}");
}

/// Events recorded in batches (as a stream that produces faster than the disk commits is
/// recorded) come back in order, each once, after the stream's process died.
pub async fn events_recorded_in_batches_come_back_in_order(fx: Fixture) {
    let hash = request_hash(br#"{"s":1}"#).unwrap();
    {
        let cache = fx.cache(&config(86_400, 100)).await;
        let ticket = opened_stream(&cache, &key(1), &hash).await;
        let events = |seqs: std::ops::Range<u32>| seqs.map(stream_event).collect::<Vec<_>>();
        ticket.append_events(1, events(1..4)).await.unwrap();
        ticket.append_events(4, events(4..5)).await.unwrap();
        ticket.append_events(5, events(5..300)).await.unwrap();
        std::mem::forget(ticket); // its process dies
    }
    if fx.backend == Backend::Postgres {
        fx.execute("UPDATE idempotency_claims SET lease_until = 0")
            .await;
    }
    let cache = fx.cache(&config(86_400, 100)).await;
    let Claim::Cached(entry) = cache.claim(&key(1), "message/stream", &hash).await.unwrap() else {
        panic!("a stream that died must never execute again")
    };
    let body = String::from_utf8(entry.response.body.clone()).unwrap();
    let recorded: Vec<u8> = (0..300).flat_map(|n| stream_event(n).to_vec()).collect();
    let recorded = String::from_utf8(recorded).unwrap();
    let (events, interrupted) = body.split_at(recorded.len());
    assert_eq!(events, recorded);
    assert!(
        interrupted.contains("IDEMPOTENCY_STREAM_INTERRUPTED"),
        "{interrupted}"
    );
    assert_eq!(interrupted.matches("\n\n").count(), 1, "{interrupted}");
}

/// A stream's TTL runs from its end, and the sweep never takes a stream that still runs (its
/// retries must attach, never run again); one a dead process left open past the TTL goes.
pub async fn the_sweep_spares_running_streams_and_takes_those_left_by_the_dead(fx: Fixture) {
    let config = config(10, 100);
    let hash = request_hash(br#"{"s":1}"#).unwrap();
    let open_streams = "SELECT COUNT(*) FROM idempotency_open_streams";
    let cache = fx.cache(&config).await;
    let running = opened_stream(&cache, &key(1), &hash).await;
    fx.clock.advance(Duration::from_secs(11));
    cache.store().sweep().await.unwrap();
    assert_eq!(
        fx.count(open_streams).await,
        1,
        "a running stream is never swept"
    );
    running
        .append_events(1, vec![stream_event(1)])
        .await
        .unwrap();
    running
        .close_stream(StoredResponse {
            status: 200,
            headers: vec![("content-type".into(), "text/event-stream".into())],
            body: [stream_event(0), stream_event(1)].concat(),
        })
        .await
        .unwrap();
    let stored = cache
        .store()
        .get(&key(1))
        .await
        .unwrap()
        .expect("live a TTL from its end");
    assert_eq!(stored.inserted_at, (T0_MS / 1000) + 11);

    // A recording that gave its key up here (a failed append, say) is no longer running.
    drop(opened_stream(&cache, &key(3), &hash).await);
    if fx.backend == Backend::Postgres {
        // The claim is released in the background: the sweep comes after it.
        while fx.count("SELECT COUNT(*) FROM idempotency_claims").await > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    fx.clock.advance(Duration::from_secs(11));
    cache.store().sweep().await.unwrap();
    assert_eq!(
        fx.count(open_streams).await,
        0,
        "given up past the TTL: swept"
    );

    std::mem::forget(opened_stream(&cache, &key(2), &hash).await); // its process dies
    drop(cache);
    if fx.backend == Backend::Postgres {
        fx.execute("UPDATE idempotency_claims SET lease_until = 0")
            .await;
    }
    fx.clock.advance(Duration::from_secs(11));
    let cache = fx.cache(&config).await;
    cache.store().sweep().await.unwrap();
    assert_eq!(
        fx.count(open_streams).await,
        0,
        "left open past the TTL: swept"
    );
    let events = fx
        .count("SELECT COUNT(*) FROM idempotency_stream_events")
        .await;
    assert_eq!(events, 0, "with its events");
}

/// Each test above, once per backend.
macro_rules! on_both_backends {
    ($($test:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    let fx = crate::store::tests::fixture::Fixture::sqlite();
                    super::$test(fx).await
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    let backend = crate::store::tests::fixture::Backend::Postgres;
                    if let Some(fx) = crate::store::tests::fixture::Fixture::new(backend).await {
                        super::$test(fx).await
                    }
                }
            )*
        }
    };
}

on_both_backends!(
    round_trip_keeps_every_field,
    entries_survive_close_and_reopen,
    ttl_expiry_is_a_miss_and_reinsert_replaces_the_stale_row,
    sweep_deletes_only_expired_rows,
    a_ttl_past_any_date_expires_nothing,
    lru_bound_evicts_least_recently_used_on_insert,
    the_bound_never_evicts_the_entry_being_stored,
    bound_holds_across_reopen,
    sixty_four_concurrent_claims_one_winner,
    dropped_ticket_releases_the_key_to_waiters,
    wait_past_the_bound_reports_still_running,
    attaching_waiters_wake_on_progress_and_others_on_the_outcome,
    quiesce_waits_for_executions_in_flight,
    staged_writes_commit_with_their_entry_and_a_failing_one_fails_alone,
    a_stream_left_open_by_a_dead_process_is_closed_as_interrupted_by_the_next_claim,
    the_sweep_spares_running_streams_and_takes_those_left_by_the_dead,
    a_stream_left_open_past_its_ttl_runs_again_before_any_sweep,
    a_stream_that_ran_past_its_ttl_then_died_is_closed_as_interrupted,
    events_recorded_in_batches_come_back_in_order,
);
