//! `cargo bench`: the costs that matter on the request path, as ratios measured in one run
//! (the machine is shared and noisy, so absolute figures only frame the ratios).
//!
//! - hashing: `request_hash` (I-JSON/number check + JCS + SHA-256, one pass over the raw
//!   bytes) against a plain `serde_json` parse of the same 1.6 KB params, the `spelling` that
//!   recognises a byte-identical resend, and our JCS writer against `serde_jcs`;
//! - durability: stored entries per second with 1 writer at a time against 64 concurrent
//!   writers, which share fsyncs through group commit;
//! - lookups in a store of 1,000 rows against one of 1,000,000: a fresh key (the key index), a
//!   stored entry in memory (the memory tier), a stored entry read from the file;
//! - the TTL sweep of 100,000 expired rows under a load of 64 concurrent writers: their p99
//!   latency with the sweep running against without it;
//! - a stream's events recorded durably, one commit an event against the events a stream has
//!   ready recorded together (as the guard gathers them).

use std::sync::Arc;
use std::time::{Duration, Instant};

use idem::hash::request_hash;
use idem::message_id::MessageId;
use idem::store::{Entry, Lease, OpenStream, SqliteStore, Store, StoredResponse};
use idem::testing::Clock;
use idem::IdempotencyConfig;
use serde_json::json;

fn main() {
    let params = sample_params();
    println!("params: {} bytes", params.len());
    let parse = per_op(|| {
        let v: serde_json::Value = serde_json::from_slice(&params).unwrap();
        std::hint::black_box(v);
    });
    let hash = per_op(|| {
        std::hint::black_box(request_hash(&params).unwrap());
    });
    let spelled = per_op(|| {
        std::hint::black_box(idem::hash::spelling(&params));
    });
    let value: serde_json::Value = serde_json::from_slice(&params).unwrap();
    let ours = per_op(|| {
        std::hint::black_box(idem::hash::canonical_json(&value).unwrap());
    });
    let reference = per_op(|| {
        std::hint::black_box(serde_jcs::to_vec(&value).unwrap());
    });
    println!("serde_json parse      {:>9.2} us/op", micros(parse));
    println!("JCS, serde_jcs        {:>9.2} us/op", micros(reference));
    println!(
        "JCS, ours             {:>9.2} us/op   ({:.1}x faster than serde_jcs)",
        micros(ours),
        ratio(reference, ours)
    );
    println!(
        "request_hash          {:>9.2} us/op   ({:.1}x a plain parse)",
        micros(hash),
        ratio(hash, parse)
    );
    println!(
        "spelling (resend)     {:>9.2} us/op   ({:.1}x a plain parse)",
        micros(spelled),
        ratio(spelled, parse)
    );

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let sequential = store_rate(1, 200).await;
        let concurrent = store_rate(64, 2000).await;
        println!("durable puts, 1 at a time   {sequential:>9.0} entries/s");
        println!(
            "durable puts, 64 concurrent {concurrent:>9.0} entries/s   ({:.1}x through group commit)",
            concurrent / sequential
        );
        lookups_by_store_size().await;
        sweep_under_load().await;
        let alone = stream_event_rate(1).await;
        let together = stream_event_rate(256).await;
        println!("stream events, 1 a commit       {alone:>9.0} events/s");
        println!(
            "stream events, 256 a commit     {together:>9.0} events/s   ({:.1}x)",
            together / alone
        );
    });
}

fn bench_key(i: u64) -> MessageId {
    MessageId::parse_str(&format!("9b2e7c1a-3f4d-4e5a-8b6c-{i:012x}")).unwrap()
}

/// A store file holding `rows` entries (inserted directly, in one transaction), `age_s` old.
fn filled_store(dir: &std::path::Path, rows: u64, age_s: u64) -> std::path::PathBuf {
    let path = dir.join(format!("rows-{rows}.db"));
    drop(SqliteStore::open(&path, &IdempotencyConfig::default()).unwrap()); // the schema
    let mut conn = idem::store::rusqlite::Connection::open(&path).unwrap();
    let tx = conn.transaction().unwrap();
    {
        let mut insert = tx
            .prepare(
                "INSERT INTO idempotency_cache (message_id, request_hash, response_status,
                   response_headers, response_body, inserted_at, method, last_used_at)
                 VALUES (?1, ?2, 200, X'7b7d', ?3, ?4, 'message/send', 0)",
            )
            .unwrap();
        let hash = request_hash(b"{}").unwrap();
        let body = vec![b'x'; 200];
        let inserted_at = idem::testing::SystemClock.now_seconds() - age_s;
        for i in 0..rows {
            let key = bench_key(i);
            insert
                .execute(idem::store::rusqlite::params![
                    key.as_str(),
                    hash.as_str(),
                    body,
                    inserted_at as i64
                ])
                .unwrap();
        }
    }
    tx.commit().unwrap();
    path
}

