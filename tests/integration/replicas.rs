//! Example-server processes on one PostgreSQL database, as replicas behind a load balancer:
//! duplicates sent to both execute once, a replica killed mid-execution leaves nothing behind
//! and its retry on the other executes once, a PostgreSQL restart fails calls clearly and the
//! servers recover on their own, and the conformance scenarios pass as on SQLite.
//!
//! Each test gets a database of its own on the server that `IDEM_TEST_POSTGRES_URL` names
//! (`.ci/run` starts one); without it the tests say SKIPPED and do not run, unless
//! `IDEM_REQUIRE_POSTGRES=1`, where they fail.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::support::{
    exited_within_30_s, metric, new_id, post_activated, send_with, stream_request, try_post,
    until_completed, Reply, SseReply, ACTIVATED, TASKS_STAGED,
};
use futures::FutureExt;
use idem_conformance::postgres::{self, TestDatabase};
use idem_conformance::server_process::{example_binary, ServerProcess};
use idem_conformance::side_effects::SideEffects;
use idem_conformance::{check, Db, Outcome, Restart, Scenario, Target};

/// A database of the test's own, dropped with it. Holds the server shared while it lives:
/// the test that restarts PostgreSQL holds it alone. Every PostgreSQL test of this crate
/// takes its database here ([`Database::shared`]), or that restart fails it.
pub(crate) struct Database {
    test: TestDatabase,
    _server: ServerGuard,
}

