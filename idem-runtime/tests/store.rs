//! The SQLite store and the atomic claim, on real database files.

use std::os::unix::fs::PermissionsExt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem_runtime::{
    request_hash, Claim, IdempotencyCache, IdempotencyConfig, ManualClock, MessageId, SqliteStore,
    Store, StoredResponse, Waited,
};

const T0_MS: u64 = 1_800_000_000_000;

fn key(n: u32) -> MessageId {
    MessageId::parse_str(&format!("9b2e7c1a-3f4d-4e5a-8b6c-{n:012x}")).unwrap()
}

fn response(body: &str) -> StoredResponse {
    StoredResponse {
        status: 200,
        headers: vec![("content-type".into(), "application/json".into())],
        body: body.as_bytes().to_vec(),
    }
}

fn config(ttl_seconds: u64, max_cache_entries: u64) -> IdempotencyConfig {
    IdempotencyConfig {
        ttl_seconds,
        max_cache_entries,
        ..IdempotencyConfig::default()
    }
}

struct Fixture {
    _dir: tempfile::TempDir,
    path: std::path::PathBuf,
    clock: Arc<ManualClock>,
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        Self {
            path: dir.path().join("cache.db"),
            _dir: dir,
            clock: Arc::new(ManualClock::new(T0_MS)),
        }
    }

    fn cache(&self, config: &IdempotencyConfig) -> IdempotencyCache {
        IdempotencyCache::new(
            SqliteStore::open_with_clock(&self.path, config, self.clock.clone()).unwrap(),
        )
    }
}

/// Claims `key` and completes it with `body`; panics unless the claim wins.
async fn execute(cache: &IdempotencyCache, key: &MessageId, params: &str, body: &str) {
    let hash = request_hash(params.as_bytes()).unwrap();
    match cache.claim(key, "message/send", &hash).await.unwrap() {
        Claim::Execute(ticket) => {
            ticket.complete(response(body)).await.unwrap();
        }
        _ => panic!("expected to win the claim for {key}"),
    }
}

/// Whether a `message/send` claim of `key` wins (the key is free: the call would execute).
async fn wins(cache: &IdempotencyCache, key: &MessageId, hash: &idem_runtime::RequestHash) -> bool {
    matches!(
        cache.claim(key, "message/send", hash).await.unwrap(),
        Claim::Execute(_)
    )
}

async fn cached_body(cache: &IdempotencyCache, key: &MessageId) -> Option<Vec<u8>> {
    cache
        .store()
        .get(key)
        .await
        .unwrap()
        .map(|e| e.response.body)
}

#[tokio::test]
async fn round_trip_keeps_every_field() {
    let fx = Fixture::new();
    let cache = fx.cache(&config(86_400, 100));
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

#[tokio::test]
async fn entries_survive_close_and_reopen() {
    let fx = Fixture::new();
    {
        let cache = fx.cache(&config(86_400, 100));
        execute(&cache, &key(1), "{}", "first").await;
    } // the store closes here: writer joined, connections dropped
    let reopened = fx.cache(&config(86_400, 100));
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

#[tokio::test]
async fn schema_is_the_spec_table_plus_documented_columns() {
    let fx = Fixture::new();
    let _cache = fx.cache(&config(86_400, 100));
    let conn = rusqlite::Connection::open(&fx.path).unwrap();
    let mut stmt = conn
        .prepare("SELECT name, type, \"notnull\", pk FROM pragma_table_info('idempotency_cache')")
        .unwrap();
    let columns: Vec<(String, String, bool, bool)> = stmt
        .query_map([], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get::<_, i64>(3)? == 1))
        })
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let expected = [
        ("message_id", "TEXT", true, true),
        ("request_hash", "TEXT", true, false),
        ("response_status", "INTEGER", true, false),
        ("response_headers", "BLOB", true, false),
        ("response_body", "BLOB", true, false),
        ("inserted_at", "INTEGER", true, false),
        ("method", "TEXT", true, false),
        ("last_used_at", "INTEGER", true, false),
    ];
    let got: Vec<_> = columns
        .iter()
        .map(|(n, t, nn, pk)| (n.as_str(), t.as_str(), *nn, *pk))
        .collect();
    assert_eq!(got, expected);
    let index: String = conn
        .query_row(
            "SELECT sql FROM sqlite_master WHERE name = 'idx_idempotency_inserted_at'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(index.contains("idempotency_cache(inserted_at)"), "{index}");
    let journal: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(journal, "wal");
}

