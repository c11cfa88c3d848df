//! What only the SQLite store has: one file, its schema and modes, its single writer and
//! lock, and the memory tier.

use std::os::unix::fs::PermissionsExt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::claim::{Claim, IdempotencyCache, Waited};
use crate::hash::request_hash;
use crate::store::{Entry, SqlWrite, SqliteStore, Store, StoreError};
use crate::IdempotencyConfig;

use crate::store::tests::fixture::Fixture;
use crate::store::tests::pausing::Pausing;
use crate::store::tests::support::*;

/// Spec §4.4's table and index, plus two columns; `message_id` is unique by the writer, not by
/// an index on disk (`key_index.rs` says why).
#[tokio::test]
async fn schema_is_the_spec_table_plus_documented_columns() {
    let fx = Fixture::sqlite();
    let _cache = fx.cache(&config(86_400, 100)).await;
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
        ("entry_id", "INTEGER", false, true),
        ("message_id", "TEXT", true, false),
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
    // The key index loads from an index at open, not from the rows.
    let plan: String = conn
        .query_row(
            "EXPLAIN QUERY PLAN SELECT rowid, message_id FROM idempotency_cache",
            [],
            |r| r.get(3),
        )
        .unwrap();
    assert!(
        plan.contains("COVERING INDEX idx_idempotency_last_used_at"),
        "{plan}"
    );
    let journal: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(journal, "wal");
}

#[tokio::test]
async fn shares_the_file_with_application_tables() {
    let fx = Fixture::sqlite();
    {
        let conn = rusqlite::Connection::open(&fx.path).unwrap();
        conn.execute_batch(
            "CREATE TABLE tasks (id TEXT PRIMARY KEY); INSERT INTO tasks VALUES ('t1');",
        )
        .unwrap();
    }
    let cache = fx.cache(&config(86_400, 100)).await;
    execute(&cache, &key(1), "{}", "x").await;
    let conn = rusqlite::Connection::open(&fx.path).unwrap();
    let n: i64 = conn
        .query_row("SELECT COUNT(*) FROM tasks", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 1);
}

#[tokio::test]
async fn new_database_files_are_private() {
    let fx = Fixture::sqlite();
    let cache = fx.cache(&config(86_400, 100)).await;
    execute(&cache, &key(1), "{}", "x").await;
    for suffix in ["", "-wal", "-shm"] {
        let path = format!("{}{suffix}", fx.path.display());
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{path}");
    }
}

#[tokio::test]
async fn closed_store_fails_loudly() {
    let fx = Fixture::sqlite();
    let store = SqliteStore::open_with_clock(&fx.path, &config(60, 10), fx.clock.clone()).unwrap();
    let store = Arc::new(store);
    let cache = IdempotencyCache::from_arc(store.clone());
    let stored = execute(&cache, &key(1), "{}", "in memory").await;
    let spelling = sent(b"{}");
    store.note_spellings(&stored, &[spelling]);
    assert!(found(&*store, &spelling).is_some());
    store.close();
    let closed = |result: Result<(), crate::store::StoreError>| {
        matches!(result, Err(crate::store::StoreError::Closed))
    };
    assert!(closed(store.sweep().await.map(drop)));
    // Memory answers nothing once the file is released: not the stored key, not a fresh one.
    assert!(closed(store.get(&key(1)).await.map(drop)));
    assert!(closed(store.lookup(&key(1)).await.map(drop)));
    assert!(closed(store.lookup(&key(2)).await.map(drop)));
    assert!(found(&*store, &spelling).is_none());
}

/// A panic of the writer's own, not of a write it runs (which fails that write alone), may
/// leave what the process knows of the file out of step with it: the store closes. Writes
/// fail, memory answers nothing, and what was committed is still read from the file.
#[tokio::test]
async fn a_panic_of_the_writer_itself_closes_the_store() {
    use crate::store::sqlite::Unanswered;
    use crate::store::StoreError;
    let fx = Fixture::sqlite();
    let store = SqliteStore::open_with_clock(&fx.path, &config(60, 10), fx.clock.clone()).unwrap();
    let store = Arc::new(store);
    let cache = IdempotencyCache::from_arc(store.clone());
    let stored = execute(&cache, &key(1), "{}", "committed").await;
    let spelling = sent(b"{}");
    store.note_spellings(&stored, &[spelling]);
    let bug = |_: &rusqlite::Connection, _: &mut _| -> Result<(), StoreError> {
        panic!("a bug of the store's own")
    };
    let answer = store.write(Unanswered::Forgotten, true, 0, bug).await;
    assert!(matches!(answer, Err(StoreError::Closed)), "{answer:?}");
    assert!(found(&*store, &spelling).is_none());
    let hash = request_hash(b"{}").unwrap();
    let fresh = cache.claim(&key(2), "message/send", &hash).await;
    let refused = match fresh {
        Ok(Claim::Execute(ticket)) => ticket.complete(response("lost")).await.err(),
        other => other.err(),
    };
    assert!(matches!(refused, Some(StoreError::Closed)), "{refused:?}");
    let read = store
        .get(&key(1))
        .await
        .unwrap()
        .expect("committed, read from the file");
    assert_eq!(read.response.body, b"committed");
}

/// A batch is bounded by the bytes of answers it carries as well as by its count: large
/// answers commit in several transactions, never one as large as all of them.
#[test]
fn a_batch_closes_at_its_byte_bound() {
    use crate::store::sqlite::job::{Call, Job};
    use crate::store::sqlite::writer::{gather, MAX_BATCH, MAX_BATCH_BYTES};
    let job = |bytes: usize| -> Box<dyn Job> {
        let (call, _) = Call::new(true, bytes, |_, _| Ok(()));
        Box::new(call)
    };
    let (queue, jobs) = std::sync::mpsc::channel();
    let quarter = MAX_BATCH_BYTES / 4;
    for _ in 0..9 {
        queue.send(job(quarter)).unwrap();
    }
    let sizes: Vec<usize> = std::iter::from_fn(|| jobs.try_recv().ok())
        .map(|first| gather(first, &jobs).len())
        .collect();
    assert_eq!(sizes, [4, 4, 1]);
    for _ in 0..MAX_BATCH + 1 {
        queue.send(job(0)).unwrap();
    }
    queue.send(job(2 * MAX_BATCH_BYTES)).unwrap();
    let first = jobs.try_recv().unwrap();
    assert_eq!(gather(first, &jobs).len(), MAX_BATCH);
    let first = jobs.try_recv().unwrap();
    assert_eq!(
        gather(first, &jobs).len(),
        2,
        "a write over the bound is still taken"
    );
}

#[test]
fn unusable_path_is_an_error_not_a_panic() {
    let err = SqliteStore::open("/nonexistent-dir/x/cache.db", &IdempotencyConfig::default())
        .err()
        .unwrap();
    assert!(err.to_string().contains("No such file"), "{err}");
    assert!(
        err.to_string().contains("/nonexistent-dir/x/cache.db"),
        "names the file: {err}"
    );
}

#[tokio::test]
async fn a_write_waits_for_the_applications_write_lock_instead_of_failing() {
    let fx = Fixture::sqlite();
    let cache = fx.cache(&config(86_400, 100)).await;
    execute(&cache, &key(1), "{}", "before").await;
    while_another_connection_writes(&fx.path, execute(&cache, &key(2), "{}", "during")).await;
    assert_eq!(cached_body(&cache, &key(2)).await.unwrap(), b"during");
}

/// The same after an application's write set the writer's busy timeout to zero through the
/// connection's API, which the authorizer does not see: every batch that met another
/// connection's lock failed, "database is locked", until a restart (helper-93).
#[tokio::test]
async fn a_write_that_sets_the_busy_timeout_leaves_the_writer_s_own() {
    let fx = Fixture::sqlite();
    let store = fx.store(&config(86_400, 100)).await;
    let cache = IdempotencyCache::from_arc(store.clone());
    let zero = SqlWrite::rerunnable(|db| Ok(db.busy_timeout(Duration::ZERO)?));
    store.apply(vec![zero]).await.unwrap();
    while_another_connection_writes(&fx.path, execute(&cache, &key(2), "{}", "during")).await;
    assert_eq!(cached_body(&cache, &key(2)).await.unwrap(), b"during");
}

/// Runs `call` while a connection of its own (the application's other one, an operator's
/// purge) holds the file's write lock for 300 ms.
async fn while_another_connection_writes<T>(
    path: &std::path::Path,
    call: impl std::future::Future<Output = T>,
) -> T {
    let path = path.to_path_buf();
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
    let out = call.await;
    holder.join().unwrap();
    out
}