/// Held, never read: dropping it lets the other kind of test run.
#[allow(dead_code)]
enum ServerGuard {
    Shared(tokio::sync::RwLockReadGuard<'static, ()>),
    Alone(tokio::sync::RwLockWriteGuard<'static, ()>),
}

static SERVER: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

const WHAT: &str = "a PostgreSQL replica test";

impl Database {
    async fn create() -> Option<Self> {
        let server = ServerGuard::Shared(SERVER.read().await);
        Self::create_holding(server).await
    }

    /// A database for a test that stops and starts the server.
    async fn create_alone() -> Option<Self> {
        let server = ServerGuard::Alone(SERVER.write().await);
        Self::create_holding(server).await
    }

    async fn create_holding(server: ServerGuard) -> Option<Self> {
        let test = TestDatabase::create("idem_replicas", WHAT).await?;
        Some(Self {
            test,
            _server: server,
        })
    }

    pub(crate) fn url(&self) -> &str {
        &self.test.url
    }

    /// A database named `PREFIX_...` for another module's test (`what` names it when skipped).
    pub(crate) async fn shared(prefix: &str, what: &str) -> Option<Self> {
        let server = ServerGuard::Shared(SERVER.read().await);
        let test = TestDatabase::create(prefix, what).await?;
        Some(Self {
            test,
            _server: server,
        })
    }

    /// (tasks, mission.assigned events) in the database now.
    fn counts(&self) -> (i64, i64) {
        let side_effects = SideEffects {
            db: Some(Db::Postgres(self.test.url.clone())),
        };
        let counts = side_effects.snapshot().unwrap().unwrap();
        (counts.tasks, counts.assigned)
    }

    fn claims(&self) -> i64 {
        postgres::count(self.url(), "SELECT COUNT(*) FROM idempotency_claims", None).unwrap()
    }
}

fn replica(db: &Database, env: &[(&str, &str)]) -> ServerProcess {
    ServerProcess::start_on(Some(db.url()), &[], env)
}

/// The outbox's delivered events are deleted past `--outbox-retention` on PostgreSQL too (the
/// statement is SQLite's): the task stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivered_outbox_events_are_deleted_past_their_retention_on_postgres() {
    let Some(db) = Database::create().await else {
        return;
    };
    let args = ["--outbox-retention", "1"];
    let server = ServerProcess::start_on(Some(db.url()), &args, &[]);
    let body = send_with(1, "message/send", &new_id(), "x", json!({"durationMs": 50}));
    assert_eq!(post_activated(&server.url, body).await.status, 200);
    let left = || postgres::count(db.url(), "SELECT COUNT(*) FROM outbox", None).unwrap();
    assert!(left() > 0, "kept a second at least");
    let deadline = Instant::now() + Duration::from_secs(20);
    while left() > 0 {
        assert!(Instant::now() < deadline, "the outbox was not pruned");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(db.counts().0, 1, "the task stays");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_sent_to_two_replicas_at_once_execute_once() {
    let Some(db) = Database::create().await else {
        return;
    };
    let (a, b) = (replica(&db, &[]), replica(&db, &[]));
    for n in 0..8 {
        // Held back a moment, so the second arrives while the first executes.
        let body = send_with(
            n,
            "message/send",
            &new_id(),
            "hello",
            json!({"delayMs": 300}),
        );
        let (first, second) = tokio::join!(
            post_activated(&a.url, body.clone()),
            post_activated(&b.url, body.clone())
        );
        assert_eq!((first.status, second.status), (200, 200));
        assert!(first.json()["result"]["id"].is_string(), "{}", first.json());
        assert_eq!(first.body, second.body, "byte-identical answers");
        assert_eq!(
            [first.replayed(), second.replayed()]
                .iter()
                .filter(|r| **r)
                .count(),
            1,
            "one executed, one replayed"
        );
    }
    assert_eq!(db.counts(), (8, 8), "one task and one event per messageId");
    let staged = metric(&a.url, TASKS_STAGED).await + metric(&b.url, TASKS_STAGED).await;
    assert_eq!(staged, 8.0, "one body ran per messageId, on either replica");
}

/// A replica of another TTL than a serving one's refuses to start, naming both (its sweep
/// would delete what the other still replays), and leaves the other's entries alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_of_another_ttl_refuses_to_start_beside_a_serving_one() {
    let Some(db) = Database::create().await else {
        return;
    };
    let serving = replica(&db, &[]);
    let body = send_with(1, "message/send", &new_id(), "hello", json!({}));
    let first = post_activated(&serving.url, body.clone()).await;
    assert_eq!(first.status, 200, "{}", first.describe());
    let said = refused_to_start(&db, &[], &[("AIWG_IDEMPOTENCY_TTL", "3")]);
    let both = "keeps entries for 86400 s, where this one is configured for 3 s";
    assert!(said.contains(both), "{said}");
    let replay = post_activated(&serving.url, body).await;
    assert!(replay.replayed(), "{}", replay.describe());
    assert_eq!(replay.body, first.body);
    assert_eq!(db.counts(), (1, 1));
}

/// A replica that cannot read its tasks at startup (a session holds the table locked) says
/// why in PostgreSQL's own words; it said "db error", then "Internal error" (helper-114).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_cannot_read_its_tasks_says_why_in_postgres_s_words() {
    let Some(db) = Database::create().await else {
        return;
    };
    drop(replica(&db, &[])); // the tables
    let locker = postgres::connect(db.url()).await;
    let lock = "BEGIN; LOCK TABLE tasks IN ACCESS EXCLUSIVE MODE";
    locker.batch_execute(lock).await.unwrap();
    let short = [("AIWG_IDEMPOTENCY_CLAIM_LEASE_MS", "1000")];
    let said = refused_to_start(&db, &[], &short);
    assert!(said.contains("cannot read the tasks"), "{said}");
    assert!(said.contains("canceling statement due to"), "{said}");
}

/// A replica that would key calls otherwise (by principal, or not) than a serving one's
/// refuses to start, before the database holds any key too: the two would key one caller's
/// retry apart, and it would run again (helper-108).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_keyed_otherwise_refuses_to_start_beside_a_serving_one() {
    let Some(db) = Database::create().await else {
        return;
    };
    let serving = replica(&db, &[]);
    let scoped = ["--principal-header", "X-Principal"];
    let said = refused_to_start(&db, &scoped, &[]);
    let both = "keys calls in one global key space, where this one would key them scoped by \
                principal";
    assert!(said.contains(both), "{said}");
    let body = send_with(1, "message/send", &new_id(), "hello", json!({}));
    let first = post_activated(&serving.url, body.clone()).await;
    assert_eq!(first.status, 200, "{}", first.describe());
    assert_eq!(db.counts(), (1, 1));
}