#[tokio::test]
async fn shares_the_file_with_application_tables() {
    let fx = Fixture::new();
    {
        let conn = rusqlite::Connection::open(&fx.path).unwrap();
        conn.execute_batch(
            "CREATE TABLE tasks (id TEXT PRIMARY KEY); INSERT INTO tasks VALUES ('t1');",
        )
        .unwrap();
    }
    let cache = fx.cache(&config(86_400, 100));
    execute(&cache, &key(1), "{}", "x").await;
    let conn = rusqlite::Connection::open(&fx.path).unwrap();
    let n: i64 = conn
        .query_row("SELECT COUNT(*) FROM tasks", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 1);
}

#[tokio::test]
async fn new_database_files_are_private() {
    let fx = Fixture::new();
    let cache = fx.cache(&config(86_400, 100));
    execute(&cache, &key(1), "{}", "x").await;
    for suffix in ["", "-wal", "-shm"] {
        let path = format!("{}{suffix}", fx.path.display());
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{path}");
    }
}

#[tokio::test]
async fn ttl_expiry_is_a_miss_and_reinsert_replaces_the_stale_row() {
    let fx = Fixture::new();
    let cache = fx.cache(&config(60, 100));
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

#[tokio::test]
async fn sweep_deletes_only_expired_rows() {
    let fx = Fixture::new();
    let cache = fx.cache(&config(60, 10_000));
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

#[tokio::test]
async fn lru_bound_evicts_least_recently_used_on_insert() {
    let fx = Fixture::new();
    let cache = fx.cache(&config(86_400, 3));
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

#[tokio::test]
async fn bound_holds_across_reopen() {
    let fx = Fixture::new();
    {
        let cache = fx.cache(&config(86_400, 10));
        for n in 0..10 {
            execute(&cache, &key(n), "{}", "x").await;
        }
    }
    let cache = fx.cache(&config(86_400, 10));
    execute(&cache, &key(100), "{}", "x").await;
    assert_eq!(cache.store().row_count().await.unwrap(), 10);
}

#[test]
fn sixty_four_concurrent_claims_one_winner() {
    let fx = Fixture::new();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(8)
        .enable_all()
        .build()
        .unwrap();
    let cache = runtime.block_on(async { fx.cache(&config(86_400, 100)) });
    let hash = request_hash(b"{}").unwrap();
    let winners = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(std::sync::Barrier::new(64));
    let threads: Vec<_> = (0..64)
        .map(|_| {
            let (cache, hash, winners, barrier) = (
                cache.clone(),
                hash.clone(),
                winners.clone(),
                barrier.clone(),
            );
            let handle = runtime.handle().clone();
            std::thread::spawn(move || {
                barrier.wait();
                handle.block_on(async {
                    match cache.claim(&key(7), "message/send", &hash).await.unwrap() {
                        Claim::Execute(ticket) => {
                            winners.fetch_add(1, Ordering::SeqCst);
                            // Hold the key a moment so the others see it in flight.
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            ticket.complete(response("won")).await.unwrap();
                            "execute"
                        }
                        Claim::InFlight(f) => match f.wait(Duration::from_secs(10), false).await {
                            Waited::Done(entry) => {
                                assert_eq!(entry.response.body, b"won");
                                "waited"
                            }
                            _ => panic!("a waiter saw no outcome"),
                        },
                        Claim::Cached(entry) => {
                            assert_eq!(entry.response.body, b"won");
                            "cached"
                        }
                    }
                })
            })
        })
        .collect();
    let outcomes: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert_eq!(winners.load(Ordering::SeqCst), 1, "{outcomes:?}");
    assert_eq!(outcomes.iter().filter(|o| **o == "execute").count(), 1);
}

#[tokio::test]
async fn dropped_ticket_releases_the_key_to_waiters() {
    let fx = Fixture::new();
    let cache = fx.cache(&config(86_400, 100));
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

#[tokio::test]
async fn wait_past_the_bound_reports_still_running() {
    let fx = Fixture::new();
    let cache = fx.cache(&config(86_400, 100));
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

#[tokio::test]
async fn attaching_waiters_wake_on_progress_and_others_on_the_outcome() {
    let fx = Fixture::new();
    let cache = fx.cache(&config(86_400, 100));
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

#[tokio::test]
async fn quiesce_waits_for_executions_in_flight() {
    let fx = Fixture::new();
    let cache = fx.cache(&config(86_400, 100));
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

#[tokio::test]
async fn closed_store_fails_loudly() {
    let fx = Fixture::new();
    let store = SqliteStore::open_with_clock(&fx.path, &config(60, 10), fx.clock.clone()).unwrap();
    store.close();
    let err = store.sweep().await.unwrap_err();
    assert!(matches!(err, idem_runtime::StoreError::Closed), "{err}");
}

#[test]
fn unusable_path_is_an_error_not_a_panic() {
    let err = SqliteStore::open("/nonexistent-dir/x/cache.db", &IdempotencyConfig::default())
        .err()
        .unwrap();
    assert!(err.to_string().contains("No such file"), "{err}");
}

#[tokio::test]
async fn a_write_waits_for_the_applications_write_lock_instead_of_failing() {
    let fx = Fixture::new();
    let cache = fx.cache(&config(86_400, 100));
    execute(&cache, &key(1), "{}", "before").await;
    // The application's own connection to the shared file holds the write lock a moment.
    let path = fx.path.clone();
    let (locked, is_locked) = std::sync::mpsc::channel();
    let holder = std::thread::spawn(move || {
        let conn = rusqlite::Connection::open(path).unwrap();
        conn.execute_batch("BEGIN IMMEDIATE; CREATE TABLE app (x); INSERT INTO app VALUES (1);")
            .unwrap();
        locked.send(()).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        conn.execute_batch("COMMIT").unwrap();
    });
    is_locked.recv().unwrap();
    execute(&cache, &key(2), "{}", "during").await;
    holder.join().unwrap();
    assert_eq!(cached_body(&cache, &key(2)).await.unwrap(), b"during");
}

#[tokio::test]
async fn a_second_store_on_the_same_file_is_refused_until_the_first_closes() {
    let fx = Fixture::new();
    let first = SqliteStore::open_with_clock(&fx.path, &config(60, 10), fx.clock.clone()).unwrap();
    let refused = SqliteStore::open(&fx.path, &config(60, 10)).err().unwrap();
    let message = refused.to_string();
    assert!(
        matches!(refused, idem_runtime::StoreError::InUse { .. }),
        "{message}"
    );
    assert!(
        message.contains(&fx.path.display().to_string()),
        "{message}"
    );
    assert!(
        message.contains(&std::process::id().to_string()),
        "{message}"
    );
    first.close();
    SqliteStore::open(&fx.path, &config(60, 10)).expect("free once the first closed");
}

/// A staged write that inserts `name` into `effects` (unique names).
fn effect(name: &str) -> idem_runtime::SqlWrite {
    let name = name.to_owned();
    idem_runtime::SqlWrite::rerunnable(move |db| {
        db.execute("INSERT INTO effects (name) VALUES (?1)", [&name])?;
        Ok(())
    })
}

fn effects(path: &std::path::Path) -> Vec<String> {
    let conn = rusqlite::Connection::open(path).unwrap();
    let mut names = conn
        .prepare("SELECT name FROM effects ORDER BY name")
        .unwrap();
    let names = names.query_map([], |r| r.get(0)).unwrap();
    names.collect::<Result<_, _>>().unwrap()
}

#[tokio::test]
async fn staged_writes_commit_with_their_entry_and_a_failing_one_fails_alone() {
    let fx = Fixture::new();
    let cache = fx.cache(&config(86_400, 100));
    let store = cache.store().clone();
    store
        .apply(vec![idem_runtime::SqlWrite::rerunnable(|db| {
            db.execute_batch("CREATE TABLE effects (name TEXT PRIMARY KEY)")?;
            Ok(())
        })])
        .await
        .unwrap();
    let hash = request_hash(b"{}").unwrap();
    let mut tickets = Vec::new();
    for n in 0..20 {
        let Claim::Execute(ticket) = cache.claim(&key(n), "message/send", &hash).await.unwrap()
        else {
            panic!()
        };
        tickets.push(ticket);
    }
    // Concurrent completions share the writer's batches; call 7 writes a name twice.
    let completions = tickets.into_iter().enumerate().map(|(n, ticket)| {
        let mut writes = vec![effect(&format!("row-{n:02}"))];
        if n == 7 {
            writes.push(effect("row-07"));
        }
        ticket.complete_with(response(&format!("body-{n}")), writes)
    });
    // A write that must run once (as `Database::transact`'s do) shares the batches too: a
    // redo of a batch never runs it twice.
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let once = store.apply(vec![idem_runtime::SqlWrite::once(move |db| {
        counted.fetch_add(1, Ordering::SeqCst);
        db.execute("INSERT INTO effects (name) VALUES ('once')", [])?;
        Ok(())
    })]);
    let (outcomes, once) = tokio::join!(futures::future::join_all(completions), once);
    once.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    for (n, outcome) in outcomes.iter().enumerate() {
        match n {
            7 => assert!(matches!(outcome, Err(idem_runtime::StoreError::Write(_)))),
            _ => assert!(outcome.is_ok(), "{n}: {outcome:?}"),
        }
    }
    let expected: Vec<String> = std::iter::once("once".to_owned())
        .chain((0..20).filter(|n| *n != 7).map(|n| format!("row-{n:02}")))
        .collect();
    assert_eq!(
        effects(&fx.path),
        expected,
        "call 7's first row was undone with it"
    );
    assert!(cached_body(&cache, &key(7)).await.is_none());
    assert_eq!(cached_body(&cache, &key(8)).await.unwrap(), b"body-8");
    // Its key was released: a retry claims it and executes.
    assert!(wins(&cache, &key(7), &hash).await);
}

#[tokio::test]
async fn a_stream_left_open_by_a_dead_process_is_closed_as_interrupted_by_the_next_claim() {
    let fx = Fixture::new();
    let hash = request_hash(br#"{"s":1}"#).unwrap();
    {
        let cache = fx.cache(&config(86_400, 100));
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
        ticket.append_event(1, second).await.unwrap();
        // The process "dies": the ticket is never completed; the store is closed under it.
        std::mem::forget(ticket);
    }
    let cache = fx.cache(&config(86_400, 100));
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
        T0_MS / 1000,
        "counted from the stream's start"
    );
    assert_eq!(
        entry.response.headers,
        vec![("content-type".into(), "text/event-stream".into())]
    );
    // From now on this is the cached outcome, and the open record is gone.
    let again = cache.store().get(&key(1)).await.unwrap().unwrap();
    assert_eq!(again.response.body, entry.response.body);
    let conn = rusqlite::Connection::open(&fx.path).unwrap();
    let open: i64 = conn
        .query_row("SELECT COUNT(*) FROM idempotency_open_streams", [], |r| {
            r.get(0)
        })
        .unwrap();
    let events: i64 = conn
        .query_row("SELECT COUNT(*) FROM idempotency_stream_events", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!((open, events), (0, 0));
}

fn bytes_of(text: &str) -> bytes::Bytes {
    bytes::Bytes::copy_from_slice(text.as_bytes())
}

/// The memory tier holds entries, never answers: whatever it holds, the answers are the file's.
/// `spelled` is the one answer only the tier gives (a resend of the very same bytes).
#[tokio::test]
async fn the_memory_tier_never_answers_what_the_store_would_not() {
    let fx = Fixture::new();
    let cache = fx.cache(&config(60, 2));
    let store = cache.store().clone();
    let (a, b, c) = (key(1), key(2), key(3));
    let spelled_a = idem_runtime::spelling(br#"{"v":"a"}"#);
    execute(&cache, &a, r#"{"v":"a"}"#, "A").await;
    store.note_spelling(&a, spelled_a);
    let entry = store
        .spelled(&spelled_a)
        .expect("a resend of the same bytes");
    assert_eq!(entry.response.body, b"A");
    assert_eq!(entry.method, "message/send", "the caller checks its method");
    let other = idem_runtime::spelling(br#"{"v":"b"}"#);
    assert!(store.spelled(&other).is_none(), "other bytes: hash them");

    // The LRU bound: a, then b and c; a is the least recently used and leaves everywhere.
    fx.clock.advance(Duration::from_millis(10));
    execute(&cache, &b, "{}", "B").await;
    fx.clock.advance(Duration::from_millis(10));
    execute(&cache, &c, "{}", "C").await;
    assert!(store.spelled(&spelled_a).is_none(), "evicted from the file");
    assert!(cached_body(&cache, &a).await.is_none());
    let hash_a = request_hash(br#"{"v":"a"}"#).unwrap();
    assert!(wins(&cache, &a, &hash_a).await);

    // The TTL, by the store's own rule (live at exactly ttl, gone one second later).
    let spelled_b = idem_runtime::spelling(b"{}");
    store.note_spelling(&b, spelled_b);
    fx.clock.advance(Duration::from_secs(60));
    assert!(store.spelled(&spelled_b).is_some());
    fx.clock.advance(Duration::from_secs(1));
    assert!(store.spelled(&spelled_b).is_none(), "past the TTL");
    assert!(cached_body(&cache, &b).await.is_none());

    // The sweep deletes them; the key index forgets them with the rows.
    assert_eq!(store.sweep().await.unwrap(), 2);
    let hash = request_hash(b"{}").unwrap();
    for k in [&b, &c] {
        assert!(wins(&cache, k, &hash).await);
    }
}

#[tokio::test]
async fn a_restart_starts_with_an_empty_tier_and_gives_the_same_answers() {
    let fx = Fixture::new();
    let spelled = idem_runtime::spelling(br#"{"v":1}"#);
    {
        let cache = fx.cache(&config(86_400, 100));
        execute(&cache, &key(1), r#"{"v":1}"#, "one").await;
        cache.store().note_spelling(&key(1), spelled);
        assert!(cache.store().spelled(&spelled).is_some());
    }
    let cache = fx.cache(&config(86_400, 100));
    assert!(
        cache.store().spelled(&spelled).is_none(),
        "nothing in memory survives the process"
    );
    // The key index is rebuilt from the file: the key is not taken for new.
    let hash = request_hash(br#"{"v":1}"#).unwrap();
    let Claim::Cached(entry) = cache.claim(&key(1), "message/send", &hash).await.unwrap() else {
        panic!("the file still holds the entry");
    };
    assert_eq!(entry.response.body, b"one");
    // Read once, it is in memory again; the bytes it was asked with are learnt anew.
    cache.store().note_spelling(&key(1), spelled);
    let again = cache.store().spelled(&spelled).unwrap();
    assert_eq!(*again, *entry);
}

#[tokio::test]
async fn with_the_tier_off_every_answer_is_the_same() {
    let fx = Fixture::new();
    let off = IdempotencyConfig {
        memory_tier_bytes: 0,
        ..config(60, 2)
    };
    let cache = fx.cache(&off);
    execute(&cache, &key(1), "{}", "one").await;
    let spelled = idem_runtime::spelling(b"{}");
    cache.store().note_spelling(&key(1), spelled);
    assert!(cache.store().spelled(&spelled).is_none());
    assert_eq!(cached_body(&cache, &key(1)).await.unwrap(), b"one");
    fx.clock.advance(Duration::from_secs(61));
    assert!(cached_body(&cache, &key(1)).await.is_none());
}