/// Mean time of an async `f` over `n` runs.
async fn per_async_op<F: std::future::Future<Output = ()>>(
    n: u64,
    mut f: impl FnMut(u64) -> F,
) -> Duration {
    let start = Instant::now();
    for i in 0..n {
        f(i).await;
    }
    start.elapsed() / n as u32
}

async fn lookups_by_store_size() {
    let dir = tempfile::tempdir().unwrap();
    let config = |tier| {
        IdempotencyConfig::default().with(|c| {
            c.max_cache_entries = 2_000_000;
            c.memory_tier_bytes = tier;
        })
    };
    let mut figures = Vec::new();
    for rows in [1_000u64, 1_000_000] {
        let path = filled_store(dir.path(), rows, 0);
        let (fresh, memory, file, open);
        {
            // Opening loads the key index: every entry's key and rowid, from an index.
            let started = Instant::now();
            let store = SqliteStore::open(&path, &config(64 << 20)).unwrap();
            open = started.elapsed();
            fresh = per_async_op(20_000, |i| {
                let key = bench_key(rows + i);
                let store = &store;
                async move {
                    std::hint::black_box(store.lookup(&key).await.unwrap());
                }
            })
            .await;
            let hot: Vec<_> = (0..100).map(|i| bench_key(i * (rows / 100))).collect();
            for key in &hot {
                store.lookup(key).await.unwrap(); // now resident
            }
            memory = per_async_op(20_000, |i| {
                let key = &hot[(i % 100) as usize];
                let store = &store;
                async move {
                    std::hint::black_box(store.lookup(key).await.unwrap());
                }
            })
            .await;
        }
        {
            let store = SqliteStore::open(&path, &config(0)).unwrap();
            file = per_async_op(20_000, |i| {
                let key = bench_key((i * 7919) % rows);
                let store = &store;
                async move {
                    std::hint::black_box(store.lookup(&key).await.unwrap());
                }
            })
            .await;
        }
        println!(
            "lookup, {rows:>9} rows: fresh key {:>6.2} us, in memory {:>6.2} us, from the file {:>6.2} us (open: {:.1} ms)",
            micros(fresh),
            micros(memory),
            micros(file),
            open.as_secs_f64() * 1000.0
        );
        figures.push((fresh, memory, file));
    }
    let (small, large) = (figures[0], figures[1]);
    println!(
        "lookup, 1M rows / 1k rows:  fresh key {:.2}x, in memory {:.2}x, from the file {:.2}x",
        ratio(large.0, small.0),
        ratio(large.1, small.1),
        ratio(large.2, small.2)
    );
}

/// p99 latency of claim-and-complete under 64 concurrent writers for `for_how_long`.
async fn p99_under_load(
    store: &Arc<SqliteStore>,
    first_key: u64,
    for_how_long: Duration,
) -> Duration {
    let hash = request_hash(b"{}").unwrap();
    let deadline = Instant::now() + for_how_long;
    let tasks: Vec<_> = (0..64u64)
        .map(|w| {
            let (store, hash) = (store.clone(), hash.clone());
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                let mut i = first_key + w;
                while Instant::now() < deadline {
                    let start = Instant::now();
                    let key = bench_key(i);
                    store_fresh(&store, &key, &hash).await;
                    latencies.push(start.elapsed());
                    i += 64;
                }
                latencies
            })
        })
        .collect();
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.unwrap());
    }
    all.sort();
    all[all.len() * 99 / 100]
}

async fn sweep_under_load() {
    let dir = tempfile::tempdir().unwrap();
    let path = filled_store(dir.path(), 100_000, 2 * 86_400);
    let config = IdempotencyConfig::default().with(|c| c.max_cache_entries = 1_000_000);
    let store = Arc::new(SqliteStore::open(&path, &config).unwrap());
    let quiet = p99_under_load(&store, 10_000_000, Duration::from_secs(3)).await;
    let sweeper = {
        let store = store.clone();
        tokio::spawn(async move {
            let start = Instant::now();
            let swept = store.sweep().await.unwrap();
            (swept, start.elapsed())
        })
    };
    let swept_p99 = p99_under_load(&store, 20_000_000, Duration::from_secs(3)).await;
    let (swept, took) = sweeper.await.unwrap();
    assert_eq!(swept, 100_000);
    println!(
        "64 writers, p99: {:.2} ms without a sweep, {:.2} ms while {swept} expired rows were swept ({:.2}x; the sweep took {:.2} s)",
        micros(quiet) / 1000.0,
        micros(swept_p99) / 1000.0,
        ratio(swept_p99, quiet),
        took.as_secs_f64()
    );
}

