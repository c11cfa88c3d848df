//! Exactly-once across crashes: example servers under concurrent load, one of them killed
//! with SIGKILL at random instants and restarted on the same database; then every request
//! ever sent is retried, on any of them. No messageId may have two tasks or two
//! `mission.assigned` events, and every answer a client received before a kill must replay
//! byte-for-byte. Run on one server over SQLite, and on two replicas over one PostgreSQL
//! database, where a retry may reach the other replica while the dead one's claim still holds.
//!
//! `IDEM_CRASH_CYCLES` sets the number of kills (default 20) for a longer soak, and
//! `IDEM_CRASH_SEED` replays the instants of a failed run (the seed is printed).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use crate::replicas::Database;
use crate::support::{new_id, send_with, try_post, Reply, SseReply, ACTIVATED};
use idem_conformance::server_process::ServerProcess;
use idem_conformance::side_effects::SideEffects;
use idem_conformance::Db;

const CLIENTS: usize = 16;

/// One request a client sent, and the answer it got before the kill, if any.
struct Sent {
    message_id: String,
    body: String,
    answer: Option<Reply>,
}

/// A small deterministic generator (xorshift), so a failing run can be replayed by its seed.
struct Rng(u64);

impl Rng {
    fn from_env() -> Self {
        let seed = std::env::var("IDEM_CRASH_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
                nanos.unwrap().as_nanos() as u64 | 1
            });
        eprintln!("crash test seed: IDEM_CRASH_SEED={seed}");
        Self(seed)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

fn cycles() -> usize {
    std::env::var("IDEM_CRASH_CYCLES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(20)
}

/// Sends fresh `message/send` calls one after another until `stop`, keeping what came back.
async fn client(url: String, stop: Arc<AtomicBool>, duration_ms: u64) -> Vec<Sent> {
    let mut sent = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let message_id = new_id();
        let metadata = json!({"durationMs": duration_ms});
        let body = send_with(1, "message/send", &message_id, "crash", metadata);
        let answer = try_post(&url, body.clone(), ACTIVATED).await.ok();
        let stopped = answer.is_none();
        sent.push(Sent {
            message_id,
            body,
            answer,
        });
        if stopped {
            break; // the server is gone; the next cycle has a new address
        }
    }
    sent
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_at_random_instants_never_creates_a_second_task() {
    let mut servers = [ServerProcess::start(&[])];
    let side_effects = SideEffects {
        db: Some(servers[0].side_effects_db()),
    };
    kill_and_retry_everything(&mut servers, &side_effects).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_either_replica_at_random_instants_never_creates_a_second_task() {
    let Some(db) = Database::shared("idem_crash", "the replicas' crash test").await else {
        return;
    };
    // A dead replica's claims are taken over after this; the retries wait for it.
    let lease = [("AIWG_IDEMPOTENCY_CLAIM_LEASE_MS", "2000")];
    let replica = || ServerProcess::start_on(Some(db.url()), &[], &lease);
    let mut servers = [replica(), replica()];
    let side_effects = SideEffects {
        db: Some(Db::Postgres(db.url().to_owned())),
    };
    kill_and_retry_everything(&mut servers, &side_effects).await;
}

/// The soak: clients spread over `servers`, one server killed and restarted per cycle, then
/// every call retried, spread over them again, and the answers and side effects checked.
async fn kill_and_retry_everything(servers: &mut [ServerProcess], side_effects: &SideEffects) {
    let mut rng = Rng::from_env();
    let mut sent = Vec::new();
    for _ in 0..cycles() {
        let stop = Arc::new(AtomicBool::new(false));
        let clients: Vec<_> = (0..CLIENTS)
            .map(|n| {
                // Missions that end within the cycle complete through the writer meanwhile.
                let duration_ms = rng.below(400);
                let url = servers[n % servers.len()].url.clone();
                tokio::spawn(client(url, stop.clone(), duration_ms))
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(50 + rng.below(250))).await;
        let victim = rng.below(servers.len() as u64) as usize;
        servers[victim].restart(); // SIGKILL, whatever is in flight
        stop.store(true, Ordering::Relaxed);
        for client in clients {
            sent.extend(client.await.unwrap());
        }
    }
    let unanswered = sent.iter().filter(|s| s.answer.is_none()).count();
    assert!(unanswered > 0, "no kill caught a call in flight");

    let chunks = sent.chunks(sent.len().div_ceil(CLIENTS));
    let retries = futures::future::join_all(chunks.enumerate().map(|(n, chunk)| {
        let url = servers[n % servers.len()].url.clone();
        async move {
            let mut replies = Vec::new();
            for s in chunk {
                let reply = try_post(&url, s.body.clone(), ACTIVATED).await;
                replies.push(reply.expect("the last servers answer every retry"));
            }
            replies
        }
    }))
    .await;
    let mut task_of = HashMap::new();
    for (s, retry) in sent.iter().zip(retries.into_iter().flatten()) {
        assert_eq!(
            retry.status,
            200,
            "{}",
            String::from_utf8_lossy(&retry.body)
        );
        let task_id = retry.json()["result"]["id"].as_str().map(str::to_owned);
        let task_id = task_id.unwrap_or_else(|| panic!("a task: {}", retry.json()));
        if let Some(answer) = &s.answer {
            assert!(
                retry.replayed(),
                "an answered call replays: {}",
                s.message_id
            );
            assert_eq!(retry.body, answer.body, "byte-for-byte: {}", s.message_id);
        }
        let earlier = task_of.insert(task_id, &s.message_id);
        assert_eq!(earlier, None, "two messageIds answered with one task");
    }
    // Every task in the database is the one a messageId's retry named, with one event.
    let assigned = side_effects.assigned_per_task().unwrap().unwrap();
    for (task_id, events) in &assigned {
        let message_id = task_of.get(task_id);
        assert!(message_id.is_some(), "task {task_id} is no call's answer");
        assert_eq!(*events, 1, "mission.assigned of {}", message_id.unwrap());
    }
    assert_eq!(assigned.len(), sent.len(), "one task per messageId");
    // And no event of a task that is not there, which the count per task cannot see
    // (helper-81).
    let totals = side_effects.snapshot().unwrap().unwrap();
    assert_eq!(
        totals.assigned,
        sent.len() as i64,
        "every mission.assigned is a task's"
    );
    eprintln!(
        "{} calls over {} kills of {} server(s), {unanswered} cut off by a kill",
        sent.len(),
        cycles(),
        servers.len()
    );
}

/// Killed after its second event, not its first alone: a store that made only the first
/// event durable passed when the kill came right after it (found by helper-81).
#[tokio::test]
async fn a_stream_killed_after_its_first_event_is_never_executed_again() {
    killed_mid_stream(&[], ACTIVATED).await
}

/// The same with keys scoped by principal: the interrupted error names the client's
/// messageId, not the key the store holds it under (found by helper-111).
#[tokio::test]
async fn a_caller_s_stream_killed_mid_way_is_never_executed_again() {
    let headers = [ACTIVATED[0], ("X-Principal", "alice")];
    killed_mid_stream(&["--principal-header", "X-Principal"], &headers).await
}

async fn killed_mid_stream(args: &[&str], headers: &[(&str, &str)]) {
    let mut server = ServerProcess::start_with(args, &[]);
    let mid = new_id();
    let body = send_with(1, "message/stream", &mid, "go", json!({"durationMs": 6000}));
    let mut first = SseReply::open(&server.url, body.clone(), headers).await;
    let task = first.next_event().await.expect("the first event");
    let working = first
        .next_event()
        .await
        .expect("the status halfway, 3 s in");
    assert_eq!(working["result"]["final"], false, "{working}");
    let task_id = task["result"]["id"].as_str().unwrap().to_owned();
    let received = first.raw().to_vec();

    let url = server.restart(); // SIGKILL mid-stream: the next event was 3 s away
    let mut retry = SseReply::open(&url, body.clone(), headers).await;
    assert_eq!(retry.status, 200);
    assert_eq!(retry.content_type(), "text/event-stream");
    assert!(retry.replayed());
    let events = retry.rest().await;
    assert_eq!(events.len(), 3, "{events:?}");
    assert!(
        retry.raw().starts_with(&received),
        "every event the client received, byte-for-byte"
    );
    assert_eq!(events[..2], [task, working]);
    assert_eq!(events[2]["id"], 1);
    let error = &events[2]["error"]["data"];
    assert_eq!(
        error["code"], "IDEMPOTENCY_STREAM_INTERRUPTED",
        "{events:?}"
    );
    assert_eq!(error["message_id"], mid.as_str(), "{events:?}");

    let mut again = SseReply::open(&url, body, headers).await;
    again.rest().await;
    assert!(again.replayed());
    assert_eq!(
        again.raw(),
        retry.raw(),
        "the interrupted outcome is what is cached"
    );

    let side_effects = SideEffects {
        db: Some(server.side_effects_db()),
    };
    let assigned = side_effects.assigned_per_task().unwrap().unwrap();
    assert_eq!(
        assigned,
        HashMap::from([(task_id.clone(), 1)]),
        "one task, one event"
    );
    // The mission itself was resumed by the restart and still completes.
    let get = json!({"jsonrpc": "2.0", "id": 2, "method": "tasks/get", "params": {"id": task_id}});
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let reply = try_post(&url, get.to_string(), &[]).await.unwrap();
        if reply.json()["result"]["status"]["state"] == "completed" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{}", reply.json());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
