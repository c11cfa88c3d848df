//! `cargo bench`: the costs that matter on the request path, as ratios measured in one run
//! (the machine is shared and noisy, so absolute figures only frame the ratios).
//!
//! - hashing: `request_hash` (I-JSON/number check + JCS + SHA-256, one pass over the raw
//!   bytes) against a plain `serde_json` parse of the same 1.6 KB params, the `spelling` that
//!   recognises a byte-identical resend, and our JCS writer against `serde_jcs`;
//! - durability: stored entries per second with 1 writer at a time against 64 concurrent
//!   writers, which share fsyncs through group commit.

use std::sync::Arc;
use std::time::{Duration, Instant};

use idem::{
    request_hash, Claim, IdempotencyCache, IdempotencyConfig, MessageId, SqliteStore,
    StoredResponse,
};
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
        std::hint::black_box(idem::spelling(&params));
    });
    let value: serde_json::Value = serde_json::from_slice(&params).unwrap();
    let ours = per_op(|| {
        std::hint::black_box(idem::canonical_json(&value).unwrap());
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
    });
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

/// Entries per second stored durably by `writers` concurrent claim-and-complete loops.
async fn store_rate(writers: usize, total: usize) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let store =
        SqliteStore::open(dir.path().join("bench.db"), &IdempotencyConfig::default()).unwrap();
    let cache = Arc::new(IdempotencyCache::new(store));
    let hash = request_hash(b"{}").unwrap();
    let start = Instant::now();
    let tasks: Vec<_> = (0..writers)
        .map(|w| {
            let (cache, hash) = (cache.clone(), hash.clone());
            tokio::spawn(async move {
                for i in (w..total).step_by(writers) {
                    let key =
                        MessageId::parse_str(&format!("9b2e7c1a-3f4d-4e5a-8b6c-{i:012x}")).unwrap();
                    let Claim::Execute(ticket) =
                        cache.claim(&key, "message/send", &hash).await.unwrap()
                    else {
                        panic!("fresh key")
                    };
                    let body = br#"{"jsonrpc":"2.0","id":1,"result":{"kind":"task"}}"#.to_vec();
                    ticket
                        .complete(StoredResponse {
                            status: 200,
                            headers: vec![],
                            body,
                        })
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    total as f64 / start.elapsed().as_secs_f64()
}