#[tokio::test]
async fn a_second_store_on_the_same_file_is_refused_until_the_first_closes() {
    let fx = Fixture::sqlite();
    let first = SqliteStore::open_with_clock(&fx.path, &config(60, 10), fx.clock.clone()).unwrap();
    let refused = SqliteStore::open(&fx.path, &config(60, 10)).err().unwrap();
    let message = refused.to_string();
    assert!(
        matches!(refused, crate::store::StoreError::InUse { .. }),
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

/// A file renamed while served keeps its lock: a store on its new name (whose lock file is
/// another) is refused, where before it opened the file without the log its name no longer
/// matched. Free again once the first store closed.
#[cfg(unix)]
#[tokio::test]
async fn a_served_file_renamed_is_refused_under_its_new_name() {
    let fx = Fixture::sqlite();
    let first = SqliteStore::open(&fx.path, &config(60, 10)).unwrap();
    let renamed = fx.path.with_file_name("renamed.db");
    std::fs::rename(&fx.path, &renamed).unwrap();
    let held = sqlite_locks_on(&renamed);
    let refused = SqliteStore::open(&renamed, &config(60, 10)).err();
    // Refused in this process without a descriptor of the file closed, which would have
    // dropped the first store's `fcntl` locks on it.
    assert_eq!(sqlite_locks_on(&renamed), held, "the first store's locks");
    let Some(crate::store::StoreError::ServedElsewhere { path }) = &refused else {
        panic!("{refused:?}");
    };
    assert_eq!(path, &renamed);
    let message = refused.unwrap().to_string();
    assert!(
        message.contains("renamed or moved while served"),
        "{message}"
    );
    first.close();
    SqliteStore::open(&renamed, &config(60, 10)).expect("free once the first closed");
}

/// A served file whose lock file was deleted is still refused, by the file's own lock, and the
/// error says so (it spoke of a rename alone: helper-63).
#[cfg(unix)]
#[tokio::test]
async fn a_served_file_whose_lock_file_was_deleted_is_refused_saying_so() {
    let fx = Fixture::sqlite();
    let first = SqliteStore::open(&fx.path, &config(60, 10)).unwrap();
    std::fs::remove_file(format!("{}.lock", fx.path.display())).unwrap();
    let refused = SqliteStore::open(&fx.path, &config(60, 10)).err();
    let message = refused.expect("refused").to_string();
    assert!(message.contains("lock file was deleted"), "{message}");
    first.close();
}

/// This process's `fcntl` locks on `file`, as /proc/locks lists them (SQLite's).
#[cfg(unix)]
fn sqlite_locks_on(file: &std::path::Path) -> Vec<String> {
    use std::os::unix::fs::MetadataExt;
    let inode = format!(":{}", std::fs::metadata(file).unwrap().ino());
    let pid = std::process::id().to_string();
    let locks = std::fs::read_to_string("/proc/locks").unwrap_or_default();
    let ours = locks.lines().filter(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        fields.get(1) == Some(&"POSIX")
            && fields.get(4) == Some(&pid.as_str())
            && fields.get(5).is_some_and(|id| id.ends_with(&inode))
    });
    ours.map(|line| line.split_once(' ').map_or(line, |(_, l)| l).to_owned())
        .collect()
}

/// The lock is the file's, not the name's: a symlink to a served file, or a path through
/// `..`, is refused like its own name; a file with a second name (a hard link) is refused even
/// alone, since SQLite would keep one log per name over it. Before, a second server on a
/// symlink started, and each messageId then executed once per server.
#[cfg(unix)]
#[tokio::test]
async fn other_names_of_a_served_file_are_refused_and_hard_links_always() {
    let fx = Fixture::sqlite();
    let first = SqliteStore::open(&fx.path, &config(60, 10)).unwrap();
    let dir = fx.path.parent().unwrap();
    let alias = dir.join("alias.db");
    std::os::unix::fs::symlink(&fx.path, &alias).unwrap();
    let detour = dir.join("sub");
    std::fs::create_dir(&detour).unwrap();
    let detour = detour.join("..").join(fx.path.file_name().unwrap());
    for other in [&alias, &detour] {
        let refused = SqliteStore::open(other, &config(60, 10)).err();
        assert!(
            matches!(refused, Some(crate::store::StoreError::InUse { .. })),
            "{}: {refused:?}",
            other.display()
        );
    }
    first.close();

    let linked = dir.join("linked.db");
    std::fs::hard_link(&fx.path, &linked).unwrap();
    for name in [&fx.path, &linked] {
        let refused = SqliteStore::open(name, &config(60, 10)).err();
        let Some(crate::store::StoreError::HardLinked { links, .. }) = refused else {
            panic!("{}: {refused:?}", name.display());
        };
        assert_eq!(links, 2);
    }
    std::fs::remove_file(&linked).unwrap();
    SqliteStore::open(&alias, &config(60, 10)).expect("one name again, through a symlink");

    // A directory is said to be one (found by helper-45: it was taken for a file of several
    // names, its links being its entries).
    let refused = SqliteStore::open(dir, &config(60, 10)).err().unwrap();
    assert!(refused.to_string().contains("is a directory"), "{refused}");
}

/// The memory tier holds entries, never answers: whatever it holds, the answers are the file's.
/// `spelled` is the one answer only the tier gives (a resend of the very same bytes).
#[tokio::test]
async fn the_memory_tier_never_answers_what_the_store_would_not() {
    let fx = Fixture::sqlite();
    let cache = fx.cache(&config(60, 2)).await;
    let store = cache.store().clone();
    let (a, b, c) = (key(1), key(2), key(3));
    let spelled_a = sent(br#"{"v":"a"}"#);
    let entry_a = execute(&cache, &a, r#"{"v":"a"}"#, "A").await;
    store.note_spellings(&entry_a, &[spelled_a]);
    let entry = found(&*store, &spelled_a).expect("a resend of the same bytes");
    assert_eq!(entry.response.body, b"A");
    assert_eq!(entry.method, "message/send", "the caller checks its method");
    let other = sent(br#"{"v":"b"}"#);
    assert!(found(&*store, &other).is_none(), "other bytes: hash them");

    // The LRU bound: a, then b and c; a is the least recently used and leaves everywhere.
    fx.clock.advance(Duration::from_millis(10));
    let entry_b = execute(&cache, &b, "{}", "B").await;
    fx.clock.advance(Duration::from_millis(10));
    execute(&cache, &c, "{}", "C").await;
    assert!(
        found(&*store, &spelled_a).is_none(),
        "evicted from the file"
    );
    assert!(cached_body(&cache, &a).await.is_none());
    let hash_a = request_hash(br#"{"v":"a"}"#).unwrap();
    assert!(wins(&cache, &a, &hash_a).await);

    // The TTL, by the store's own rule (live at exactly ttl, gone one second later).
    let spelled_b = sent(b"{}");
    store.note_spellings(&entry_b, &[spelled_b]);
    fx.clock.advance(Duration::from_secs(60));
    assert!(found(&*store, &spelled_b).is_some());
    fx.clock.advance(Duration::from_secs(1));
    assert!(found(&*store, &spelled_b).is_none(), "past the TTL");
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
    let fx = Fixture::sqlite();
    let spelled = sent(br#"{"v":1}"#);
    {
        let cache = fx.cache(&config(86_400, 100)).await;
        let one = execute(&cache, &key(1), r#"{"v":1}"#, "one").await;
        cache.store().note_spellings(&one, &[spelled]);
        assert!(found(&**cache.store(), &spelled).is_some());
    }
    let cache = fx.cache(&config(86_400, 100)).await;
    assert!(
        found(&**cache.store(), &spelled).is_none(),
        "nothing in memory survives the process"
    );
    // The key index is rebuilt from the file: the key is not taken for new.
    let hash = request_hash(br#"{"v":1}"#).unwrap();
    let Claim::Cached(entry) = cache.claim(&key(1), "message/send", &hash).await.unwrap() else {
        panic!("the file still holds the entry");
    };
    assert_eq!(entry.response.body, b"one");
    // Read once, it is in memory again; the bytes it was asked with are learnt anew.
    cache.store().note_spellings(&entry, &[spelled]);
    let again = found(&**cache.store(), &spelled).unwrap();
    assert_eq!(*again, *entry);
}

#[tokio::test]
async fn with_the_tier_off_every_answer_is_the_same() {
    let fx = Fixture::sqlite();
    let off = config(60, 2).with(|c| c.memory_tier_bytes = 0);
    let cache = fx.cache(&off).await;
    let one = execute(&cache, &key(1), "{}", "one").await;
    let spelled = sent(b"{}");
    cache.store().note_spellings(&one, &[spelled]);
    assert!(found(&**cache.store(), &spelled).is_none());
    assert_eq!(cached_body(&cache, &key(1)).await.unwrap(), b"one");
    fx.clock.advance(Duration::from_secs(61));
    assert!(cached_body(&cache, &key(1)).await.is_none());
}

/// A write that must run once (as `Database::transact`'s do) shares the writer's batches with
/// calls whose writes fail: a redo of a batch never runs it twice.
#[tokio::test]
async fn a_write_that_runs_once_runs_once_through_a_redone_batch() {
    let fx = Fixture::sqlite();
    let cache = fx.cache(&config(86_400, 100)).await;
    let store = cache.store().clone();
    fx.create_effects(&store).await;
    let hash = request_hash(b"{}").unwrap();
    let Claim::Execute(failing) = cache.claim(&key(1), "message/send", &hash).await.unwrap() else {
        panic!()
    };
    let twice = vec![fx.effect("dup"), fx.effect("dup")];
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let once = store.apply(vec![crate::store::SqlWrite::once(move |db| {
        counted.fetch_add(1, Ordering::SeqCst);
        db.execute("INSERT INTO effects (name) VALUES ('once')", [])?;
        Ok(())
    })]);
    let (failed, once) = tokio::join!(failing.complete_with(response("x"), twice), once);
    assert!(matches!(failed, Err(crate::store::StoreError::Write(_))));
    once.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(fx.effects().await, vec!["once".to_owned()]);
}

/// A write that has SQLite roll the whole transaction back (`INSERT OR ROLLBACK` on a taken
/// name, as a trigger's `RAISE(ROLLBACK)` would) fails its own call: the others in its batch
/// commit, with their entries, as if it had not been there.
#[tokio::test]
async fn a_write_that_rolls_the_batch_back_fails_its_own_call_only() {
    let (fx, results) = one_batch(|fx| {
        vec![
            fx.effect("a"),
            crate::store::SqlWrite::rerunnable(|db| {
                db.execute(
                    "INSERT OR ROLLBACK INTO effects (name) VALUES ('taken')",
                    [],
                )?;
                Ok(())
            }),
            fx.effect("c"),
            once("d"),
        ]
    })
    .await;
    assert!(results[0].is_ok() && results[2].is_ok(), "{results:?}");
    let failed = results[1].as_ref().unwrap_err();
    assert!(
        matches!(failed, crate::store::StoreError::Write(_)),
        "{failed}"
    );
    assert!(
        failed.to_string().contains("UNIQUE"),
        "its own error: {failed}"
    );
    assert!(
        results[3].is_ok(),
        "a write that runs once, queued after it"
    );
    assert_eq!(fx.effects().await, ["a", "c", "d", "taken"]);
}

/// A write that has SQLite roll the batch back and swallows the error fails its own call all
/// the same, and nothing after it commits on its own: not its later statements, not the next
/// calls' writes and entries (which would be told the batch failed and run again). So does a
/// write that commits by itself.
#[tokio::test]
async fn a_write_that_ends_the_batch_silently_fails_its_own_call_only() {
    let (fx, results) = one_batch(|fx| {
        vec![
            fx.effect("a"),
            crate::store::SqlWrite::rerunnable(|db| {
                let _ = db.execute(
                    "INSERT OR ROLLBACK INTO effects (name) VALUES ('taken')",
                    [],
                );
                db.execute("INSERT INTO effects (name) VALUES ('after it')", [])?;
                Ok(())
            }),
            fx.effect("c"),
            crate::store::SqlWrite::rerunnable(|db| {
                let _ = db.execute(
                    "INSERT OR ROLLBACK INTO effects (name) VALUES ('taken')",
                    [],
                );
                let _ = db.execute("INSERT INTO effects (name) VALUES ('swallowed')", []);
                Ok(())
            }),
            crate::store::SqlWrite::rerunnable(|db| {
                db.execute("INSERT INTO effects (name) VALUES ('committed alone')", [])?;
                db.execute_batch("COMMIT")?;
                Ok(())
            }),
            fx.effect("f"),
            once("g"),
        ]
    })
    .await;
    for ok in [0, 2, 5, 6] {
        assert!(results[ok].is_ok(), "{ok}: {results:?}");
    }
    for failed in [1, 3, 4] {
        let error = results[failed].as_ref().unwrap_err();
        assert!(
            matches!(error, crate::store::StoreError::Write(_)),
            "{failed}: {error}"
        );
    }
    assert_eq!(fx.effects().await, ["a", "c", "f", "g", "taken"]);
}

/// A write that rolls the batch back and opens a transaction of its own (`ROLLBACK; BEGIN`,
/// or a `SAVEPOINT`, which opens one outside a transaction) fails its own call, and that
/// transaction is not taken for the batch's: the calls before it, whose work the rollback
/// took, are not answered as stored, and the calls after it do not commit in it.
#[tokio::test]
async fn a_write_that_rolls_back_and_begins_anew_fails_its_own_call_only() {
    let reopening = |sql: &'static str| {
        crate::store::SqlWrite::rerunnable(move |db| {
            db.execute_batch(sql)?;
            db.execute("INSERT INTO effects (name) VALUES ('reopened')", [])?;
            Ok(())
        })
    };
    let (fx, results) = one_batch(|fx| {
        vec![
            fx.effect("a"),
            reopening("ROLLBACK; BEGIN"),
            fx.effect("c"),
            reopening("ROLLBACK; SAVEPOINT s"),
            fx.effect("e"),
            once("f"),
        ]
    })
    .await;
    for ok in [0, 2, 4, 5] {
        assert!(results[ok].is_ok(), "{ok}: {results:?}");
    }
    for failed in [1, 3] {
        let error = results[failed].as_ref().unwrap_err();
        assert!(
            matches!(error, crate::store::StoreError::Write(_)),
            "{failed}: {error}"
        );
    }
    assert_eq!(fx.effects().await, ["a", "c", "e", "f", "taken"]);
}

/// A write that panics fails its own call, as an error would; the writer thread, which every
/// call needs, lives on.
#[tokio::test]
async fn a_write_that_panics_fails_its_own_call_and_the_writer_lives() {
    let (fx, results) = one_batch(|fx| {
        vec![
            fx.effect("a"),
            crate::store::SqlWrite::rerunnable(|_| panic!("a bug in the application")),
            fx.effect("c"),
            crate::store::SqlWrite::once(|_| panic!("a bug, run once")),
            once("d"),
        ]
    })
    .await;
    assert!(results[0].is_ok() && results[2].is_ok() && results[4].is_ok());
    for failed in [&results[1], &results[3]] {
        let failed = failed.as_ref().unwrap_err();
        assert!(failed.to_string().contains("panicked: a bug"), "{failed}");
    }
    assert_eq!(fx.effects().await, ["a", "c", "d", "taken"]);
    let store = fx.store(&config(86_400, 100)).await;
    store.apply(vec![fx.effect("after")]).await.unwrap();
    assert_eq!(fx.effects().await, ["a", "after", "c", "d", "taken"]);
}

/// A write that rolls the batch back and returns an error in words of its own (no SQLite
/// error among its causes; `Database::transact` returns such an error for any refusal) fails
/// its own call only, as one that returns SQLite's error does (found by helper-44: the whole
/// batch failed).
#[tokio::test]
async fn a_write_that_rolls_the_batch_back_with_an_error_of_its_own_fails_alone() {
    let rolling_back = |once: bool| {
        let work = |db: &rusqlite::Connection| {
            db.execute(
                "INSERT OR ROLLBACK INTO effects (name) VALUES ('taken')",
                [],
            )
            .map_err(|e| format!("the name is taken ({e})"))?;
            Ok(())
        };
        match once {
            true => crate::store::SqlWrite::once(work),
            false => crate::store::SqlWrite::rerunnable(work),
        }
    };
    let (fx, results) = one_batch(|fx| {
        vec![
            fx.effect("a"),
            rolling_back(false),
            fx.effect("c"),
            rolling_back(true),
            once("e"),
        ]
    })
    .await;
    for ok in [0, 2, 4] {
        assert!(results[ok].is_ok(), "{ok}: {results:?}");
    }
    for failed in [1, 3] {
        let error = results[failed].as_ref().unwrap_err();
        assert!(error.to_string().contains("the name is taken"), "{error}");
    }
    assert_eq!(fx.effects().await, ["a", "c", "e", "taken"]);
}

/// A write that leaves a deferred foreign key unresolved passes its statements and fails the
/// batch's `COMMIT`, where SQLite checks such keys: it fails its own call, with its error, and
/// the calls beside it commit (found by helper-44: every call of the batch failed, the guilty
/// one too, as the store's failure). The writes that run once ran in the lost transaction.
#[tokio::test]
async fn a_write_that_leaves_a_deferred_foreign_key_unresolved_fails_alone() {
    let orphan = || {
        crate::store::SqlWrite::rerunnable(|db| {
            db.execute_batch(
                "CREATE TABLE IF NOT EXISTS parent (id INTEGER PRIMARY KEY);
                 CREATE TABLE IF NOT EXISTS child (parent INTEGER
                     REFERENCES parent (id) DEFERRABLE INITIALLY DEFERRED);
                 INSERT INTO child VALUES (999);",
            )?;
            Ok(())
        })
    };
    let refusing = || crate::store::SqlWrite::once(|_| Err("the application refuses".into()));
    let (fx, results) = one_batch(|fx| {
        vec![
            fx.effect("a"),
            orphan(),
            fx.effect("c"),
            once("d"),
            refusing(),
        ]
    })
    .await;
    assert!(results[0].is_ok() && results[2].is_ok(), "{results:?}");
    let failed = results[1].as_ref().unwrap_err();
    assert!(
        matches!(failed, crate::store::StoreError::Write(_)),
        "its own failure: {failed}"
    );
    assert!(failed.to_string().contains("FOREIGN KEY"), "{failed}");
    let lost = results[3].as_ref().unwrap_err();
    assert!(
        matches!(lost, crate::store::StoreError::Commit(_)),
        "{lost}"
    );
    assert!(lost.to_string().contains("deferred foreign key"), "{lost}");
    // A refusal keeps its own error (found by helper-46: it was told its work was lost).
    let refused = results[4].as_ref().unwrap_err();
    assert!(
        refused.to_string().contains("the application refuses"),
        "{refused}"
    );
    assert_eq!(fx.effects().await, ["a", "c", "taken"]);

    // Alone in its batch, it is its own failure too.
    let store = fx.store(&config(86_400, 100)).await;
    let alone = store.apply(vec![orphan()]).await.unwrap_err();
    assert!(
        matches!(alone, crate::store::StoreError::Write(_)),
        "{alone}"
    );
    store.apply(vec![fx.effect("after")]).await.unwrap();
}

/// A write that runs once and refuses keeps its own error when a later write rolls the batch
/// back (found by helper-44: it was told the transaction was lost, and `Database::transact`
/// reported the store's failure instead of the application's refusal).
#[tokio::test]
async fn a_refusal_keeps_its_own_error_when_another_write_rolls_the_batch_back() {
    let (_fx, results) = one_batch(|_| {
        vec![
            crate::store::SqlWrite::once(|_| Err("the application refuses".into())),
            crate::store::SqlWrite::once(|db| {
                let _ = db.execute(
                    "INSERT OR ROLLBACK INTO effects (name) VALUES ('taken')",
                    [],
                );
                Ok(())
            }),
        ]
    })
    .await;
    let refused = results[0].as_ref().unwrap_err();
    assert!(
        refused.to_string().contains("the application refuses"),
        "{refused}"
    );
    assert!(results[1].is_err());
}

/// What a write captured, panicking as the writer drops it after the commit, leaves the writer
/// thread alive: every later write needs it (found by helper-44: every write after it failed
/// as closed, for the life of the process).
#[tokio::test]
async fn a_write_whose_captures_panic_as_they_are_dropped_leaves_the_writer_alive() {
    struct PanicsOnDrop;
    impl Drop for PanicsOnDrop {
        fn drop(&mut self) {
            panic!("a bug in a value the write captured");
        }
    }
    let fx = Fixture::sqlite();
    let store = fx.store(&config(86_400, 100)).await;
    fx.create_effects(&store).await;
    let captured = PanicsOnDrop;
    let write = crate::store::SqlWrite::rerunnable(move |db| {
        let _ = &captured;
        db.execute("INSERT INTO effects (name) VALUES ('a')", [])?;
        Ok(())
    });
    store.apply(vec![write]).await.unwrap();
    store.apply(vec![fx.effect("b")]).await.unwrap();
    assert_eq!(fx.effects().await, ["a", "b"]);
}

/// A write of `name` that may run only once, as `Database::transact`'s.
fn once(name: &str) -> crate::store::SqlWrite {
    let name = name.to_owned();
    crate::store::SqlWrite::once(move |db| {
        db.execute("INSERT INTO effects (name) VALUES (?1)", [&name])?;
        Ok(())
    })
}

/// Each of the writes `writes` makes, in a call of its own (the ones that may run again
/// with an entry, as a call's staged writes commit), all queued while the application holds
/// the file's write lock so that they commit in one batch; with `taken` already in effects.
async fn one_batch(
    writes: impl FnOnce(&Fixture) -> Vec<crate::store::SqlWrite>,
) -> (Fixture, Vec<Result<(), crate::store::StoreError>>) {
    one_batch_with(config(86_400, 100), writes).await
}

/// [`one_batch`] on a store of `config`.
async fn one_batch_with(
    config: IdempotencyConfig,
    writes: impl FnOnce(&Fixture) -> Vec<crate::store::SqlWrite>,
) -> (Fixture, Vec<Result<(), crate::store::StoreError>>) {
    let fx = Fixture::sqlite();
    // No memory tier: an entry the batch lost must not be found in memory by the checks.
    let cache = fx.cache(&config.with(|c| c.memory_tier_bytes = 0)).await;
    let store = cache.store().clone();
    fx.create_effects(&store).await;
    store.apply(vec![fx.effect("taken")]).await.unwrap();
    let writes = writes(&fx);
    let (release, lock_released) = std::sync::mpsc::channel::<()>();
    let (locked, is_locked) = std::sync::mpsc::channel();
    let path = fx.path.clone();
    let holder = std::thread::spawn(move || {
        let conn = rusqlite::Connection::open(path).unwrap();
        conn.execute_batch("BEGIN IMMEDIATE").unwrap();
        locked.send(()).unwrap();
        lock_released.recv().unwrap();
        conn.execute_batch("COMMIT").unwrap();
    });
    is_locked.recv().unwrap();
    // The writer takes this one and waits for the lock; the calls queue up behind it.
    let first = tokio::spawn({
        let store = store.clone();
        async move { store.apply(Vec::new()).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let with_entry: Vec<bool> = writes.iter().map(|w| w.is_rerunnable()).collect();
    let calls: Vec<_> = writes
        .into_iter()
        .enumerate()
        .map(|(n, write)| {
            let (cache, store) = (cache.clone(), store.clone());
            tokio::spawn(async move {
                if !write.is_rerunnable() {
                    return store.apply(vec![write]).await;
                }
                let hash = request_hash(b"{}").unwrap();
                let Claim::Execute(ticket) = cache
                    .claim(&key(n as u32), "message/send", &hash)
                    .await
                    .unwrap()
                else {
                    panic!("a fresh key")
                };
                ticket
                    .complete_with(response("x"), vec![write])
                    .await
                    .map(drop)
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    release.send(()).unwrap();
    holder.join().unwrap();
    first.await.unwrap().unwrap();
    let mut results = Vec::new();
    for call in calls {
        results.push(call.await.unwrap());
    }
    for (n, result) in results.iter().enumerate() {
        let stored = cached_body(&cache, &key(n as u32)).await.is_some();
        assert!(
            !stored || result.is_ok(),
            "call {n} failed but has an entry"
        );
        assert!(
            stored || result.is_err() || !with_entry[n],
            "call {n} was answered but its entry is not stored"
        );
    }
    (fx, results)
}

/// A fresh key's insert skips the read for its row (the key index knows it has none); two
/// stores of one key in the same batch must still count one row, or the LRU bound drifts.
#[tokio::test]
async fn one_key_stored_twice_in_a_batch_is_one_row() {
    let fx = Fixture::sqlite();
    let store = SqliteStore::open(&fx.path, &config(86_400, 50)).unwrap();
    let entry = |n: u32, body: &str| entry(&store, n, body);
    let lease = crate::store::Lease::exclusive();
    for round in 0..20 {
        // Queued together, these commit in one batch more often than not.
        let (a, b, c) = tokio::join!(
            store.put(entry(round, "first"), Vec::new(), &lease),
            store.put(entry(round, "second"), Vec::new(), &lease),
            store.put(entry(1000 + round, "other"), Vec::new(), &lease),
        );
        a.and(b).and(c).unwrap();
    }
    assert_eq!(store.row_count().await.unwrap(), 40);
    // The bound counts rows as they are: with room for 50, ten more evict nothing.
    for n in 2000..2010 {
        store
            .put(entry(n, "more"), Vec::new(), &lease)
            .await
            .unwrap();
    }
    assert_eq!(store.row_count().await.unwrap(), 50);
}

/// An entry of `key(n)` answered with `body`, stored now.
fn entry(store: &SqliteStore, n: u32, body: &str) -> Arc<crate::store::Entry> {
    Arc::new(crate::store::Entry {
        message_id: key(n),
        method: "message/send".into(),
        request_hash: request_hash(b"{}").unwrap(),
        response: response(body),
        inserted_at: store.now_seconds(),
    })
}

/// Stores `body` for `key(n)` straight through the store (no claim), as the writer would.
async fn put(store: &SqliteStore, n: u32, body: &str) {
    let lease = crate::store::Lease::exclusive();
    let stored = store.put(entry(store, n, body), Vec::new(), &lease).await;
    stored.unwrap();
}

async fn body_of(store: &SqliteStore, n: u32) -> Option<Vec<u8>> {
    store.get(&key(n)).await.unwrap().map(|e| e.response.body)
}

/// Rows are found by the rowids the key index keeps. A row deleted behind the writer's back
/// (an operator's purge) is a miss, also once SQLite gave its rowid to another key's row, and
/// the key stored again is one row.
#[tokio::test]
async fn a_row_purged_behind_the_writer_is_a_miss_even_when_its_rowid_is_reused() {
    let fx = Fixture::sqlite();
    let off = config(86_400, 100).with(|c| c.memory_tier_bytes = 0);
    let store = SqliteStore::open(&fx.path, &off).unwrap();
    put(&store, 1, "one").await;
    put(&store, 2, "two").await;
    let purge = rusqlite::Connection::open(&fx.path).unwrap();
    let purged = purge
        .execute(
            "DELETE FROM idempotency_cache WHERE message_id = ?1",
            [key(2).as_str()],
        )
        .unwrap();
    assert_eq!(purged, 1);
    assert_eq!(body_of(&store, 2).await, None);
    // The highest rowid was freed: the next row takes it.
    put(&store, 3, "three").await;
    let rowid = |n: u32| -> i64 {
        purge
            .query_row(
                "SELECT rowid FROM idempotency_cache WHERE message_id = ?1",
                [key(n).as_str()],
                |r| r.get(0),
            )
            .unwrap()
    };
    assert_eq!(rowid(3), 2, "SQLite reused the purged row's rowid");
    assert_eq!(body_of(&store, 2).await, None, "not key 3's entry");
    assert_eq!(body_of(&store, 3).await.unwrap(), b"three");
    // Stored again, the purged key is one row, found after a restart too.
    put(&store, 2, "two again").await;
    put(&store, 2, "two, replaced").await;
    assert_eq!(store.row_count().await.unwrap(), 3);
    store.close();
    let store = SqliteStore::open(&fx.path, &off).unwrap();
    assert_eq!(body_of(&store, 2).await.unwrap(), b"two, replaced");
    assert_eq!(body_of(&store, 1).await.unwrap(), b"one");
    assert_eq!(store.row_count().await.unwrap(), 3);
}

/// A file created before the key index kept rowids has the spec's `PRIMARY KEY` on
/// `message_id`, no named rowid, and its LRU index on `last_used_at` alone: it is served as
/// it is, and its unique index still holds one row per key.
#[tokio::test]
async fn a_file_with_the_primary_key_of_an_earlier_version_is_served() {
    let fx = Fixture::sqlite();
    {
        let conn = rusqlite::Connection::open(&fx.path).unwrap();
        conn.execute_batch(
            "CREATE TABLE idempotency_cache (
                message_id TEXT NOT NULL PRIMARY KEY, request_hash TEXT NOT NULL,
                response_status INTEGER NOT NULL, response_headers BLOB NOT NULL,
                response_body BLOB NOT NULL, inserted_at INTEGER NOT NULL,
                method TEXT NOT NULL DEFAULT '', last_used_at INTEGER NOT NULL DEFAULT 0);
             CREATE INDEX idx_idempotency_inserted_at ON idempotency_cache(inserted_at);
             CREATE INDEX idx_idempotency_last_used_at ON idempotency_cache(last_used_at);",
        )
        .unwrap();
    }
    let off = config(86_400, 100).with(|c| c.memory_tier_bytes = 0);
    {
        let store = SqliteStore::open(&fx.path, &off).unwrap();
        put(&store, 1, "one").await;
        put(&store, 1, "one, replaced").await;
        put(&store, 2, "two").await;
    }
    let store = SqliteStore::open(&fx.path, &off).unwrap();
    assert_eq!(body_of(&store, 1).await.unwrap(), b"one, replaced");
    put(&store, 2, "two, replaced").await;
    assert_eq!(body_of(&store, 2).await.unwrap(), b"two, replaced");
    assert_eq!(store.row_count().await.unwrap(), 2);
}

/// A lock file that cannot be opened is named in the error: the database file itself may be
/// readable, and "Permission denied" alone pointed at it (helper-63).
#[test]
fn a_lock_file_that_cannot_be_opened_is_named() {
    let fx = Fixture::sqlite();
    let lock = format!("{}.lock", fx.path.display());
    std::fs::create_dir(&lock).unwrap();
    let refused = SqliteStore::open(&fx.path, &config(86_400, 100)).err();
    let said = refused.expect("refused").to_string();
    assert!(said.contains(&lock), "{said}");
}

/// A file whose `idempotency_cache` is another schema's (the spec's §4.4 table alone, or a
/// table of the same name that is no cache) is refused in one line, SQLite's reason without
/// the schema's SQL, and left as it was: no table added, not switched to WAL (helper-63).
#[test]
fn a_file_whose_cache_table_is_another_schemas_is_refused_unchanged() {
    let spec_table = "CREATE TABLE idempotency_cache (
        message_id TEXT NOT NULL PRIMARY KEY, request_hash TEXT NOT NULL,
        response_status INTEGER NOT NULL, response_headers BLOB NOT NULL,
        response_body BLOB NOT NULL, inserted_at INTEGER NOT NULL);
        CREATE INDEX idx_idempotency_inserted_at ON idempotency_cache(inserted_at);";
    let no_cache = "CREATE TABLE idempotency_cache (message_id TEXT PRIMARY KEY, foo INT)";
    for (schema, missing) in [(spec_table, "last_used_at"), (no_cache, "inserted_at")] {
        let fx = Fixture::sqlite();
        let tables = |conn: &rusqlite::Connection| -> Vec<String> {
            let mut names = conn
                .prepare("SELECT name FROM sqlite_master ORDER BY name")
                .unwrap();
            let names = names.query_map([], |row| row.get(0)).unwrap();
            names.map(Result::unwrap).collect()
        };
        let before = {
            let conn = rusqlite::Connection::open(&fx.path).unwrap();
            conn.execute_batch(schema).unwrap();
            tables(&conn)
        };
        let refused = SqliteStore::open(&fx.path, &config(86_400, 100)).err();
        let said = refused.expect("refused").to_string();
        assert!(
            said.contains(&format!("no such column: {missing}")),
            "{said}"
        );
        assert!(!said.contains("CREATE"), "no SQL: {said}");
        assert_eq!(said.lines().count(), 1, "{said}");
        let conn = rusqlite::Connection::open(&fx.path).unwrap();
        assert_eq!(tables(&conn), before, "no table added");
        let mode: String = conn
            .query_row("PRAGMA journal_mode", [], |row| row.get(0))
            .unwrap();
        assert_eq!(mode, "delete", "not switched to WAL");
    }
}

/// Rows an operator's purge deleted were never counted out by the writer: the sweep counts
/// them again, so the LRU bound does not evict live entries early.
#[tokio::test]
async fn the_sweep_recounts_rows_purged_behind_the_writer() {
    let fx = Fixture::sqlite();
    let bound = config(86_400, 3).with(|c| c.memory_tier_bytes = 0);
    let store = SqliteStore::open(&fx.path, &bound).unwrap();
    for n in 1..=3 {
        put(&store, n, "kept").await;
        fx.clock.advance(Duration::from_millis(10));
    }
    let purge = rusqlite::Connection::open(&fx.path).unwrap();
    let purged = purge.execute(
        "DELETE FROM idempotency_cache WHERE message_id IN (?1, ?2)",
        [key(1).as_str(), key(2).as_str()],
    );
    assert_eq!(purged.unwrap(), 2);
    assert_eq!(store.sweep().await.unwrap(), 0);
    two_more_keep_the_third(&store).await;
}

/// The same for rows `idem-admin` purged, before any sweep: the writer counts the rows again
/// at its next batch, having seen the purge's generation change.
#[tokio::test]
async fn rows_the_admin_tool_purged_are_not_counted_against_the_bound() {
    let fx = Fixture::sqlite();
    let bound = config(86_400, 3).with(|c| c.memory_tier_bytes = 0);
    let store = SqliteStore::open_with_clock(&fx.path, &bound, fx.clock.clone()).unwrap();
    for n in 1..=3 {
        put(&store, n, "kept").await;
        fx.clock.advance(Duration::from_millis(10));
    }
    let admin = crate::admin::Admin::open(fx.path.to_str().unwrap(), &bound)
        .await
        .unwrap();
    for n in [1, 2] {
        assert!(admin.purge(&key(n)).await.unwrap());
    }
    two_more_keep_the_third(&store).await;
}

/// A bound lowered across a restart is reached a chunk at a time: a call's commit evicts at
/// most a sweep chunk (100) more than it stores, and the sweep the rest, step by step, none of
/// it counted as expired. One commit evicted all the rows over it: 199,000 took 9 s and wrote
/// an 800 MB log while every call waited (helper-102).
#[tokio::test]
async fn a_bound_lowered_across_a_restart_is_reached_a_chunk_at_a_time() {
    let fx = Fixture::sqlite();
    let store = SqliteStore::open(&fx.path, &config(86_400, 1_000)).unwrap();
    futures::future::join_all((1..=350).map(|n| put(&store, n, "old"))).await;
    store.close();
    let store = SqliteStore::open(&fx.path, &config(86_400, 10)).unwrap();
    put(&store, 1_000, "new").await;
    assert_eq!(
        store.row_count().await.unwrap(),
        351 - 101,
        "one chunk more"
    );
    assert_eq!(store.sweep().await.unwrap(), 0, "nothing expired");
    assert_eq!(store.row_count().await.unwrap(), 10);
    assert_eq!(body_of(&store, 1_000).await.unwrap(), b"new");
}

/// The same where the sweep also deletes expired rows: they are counted out before the bound
/// is looked at. Counted in, the steps evicted live entries below the bound, all 300 of them
/// here for a bound of 10 (helper-106).
#[tokio::test]
async fn a_lowered_bound_keeps_its_entries_when_the_sweep_also_expires_rows() {
    let fx = Fixture::sqlite();
    let wide = config(60, 1_000);
    let store = SqliteStore::open_with_clock(&fx.path, &wide, fx.clock.clone()).unwrap();
    futures::future::join_all((1..=50).map(|n| put(&store, n, "expires"))).await;
    fx.clock.advance(Duration::from_secs(30));
    for n in 51..=350 {
        put(&store, n, "live").await;
        fx.clock.advance(Duration::from_millis(1));
    }
    store.close();
    fx.clock.advance(Duration::from_secs(31));
    let narrow = config(60, 10);
    let store = SqliteStore::open_with_clock(&fx.path, &narrow, fx.clock.clone()).unwrap();
    assert_eq!(store.sweep().await.unwrap(), 50, "the expired rows");
    assert_eq!(
        store.row_count().await.unwrap(),
        10,
        "the bound's live entries"
    );
    assert_eq!(body_of(&store, 350).await.unwrap(), b"live");
}

/// A file whose entries were stored with keys scoped otherwise is refused: the retries of
/// the calls they answered would find nothing under their new keys and run again
/// (helper-107). Kept as it was, or on a file that holds no entries, it opens.
#[tokio::test]
async fn a_file_keyed_otherwise_is_refused_while_it_holds_entries() {
    let fx = Fixture::sqlite();
    let global = config(86_400, 100);
    let scoped = global.clone().with(|c| c.scope_keys_by_principal = true);
    let store = SqliteStore::open(&fx.path, &global).unwrap();
    put(&store, 1, "global").await;
    store.close();
    let refused = SqliteStore::open(&fx.path, &scoped).err();
    assert!(
        matches!(refused, Some(StoreError::ScopingChanged { scoped: true })),
        "{refused:?}"
    );
    let message = refused.unwrap().to_string();
    assert!(message.contains("scope_keys_by_principal"), "{message}");
    let store = SqliteStore::open(&fx.path, &global).unwrap();
    assert_eq!(
        body_of(&store, 1).await.unwrap(),
        b"global",
        "kept as it was"
    );
    store.close();
    rusqlite::Connection::open(&fx.path)
        .unwrap()
        .execute("DELETE FROM idempotency_cache", [])
        .unwrap();
    let store = SqliteStore::open(&fx.path, &scoped).unwrap();
    put(&store, 2, "scoped").await;
    store.close();
    let refused = SqliteStore::open(&fx.path, &global).err();
    assert!(
        matches!(refused, Some(StoreError::ScopingChanged { scoped: false })),
        "recorded by the store that opened the empty file: {refused:?}"
    );
}

/// The same for a file whose only key is a stream its process left open as it died: its
/// retry must get the interrupted outcome under its key, not run under a new one
/// (helper-108).
#[tokio::test]
async fn a_file_keyed_otherwise_is_refused_while_it_holds_an_open_stream() {
    let fx = Fixture::sqlite();
    let global = config(86_400, 100);
    let scoped = global.clone().with(|c| c.scope_keys_by_principal = true);
    let store = Arc::new(SqliteStore::open(&fx.path, &global).unwrap());
    let cache = IdempotencyCache::from_arc(store.clone());
    let hash = request_hash(b"{}").unwrap();
    let mut ticket = won(&cache, &key(1), "message/stream", &hash).await;
    let event = bytes_of("data: {\"jsonrpc\":\"2.0\",\"id\":5,\"result\":0}\n\n");
    ticket
        .open_stream("5".into(), event, Vec::new())
        .await
        .unwrap();
    std::mem::forget(ticket); // the process dies mid-stream
    store.close();
    let refused = SqliteStore::open(&fx.path, &scoped).err();
    assert!(
        matches!(refused, Some(StoreError::ScopingChanged { scoped: true })),
        "{refused:?}"
    );
}

/// Two more entries in a store bounded at 3 that holds key 3 alone: key 3 stays.
async fn two_more_keep_the_third(store: &SqliteStore) {
    put(store, 4, "new").await;
    put(store, 5, "new").await;
    assert_eq!(
        body_of(store, 3).await.unwrap(),
        b"kept",
        "within the bound of 3"
    );
    assert_eq!(store.row_count().await.unwrap(), 3);
}

/// `idem-admin purge` on a served file returns once the server has emptied its memory of
/// the key, and the server then executes the key again.
#[tokio::test]
async fn a_purge_returns_once_the_serving_process_confirms_it() {
    let fx = Fixture::sqlite();
    let cache = fx.cache(&config(86_400, 100)).await;
    let first = execute(&cache, &key(1), "{}", "first").await;
    assert!(
        matches!(cache.claim(&key(1), "message/send", &first.request_hash).await.unwrap(),
            Claim::Cached(found) if Arc::ptr_eq(&found, &first)),
        "answered from memory"
    );
    let admin = crate::admin::Admin::open(fx.path.to_str().unwrap(), &config(86_400, 100))
        .await
        .unwrap();
    assert!(admin.purge(&key(1)).await.unwrap());
    execute(&cache, &key(1), "{}", "again").await;
    assert!(
        !admin.purge(&key(2)).await.unwrap(),
        "nothing stored for it"
    );
}

/// The keys an operator's purge deleted leave the key index at the next sweep (else it would
/// grow with every `purge --expired` until a restart); the others stay in it.
#[tokio::test]
async fn the_sweep_after_a_purge_forgets_the_purged_keys() {
    let fx = Fixture::sqlite();
    let store = Arc::new(SqliteStore::open(&fx.path, &config(86_400, 100)).unwrap());
    let cache = IdempotencyCache::from_arc(store.clone());
    for n in 1..=3 {
        execute(&cache, &key(n), "{}", "stored").await;
    }
    let admin = crate::admin::Admin::open(fx.path.to_str().unwrap(), &config(86_400, 100))
        .await
        .unwrap();
    assert!(admin.purge(&key(1)).await.unwrap());
    assert!(store.indexes(&key(1)), "until the next sweep");
    assert_eq!(store.sweep().await.unwrap(), 0);
    assert!(!store.indexes(&key(1)), "the purged key");
    assert!(store.indexes(&key(2)) && store.indexes(&key(3)));
    assert_eq!(cached_body(&cache, &key(2)).await.unwrap(), b"stored");
    assert_eq!(store.row_count().await.unwrap(), 2);
    execute(&cache, &key(1), "{}", "again").await;
    assert!(store.indexes(&key(1)), "stored again");
}

/// A process that holds the file's lock and never confirms: the purge is done, and says
/// that the server may still answer from memory.
#[tokio::test]
async fn a_purge_that_the_serving_process_does_not_confirm_says_so() {
    let fx = Fixture::sqlite();
    let store = SqliteStore::open(&fx.path, &config(86_400, 100)).unwrap();
    put(&store, 1, "first").await;
    store.close();
    let _holder = crate::store::sqlite::file_lock::ServingLock::acquire(&fx.path).unwrap();
    let mut admin = crate::admin::Admin::open(fx.path.to_str().unwrap(), &config(86_400, 100))
        .await
        .unwrap();
    admin.set_purge_wait(Duration::from_millis(100));
    let refused = admin.purge(&key(1)).await.unwrap_err();
    let crate::store::StoreError::PurgeUnconfirmed { pid, .. } = &refused else {
        panic!("{refused}");
    };
    assert_eq!(*pid, std::process::id().to_string());
    assert!(refused.to_string().contains("restart it"), "{refused}");
    assert_eq!(
        admin.show(&key(1)).await.unwrap(),
        None,
        "deleted all the same"
    );
}

/// What the database said is in the error's message, once: a report that walks the chain of
/// sources (anyhow's `{:#}`, say) finds nothing below it to print again. A staged write's
/// error says its causes too: tokio-postgres's says only "db error" at the top.
#[test]
fn a_store_error_says_what_the_database_said_once() {
    let conn = rusqlite::Connection::open_in_memory().unwrap();
    let refused = conn
        .execute("INSERT INTO nowhere VALUES (1)", [])
        .unwrap_err();
    let error = crate::store::StoreError::from(refused);
    let said = error.to_string();
    assert_eq!(said.matches("no such table: nowhere").count(), 1, "{said}");
    assert!(said.starts_with("sqlite: "), "{said}");
    assert!(std::error::Error::source(&error).is_none());

    #[derive(Debug)]
    struct DbError(std::io::Error);
    impl std::fmt::Display for DbError {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("db error")
        }
    }
    impl std::error::Error for DbError {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }
    let write = DbError(std::io::Error::other("disk full"));
    let error = crate::store::StoreError::Write(Box::new(write));
    assert_eq!(
        error.to_string(),
        "a staged write failed: db error: disk full"
    );
}

/// A disk that does not answer (here: the writer held inside a call's staged write, as a
/// hung `fsync` would hold it) fails the call within `disk_timeout`, and its key stays held
/// until the write settles: a retry meanwhile finds the call still running, never a free key.
/// Once the write lands the retry replays it, and the call's after-commit hooks run; once it
/// fails instead the retry runs, and they never do. Either way the call's writes commit once
/// at most.
#[tokio::test]
async fn a_write_the_disk_does_not_answer_fails_in_time_and_holds_its_key_until_it_settles() {
    let fx = Fixture::sqlite();
    let cache = impatient(&fx).await;
    let hash = request_hash(b"{}").unwrap();
    for (n, lands) in [(1, true), (2, false)] {
        let ticket = won(&cache, &key(n), "message/send", &hash).await;
        let (disk, held) = held_write(n, lands);
        let (mut ticket, hooks_ran) = (ticket, Arc::new(AtomicUsize::new(0)));
        let _no_writes = ticket.commits(counted_hook(cache.store(), &hooks_ran));
        let started = std::time::Instant::now();
        let failed = ticket.complete_with(response("landed"), vec![held]).await;
        assert_unanswered(failed, started);
        assert_still_held(&cache, n, "message/send", &hash).await;
        drop(disk);
        match (lands, settled(&cache, n, "message/send", &hash).await) {
            (true, Claim::Cached(entry)) => assert_eq!(entry.response.body, b"landed"),
            (false, Claim::Execute(_)) => {}
            (_, _) => panic!("landed: replayed; failed: runs (lands = {lands})"),
        }
        assert_eq!(hooks_ran.load(Ordering::SeqCst), usize::from(lands));
    }
    assert_eq!(fx.effects().await, vec!["effect 1".to_owned()]);
}

/// The same for a stream whose start the disk does not answer: once it lands, its
/// after-commit hooks run, and the retry gets the interrupted outcome (its first event, then
/// the interruption), never a second run.
#[tokio::test]
async fn a_stream_start_the_disk_does_not_answer_is_never_run_again() {
    let fx = Fixture::sqlite();
    let cache = impatient(&fx).await;
    let hash = request_hash(b"{}").unwrap();
    let mut ticket = won(&cache, &key(1), "message/stream", &hash).await;
    let (disk, held) = held_write(1, true);
    let hooks_ran = Arc::new(AtomicUsize::new(0));
    let _no_writes = ticket.commits(counted_hook(cache.store(), &hooks_ran));
    let first = bytes_of("data: {\"jsonrpc\":\"2.0\",\"id\":5,\"result\":0}\n\n");
    let started = std::time::Instant::now();
    assert_unanswered(
        ticket.open_stream("5".into(), first, vec![held]).await,
        started,
    );
    drop(ticket);
    assert_still_held(&cache, 1, "message/stream", &hash).await;
    drop(disk);
    let Claim::Cached(entry) = settled(&cache, 1, "message/stream", &hash).await else {
        panic!("a stream whose start landed never runs again")
    };
    let body = String::from_utf8(entry.response.body.clone()).unwrap();
    assert!(body.starts_with("data: {\"jsonrpc\":\"2.0\",\"id\":5,\"result\":0}\n\n"));
    assert!(body.contains("IDEMPOTENCY_STREAM_INTERRUPTED"), "{body}");
    assert_eq!(fx.effects().await, vec!["effect 1".to_owned()]);
    assert_eq!(hooks_ran.load(Ordering::SeqCst), 1, "its start landed");
}

/// A stream whose event the disk does not answer: until the write settles its retries wait
/// (they do not attach to the recording, which ended with the failure), then they get the
/// interrupted outcome with every event that landed.
#[tokio::test]
async fn a_stream_event_the_disk_does_not_answer_is_waited_out_not_attached_to() {
    let fx = Fixture::sqlite();
    let cache = impatient(&fx).await;
    let hash = request_hash(b"{}").unwrap();
    let mut ticket = won(&cache, &key(1), "message/stream", &hash).await;
    let event = |n: u32| {
        bytes_of(&format!(
            "data: {{\"jsonrpc\":\"2.0\",\"id\":5,\"result\":{n}}}\n\n"
        ))
    };
    let opened = ticket.open_stream("5".into(), event(0), Vec::new()).await;
    opened.unwrap();
    ticket.set_progress(Arc::new(()));
    // The writer held by a write queued first, as a hung disk holds it.
    let (disk, holding) = hold_the_writer(&cache).await;
    let started = std::time::Instant::now();
    assert_unanswered(ticket.append_events(1, vec![event(1)]).await, started);
    drop(ticket);
    let Claim::InFlight(retry) = cache.claim(&key(1), "message/stream", &hash).await.unwrap()
    else {
        panic!("the key stays held while the event may still commit")
    };
    let waited = retry.wait(Duration::from_millis(100), true).await;
    assert!(matches!(waited, crate::claim::Waited::StillRunning));
    drop(disk);
    drop(holding.await);
    let Claim::Cached(entry) = settled(&cache, 1, "message/stream", &hash).await else {
        panic!("a stream whose event landed never runs again")
    };
    let body = String::from_utf8(entry.response.body.clone()).unwrap();
    let events: Vec<&str> = body.split_terminator("\n\n").collect();
    assert_eq!(events.len(), 3, "{body}");
    assert!(events[1].ends_with("\"result\":1}"), "{body}");
    assert!(
        events[2].contains("IDEMPOTENCY_STREAM_INTERRUPTED"),
        "{body}"
    );
}

/// A call cancelled while its write waits in the writer's queue (its task dropped) holds its
/// key the same way until the write settles: the write may still commit.
#[tokio::test]
async fn a_call_cancelled_while_its_write_waits_holds_its_key_until_it_settles() {
    let fx = Fixture::sqlite();
    let cache = impatient(&fx).await;
    let hash = request_hash(b"{}").unwrap();
    let ticket = won(&cache, &key(1), "message/send", &hash).await;
    let (disk, held) = held_write(1, true);
    let completing = ticket.complete_with(response("landed"), vec![held]);
    let cancelled = tokio::time::timeout(Duration::from_millis(100), completing).await;
    assert!(cancelled.is_err(), "cancelled before the disk timeout");
    assert_still_held(&cache, 1, "message/send", &hash).await;
    drop(disk);
    let Claim::Cached(entry) = settled(&cache, 1, "message/send", &hash).await else {
        panic!("the cancelled call's write landed: replayed, never run again")
    };
    assert_eq!(entry.response.body, b"landed");
    assert_eq!(fx.effects().await, vec!["effect 1".to_owned()]);
}

/// The same for a call that is not deduplicated: its unit of work's commit fails in time,
/// and should its writes land after all, its after-commit hooks run then (the example's
/// mission timer would otherwise never start); never if they fail.
#[tokio::test]
async fn a_unit_of_work_the_disk_does_not_answer_runs_its_hooks_once_it_lands() {
    let fx = Fixture::sqlite();
    let cache = impatient(&fx).await;
    for (n, lands) in [(1, true), (2, false)] {
        let unit = crate::UnitOfWork::new(cache.store().clone());
        let (disk, held) = held_effect(n, lands);
        unit.stage(held).unwrap();
        let ran = Arc::new(tokio::sync::Notify::new());
        let hooks_ran = Arc::new(AtomicUsize::new(0));
        let (counted, woken) = (hooks_ran.clone(), ran.clone());
        unit.after_commit(move || {
            counted.fetch_add(1, Ordering::SeqCst);
            woken.notify_one();
        })
        .unwrap();
        let started = std::time::Instant::now();
        assert_unanswered(unit.commit_alone().await, started);
        assert_eq!(hooks_ran.load(Ordering::SeqCst), 0, "not committed yet");
        drop(disk);
        let waited = tokio::time::timeout(Duration::from_secs(5), ran.notified()).await;
        assert_eq!(
            waited.is_ok(),
            lands,
            "the hooks run once the writes land (lands = {lands})"
        );
        assert_eq!(hooks_ran.load(Ordering::SeqCst), usize::from(lands));
    }
    assert_eq!(fx.effects().await, vec!["effect 1".to_owned()]);
}

/// A runtime whose time is paused (a test's `start_paused`) moves its clock to the next timer
/// whenever it idles, as it does while a write or a read waits on the store's threads: the
/// disk bound keeps to the wall clock, so none of them fails for it.
#[tokio::test(start_paused = true)]
async fn paused_time_never_times_the_disk_out() {
    let fx = Fixture::sqlite();
    let config = config(86_400, 100).with(|c| c.memory_tier_bytes = 0);
    let store = SqliteStore::open(&fx.path, &config).unwrap();
    let paused_at = tokio::time::Instant::now();
    for n in 0..10 {
        put(&store, n, "stored").await;
        assert_eq!(body_of(&store, n).await, Some(b"stored".to_vec()));
    }
    assert_eq!(
        paused_at.elapsed(),
        Duration::ZERO,
        "waiting on the disk set no timer of the test's clock"
    );
}

/// How long the tests below give the disk: well past an `fsync` of a busy machine.
const DISK_TIMEOUT: Duration = Duration::from_secs(2);

/// Sealed hooks of a unit of work that count their runs in `runs`.
fn counted_hook(
    store: &Arc<dyn crate::store::Store>,
    runs: &Arc<AtomicUsize>,
) -> crate::unit_of_work::Sealed {
    let unit = crate::UnitOfWork::new(store.clone());
    let runs = runs.clone();
    let counted = move || {
        runs.fetch_add(1, Ordering::SeqCst);
    };
    unit.after_commit(counted).expect("an open unit");
    unit.seal()
}

/// A cache on `fx` that waits `DISK_TIMEOUT` for the disk, with the `effects` table.
async fn impatient(fx: &Fixture) -> crate::claim::IdempotencyCache {
    let cache = fx
        .cache(&config(86_400, 100).with(|c| c.disk_timeout = DISK_TIMEOUT))
        .await;
    fx.create_effects(cache.store()).await;
    cache
}

/// Holds the writer, as a hung disk or a slow application write would, with a write queued
/// first that waits until the returned sender is dropped; returns once the writer is in it.
async fn hold_the_writer(
    cache: &crate::claim::IdempotencyCache,
) -> (
    std::sync::mpsc::Sender<()>,
    tokio::task::JoinHandle<Result<(), StoreError>>,
) {
    let (release, released) = std::sync::mpsc::channel::<()>();
    let (entered, inside) = std::sync::mpsc::channel::<()>();
    let held = crate::store::SqlWrite::rerunnable(move |_| {
        let _ = entered.send(());
        let _ = released.recv();
        Ok(())
    });
    let store = cache.store().clone();
    let holding = tokio::spawn(async move { store.apply(vec![held]).await });
    while inside.try_recv().is_err() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    (release, holding)
}

/// A staged write that holds the writer (as a hung `fsync` would) until the returned sender
/// is dropped, then inserts `effect {n}` and, unless it `lands`, fails.
fn held_write(n: u32, lands: bool) -> (std::sync::mpsc::Sender<()>, crate::store::SqlWrite) {
    let (disk, held) = held_effect(n, lands);
    (disk, crate::store::SqlWrite::rerunnable(held))
}

/// [`held_write`]'s work, to stage.
fn held_effect(
    n: u32,
    lands: bool,
) -> (
    std::sync::mpsc::Sender<()>,
    impl FnMut(&rusqlite::Connection) -> Result<(), crate::store::WriteError> + Send + 'static,
) {
    let (disk, answers) = std::sync::mpsc::channel::<()>();
    let name = format!("effect {n}");
    let held = move |db: &rusqlite::Connection| {
        let _ = answers.recv();
        db.execute("INSERT INTO effects (name) VALUES (?1)", [&name])?;
        match lands {
            true => Ok(()),
            false => Err("the write fails once the disk answers".into()),
        }
    };
    (disk, held)
}

fn assert_unanswered<T: std::fmt::Debug>(
    outcome: Result<T, crate::store::StoreError>,
    started: std::time::Instant,
) {
    let error = outcome.expect_err("the disk did not answer");
    let said = error.to_string();
    let ms = DISK_TIMEOUT.as_millis();
    let expected = format!("no answer from the database file in {ms} ms");
    assert!(said.contains(&expected), "{said}");
    assert!(started.elapsed() < DISK_TIMEOUT * 3, "bounded");
}

/// A retry of key `n` finds the call still running, not a free key.
async fn assert_still_held(
    cache: &crate::claim::IdempotencyCache,
    n: u32,
    method: &str,
    hash: &crate::hash::RequestHash,
) {
    let Claim::InFlight(retry) = cache.claim(&key(n), method, hash).await.unwrap() else {
        panic!("the key stays held while the write may still commit")
    };
    let waited = retry.wait(Duration::from_millis(100), false).await;
    assert!(matches!(waited, crate::claim::Waited::StillRunning));
}

/// The claim of key `n` once the call that held it gave it up.
async fn settled(
    cache: &crate::claim::IdempotencyCache,
    n: u32,
    method: &str,
    hash: &crate::hash::RequestHash,
) -> Claim {
    loop {
        match cache.claim(&key(n), method, hash).await.unwrap() {
            Claim::InFlight(flight) => drop(flight.wait(Duration::from_secs(10), false).await),
            claimed => return claimed,
        }
    }
}

/// A read the disk does not answer (here: reads held, as hung ones would be) fails within
/// `disk_timeout` too; a read changes nothing, so nothing waits for it after. The
/// application's reads queued behind them fail in as long, and the store's own read, on the
/// reader they leave free, is answered (before, they held every reader: helper-93).
#[tokio::test]
async fn a_read_the_disk_does_not_answer_fails_in_time() {
    use crate::store::sqlite::readers::APPLICATION_READS;

    let fx = Fixture::sqlite();
    let config = config(86_400, 100).with(|c| {
        c.disk_timeout = DISK_TIMEOUT;
        // Every read of an entry goes to the file.
        c.memory_tier_bytes = 0;
    });
    let store = SqliteStore::open(&fx.path, &config).unwrap();
    put(&store, 1, "stored").await;
    let (disk, answers) = std::sync::mpsc::channel::<()>();
    let answers = Arc::new(std::sync::Mutex::new(answers));
    // More than there are reader threads: each holds one, the rest wait in the queue.
    let held = (0..16).map(|_| {
        let answers = answers.clone();
        store.read(Box::new(move |_| {
            let _ = answers.lock().unwrap().recv();
        }))
    });
    let started = std::time::Instant::now();
    let stored = key(1);
    let (held, read) = tokio::join!(futures::future::join_all(held), store.get(&stored));
    let mut unanswered = 0;
    for outcome in held {
        let said = outcome.as_ref().map_err(ToString::to_string).err();
        match said
            .as_deref()
            .is_some_and(|s| s.contains("no reader free"))
        {
            true => assert!(started.elapsed() < DISK_TIMEOUT * 3, "bounded"),
            false => {
                assert_unanswered(outcome, started);
                unanswered += 1;
            }
        }
    }
    assert_eq!(unanswered, APPLICATION_READS, "the reads the disk held");
    assert!(read.unwrap().is_some(), "the store's own read is answered");
    drop(disk);
    assert_eq!(body_of(&store, 1).await, Some(b"stored".to_vec()));
}

/// Bytes as a call sent them: their glimpse and spelling.
fn sent(bytes: &[u8]) -> (crate::hash::Glimpse, crate::hash::Spelling) {
    (crate::hash::glimpse(bytes), crate::hash::spelling(bytes))
}

/// The entry `store` answers a resend of `sent`'s bytes with, from memory.
fn found(
    store: &dyn Store,
    (glimpse, spelling): &(crate::hash::Glimpse, crate::hash::Spelling),
) -> Option<Arc<Entry>> {
    store.spelled(*glimpse, &|| *spelling)
}

/// A claim of another payload that finds a stream a crash interrupted closes it in the
/// stream's name: the stream's own retry meanwhile waits for that outcome and replays it,
/// where it met the other payload's hash and was answered a 422 (found by helper-52). The
/// writer is held so that the retry comes while the stream is being closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_of_an_interrupted_stream_waits_while_another_payload_closes_it() {
    let fx = Fixture::sqlite();
    let (hash, other) = (request_hash(b"{}").unwrap(), request_hash(b"[]").unwrap());
    {
        let cache = fx.cache(&config(86_400, 100)).await;
        std::mem::forget(opened_stream(&cache, &key(1), &hash).await); // its process dies
    }
    let cache = fx.cache(&config(86_400, 100)).await;
    fx.create_effects(cache.store()).await;
    let (disk, held) = held_write(1, true);
    let store = cache.store().clone();
    let holding = tokio::spawn(async move { store.apply(vec![held]).await });
    // The held write in the writer first, so that the close below waits behind it.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let closing = {
        let cache = cache.clone();
        tokio::spawn(async move { cache.claim(&key(1), "message/stream", &other).await })
    };
    while cache.holder(&key(1)).await.unwrap().is_none() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let Claim::InFlight(flight) = cache.claim(&key(1), "message/stream", &hash).await.unwrap()
    else {
        panic!("the key is held while the stream is closed")
    };
    assert_eq!(
        (flight.method(), flight.request_hash()),
        ("message/stream", &hash),
        "held in the stream's name, not the other payload's"
    );
    drop(disk);
    holding.await.unwrap().unwrap();
    let Ok(Claim::Cached(closed)) = closing.await.unwrap() else {
        panic!("the other payload finds the interrupted stream's outcome")
    };
    assert_eq!(closed.request_hash, hash);
    let entry = outcome_after(flight, &cache, &key(1), "message/stream", &hash).await;
    assert!(
        String::from_utf8_lossy(&entry.response.body).contains("IDEMPOTENCY_STREAM_INTERRUPTED")
    );
}

/// An application's read that opens a transaction and fails before its end left its reader on
/// that snapshot: the store's lookups there missed every entry committed later, and its claims
/// failed to begin their own transaction (found by helper-75). The reader now ends it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_that_leaves_its_transaction_open_hides_nothing_later() {
    use crate::store::sqlite::readers::{APPLICATION_READS, READER_THREADS};
    use crate::store::Database;
    use std::sync::Barrier;

    let fx = Fixture::sqlite();
    let no_tier = config(86_400, 100).with(|c| c.memory_tier_bytes = 0);
    let cache = fx.cache(&no_tier).await;
    let db = Database::new(cache.store().clone());
    // One such read on as many reader threads as the application's reads may take at once.
    let barrier = Arc::new(Barrier::new(APPLICATION_READS));
    let reads = (0..APPLICATION_READS).map(|_| {
        let (db, barrier) = (db.clone(), barrier.clone());
        tokio::spawn(async move {
            let read = db.read(move |conn| {
                barrier.wait();
                conn.execute_batch("BEGIN")?;
                let count = "SELECT COUNT(*) FROM idempotency_cache";
                conn.query_row(count, [], |r| r.get::<_, i64>(0))?;
                conn.query_row("SELECT COUNT(*) FROM no_such_table", [], |r| r.get(0))
            });
            read.await
        })
    });
    for read in reads.collect::<Vec<_>>() {
        let failed: Result<i64, _> = read.await.unwrap();
        assert!(failed.is_err(), "the application's read fails");
    }
    execute(&cache, &key(1), "{}", "one").await;
    let hash = request_hash(b"{}").unwrap();
    for n in 0..2 * READER_THREADS {
        let got = cache.store().get(&key(1)).await;
        assert!(
            matches!(&got, Ok(Some(_))),
            "get #{n}: {:?}",
            got.map(|e| e.is_some())
        );
        let claimed = cache.claim(&key(1), "message/send", &hash).await;
        assert!(
            matches!(claimed, Ok(Claim::Cached(_))),
            "claim #{n}: {:?}",
            claimed.err()
        );
    }
}

/// A read that steps a statement and forgets its rows leaves the statement running, and with
/// it the connection's snapshot, though the connection reports autocommit: every later lookup
/// on that reader missed newer entries, and 8 claims of a stored key of 8 ran it again
/// (helper-93). Whether the statement is in the cache or held by no one, reads after it see
/// what is committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_that_leaves_a_statement_running_hides_nothing_later() {
    use crate::store::sqlite::readers::{APPLICATION_READS, READER_THREADS};
    use crate::store::Database;
    use std::sync::Barrier;

    let fx = Fixture::sqlite();
    let no_tier = config(86_400, 100).with(|c| c.memory_tier_bytes = 0);
    let cache = fx.cache(&no_tier).await;
    execute(&cache, &key(0), "{}", "zero").await;
    let db = Database::new(cache.store().clone());
    // On as many reader threads as the application's reads may take at once: some leak a
    // cached statement, some one of their own.
    let barrier = Arc::new(Barrier::new(APPLICATION_READS));
    let reads = (0..APPLICATION_READS).map(|n| {
        let (db, barrier) = (db.clone(), barrier.clone());
        tokio::spawn(async move {
            let read = db.read(move |conn| {
                barrier.wait();
                let sql = "SELECT message_id FROM idempotency_cache";
                if n % 2 == 0 {
                    let mut statement = conn.prepare_cached(sql)?;
                    let mut rows = statement.query([])?;
                    let first = rows.next()?.map(|row| row.get::<_, String>(0)).transpose();
                    std::mem::forget(rows);
                    first
                } else {
                    let statement = conn.prepare(sql)?;
                    let statement = Box::leak(Box::new(statement));
                    let mut rows = statement.query([])?;
                    let first = rows.next()?.map(|row| row.get::<_, String>(0)).transpose();
                    std::mem::forget(rows);
                    first
                }
            });
            read.await
        })
    });
    for read in reads.collect::<Vec<_>>() {
        assert!(
            read.await.unwrap().unwrap().is_some(),
            "the read found key 0"
        );
    }
    execute(&cache, &key(1), "{}", "one").await;
    let hash = request_hash(b"{}").unwrap();
    for n in 0..2 * READER_THREADS {
        let claimed = cache.claim(&key(1), "message/send", &hash).await;
        assert!(
            matches!(claimed, Ok(Claim::Cached(_))),
            "claim #{n} of a stored key: {:?}",
            claimed.map(|c| matches!(c, Claim::Execute(_)))
        );
    }
    // Nor do they pin the log: a checkpoint copies all of it back (a connection set aside
    // for its statement held its snapshot for good: helper-96).
    let conn = rusqlite::Connection::open(&fx.path).unwrap();
    let checkpoint = "PRAGMA wal_checkpoint(PASSIVE)";
    let framed = |row: &rusqlite::Row| Ok((row.get::<_, i64>(1)?, row.get::<_, i64>(2)?));
    let (log, copied) = conn.query_row(checkpoint, [], framed).unwrap();
    assert_eq!(copied, log, "frames copied back of the log's");
}

/// A read that sets its connection's busy timeout through the API leaves it for the next
/// read on that reader no more than a write leaves the writer's (helper-96).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_that_sets_the_busy_timeout_leaves_the_reader_s_own() {
    use crate::store::Database;

    let fx = Fixture::sqlite();
    let cache = fx.cache(&config(86_400, 100)).await;
    let db = Database::new(cache.store().clone());
    // Sequential reads over four readers: each thread serves several.
    for n in 0..20 {
        let found = db.read(|conn| {
            let found: i64 = conn.query_row("PRAGMA busy_timeout", [], |row| row.get(0))?;
            conn.busy_timeout(Duration::ZERO)?;
            Ok::<_, rusqlite::Error>(found)
        });
        assert_eq!(found.await.unwrap(), 5_000, "read {n}");
    }
}

/// The same in an application's write (an `INSERT ... RETURNING` stepped once): every later
/// batch failed ("cannot commit transaction - SQL statements in progress") until a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_that_leaves_a_statement_running_holds_no_later_batch() {
    use crate::store::Database;

    let fx = Fixture::sqlite();
    let cache = fx.cache(&config(86_400, 100)).await;
    execute(&cache, &key(0), "{}", "zero").await;
    let db = Database::new(cache.store().clone());
    // In the cache, or held by no one (out of the cache's reach: helper-96).
    for cached in [true, false] {
        let leaked = db.transact(move |conn| {
            conn.execute_batch("CREATE TABLE IF NOT EXISTS app (x)")?;
            let insert = "INSERT INTO app (x) VALUES (1), (2) RETURNING x";
            let mut rows = match cached {
                true => Box::leak(Box::new(conn.prepare_cached(insert)?)).query([])?,
                false => Box::leak(Box::new(conn.prepare(insert)?)).query([])?,
            };
            let first = rows.next()?.map(|row| row.get::<_, i64>(0)).transpose();
            std::mem::forget(rows);
            first
        });
        // Its own batch fails ("SQL statements in progress"): the write's own doing.
        let _ = leaked.await;
        let n = 1 + u32::from(cached);
        execute(&cache, &key(n), "{}", "later").await;
    }
    execute(&cache, &key(3), "{}", "later").await;
    let written = db.transact(|conn| conn.execute_batch("CREATE TABLE later (x)"));
    written.await.unwrap();
    assert_eq!(fx.count("SELECT COUNT(*) FROM idempotency_cache").await, 4);
}

/// An application's write that runs SQLite past its bound (half the disk timeout) is
/// interrupted and fails alone, saying so; the call queued behind it commits. Every write of
/// the process waited for it, and past the disk timeout failed as a disk that did not answer
/// (helper-112).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_past_its_bound_is_interrupted_and_holds_no_one_else_back() {
    use crate::store::{Database, TransactError};

    let fx = Fixture::sqlite();
    let bounded = config(86_400, 100).with(|c| c.disk_timeout = Duration::from_secs(2));
    let cache = fx.cache(&bounded).await;
    let db = Database::new(cache.store().clone());
    // Seconds of SQLite's own work, far past the bound.
    let count = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c \
                 WHERE x < 100000000) SELECT count(*) FROM c";
    let slow = tokio::spawn({
        let db = db.clone();
        async move {
            let counted =
                db.transact(move |conn| conn.query_row(count, [], |row| row.get::<_, i64>(0)));
            counted.await
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    execute(&cache, &key(1), "{}", "behind it").await;
    let Err(TransactError::Store(error)) = slow.await.unwrap() else {
        panic!("the slow write ran to its end")
    };
    assert!(error.to_string().contains("ran past 1000 ms"), "{error}");
    let written = db.transact(|conn| conn.execute_batch("CREATE TABLE after (x)"));
    written.await.unwrap();
}

/// The same for a call's staged write, which may run again: in a batch with another call, the
/// interrupted write fails, and the other commits without it. Run again carefully, as a write
/// that failed in the batch's first pass is, it held the writer a second bound, and the batch
/// passed the disk timeout (helper-118).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_staged_write_past_its_bound_runs_once_and_its_batch_commits() {
    use crate::store::{Database, SqlWrite};

    let fx = Fixture::sqlite();
    let bounded = config(86_400, 100).with(|c| c.disk_timeout = Duration::from_secs(2));
    let cache = fx.cache(&bounded).await;
    let db = Database::new(cache.store().clone());
    // Holds the writer (a sleep, which nothing interrupts), so that the next two share a batch.
    let holding = tokio::spawn(async move {
        let sleeping = db.transact(|_| {
            std::thread::sleep(Duration::from_millis(300));
            Ok::<_, rusqlite::Error>(())
        });
        sleeping.await
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let runs = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let store = cache.store().clone();
    let counted = runs.clone();
    let slow = tokio::spawn(async move {
        let count = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c \
                     WHERE x < 100000000) SELECT count(*) FROM c";
        let write = SqlWrite::rerunnable(move |conn| {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            conn.query_row(count, [], |row| row.get::<_, i64>(0))?;
            Ok(())
        });
        store.apply(vec![write]).await
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    execute(&cache, &key(1), "{}", "beside it").await;
    let failed = slow.await.unwrap().expect_err("interrupted");
    assert!(failed.to_string().contains("was interrupted"), "{failed}");
    assert_eq!(
        runs.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "run once"
    );
    holding.await.unwrap().unwrap();
}

/// Nor in the careful pass, when that pass is redone: a write before it failed in the first
/// pass, it was interrupted in the careful one, and a write after it then rolled the whole
/// transaction back (or left a deferred foreign key that failed the commit, so that each job
/// was run alone): it ran a second bound, and every call of the batch failed as a disk that
/// did not answer (helper-120).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_interrupted_in_the_careful_pass_is_not_run_again_when_it_is_redone() {
    for orphan in [false, true] {
        let runs = Arc::new(AtomicUsize::new(0));
        let counted = runs.clone();
        let writes = |fx: &Fixture| {
            vec![
                // Fails (UNIQUE) in the first pass: the batch is redone carefully.
                SqlWrite::rerunnable(|db| {
                    db.execute_batch("INSERT INTO effects VALUES ('d'), ('d')")?;
                    Ok(())
                }),
                // Interrupted past its bound, in the careful pass.
                SqlWrite::rerunnable(move |db| {
                    counted.fetch_add(1, Ordering::SeqCst);
                    let count = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 \
                                 FROM c WHERE x < 10000000000) SELECT count(*) FROM c";
                    db.query_row(count, [], |row| row.get::<_, i64>(0))?;
                    Ok(())
                }),
                // Rolls the whole transaction back, or leaves a deferred foreign key unresolved.
                SqlWrite::rerunnable(move |db| {
                    db.execute_batch(match orphan {
                        false => {
                            "INSERT INTO effects VALUES ('r'); \
                                  INSERT OR ROLLBACK INTO effects VALUES ('r')"
                        }
                        true => {
                            "CREATE TABLE IF NOT EXISTS parent (id INTEGER PRIMARY KEY);
                                 CREATE TABLE IF NOT EXISTS child (parent INTEGER
                                     REFERENCES parent (id) DEFERRABLE INITIALLY DEFERRED);
                                 INSERT INTO child VALUES (999);"
                        }
                    })?;
                    Ok(())
                }),
                fx.effect("innocent"),
            ]
        };
        let bounded = config(86_400, 100).with(|c| c.disk_timeout = Duration::from_secs(2));
        let (_fx, outcomes) = one_batch_with(bounded, writes).await;
        assert_eq!(runs.load(Ordering::SeqCst), 1, "orphan={orphan}: run once");
        assert!(outcomes[3].is_ok(), "orphan={orphan}: {outcomes:?}");
    }
}

/// The application's slow reads (a report on `Database::read`), as many as there are reader
/// threads, took them all: a replay the memory tier did not hold queued behind them and
/// failed as a disk that did not answer (helper-93). One thread stays the store's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_application_reads_leave_a_reader_for_the_store() {
    use crate::store::sqlite::readers::READER_THREADS;
    use crate::store::Database;

    let fx = Fixture::sqlite();
    let config = config(86_400, 100).with(|c| {
        c.memory_tier_bytes = 0;
        c.disk_timeout = Duration::from_millis(500);
    });
    let cache = fx.cache(&config).await;
    execute(&cache, &key(1), "{}", "one").await;
    let db = Database::new(cache.store().clone());
    let reads: Vec<_> = (0..READER_THREADS)
        .map(|_| {
            let db = db.clone();
            tokio::spawn(async move {
                let report = |_: &rusqlite::Connection| {
                    std::thread::sleep(Duration::from_millis(1500));
                    Ok::<_, rusqlite::Error>(())
                };
                db.read(report).await
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let hash = request_hash(b"{}").unwrap();
    let claimed = cache.claim(&key(1), "message/send", &hash).await;
    assert!(
        matches!(claimed, Ok(Claim::Cached(_))),
        "{:?}",
        claimed.err()
    );
    for read in reads {
        // Each outlasts `disk_timeout`, and is answered so: the application's to bound.
        let _ = read.await.unwrap();
    }
}

/// A stream a crash interrupted, at the last second of its TTL, is claimed by a call of
/// another payload, whose second read comes after the TTL ran out: that call wins the key and
/// binds it to its own payload. The stream's own retry, which came between the two reads and
/// waits on the key as the stream's, must be released to claim again (and meet the 422), not
/// attach to the other payload's events (found by helper-84; spec §7.3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_waiting_on_a_key_bound_anew_is_released_not_attached() {
    let fx = Fixture::sqlite();
    let (ttl, stream, other) = (
        100,
        request_hash(b"{}").unwrap(),
        request_hash(b"[]").unwrap(),
    );
    {
        let cache = fx.cache(&config(ttl, 100)).await;
        std::mem::forget(opened_stream(&cache, &key(1), &stream).await); // its process died
    }
    let store = SqliteStore::open_with_clock(&fx.path, &config(ttl, 100), fx.clock.clone());
    let pausing = Pausing::new(Arc::new(store.unwrap()), 1); // the other call's second read
    let cache = IdempotencyCache::from_arc(pausing.clone());
    fx.clock.advance(Duration::from_secs(ttl)); // the stream's last second
    let claiming = {
        let (cache, other) = (cache.clone(), other.clone());
        tokio::spawn(async move { cache.claim(&key(1), "message/stream", &other).await })
    };
    pausing.paused.notified().await;
    fx.clock.advance(Duration::from_secs(1));
    let Claim::InFlight(retry) = cache
        .claim(&key(1), "message/stream", &stream)
        .await
        .unwrap()
    else {
        panic!("the key is held in the interrupted stream's name")
    };
    let waiting = tokio::spawn(retry.wait(Duration::from_secs(10), true));
    pausing.resume.notify_one();
    let Ok(Claim::Execute(mut ticket)) = claiming.await.unwrap() else {
        panic!("the other payload wins the key once the stream's record expired")
    };
    ticket
        .open_stream("9".into(), stream_event(0), Vec::new())
        .await
        .unwrap();
    ticket.set_progress(Arc::new("the other payload's events"));
    assert!(
        matches!(waiting.await.unwrap(), Waited::Released),
        "the retry of one payload must never attach to another's stream"
    );
    let again = cache
        .claim(&key(1), "message/stream", &stream)
        .await
        .unwrap();
    assert!(matches!(again, Claim::InFlight(f) if f.request_hash() == &other));
}

/// A failing write with a savepoint of its own, named as the writer's was (`job`): the
/// writer's `ROLLBACK TO` took the write's savepoint, and the rows before it committed,
/// again at each retry (found by helper-86). The writer's own savepoint is refused to writes.
#[tokio::test]
async fn a_failing_write_commits_nothing_whatever_savepoints_it_opens() {
    let fx = Fixture::sqlite();
    let store = fx.store(&config(86_400, 100)).await;
    fx.create_effects(&store).await;
    for name in ["job", "idem_writer_job"] {
        let insert = "INSERT INTO effects (name) VALUES ('before its savepoint')";
        let savepoint = format!("SAVEPOINT {name}");
        let own_savepoint = SqlWrite::once(move |db| {
            db.execute(insert, [])?;
            db.execute_batch(&savepoint)?;
            db.execute("INSERT INTO effects (name) VALUES ('inside')", [])?;
            Err("the application refuses".into())
        });
        assert!(store.apply(vec![own_savepoint]).await.is_err());
        assert_eq!(fx.effects().await, Vec::<String>::new(), "{name}");
    }
    store.apply(vec![fx.effect("after")]).await.unwrap();
    assert_eq!(fx.effects().await, ["after"]);
}

/// A write that changes the writer connection's lasting settings, even one that then
/// fails, changed them for every later call: `query_only` failed them all until a restart
/// (found by helper-86). Such a `PRAGMA`, `ATTACH` and `DETACH` are refused to writes; the
/// schema's reads and the header's version are not.
#[tokio::test]
async fn a_write_cannot_change_the_writer_s_settings_for_later_calls() {
    let fx = Fixture::sqlite();
    let store = fx.store(&config(86_400, 100)).await;
    fx.create_effects(&store).await;
    let lasting = [
        "PRAGMA query_only = ON",
        "PRAGMA busy_timeout = 0",
        "PRAGMA locking_mode = EXCLUSIVE",
        "PRAGMA recursive_triggers = ON",
        "ATTACH DATABASE ':memory:' AS other",
    ];
    for sql in lasting {
        let write = SqlWrite::rerunnable(move |db| Ok(db.execute_batch(sql)?));
        let refused = store.apply(vec![write]).await.unwrap_err().to_string();
        assert!(refused.contains("not authorized"), "{sql}: {refused}");
        store.apply(vec![fx.effect(sql)]).await.unwrap();
    }
    assert_eq!(fx.effects().await.len(), lasting.len());
    let reads = SqlWrite::rerunnable(|db| {
        db.execute_batch("PRAGMA user_version = 7; PRAGMA defer_foreign_keys = ON")?;
        let columns: i64 = db.query_row(
            "SELECT COUNT(*) FROM pragma_table_info('effects')",
            [],
            |r| r.get(0),
        )?;
        db.prepare("PRAGMA table_info(effects)")?;
        assert_eq!(columns, 1);
        Ok(())
    });
    store.apply(vec![reads]).await.unwrap();
}

/// A symlink to no file is named as such, where the open failed with "No such file or
/// directory" alone (found by helper-89).
#[test]
fn a_symlink_to_no_file_is_refused_saying_so() {
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("link.db");
    std::os::unix::fs::symlink(dir.path().join("missing.db"), &link).unwrap();
    let refused = SqliteStore::open(&link, &config(86_400, 100))
        .err()
        .unwrap()
        .to_string();
    assert!(
        refused.contains("a symlink to a file that does not exist"),
        "{refused}"
    );
    assert!(refused.contains("link.db"), "{refused}");
}

/// The uses a stretch of replays notes are written a batch's worth at a time: a write queued
/// behind them sees `PER_WRITE` of them in its own transaction, not all (taken whole, the uses
/// of 50,000 replayed keys held the next fresh call 0.7 s, and every call queued behind it:
/// helper-122); the rest are written by batches of their own before the writer waits again
/// (they waited for later writes: helper-125).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_uses_of_many_replays_are_written_a_batchs_worth_at_a_time() {
    use crate::clock::Clock;
    use crate::store::touches::PER_WRITE;
    use crate::store::Database;

    let fx = Fixture::sqlite();
    let cache = fx.cache(&config(86_400, 100_000)).await;
    let replayed = (PER_WRITE * 8) as u32;
    let keys: Vec<_> = (0..replayed).map(key).collect();
    for chunk in keys.chunks(256) {
        futures::future::join_all(chunk.iter().map(|k| execute(&cache, k, "{}", "old"))).await;
    }
    // The writer held (entered before any use is noted, so no batch takes one before the
    // writer is let go).
    let (release, holding) = hold_the_writer(&cache).await;
    let db = Database::new(cache.store().clone());
    fx.clock.advance(Duration::from_secs(5));
    let used_at = fx.clock.now_millis() as i64;
    replay_all(&cache, &keys).await;
    let written = "SELECT COUNT(*) FROM idempotency_cache WHERE last_used_at >= ?1";
    // Queued (at its first poll) behind the batch the replays asked for, so taken with it: it
    // reads that batch's uses in their transaction.
    let mut behind = Box::pin(
        db.transact(move |conn| conn.query_row(written, [used_at], |row| row.get::<_, i64>(0))),
    );
    assert!(futures::poll!(&mut behind).is_pending());
    drop(release);
    holding.await.unwrap().unwrap();
    assert_eq!(behind.await.unwrap(), PER_WRITE as i64, "one batch's worth");

    let file = rusqlite::Connection::open(&fx.path).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let n: i64 = file
            .query_row(written, [used_at], |row| row.get(0))
            .unwrap();
        if n == i64::from(replayed) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{n} of {replayed} uses written"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Replays alone write their uses too: once a batch's worth waits, the writer is asked for a
/// batch of nothing else (it ran none while only replays came, and the uses piled up).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replays_alone_have_their_uses_written() {
    use crate::clock::Clock;
    use crate::store::touches::PER_WRITE;

    let fx = Fixture::sqlite();
    let cache = fx.cache(&config(86_400, 100_000)).await;
    let keys: Vec<_> = (0..PER_WRITE as u32).map(key).collect();
    futures::future::join_all(keys.iter().map(|k| execute(&cache, k, "{}", "old"))).await;
    fx.clock.advance(Duration::from_secs(5));
    let used_at = fx.clock.now_millis() as i64;
    replay_all(&cache, &keys).await;
    let file = rusqlite::Connection::open(&fx.path).unwrap();
    let written = || -> i64 {
        file.query_row(
            "SELECT COUNT(*) FROM idempotency_cache WHERE last_used_at >= ?1",
            [used_at],
            |row| row.get(0),
        )
        .unwrap()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while written() < PER_WRITE as i64 {
        assert!(
            std::time::Instant::now() < deadline,
            "{} uses written",
            written()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A `message/send` claim of each of `keys`, each one a replay (of params `{}`).
async fn replay_all(cache: &IdempotencyCache, keys: &[crate::message_id::MessageId]) {
    let hash = request_hash(b"{}").unwrap();
    for k in keys {
        let claim = cache.claim(k, "message/send", &hash).await.unwrap();
        assert!(matches!(claim, Claim::Cached(_)), "{k} replays");
    }
}

/// The writer's connection commits durably: to the log (WAL), synced at every commit
/// (`synchronous=FULL`), as spec §4.3.4's host reboot needs. No crash a test here can cause
/// tells a synced commit from one left in the OS's cache, so the settings are read: with
/// `synchronous` off every other test passed (helper-123).
#[tokio::test]
async fn the_writer_syncs_the_log_at_every_commit() {
    use crate::store::Database;

    let fx = Fixture::sqlite();
    let cache = fx.cache(&config(86_400, 100)).await;
    let db = Database::new(cache.store().clone());
    let settings = db.transact(|conn| {
        let journal: String = conn.query_row("PRAGMA journal_mode", [], |row| row.get(0))?;
        let synchronous: i64 = conn.query_row("PRAGMA synchronous", [], |row| row.get(0))?;
        Ok::<_, rusqlite::Error>((journal, synchronous))
    });
    let (journal, synchronous) = settings.await.unwrap();
    assert_eq!(journal, "wal");
    assert_eq!(synchronous, 2, "FULL");
}

/// A `file:` URI or `:memory:` is refused before anything is created: SQLite opened the file
/// a URI names while the lock was taken at the literal name, so a server on `foo.db` and one
/// on `file:foo.db` served one file, each running the other's retries again (helper-121).
#[test]
fn a_uri_or_memory_is_refused_before_anything_is_created() {
    let fx = Fixture::sqlite();
    let dir = fx.path.parent().unwrap().to_owned();
    let served = SqliteStore::open(&fx.path, &config(86_400, 100)).unwrap();
    let uri = format!("file:{}", fx.path.display());
    for (given, says) in [
        (uri.as_str(), "a URI"),
        (":memory:", "not a file"),
        ("", "not a file"),
    ] {
        let Err(refused) = SqliteStore::open(given, &config(86_400, 100)) else {
            panic!("{given:?} was opened beside the served file");
        };
        assert!(
            matches!(refused, StoreError::NotServable { .. }),
            "{refused:?}"
        );
        assert!(refused.to_string().contains(says), "{refused}");
    }
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    let file = fx.path.file_name().unwrap().to_str().unwrap();
    let expected = ["", "-shm", "-wal", ".lock"].map(|suffix| format!("{file}{suffix}"));
    assert_eq!(names, expected, "nothing made at the literal names");
    served.close();
}
