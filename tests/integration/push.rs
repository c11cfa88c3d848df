//! A2A push notifications on the example server process: the config methods of both
//! versions, and the outbox relay delivering every `mission.*` event to a real webhook
//! receiver on 127.0.0.1 that fails its first attempts and is stopped and started again while
//! the server is killed with SIGKILL and restarted: every event arrives, and duplicates carry
//! the same id.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use crate::operations::{eventually, Metrics};
use crate::support::{new_id, post, post_activated};
use idem_conformance::server_process::ServerProcess;

/// The example's SQL, as its server runs it.
#[allow(dead_code)]
#[path = "../../examples/a2a_server/tasks/sql.rs"]
mod example_sql;

/// The example's counter of events given up (`relay::ABANDONED`).
const ABANDONED: &str = "a2a_outbox_abandoned_total";

/// One POST the receiver took.
#[derive(Debug, Clone)]
struct Delivery {
    event_id: i64,
    event_type: String,
    token: Option<String>,
    body: Value,
    /// The status it answered.
    status: u16,
}

/// A webhook receiver: answers 500 to the first `failures` requests (of events of type
/// `failing`, where it names one), then 200.
struct Receiver {
    port: u16,
    deliveries: Arc<Mutex<Vec<Delivery>>>,
    failures: Arc<AtomicUsize>,
    failing: Option<&'static str>,
    /// How long it takes to answer, once it has recorded what it was posted.
    answer_after: Arc<Mutex<Duration>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Receiver {
    async fn start(failures: usize) -> Self {
        Self::failing(None, failures).await
    }

    async fn failing(failing: Option<&'static str>, failures: usize) -> Self {
        let mut receiver = Self {
            port: 0,
            deliveries: Arc::default(),
            failures: Arc::new(AtomicUsize::new(failures)),
            failing,
            answer_after: Arc::default(),
            task: None,
        };
        receiver.listen().await;
        receiver
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/hook", self.port)
    }

    /// Listens (again, on the same port once it has one).
    async fn listen(&mut self) {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", self.port))
            .await
            .expect("bind the receiver");
        self.port = listener.local_addr().unwrap().port();
        let (deliveries, failures) = (self.deliveries.clone(), self.failures.clone());
        let (failing, answer_after) = (self.failing, self.answer_after.clone());
        self.task = Some(tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let (deliveries, failures) = (deliveries.clone(), failures.clone());
                let after = *answer_after.lock().unwrap();
                tokio::spawn(async move {
                    let _ = answer(socket, &deliveries, &failures, failing, after).await;
                });
            }
        }));
    }

    /// Stops listening: the relay's next attempts are refused.
    async fn stop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
    }

    fn taken(&self) -> Vec<Delivery> {
        self.deliveries.lock().unwrap().clone()
    }

    /// Waits until an event of `event_type` was answered 200.
    async fn wait_for(&self, event_type: &str) {
        let answered = |d: &Delivery| d.event_type == event_type && d.status == 200;
        self.wait_until(event_type, |taken| taken.iter().any(answered))
            .await
    }

    /// Waits until the deliveries taken so far are `done` (what, for the panic message).
    async fn wait_until(&self, what: &str, done: impl Fn(&[Delivery]) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !done(&self.taken()) {
            assert!(Instant::now() < deadline, "no {what}: {:?}", self.taken());
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// Reads one HTTP/1.1 request, records it, answers, and closes the connection.
async fn answer(
    socket: tokio::net::TcpStream,
    deliveries: &Mutex<Vec<Delivery>>,
    failures: &AtomicUsize,
    failing: Option<&str>,
    after: Duration,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(socket);
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).await?;
        if line.trim().is_empty() {
            break;
        }
        headers.push(line.trim().to_ascii_lowercase());
    }
    let header = |name: &str| {
        let prefix = format!("{name}:");
        let found = headers.iter().find(|h| h.starts_with(&prefix));
        found.map(|h| h[prefix.len()..].trim().to_owned())
    };
    let length: usize = header("content-length")
        .and_then(|l| l.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; length];
    reader.read_exact(&mut body).await?;
    let event_type = header("x-a2a-event-type").unwrap_or_default();
    let failed = failing.is_none_or(|failing| failing == event_type)
        && failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
    let status = if failed { 500 } else { 200 };
    deliveries.lock().unwrap().push(Delivery {
        event_id: header("x-a2a-event-id")
            .and_then(|id| id.parse().ok())
            .unwrap_or(-1),
        event_type,
        token: header("x-a2a-notification-token"),
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
        status,
    });
    tokio::time::sleep(after).await;
    let reply = format!("HTTP/1.1 {status} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
    reader.get_mut().write_all(reply.as_bytes()).await
}

/// The outbox of task `task_id`, as the server's SQLite file holds it: (id, type, delivered).
fn outbox(server: &ServerProcess, task_id: &str) -> Vec<(i64, String, bool)> {
    let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY;
    let conn = rusqlite::Connection::open_with_flags(server.db(), flags).unwrap();
    conn.busy_timeout(Duration::from_secs(5)).unwrap();
    let sql = "SELECT id, event_type, delivered_at IS NOT NULL FROM outbox WHERE task_id = ?1 ORDER BY id";
    let mut statement = conn.prepare(sql).unwrap();
    let rows = statement.query_map([task_id], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)));
    rows.unwrap().map(Result::unwrap).collect()
}

/// The example server on a database of its own, `name`, which outlives it; `None` (the test
/// skipped, saying so of `what`) without PostgreSQL.
async fn on_postgres(name: &str, what: &str) -> Option<(ServerProcess, crate::replicas::Database)> {
    let db = crate::replicas::Database::shared(name, what).await?;
    Some((ServerProcess::start_on(Some(db.url()), &[], &[]), db))
}