/// Starts the example server on `db` with `args` and `envs` (beside a live replica, say),
/// and returns what it said as it refused to start (exit code 2).
fn refused_to_start(db: &Database, args: &[&str], envs: &[(&str, &str)]) -> String {
    let other = std::process::Command::new(example_binary("a2a_server"))
        .args(["--listen", "127.0.0.1:0", "--db", db.url()])
        .args(args)
        .envs(envs.iter().copied())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let exited = exited_within_30_s(other, &format!("it served: {args:?} {envs:?}"));
    let said = String::from_utf8_lossy(&exited.stderr).into_owned();
    assert_eq!(exited.status.code(), Some(2), "{said}");
    said
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_retried_on_another_replica_while_it_runs_replays_its_whole_recording() {
    let Some(db) = Database::create().await else {
        return;
    };
    let (a, b) = (replica(&db, &[]), replica(&db, &[]));
    let body = stream_request(1, &new_id(), "go", json!({"durationMs": 1500}));
    let mut first = SseReply::open(&a.url, body.clone(), ACTIVATED).await;
    assert!(first.next_event().await.is_some(), "the stream runs");
    let (_, mut retry) = tokio::join!(
        first.rest(),
        SseReply::open(&b.url, body.clone(), ACTIVATED)
    );
    assert_eq!(retry.status, 200);
    assert!(retry.replayed());
    retry.rest().await;
    assert_eq!(retry.raw(), first.raw(), "every event, byte for byte");
    assert_eq!(db.counts(), (1, 1), "executed once");
}

/// A replica paused past its lease while it streams (a long pause, a partition) loses the
/// call to its retry on another replica, which closes the recording as interrupted. When the
/// paused replica carries on, its next event is fenced out: its stream ends with
/// `IDEMPOTENCY_CLAIM_LOST` naming the key, and the interrupted outcome stays the one cached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_taken_over_elsewhere_ends_with_claim_lost_where_it_ran() {
    let Some(db) = Database::create().await else {
        return;
    };
    // Two minutes: no renewal runs while the test expires the lease by hand.
    let lease = [("AIWG_IDEMPOTENCY_CLAIM_LEASE_MS", "120000")];
    let (a, b) = (replica(&db, &lease), replica(&db, &lease));
    let key = new_id();
    // Taken over after its second event: every recorded event is the retry's, not the
    // first alone (helper-81).
    let body = stream_request(1, &key, "go", json!({"durationMs": 6000}));
    let mut paused = SseReply::open(&a.url, body.clone(), ACTIVATED).await;
    let first = paused.next_event().await.expect("the first event");
    let second = paused
        .next_event()
        .await
        .expect("the status halfway, 3 s in");
    let client = postgres::connect(db.url()).await;
    let expired = "UPDATE idempotency_claims SET lease_until = 0";
    assert_eq!(client.execute(expired, &[]).await.unwrap(), 1);

    let mut retry = SseReply::open(&b.url, body.clone(), ACTIVATED).await;
    let events = retry.rest().await;
    assert!(retry.replayed());
    assert_eq!(events[..2], [first, second], "the recorded events");
    assert_eq!(events.len(), 3, "{events:?}");
    let code = &events.last().unwrap()["error"]["data"]["code"];
    assert_eq!(code, "IDEMPOTENCY_STREAM_INTERRUPTED", "{events:?}");

    let rest = paused.rest().await;
    let last = rest.last().unwrap_or_else(|| panic!("an end: {rest:?}"));
    assert_eq!(
        last["error"]["data"]["code"], "IDEMPOTENCY_CLAIM_LOST",
        "{rest:?}"
    );
    assert_eq!(last["error"]["data"]["message_id"], key.as_str(), "{last}");
    let mut again = SseReply::open(&a.url, body, ACTIVATED).await;
    again.rest().await;
    assert_eq!(
        again.raw(),
        retry.raw(),
        "the interrupted outcome is cached"
    );
    assert_eq!(db.counts(), (1, 1), "executed once");
    // Counted as the calls they were: one executed (its lost claim a store error of its
    // kind, not a second outcome), one replayed.
    let calls = |outcome| {
        format!("idempotency_calls_total{{method=\"message/stream\",outcome=\"{outcome}\"}}")
    };
    for (outcome, count) in [("executed", 1.0), ("store_error", 0.0), ("replayed", 1.0)] {
        assert_eq!(metric(&a.url, &calls(outcome)).await, count, "{outcome}");
    }
    let lost = "idempotency_store_errors_total{kind=\"claim_lost\"}";
    assert_eq!(metric(&a.url, lost).await, 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_mid_execution_leaves_nothing_and_the_retry_elsewhere_executes_once() {
    let Some(db) = Database::create().await else {
        return;
    };
    let lease = [("AIWG_IDEMPOTENCY_CLAIM_LEASE_MS", "1500")];
    let (mut a, b) = (replica(&db, &lease), replica(&db, &lease));
    let body = send_with(1, "message/send", &new_id(), "hi", json!({"delayMs": 3000}));
    let in_flight = tokio::spawn({
        let (url, body) = (a.url.clone(), body.clone());
        async move { try_post(&url, body, ACTIVATED).await }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    while db.claims() == 0 {
        assert!(Instant::now() < deadline, "a never claimed the call");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    a.kill();
    assert!(
        in_flight.await.unwrap().is_err(),
        "a died before it answered"
    );
    assert_eq!(db.counts(), (0, 0), "a's staged task died with it");

    // The retry waits on a's claim until its lease expires, then takes it over.
    let retried = post_activated(&b.url, body.clone()).await;
    assert_eq!(retried.status, 200, "{}", retried.json());
    assert!(
        retried.json()["result"]["id"].is_string(),
        "{}",
        retried.json()
    );
    assert!(!retried.replayed(), "executed");
    assert_eq!(db.counts(), (1, 1));
    let again = post_activated(&b.url, body).await;
    assert!(again.replayed());
    assert_eq!(again.body, retried.body);
    assert_eq!(db.counts(), (1, 1), "exactly one task in the end");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_restart_fails_calls_clearly_and_the_servers_recover_without_one() {
    let Some(db) = Database::create_alone().await else {
        return;
    };
    let (Some(stop), Some(start)) = (
        postgres::variable("IDEM_TEST_POSTGRES_STOP", WHAT),
        postgres::variable("IDEM_TEST_POSTGRES_START", WHAT),
    ) else {
        return;
    };
    let server = replica(&db, &[]);
    // Its mission ends while the database is down: it completes once the database is back.
    let acknowledged = send_with(
        1,
        "message/send",
        &new_id(),
        "before",
        json!({"durationMs": 1000}),
    );
    let sent = Instant::now();
    let first = post_activated(&server.url, acknowledged.clone()).await;
    assert_eq!(first.status, 200);
    let task_id = first.json()["result"]["id"].as_str().unwrap().to_owned();

    run(&stop);
    let during = send_with(2, "message/send", &new_id(), "during", json!({}));
    let refused = tokio::time::timeout(
        Duration::from_secs(30),
        post_activated(&server.url, during.clone()),
    )
    .await
    .expect("an answer, not a hang");
    let refused_json = refused.json();
    assert_eq!(refused.error_code(), -32603, "{refused_json}");
    assert_eq!(refused.data_code(), "IDEMPOTENCY_STORE_UNAVAILABLE");
    tokio::time::sleep(
        (sent + Duration::from_millis(1500)).saturating_duration_since(Instant::now()),
    )
    .await;
    run(&start);

    let recovered = retry_until_answered(&server.url, &during).await;
    assert!(!recovered.replayed(), "the refused call executes now");
    let replay = post_activated(&server.url, acknowledged).await;
    assert!(replay.replayed(), "nothing acknowledged was lost");
    assert_eq!(replay.body, first.body);
    assert_eq!(db.counts(), (2, 2));
    until_completed(&server.url, &task_id, Duration::from_secs(20)).await;
}

/// Sends `body` until it gets a result (the pool reconnects on its own), at most 30 s.
async fn retry_until_answered(url: &str, body: &str) -> Reply {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let reply = post_activated(url, body.to_owned()).await;
        if reply.status == 200 && reply.json()["result"].is_object() {
            return reply;
        }
        assert!(Instant::now() < deadline, "no recovery: {}", reply.json());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn run(command: &str) {
    let status = std::process::Command::new("sh")
        .args(["-c", command])
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "{command}");
}

/// The conformance scenarios (side effects counted in the database), against a replica on
/// PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_conformance_scenarios_pass_on_postgres() {
    let Some(db) = Database::create().await else {
        return;
    };
    // Short enough for AC-3 to run, long enough that a stream scenario on a loaded machine is
    // not past it before its retry (with 2 s, a 422 once became a new execution under CI load,
    // correctly: the entry had expired).
    let server = replica(&db, &[("AIWG_IDEMPOTENCY_TTL", "4")]);
    let target = Target::new(&server.url, Some(server.side_effects_db()));
    let with_restart = [Scenario::Ac4, Scenario::StreamRestart];
    let restartless = Scenario::ALL
        .into_iter()
        .filter(|s| !with_restart.contains(s));
    for scenario in restartless {
        let outcome = check(scenario, &target, None).await;
        assert!(
            outcome == Outcome::Pass,
            "{}: {outcome:?}\n{}",
            scenario.name(),
            server.stderr()
        );
    }
    crate::conformance::every_staged_task_committed(&server).await;
    drop(server);
    // Its sessions end once PostgreSQL notices the kill; until then a replica of another TTL
    // is refused (as it should be), so the next one waits for them.
    let ttl_4 = "SELECT COUNT(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND application_name = 'idem ttl=4'";
    let deadline = Instant::now() + Duration::from_secs(20);
    while postgres::count(db.url(), ttl_4, None).unwrap() > 0 {
        assert!(
            Instant::now() < deadline,
            "the killed replica's sessions never ended"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The restart hook: SIGKILL, then a new process on the same database.
    for scenario in with_restart {
        let mut server = replica(&db, &[]);
        let target = Target::new(&server.url, Some(server.side_effects_db()));
        let process = &mut server;
        let restart: Restart = Box::new(move || async move { Ok(process.restart()) }.boxed());
        let outcome = check(scenario, &target, Some(restart)).await;
        assert!(
            outcome == Outcome::Pass,
            "{}: {outcome:?}\n{}",
            scenario.name(),
            server.stderr()
        );
    }
}

/// A task followed on one replica (`tasks/resubscribe`) and canceled on another: the follower
/// gets the final `canceled` status within seconds, not at the mission's deadline (another
/// replica's cancel reached no watch of the follower's: up to a minute late; helper-95).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_learns_of_a_cancel_on_another_replica_before_the_deadline() {
    let Some(db) = Database::create().await else {
        return;
    };
    let (a, b) = (replica(&db, &[]), replica(&db, &[]));
    let body = send_with(
        1,
        "message/send",
        &new_id(),
        "long",
        json!({"durationMs": 60000}),
    );
    let task = post_activated(&a.url, body).await.json()["result"].clone();
    let follow = json!({"jsonrpc": "2.0", "id": 2, "method": "tasks/resubscribe",
        "params": {"id": task["id"]}});
    let mut follower = SseReply::open(&a.url, follow.to_string(), &[]).await;
    let first = follower.next_event().await.expect("the task as it is");
    assert_eq!(first["result"]["status"]["state"], "working", "{first}");
    let started = Instant::now();
    let cancel = json!({"jsonrpc": "2.0", "id": 3, "method": "tasks/cancel",
        "params": {"id": task["id"]}});
    let canceled = try_post(&b.url, cancel.to_string(), &[]).await.unwrap();
    assert_eq!(canceled.json()["result"]["status"]["state"], "canceled");
    let last = follower.rest().await.pop().expect("a final status");
    assert_eq!(last["result"]["status"]["state"], "canceled", "{last}");
    assert_eq!(last["result"]["final"], true, "{last}");
    let waited = started.elapsed();
    assert!(
        waited < Duration::from_secs(20),
        "{waited:?}: at the deadline"
    );
}