/// A 1.6 KB `message/send` params object, like a real A2A client sends.
fn sample_params() -> Vec<u8> {
    let parts: Vec<_> = (0..12)
        .map(|i| json!({"kind": "text", "text": format!("step {i}: collect the telemetry and summarize anomalies"), "metadata": {"n": i, "w": 0.25}}))
        .collect();
    serde_json::to_vec(&json!({
        "message": {"kind": "message", "messageId": "0190b5a4-7c3e-7d2a-9f11-2b3c4d5e6f70", "role": "user", "parts": parts},
        "configuration": {"acceptedOutputModes": ["text/plain"], "historyLength": 10, "blocking": false},
        "metadata": {"tenant": "acme", "trace": {"id": "4bf92f3577b34da6a3ce929d0e0e4736", "sampled": true}}
    }))
    .unwrap()
}

/// Mean time of `f` over at least half a second.
fn per_op(mut f: impl FnMut()) -> Duration {
    for _ in 0..200 {
        f();
    }
    let start = Instant::now();
    let mut n = 0u32;
    while start.elapsed() < Duration::from_millis(500) {
        for _ in 0..100 {
            f();
        }
        n += 100;
    }
    start.elapsed() / n
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn ratio(a: Duration, b: Duration) -> f64 {
    a.as_secs_f64() / b.as_secs_f64()
}

/// Stores a small response for a fresh key, durably, as a won claim's completion does (the
/// lookup a claim makes first, then the put; on SQLite this process's table is the claim).
async fn store_fresh(store: &SqliteStore, key: &MessageId, hash: &idem::hash::RequestHash) {
    let found = store.lookup(key).await.unwrap();
    assert!(matches!(found, idem::store::Found::Nothing), "fresh key");
    let body = br#"{"jsonrpc":"2.0","id":1,"result":{"kind":"task"}}"#.to_vec();
    let entry = Entry {
        message_id: key.clone(),
        method: "message/send".into(),
        request_hash: hash.clone(),
        response: StoredResponse {
            status: 200,
            headers: vec![],
            body,
        },
        inserted_at: store.now_seconds(),
    };
    let lease = Lease::exclusive();
    store.put(Arc::new(entry), vec![], &lease).await.unwrap();
}

/// Events per second one stream records durably, `batch` events a commit.
async fn stream_event_rate(batch: usize) -> f64 {
    const EVENTS: usize = 2_000;
    let dir = tempfile::tempdir().unwrap();
    let store =
        SqliteStore::open(dir.path().join("bench.db"), &IdempotencyConfig::default()).unwrap();
    let event = |n: usize| {
        let text = format!("data: {{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{{\"seq\":{n}}}}}\n\n");
        bytes::Bytes::from(text)
    };
    let stream = OpenStream {
        message_id: bench_key(1),
        method: "message/stream".into(),
        request_hash: request_hash(b"{}").unwrap(),
        jsonrpc_id: "1".into(),
        recorded_at: store.now_seconds(),
    };
    let lease = Lease::exclusive();
    store
        .open_stream(&stream, event(0), vec![], &lease)
        .await
        .unwrap();
    let start = Instant::now();
    for first in (1..EVENTS).step_by(batch) {
        let events = (first..(first + batch).min(EVENTS)).map(event).collect();
        let key = &stream.message_id;
        store
            .append_events(key, first as u32, events, &lease)
            .await
            .unwrap();
    }
    (EVENTS - 1) as f64 / start.elapsed().as_secs_f64()
}

/// Entries per second stored durably by `writers` concurrent claim-and-complete loops.
async fn store_rate(writers: usize, total: usize) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let store =
        SqliteStore::open(dir.path().join("bench.db"), &IdempotencyConfig::default()).unwrap();
    let store = Arc::new(store);
    let hash = request_hash(b"{}").unwrap();
    let start = Instant::now();
    let tasks: Vec<_> = (0..writers)
        .map(|w| {
            let (store, hash) = (store.clone(), hash.clone());
            tokio::spawn(async move {
                for i in (w..total).step_by(writers) {
                    store_fresh(&store, &bench_key(i as u64), &hash).await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    total as f64 / start.elapsed().as_secs_f64()
}