/// Waits until every event of task `task_id` is marked delivered; panics after 5 s.
async fn until_marked_delivered(server: &ServerProcess, task_id: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !outbox(server, task_id)
        .iter()
        .all(|(_, _, delivered)| *delivered)
    {
        assert!(Instant::now() < deadline, "delivered, never marked");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

fn rpc(method: &str, params: Value) -> String {
    json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).to_string()
}

async fn call(url: &str, method: &str, params: Value) -> Value {
    post(url, rpc(method, params), &[]).await.json()
}

async fn call_v10(url: &str, method: &str, params: Value) -> Value {
    post(url, rpc(method, params), &[("A2A-Version", "1.0")])
        .await
        .json()
}

/// Sends a message whose task has the webhook `push`; the task's id.
async fn send_with_webhook(server: &ServerProcess, push: Value, duration_ms: u64) -> String {
    let url = &server.url;
    let message = json!({"kind": "message", "messageId": new_id(), "role": "user",
        "parts": [{"kind": "text", "text": "notify me"}]});
    let params = json!({"message": message, "configuration": {"pushNotificationConfig": push},
        "metadata": {"durationMs": duration_ms}});
    let reply = post_activated(url, rpc("message/send", params)).await;
    let id = reply.json()["result"]["id"].as_str().map(str::to_owned);
    id.unwrap_or_else(|| panic!("a task: {}\n{}", reply.describe(), server.stderr()))
}

#[tokio::test]
async fn every_event_reaches_a_webhook_that_fails_and_restarts_across_a_server_crash() {
    let mut receiver = Receiver::start(2).await;
    let mut server = ServerProcess::start(&[]);
    let webhook = json!({"url": receiver.url(), "token": "secret"});
    let task_id = send_with_webhook(&server, webhook, 1500).await;

    // Delivered after two refusals, retried with backoff.
    receiver.wait_for("mission.assigned").await;
    let attempts = receiver.taken();
    assert!(attempts.len() >= 3, "{attempts:?}");
    assert_eq!(attempts[0].status, 500);

    // The receiver goes away, the mission completes, its event cannot be delivered; then the
    // server dies. Both come back: the relay resumes from the outbox.
    receiver.stop().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while outbox(&server, &task_id).len() < 2 {
        assert!(Instant::now() < deadline, "the mission never completed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.restart();
    receiver.listen().await;
    receiver.wait_for("mission.completed").await;

    let events = outbox(&server, &task_id);
    let types: Vec<&str> = events.iter().map(|(_, t, _)| t.as_str()).collect();
    assert_eq!(types, ["mission.assigned", "mission.completed"]);
    until_marked_delivered(&server, &task_id).await;
    for delivery in receiver.taken() {
        // A duplicate is the same event: its id names the outbox row of its type.
        let row = events.iter().find(|(id, _, _)| *id == delivery.event_id);
        let (_, event_type, _) = row.unwrap_or_else(|| panic!("unknown event {delivery:?}"));
        assert_eq!(&delivery.event_type, event_type);
        assert_eq!(delivery.token.as_deref(), Some("secret"));
        assert_eq!(delivery.body["kind"], "task");
        assert_eq!(delivery.body["id"], task_id.as_str());
    }
}

/// Events waiting for a webhook that keeps failing wait out their backoff in their rows, and
/// the relay reads past them: more of them than it reads at once (512) hold back no other
/// task's event. Before, the oldest 512 were read again and again, and nothing behind them.
/// A 1.0 client names the webhook of its `SendMessage` `taskPushNotificationConfig`: it is
/// set with the task, and the task's events reach it (before, it was ignored without a word).
#[tokio::test]
async fn a_1_0_send_sets_its_webhook_under_the_1_0_name() {
    let receiver = Receiver::start(0).await;
    let server = ServerProcess::start(&[]);
    let message =
        json!({"messageId": new_id(), "role": "ROLE_USER", "parts": [{"text": "notify me"}]});
    let webhook = json!({"url": receiver.url(), "token": "one-oh"});
    let params = json!({"message": message,
        "configuration": {"taskPushNotificationConfig": webhook},
        "metadata": {"durationMs": 200}});
    let headers = [
        ("A2A-Extensions", crate::support::URI),
        ("A2A-Version", "1.0"),
    ];
    let reply = post(&server.url, rpc("SendMessage", params), &headers).await;
    assert!(
        reply.json()["result"]["task"]["id"].is_string(),
        "{}",
        reply.describe()
    );
    receiver.wait_for("mission.completed").await;
    let tokens: Vec<_> = receiver.taken().into_iter().map(|d| d.token).collect();
    assert!(
        tokens.iter().all(|t| t.as_deref() == Some("one-oh")),
        "{tokens:?}"
    );
}

#[tokio::test]
async fn events_waiting_for_a_failing_webhook_never_hold_back_another_tasks() {
    let failing = Receiver::start(usize::MAX).await;
    let working = Receiver::start(0).await;
    let server = ServerProcess::start(&[]);
    // The longest mission: no completion events while the test runs.
    let sends = (0..600).map(|_| send_with_webhook(&server, json!({"url": failing.url()}), 60_000));
    futures::future::join_all(sends).await;
    // The failing webhook's events are being tried, and failing, when the other task's comes:
    // waited for, not counted after (the other's can go out before 512 attempts have).
    failing
        .wait_until("512 failed attempts", |taken| taken.len() >= 512)
        .await;
    let task_id = send_with_webhook(&server, json!({"url": working.url()}), 60_000).await;
    working.wait_for("mission.assigned").await;
    assert_eq!(working.taken()[0].body["id"], task_id.as_str());
    assert!(failing.taken().iter().all(|d| d.status == 500));
}

/// A webhook that takes its time to fail holds back its own task only: while the relay waits
/// on one that accepted the event and never answers (it gives up after 5 s), another task's
/// event reaches its webhook. Before, events went out one at a time, and one dead webhook held
/// every task's events back.
#[tokio::test]
async fn a_webhook_that_never_answers_holds_back_no_other_task() {
    let silent = Silent::start().await;
    let working = Receiver::start(0).await;
    let server = ServerProcess::start(&[]);
    send_with_webhook(&server, json!({"url": silent.url()}), 60_000).await;
    silent
        .until(|s| s.accepted.load(Ordering::SeqCst) > 0)
        .await;
    let task_id = send_with_webhook(&server, json!({"url": working.url()}), 60_000).await;
    working.wait_for("mission.assigned").await;
    assert_eq!(
        silent.closed.load(Ordering::SeqCst),
        0,
        "the other task's event waited for the silent webhook's timeout"
    );
    assert_eq!(working.taken()[0].body["id"], task_id.as_str());
}

/// Tasks whose webhooks keep timing out take at most half of the relay's 64 workers once
/// they have failed, so the other tasks always find one free: 40 dead webhooks are tried again
/// 32 at a time, and another task's event goes out meanwhile. Before, they took every worker
/// on every read, and with 150 of them no other task's event was ever delivered.
#[tokio::test]
async fn webhooks_that_keep_failing_take_at_most_half_the_workers() {
    let silent = Silent::start().await;
    let working = Receiver::start(0).await;
    let server = ServerProcess::start(&[]);
    for _ in 0..40 {
        send_with_webhook(&server, json!({"url": silent.url()}), 60_000).await;
    }
    // Every first attempt timed out (5 s): all 40 have failed once.
    silent
        .until(|s| s.closed.load(Ordering::SeqCst) >= 40)
        .await;
    silent.most_open.store(0, Ordering::SeqCst);
    silent
        .until(|s| s.accepted.load(Ordering::SeqCst) >= 72)
        .await;
    let task_id = send_with_webhook(&server, json!({"url": working.url()}), 60_000).await;
    working.wait_for("mission.assigned").await;
    assert_eq!(working.taken()[0].body["id"], task_id.as_str());
    let most = silent.most_open.load(Ordering::SeqCst);
    assert!(most <= 32, "{most} failing webhooks tried at once");
}

/// Due events of failing tasks, more than one read takes (512), never hide a new task's event:
/// the relay reads first attempts beside them. Before, every read returned the same oldest
/// 512 failing events, and a new task's event was not read while they stayed due.
#[tokio::test]
async fn more_failing_events_than_a_read_takes_hide_no_new_task() {
    let silent = Silent::start().await;
    let working = Receiver::start(0).await;
    let (mut server, _) = failing_tasks(&silent, 600).await;
    server.restart();
    silent
        .until(|s| s.accepted.load(Ordering::SeqCst) >= 32)
        .await;
    let task_id = send_with_webhook(&server, json!({"url": working.url()}), 60_000).await;
    working.wait_for("mission.assigned").await;
    assert_eq!(working.taken()[0].body["id"], task_id.as_str());
}

/// Failing tasks take the 32 retry places in turn, the longest waiting first: of 81 tasks
/// whose webhooks failed, the newest one's webhook answers again and its event goes out within
/// three rounds. Before, the oldest 32 took the places round after round, and it never did.
#[tokio::test]
async fn failing_tasks_take_turns_and_a_webhook_that_came_back_is_tried_again() {
    let silent = Silent::start().await;
    let working = Receiver::start(0).await;
    let (mut server, dead) = failing_tasks(&silent, 80).await;
    let conn = rusqlite::Connection::open(server.db()).unwrap();
    comes_back(&conn, &format!("{dead}-80"), &silent, &working);
    drop(conn);
    server.restart();
    working.wait_for("mission.assigned").await;
    assert_eq!(working.taken()[0].event_id, 81, "{:?}", working.taken());
}

/// A retry is read however many failing events are older: of 601 failing tasks, the newest
/// one's webhook answers again and its retry is the one due longest; it goes out in the first
/// read, before any of the others' attempts has timed out. Before, the reads found retries
/// among the oldest 512 due events only, and it waited for the older ones to drain.
#[tokio::test]
async fn a_retry_past_the_oldest_512_due_events_is_read_in_its_turn() {
    let silent = Silent::start().await;
    let working = Receiver::start(0).await;
    let (mut server, dead) = failing_tasks(&silent, 600).await;
    let conn = rusqlite::Connection::open(server.db()).unwrap();
    let back = format!("{dead}-600");
    comes_back(&conn, &back, &silent, &working);
    let due_longest = "UPDATE outbox SET next_attempt_at = 0 WHERE task_id = ?1";
    assert_eq!(conn.execute(due_longest, [back]).unwrap(), 1);
    drop(conn);
    server.restart();
    working.wait_for("mission.assigned").await;
    assert_eq!(working.taken()[0].event_id, 601, "{:?}", working.taken());
    let timed_out = silent.closed.load(Ordering::SeqCst);
    assert_eq!(
        timed_out, 0,
        "delivered only after {timed_out} attempts timed out"
    );
}

/// The webhook of `task_id` in the stopped server's file is `working`'s instead of `silent`'s.
fn comes_back(conn: &rusqlite::Connection, task_id: &str, silent: &Silent, working: &Receiver) {
    let came_back = "UPDATE push_configs SET config_json = replace(config_json, ?1, ?2)
                     WHERE task_id = ?3";
    let changed = conn.execute(came_back, [&silent.url(), &working.url(), task_id]);
    assert_eq!(changed.unwrap(), 1);
}

/// A stopped server whose file holds a task with `silent` as its webhook, and `copies` copies
/// of it (named `TASK-1` ...), each with an event whose last attempt failed long ago, as has
/// the task's own; and the task's id.
async fn failing_tasks(silent: &Silent, copies: u32) -> (ServerProcess, String) {
    let mut server = ServerProcess::start(&[]);
    let task_id = send_with_webhook(&server, json!({"url": silent.url()}), 60_000).await;
    server.kill();
    let conn = rusqlite::Connection::open(server.db()).unwrap();
    let numbers = format!(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {copies})"
    );
    conn.execute_batch(&format!(
        "{numbers} INSERT INTO tasks SELECT id || '-' || i, context_id, state, due_at,
           created_at, updated_at, task_json FROM tasks, n WHERE id = '{task_id}';
         {numbers} INSERT INTO push_configs SELECT task_id || '-' || i, config_id, config_json,
           created_at FROM push_configs, n WHERE task_id = '{task_id}';
         {numbers} INSERT INTO outbox (task_id, event_type, payload, created_at, next_attempt_at)
           SELECT task_id || '-' || i, event_type, payload, created_at, 1
           FROM outbox, n WHERE task_id = '{task_id}';
         UPDATE outbox SET next_attempt_at = 1 WHERE task_id = '{task_id}';"
    ))
    .unwrap();
    (server, task_id)
}

/// A webhook that accepts every request and never answers; counts what it sees.
struct Silent {
    port: u16,
    accepted: Arc<AtomicUsize>,
    closed: Arc<AtomicUsize>,
    /// The most requests open at once since it was last reset.
    most_open: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Silent {
    async fn start() -> Arc<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let counters: [Arc<AtomicUsize>; 4] = Default::default();
        let [accepted, closed, open, most_open] = counters.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                accepted.fetch_add(1, Ordering::SeqCst);
                let now_open = open.fetch_add(1, Ordering::SeqCst) + 1;
                most_open.fetch_max(now_open, Ordering::SeqCst);
                let (closed, open) = (closed.clone(), open.clone());
                tokio::spawn(async move {
                    let mut sink = vec![0; 4096];
                    while matches!(socket.read(&mut sink).await, Ok(n) if n > 0) {}
                    open.fetch_sub(1, Ordering::SeqCst);
                    closed.fetch_add(1, Ordering::SeqCst);
                });
            }
        });
        let [accepted, closed, _, most_open] = counters;
        Arc::new(Self {
            port,
            accepted,
            closed,
            most_open,
            task,
        })
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/hook", self.port)
    }

    async fn until(&self, done: impl Fn(&Self) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !done(self) {
            assert!(
                Instant::now() < deadline,
                "accepted {}, closed {}",
                self.accepted.load(Ordering::SeqCst),
                self.closed.load(Ordering::SeqCst)
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for Silent {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// An outbox made by an earlier version has no `next_attempt_at`, `attempts` nor
/// `abandoned_at`: the server adds them at start, and the index of held events, and a failed
/// delivery's retry is held and counted in them.
#[tokio::test]
async fn an_outbox_of_an_earlier_version_gains_its_retry_columns() {
    let receiver = Receiver::start(1).await;
    let mut server = ServerProcess::start(&[]);
    server.kill();
    let conn = rusqlite::Connection::open(server.db()).unwrap();
    conn.execute_batch(
        "DROP INDEX idx_outbox_held; ALTER TABLE outbox DROP COLUMN next_attempt_at;
         ALTER TABLE outbox DROP COLUMN attempts; ALTER TABLE outbox DROP COLUMN abandoned_at",
    )
    .unwrap();
    drop(conn);
    server.restart();
    let task_id = send_with_webhook(&server, json!({"url": receiver.url()}), 60_000).await;
    receiver.wait_for("mission.assigned").await;
    assert_eq!(receiver.taken()[0].status, 500, "delivered after a retry");
    // The index of held events needs the column: it is made after it.
    let conn = rusqlite::Connection::open(server.db()).unwrap();
    let held = "SELECT COUNT(*) FROM sqlite_master WHERE name = 'idx_outbox_held'";
    assert_eq!(conn.query_row(held, [], |r| r.get::<_, i64>(0)).unwrap(), 1);
    let assigned = retries(&server, &task_id)[0];
    assert_eq!(
        assigned.attempts, 1,
        "one failed attempt, counted in its row"
    );
    assert!(assigned.abandoned_at.is_none());
}

/// An event's retries as its row keeps them.
#[derive(Debug, Clone, Copy)]
struct Retries {
    attempts: i64,
    delivered_at: Option<i64>,
    abandoned_at: Option<i64>,
}

/// The retries of task `task_id`'s events, in order, as the server's SQLite file holds them.
fn retries(server: &ServerProcess, task_id: &str) -> Vec<Retries> {
    let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY;
    let conn = rusqlite::Connection::open_with_flags(server.db(), flags).unwrap();
    conn.busy_timeout(Duration::from_secs(5)).unwrap();
    let sql = "SELECT attempts, delivered_at, abandoned_at FROM outbox WHERE task_id = ?1
        ORDER BY id";
    let mut statement = conn.prepare(sql).unwrap();
    let rows = statement.query_map([task_id], |row| {
        Ok(Retries {
            attempts: row.get(0)?,
            delivered_at: row.get(1)?,
            abandoned_at: row.get(2)?,
        })
    });
    rows.unwrap().map(Result::unwrap).collect()
}

/// A webhook that never answers 2xx: its task's events are retried until their attempts have
/// waited `--outbox-give-up` between them, then given up (marked, counted), and tried no more.
/// The later event, held back behind the first, goes once the first is given up.
#[tokio::test]
async fn events_of_a_webhook_that_never_comes_back_are_given_up() {
    let receiver = Receiver::start(usize::MAX).await;
    let server = ServerProcess::start_with(&["--outbox-give-up", "1"], &[]);
    let before = Metrics::scrape(&server.url).await;
    let shown = before.samples(ABANDONED, &[]);
    assert_eq!(shown, [(ABANDONED.to_owned(), 0.0)], "shown at zero");
    let task_id = send_with_webhook(&server, json!({"url": receiver.url()}), 100).await;

    let deadline = Instant::now() + Duration::from_secs(20);
    let given_up = loop {
        let events = retries(&server, &task_id);
        if events.len() == 2 && events.iter().all(|e| e.abandoned_at.is_some()) {
            break events;
        }
        assert!(Instant::now() < deadline, "never given up: {events:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    for event in &given_up {
        assert_eq!(event.delivered_at, event.abandoned_at, "{event:?}");
        // Waits of 100, 200, 400 and 800 ms (1.5 s) between five attempts: the fifth failure
        // is the first after a second of them, however slow the machine.
        assert_eq!(event.attempts, 5, "{event:?}");
    }
    let taken = receiver.taken();
    let types: Vec<&str> = taken.iter().map(|d| d.event_type.as_str()).collect();
    let (assigned, completed) = (["mission.assigned"; 5], ["mission.completed"; 5]);
    assert_eq!(
        types,
        [assigned, completed].concat(),
        "in order, each 5 times"
    );
    assert!(taken.iter().all(|d| d.status == 500));
    eventually(&server.url, "two events given up", |m| {
        m.get(ABANDONED, &[]) == 2.0
    })
    .await;

    // Given up means tried no more.
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(
        receiver.taken().len(),
        taken.len(),
        "{:?}",
        receiver.taken()
    );
}

/// A webhook that keeps failing holds back no other webhook of its task, whichever comes first:
/// each healthy one gets every event once, in order, and the dead one's retries and give-ups
/// are its own. Before, the relay stopped at the first failing webhook: the ones after it
/// never got the event, which was then given up for all of them, and the ones before it got
/// it again at every retry (helper-65).
#[tokio::test]
async fn a_dead_webhook_holds_back_none_of_its_tasks_other_webhooks() {
    let dead = Receiver::start(usize::MAX).await;
    let healthy = Receiver::start(0).await;
    let server = ServerProcess::start_with(&["--outbox-give-up", "2"], &[]);
    let (a, b) = (json!({"id": "a"}), json!({"id": "b"}));
    let config = |id: &Value, receiver: &Receiver| json!({"id": id["id"], "url": receiver.url()});
    let mut tasks = Vec::new();
    for (first, second) in [(&dead, &healthy), (&healthy, &dead)] {
        let task_id = send_with_webhook(&server, config(&a, first), 800).await;
        let set = json!({"taskId": task_id, "pushNotificationConfig": config(&b, second)});
        let set = call(&server.url, "tasks/pushNotificationConfig/set", set).await;
        assert!(set["result"].is_object(), "{set}");
        tasks.push(task_id);
    }
    let of_task = |deliveries: Vec<Delivery>, task_id: &str| -> Vec<String> {
        let of_it = deliveries.into_iter().filter(|d| d.body["id"] == task_id);
        of_it.map(|d| d.event_type).collect()
    };
    let both = ["mission.assigned", "mission.completed"];
    healthy
        .wait_until("both events of both tasks", |taken| {
            tasks
                .iter()
                .all(|task| of_task(taken.to_vec(), task).len() == 2)
        })
        .await;
    // Both events given up for the dead webhook (2 s of failing each), counted.
    eventually(&server.url, "four events given up", |m| {
        m.get(ABANDONED, &[]) == 4.0
    })
    .await;
    for task_id in &tasks {
        assert_eq!(
            of_task(healthy.taken(), task_id),
            both,
            "once each, in order"
        );
        let failed = of_task(dead.taken(), task_id);
        let last_assigned = failed.iter().rposition(|t| t == "mission.assigned");
        let first_completed = failed.iter().position(|t| t == "mission.completed");
        assert!(failed.len() > 4, "retried: {failed:?}");
        assert!(last_assigned < first_completed, "in order: {failed:?}");
    }
    assert!(healthy.taken().iter().all(|d| d.status == 200));
}

/// A webhook gets a task's events in order even while another webhook of the task fails the
/// later one: B fails `mission.assigned` six times, C fails `mission.completed` once. Before,
/// the later event got a retry time of its own when C failed it, was read alone once that ran
/// out, and reached B before the event B still failed (helper-67: 4.7 s before).
#[tokio::test]
async fn a_webhook_gets_its_tasks_events_in_order_while_another_fails_the_later_one() {
    let b = Receiver::failing(Some("mission.assigned"), 6).await;
    let c = Receiver::failing(Some("mission.completed"), 1).await;
    let server = ServerProcess::start(&[]);
    let task_id = send_with_webhook(&server, json!({"id": "b", "url": b.url()}), 1500).await;
    let set = json!({"taskId": task_id, "pushNotificationConfig": {"id": "c", "url": c.url()}});
    let set = call(&server.url, "tasks/pushNotificationConfig/set", set).await;
    assert!(set["result"].is_object(), "{set}");
    for receiver in [&b, &c] {
        receiver.wait_for("mission.completed").await;
        let taken = receiver.taken();
        let first_assigned = taken
            .iter()
            .position(|d| d.event_type == "mission.assigned" && d.status == 200);
        let first_completed = taken
            .iter()
            .position(|d| d.event_type == "mission.completed");
        assert!(
            first_assigned.is_some() && first_assigned < first_completed,
            "in order: {:?}",
            taken
                .iter()
                .map(|d| (&d.event_type, d.status))
                .collect::<Vec<_>>()
        );
    }
}

/// A webhook set while a pass over its task's events runs gets none of them before the ones it
/// has not been posted: A never answers (each attempt takes the relay's 5 s), and C is set
/// while the pass that holds both events waits on A for the first. Before, the pass posted C
/// the second event at once, 5 s before the first (helper-68).
#[tokio::test]
async fn a_webhook_set_during_a_pass_gets_its_tasks_events_in_order() {
    let a = Silent::start().await;
    let c = Receiver::start(0).await;
    let server = ServerProcess::start(&[]);
    let task_id = send_with_webhook(&server, json!({"id": "a", "url": a.url()}), 300).await;
    // The second attempt at the first event: its pass holds the second event too.
    a.until(|a| a.accepted.load(Ordering::SeqCst) >= 2).await;
    let set = json!({"taskId": task_id, "pushNotificationConfig": {"id": "c", "url": c.url()}});
    let set = call(&server.url, "tasks/pushNotificationConfig/set", set).await;
    assert!(set["result"].is_object(), "{set}");
    c.wait_for("mission.completed").await;
    let types: Vec<String> = c.taken().into_iter().map(|d| d.event_type).collect();
    assert_eq!(
        types,
        ["mission.assigned", "mission.completed"],
        "in order, once each"
    );
}

/// A webhook set again under its id, to another URL, is another webhook: the new URL gets the
/// task's undelivered events, in order, including one the old URL took while another webhook
/// still failed it. Before, the old URL's record under the id had the new one skip it
/// (helper-69).
#[tokio::test]
async fn a_webhook_set_again_under_its_id_gets_what_the_old_url_took() {
    let server = ServerProcess::start(&[]);
    let new = set_again_under_its_id(&server, false).await;
    let types: Vec<String> = new.taken().into_iter().map(|d| d.event_type).collect();
    assert_eq!(
        types,
        ["mission.assigned", "mission.completed"],
        "in order, once each"
    );
    // Set again by a send that continues the task, as well.
    set_again_under_its_id(&server, true).await;
}

/// The same on PostgreSQL, where a send that set the webhook again kept the old URL's records
/// (found by helper-77).
#[tokio::test]
async fn a_webhook_set_again_under_its_id_gets_what_the_old_url_took_on_postgres() {
    let what = "webhooks set again on PostgreSQL";
    let Some(db) = crate::replicas::Database::shared("idem_push_again", what).await else {
        return;
    };
    let server = ServerProcess::start_on(Some(db.url()), &[], &[]);
    for by_send in [false, true] {
        set_again_under_its_id(&server, by_send).await;
    }
}

/// Sets webhook `c` of a task to one URL, which takes its first event while webhook `b` fails
/// it, then to another (by `tasks/pushNotificationConfig/set`, or `by_send`, a send that
/// continues the task with it): the other URL gets that event too. Returns its receiver.
async fn set_again_under_its_id(server: &ServerProcess, by_send: bool) -> Receiver {
    let b = Receiver::failing(Some("mission.assigned"), 6).await;
    let (old, new) = (Receiver::start(0).await, Receiver::start(0).await);
    let task_id = send_with_webhook(server, json!({"id": "b", "url": b.url()}), 1500).await;
    let config =
        json!({"taskId": task_id, "pushNotificationConfig": {"id": "c", "url": old.url()}});
    let set = call(&server.url, "tasks/pushNotificationConfig/set", config).await;
    assert!(set["result"].is_object(), "{set}");
    old.wait_for("mission.assigned").await;
    let first = old.taken().into_iter().find(|d| d.status == 200).unwrap();
    match by_send {
        false => {
            let config = json!({"taskId": task_id,
                "pushNotificationConfig": {"id": "c", "url": new.url()}});
            let set = call(&server.url, "tasks/pushNotificationConfig/set", config).await;
            assert!(set["result"].is_object(), "{set}");
        }
        true => {
            let message = json!({"kind": "message", "messageId": new_id(), "role": "user",
                "taskId": task_id, "parts": [{"kind": "text", "text": "and tell this one"}]});
            let push = json!({"id": "c", "url": new.url()});
            let params = json!({"message": message,
                "configuration": {"pushNotificationConfig": push, "blocking": false}});
            let reply = post_activated(&server.url, rpc("message/send", params)).await;
            assert!(reply.json()["result"].is_object(), "{}", reply.describe());
        }
    }
    let took_first = |taken: &[Delivery]| {
        taken
            .iter()
            .any(|d| d.event_id == first.event_id && d.status == 200)
    };
    new.wait_until("the event the old URL took", took_first)
        .await;
    new.wait_for("mission.completed").await;
    new
}

/// A webhook set again under its id while its old URL is being posted an event, which it
/// takes, while another webhook of the task fails that event: the new URL gets it too. The
/// old URL's record, written after the set had forgotten the id's records, had the new one
/// skipped at every retry, for good (helper-95).
#[tokio::test]
async fn a_webhook_set_again_while_its_old_url_takes_an_event_gets_it_too() {
    set_again_while_its_old_url_takes_an_event(ServerProcess::start(&[])).await;
}

/// The same on PostgreSQL, where the record locks the config's row until it commits.
#[tokio::test]
async fn a_webhook_set_again_while_its_old_url_takes_an_event_gets_it_too_on_postgres() {
    let what = "webhooks set again mid-post on PostgreSQL";
    let Some((server, _db)) = on_postgres("idem_push_mid_post", what).await else {
        return;
    };
    set_again_while_its_old_url_takes_an_event(server).await;
}

async fn set_again_while_its_old_url_takes_an_event(server: ServerProcess) {
    let failing = Receiver::failing(Some("mission.completed"), 2).await;
    let (old, new) = (Receiver::start(0).await, Receiver::start(0).await);
    *old.answer_after.lock().unwrap() = Duration::from_secs(2);
    let task_id = send_with_webhook(&server, json!({"id": "x", "url": old.url()}), 1000).await;
    set_webhook(&server, &task_id, "w", &failing).await;
    // The old URL has been posted the completion, and has not answered yet.
    old.wait_until("a post of the completion", |taken| {
        taken.iter().any(|d| d.event_type == "mission.completed")
    })
    .await;
    set_webhook(&server, &task_id, "x", &new).await;
    new.wait_for("mission.completed").await;
    failing.wait_for("mission.completed").await;
}

/// A receiver that sets its webhook again with a new token (the same id and URL) while it is
/// being posted an event, then takes it, is posted each event once: the same webhook, whose
/// record stands. Its record was refused (the config was no longer the one posted), and a
/// receiver that rotated its token at every delivery was posted the first event for good
/// (helper-103).
#[tokio::test]
async fn a_webhook_whose_token_is_rotated_mid_post_is_posted_each_event_once() {
    rotated_mid_post(ServerProcess::start(&[])).await;
}

/// The same on PostgreSQL, where the set takes the config's row's lock before it forgets.
#[tokio::test]
async fn a_webhook_whose_token_is_rotated_mid_post_is_posted_each_event_once_on_postgres() {
    let what = "webhooks rotated mid-post on PostgreSQL";
    let Some((server, _db)) = on_postgres("idem_push_rotated", what).await else {
        return;
    };
    rotated_mid_post(server).await;
}

async fn rotated_mid_post(server: ServerProcess) {
    let receiver = Receiver::start(0).await;
    *receiver.answer_after.lock().unwrap() = Duration::from_millis(1500);
    let webhook = |token: &str| json!({"id": "x", "url": receiver.url(), "token": token});
    let task_id = send_with_webhook(&server, webhook("old"), 300).await;
    receiver
        .wait_until("a post of the first event", |taken| !taken.is_empty())
        .await;
    let set = json!({"taskId": task_id, "pushNotificationConfig": webhook("new")});
    let set = call(&server.url, "tasks/pushNotificationConfig/set", set).await;
    assert!(set["result"].is_object(), "{set}");
    receiver.wait_for("mission.completed").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let taken: Vec<(String, Option<String>)> = receiver
        .taken()
        .into_iter()
        .map(|d| (d.event_type, d.token))
        .collect();
    let expected = [("mission.assigned", "old"), ("mission.completed", "new")]
        .map(|(event, token)| (event.to_owned(), Some(token.to_owned())));
    assert_eq!(taken, expected);
}

/// A webhook set again with a new token, the same URL, after it took an event that another
/// webhook of its task still fails: it is not posted that event again at the retry. The set
/// forgot its records as if it were another webhook (helper-103).
#[tokio::test]
async fn a_webhook_whose_token_is_rotated_keeps_what_it_took() {
    let server = ServerProcess::start(&[]);
    let failing = Receiver::failing(Some("mission.completed"), 6).await;
    let kept = Receiver::start(0).await;
    let webhook = |token: &str| json!({"id": "x", "url": kept.url(), "token": token});
    let task_id = send_with_webhook(&server, webhook("old"), 100).await;
    set_webhook(&server, &task_id, "w", &failing).await;
    kept.wait_for("mission.completed").await;
    let set = json!({"taskId": task_id, "pushNotificationConfig": webhook("new")});
    let set = call(&server.url, "tasks/pushNotificationConfig/set", set).await;
    assert!(set["result"].is_object(), "{set}");
    failing.wait_for("mission.completed").await;
    until_marked_delivered(&server, &task_id).await;
    let completions = kept.taken().into_iter();
    let completions = completions.filter(|d| d.event_type == "mission.completed");
    assert_eq!(completions.count(), 1, "{:?}", kept.taken());
}

/// Sets webhook `id` of task `task_id` to `receiver`'s URL.
async fn set_webhook(server: &ServerProcess, task_id: &str, id: &str, receiver: &Receiver) {
    let config = json!({"taskId": task_id,
        "pushNotificationConfig": {"id": id, "url": receiver.url()}});
    let set = call(&server.url, "tasks/pushNotificationConfig/set", config).await;
    assert!(set["result"].is_object(), "{set}");
}

/// The same where the event the old URL takes is the first of two its pass carries: the new
/// URL gets them in order. Left unmarked, the first was passed over and the second posted to
/// the new URL before it (helper-96).
#[tokio::test]
async fn a_webhook_set_again_mid_post_gets_its_tasks_events_in_order() {
    let server = ServerProcess::start(&[]);
    let old = Receiver::failing(Some("mission.assigned"), 3).await;
    let new = Receiver::start(0).await;
    let task_id = send_with_webhook(&server, json!({"id": "x", "url": old.url()}), 100).await;
    let failed = |taken: &[Delivery]| taken.iter().filter(|d| d.status == 500).count() >= 3;
    old.wait_until("three failed attempts", failed).await;
    *old.answer_after.lock().unwrap() = Duration::from_secs(2);
    old.wait_until("the fourth attempt", |taken| taken.len() >= 4)
        .await;
    set_webhook(&server, &task_id, "x", &new).await;
    new.wait_for("mission.completed").await;
    let took = new.taken().into_iter().filter(|d| d.status == 200);
    let order: Vec<String> = took.map(|d| d.event_type).collect();
    assert_eq!(order, ["mission.assigned", "mission.completed"]);
}

/// The relay's read runs on every poll over every undelivered event: each event must cost index
/// lookups only, the held-back events' in their own small index (a visit to every event of
/// the task made the read connection 3.6x as busy under load).
#[tokio::test]
async fn the_relays_read_of_the_outbox_uses_its_indexes() {
    let mut server = ServerProcess::start(&[]);
    server.kill();
    let conn = rusqlite::Connection::open(server.db()).unwrap();
    let sql = example_sql::sqlite(example_sql::UNDELIVERED);
    let plan: Vec<String> = conn
        .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
        .unwrap()
        .query_map([512, 0], |row| row.get(3))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let plan = plan.join("\n");
    assert!(
        plan.contains("USING INDEX idx_outbox_undelivered"),
        "{plan}"
    );
    assert!(plan.contains("USING INDEX idx_outbox_held"), "{plan}");
    assert!(
        plan.contains("USING COVERING INDEX sqlite_autoindex_push_configs_1"),
        "{plan}"
    );
    // The task's index serves the later events of a retried one alone: at most one lookup a
    // retry, never a visit to the events of every task read.
    let by_task: Vec<&str> = plan
        .lines()
        .filter(|l| l.contains("idx_outbox_task"))
        .collect();
    assert!(
        by_task.iter().all(|line| line.starts_with("SEARCH later")),
        "{plan}"
    );
}

/// A retried event is read with the later events of its task, however many older events are
/// due: the task's other webhooks get them at that retry. Before, the later event was read by
/// the oldest 512 due events alone, and behind 600 of them it waited until the retried event
/// was given up, a day (helper-69).
#[tokio::test]
async fn a_retried_event_is_read_with_the_later_events_of_its_task() {
    let mut server = ServerProcess::start(&[]);
    server.kill();
    let conn = rusqlite::Connection::open(server.db()).unwrap();
    let event = "INSERT INTO outbox (id, task_id, event_type, payload, created_at,
                   next_attempt_at, attempts) VALUES (?1, ?2, ?3, '{}', 0, ?4, ?5)";
    let task = "INSERT INTO tasks (id, context_id, state, due_at, created_at, updated_at,
                  task_json) VALUES (?1, 'c', 'working', 0, 0, 0, '{}')";
    for n in 1..=600 {
        let older = format!("OLDER-{n}");
        conn.execute(task, [&older]).unwrap();
        let never_tried: Option<i64> = None;
        let values = rusqlite::params![n, older, "mission.assigned", never_tried, 0];
        conn.execute(event, values).unwrap();
    }
    conn.execute(task, ["T"]).unwrap();
    let retried = rusqlite::params![601, "T", "mission.assigned", 1, 3];
    conn.execute(event, retried).unwrap();
    let later = rusqlite::params![602, "T", "mission.completed", None::<i64>, 0];
    conn.execute(event, later).unwrap();
    let sql = example_sql::sqlite(example_sql::UNDELIVERED);
    let ids: Vec<i64> = conn
        .prepare(&sql)
        .unwrap()
        .query_map([512, 1_000], |row| row.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert!(ids.contains(&601) && ids.contains(&602), "{ids:?}");
}

/// A store that fails for good (here its file deleted) while an event waits for its webhook:
/// the relay waits longer after each failed pass, as it does when its reads fail, instead of
/// delivering the event again every 100 ms (a delivery whose mark cannot be written goes
/// again: at least once, not ten times a second).
#[tokio::test]
async fn a_store_that_fails_for_good_slows_the_relay_instead_of_flooding_the_webhook() {
    // Three refusals first: the event cannot be delivered and marked before the file goes.
    let receiver = Receiver::start(3).await;
    let server = ServerProcess::start(&[]);
    send_with_webhook(&server, json!({"url": receiver.url()}), 60_000).await;
    receiver
        .wait_until("a first attempt", |taken| !taken.is_empty())
        .await;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", server.db().display()));
    }
    receiver.wait_for("mission.assigned").await; // delivered now: its mark cannot be written
    let before = receiver.taken().len();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let again = receiver.taken().len() - before;
    assert!(
        again <= 6,
        "the webhook got the event {again} more times in 3 s"
    );
}

/// Events of tasks without webhooks have nowhere to go: the relay marks all it reads in one
/// write (one timestamp), not one write and one commit each, which under load fell behind the
/// calls by thousands of events a second.
#[tokio::test]
async fn events_without_webhooks_are_marked_delivered_together() {
    let server = ServerProcess::start(&[]);
    let sends = (0..200).map(|n| {
        let url = server.url.clone();
        let body = crate::support::send_with(n, "message/send", &new_id(), "quiet", json!({}));
        async move { post_activated(&url, body).await.status }
    });
    let statuses = futures::future::join_all(sends).await;
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY;
    let conn = rusqlite::Connection::open_with_flags(server.db(), flags).unwrap();
    conn.busy_timeout(Duration::from_secs(5)).unwrap();
    let assigned = "FROM outbox WHERE event_type = 'mission.assigned'";
    let undelivered = format!("SELECT COUNT(*) {assigned} AND delivered_at IS NULL");
    let deadline = Instant::now() + Duration::from_secs(10);
    while conn
        .query_row(&undelivered, [], |r| r.get::<_, i64>(0))
        .unwrap()
        > 0
    {
        assert!(Instant::now() < deadline, "{}", server.stderr());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let writes = format!("SELECT COUNT(DISTINCT delivered_at) {assigned}");
    let writes: i64 = conn.query_row(&writes, [], |r| r.get(0)).unwrap();
    // One per read of the outbox that found some (a read every 100 ms while the calls came).
    assert!(writes <= 40, "200 events marked in {writes} writes");
}

#[tokio::test]
async fn push_configs_are_set_read_listed_and_deleted_in_both_versions() {
    push_configs_on(ServerProcess::start(&[])).await;
}

/// The same read on PostgreSQL: its planner must prove `next_attempt_at > $2` implies the held
/// index's predicate. Sequential scans are turned off, since a table this small would
/// otherwise be read whole whatever its indexes.
#[tokio::test]
async fn the_relays_read_uses_the_held_index_on_postgres() {
    let what = "the relay's outbox read on PostgreSQL";
    let Some(db) = crate::replicas::Database::shared("idem_relay_plan", what).await else {
        return;
    };
    let server = ServerProcess::start_on(Some(db.url()), &[], &[]);
    drop(server);
    let client = idem_conformance::postgres::connect(db.url()).await;
    client
        .batch_execute("SET enable_seqscan = off")
        .await
        .unwrap();
    let explain = format!("EXPLAIN {}", example_sql::UNDELIVERED);
    let rows = client.query(&explain, &[&512i64, &0i64]).await.unwrap();
    let plan: Vec<String> = rows.iter().map(|row| row.get(0)).collect();
    let plan = plan.join("\n");
    assert!(plan.contains("idx_outbox_held"), "{plan}");
    assert!(!plan.contains("idx_outbox_task"), "{plan}");
}

#[tokio::test]
async fn push_configs_and_their_delivery_on_postgres() {
    let what = "push notifications on PostgreSQL";
    let Some(db) = crate::replicas::Database::shared("idem_push", what).await else {
        return;
    };
    push_configs_on(ServerProcess::start_on(Some(db.url()), &[], &[])).await;
    // As an earlier version left the outbox: the next start adds the retry columns.
    let client = idem_conformance::postgres::connect(db.url()).await;
    let earlier = "DROP INDEX IF EXISTS idx_outbox_held; ALTER TABLE outbox
        DROP COLUMN next_attempt_at, DROP COLUMN attempts, DROP COLUMN abandoned_at";
    client.batch_execute(earlier).await.unwrap();
    let receiver = Receiver::start(1).await;
    let server = ServerProcess::start_on(Some(db.url()), &[], &[]);
    let task_id = send_with_webhook(&server, json!({"url": receiver.url()}), 100).await;
    receiver.wait_for("mission.assigned").await;
    receiver.wait_for("mission.completed").await;
    assert!(receiver
        .taken()
        .iter()
        .all(|d| d.body["id"] == task_id.as_str()));
    let attempts = "SELECT attempts FROM outbox WHERE task_id = $1 ORDER BY id";
    let rows = client.query(attempts, &[&task_id]).await.unwrap();
    let attempts: Vec<i32> = rows.iter().map(|row| row.get(0)).collect();
    assert_eq!(attempts, [1, 0], "the failed attempt, counted in its row");
}

async fn push_configs_on(server: ServerProcess) {
    let url = &server.url;
    let card = reqwest::get(format!("{url}/.well-known/agent-card.json"))
        .await
        .unwrap();
    let card: Value = card.json().await.unwrap();
    assert_eq!(card["capabilities"]["pushNotifications"], true);
    let hook = "http://127.0.0.1:9/hook";
    let task_id = send_with_webhook(&server, json!({"url": hook, "token": "t"}), 60_000).await;
    let first = json!({"taskId": task_id, "pushNotificationConfig": {"id": task_id, "url": hook, "token": "t"}});

    // The send's own webhook, under the task's id.
    let got = call(
        url,
        "tasks/pushNotificationConfig/get",
        json!({"id": task_id}),
    )
    .await;
    assert_eq!(got["result"], first);
    let listed = call(
        url,
        "tasks/pushNotificationConfig/list",
        json!({"id": task_id}),
    )
    .await;
    assert_eq!(listed["result"], json!([first]));

    // 1.0: a second one, flat.
    let second = json!({"taskId": task_id, "id": "second", "url": hook});
    let created = call_v10(url, "CreateTaskPushNotificationConfig", second.clone()).await;
    assert_eq!(created["result"], second);
    let got = call_v10(
        url,
        "GetTaskPushNotificationConfig",
        json!({"taskId": task_id, "id": "second"}),
    )
    .await;
    assert_eq!(got["result"], second);
    let listed = call_v10(
        url,
        "ListTaskPushNotificationConfigs",
        json!({"taskId": task_id}),
    )
    .await;
    assert_eq!(
        listed["result"]["configs"].as_array().map(Vec::len),
        Some(2)
    );

    // 0.3 set replaces by id.
    let replaced = json!({"taskId": task_id, "pushNotificationConfig": {"id": "second", "url": "http://127.0.0.1:9/other"}});
    let set = call(url, "tasks/pushNotificationConfig/set", replaced.clone()).await;
    assert_eq!(set["result"], replaced);

    let deleted = call(
        url,
        "tasks/pushNotificationConfig/delete",
        json!({"id": task_id, "pushNotificationConfigId": task_id}),
    )
    .await;
    assert_eq!(deleted["result"], Value::Null);
    let deleted = call_v10(
        url,
        "DeleteTaskPushNotificationConfig",
        json!({"taskId": task_id, "id": "second"}),
    )
    .await;
    assert_eq!(deleted["result"], json!({}));
    let listed = call(
        url,
        "tasks/pushNotificationConfig/list",
        json!({"id": task_id}),
    )
    .await;
    assert_eq!(listed["result"], json!([]));

    // Errors: an unknown task, a config that is not there, a URL that is not HTTP.
    let unknown = call(
        url,
        "tasks/pushNotificationConfig/list",
        json!({"id": "nope"}),
    )
    .await;
    assert_eq!(unknown["error"]["code"], -32001);
    let missing = call(
        url,
        "tasks/pushNotificationConfig/get",
        json!({"id": task_id, "pushNotificationConfigId": "gone"}),
    )
    .await;
    assert_eq!(missing["error"]["code"], -32602);
    // Refused when set, never retried for ever: no TLS here, and URLs the relay cannot post to.
    for hook in [
        "ftp://x",
        "https://hooks.example/a2a",
        "http://exa mple/",
        "hooks",
    ] {
        let bad = json!({"taskId": task_id, "pushNotificationConfig": {"url": hook}});
        let bad = call(url, "tasks/pushNotificationConfig/set", bad).await;
        assert_eq!(bad["error"]["code"], -32602, "{hook}: {bad}");
    }
    // And tokens it cannot send as a header: every post failed before it left (helper-101).
    for token in ["a\nb", "\0\r\nX-Evil: 1"] {
        let config = json!({"url": "http://127.0.0.1:9/hook", "token": token});
        let bad = json!({"taskId": task_id, "pushNotificationConfig": config});
        let bad = call(url, "tasks/pushNotificationConfig/set", bad).await;
        assert_eq!(bad["error"]["code"], -32602, "{token}: {bad}");
        let reason = bad["error"]["data"]["reason"].as_str().unwrap_or_default();
        assert!(reason.contains("token"), "{bad}");
    }
}

/// Two replicas on one PostgreSQL database share its outbox, and only one relay delivers it:
/// every event arrives once, a task's events in order. When that replica dies (SIGKILL), the
/// other takes over, and the events of tasks it runs arrive too. Before, each replica's relay
/// delivered every event it read, so events arrived twice and out of order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_deliver_each_event_once_and_a_survivor_takes_over_the_relay() {
    let what = "the relay's leadership across PostgreSQL replicas";
    let Some(db) = crate::replicas::Database::shared("idem_relay_leader", what).await else {
        return;
    };
    let receiver = Receiver::start(0).await;
    let mut replicas = [
        ServerProcess::start_on(Some(db.url()), &[], &[]),
        ServerProcess::start_on(Some(db.url()), &[], &[]),
    ];
    let hook = json!({"url": receiver.url()});
    let mut tasks = Vec::new();
    for i in 0..20 {
        tasks.push(send_with_webhook(&replicas[i % 2], hook.clone(), 50).await);
    }
    delivered_once_in_order(&receiver, &tasks).await;

    let leads = |server: &ServerProcess| server.stderr().contains("this replica delivers");
    let leaders: Vec<usize> = (0..2).filter(|&i| leads(&replicas[i])).collect();
    assert_eq!(leaders.len(), 1, "{leaders:?}");
    let survivor = 1 - leaders[0];
    replicas[leaders[0]].kill();
    for _ in 0..5 {
        tasks.push(send_with_webhook(&replicas[survivor], hook.clone(), 50).await);
    }
    delivered_once_in_order(&receiver, &tasks).await;
    assert!(
        leads(&replicas[survivor]),
        "{}",
        replicas[survivor].stderr()
    );
}

/// Waits until each of `tasks` had its two events delivered, then a little longer for any
/// second delivery: none may come, and each task's `mission.assigned` came first.
async fn delivered_once_in_order(receiver: &Receiver, tasks: &[String]) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while receiver.taken().len() < 2 * tasks.len() {
        assert!(Instant::now() < deadline, "{:?}", receiver.taken());
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let taken = receiver.taken();
    let mut ids: Vec<i64> = taken.iter().map(|d| d.event_id).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), taken.len(), "an event arrived twice: {taken:?}");
    for task in tasks {
        let types: Vec<&str> = taken
            .iter()
            .filter(|d| d.body["id"] == task.as_str())
            .map(|d| d.event_type.as_str())
            .collect();
        assert_eq!(types, ["mission.assigned", "mission.completed"], "{task}");
    }
}
