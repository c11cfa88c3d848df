//! What an operator sees, on the example server as a real process: each metric of
//! `idem::telemetry` moving on the scenario it counts (read from `GET /metrics`), the
//! `idem-admin` tool on a database a server is serving, and the limits' errors.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::support::{
    deep_json, new_id, post, post_activated, send_with, stream_request, until_completed, SseReply,
    URI,
};
use idem_conformance::server_process::ServerProcess;

/// The Prometheus text of `GET /metrics`, for lookups by name and labels.
pub(crate) struct Metrics(String);

impl Metrics {
    /// Prometheus text rendered in this process.
    pub(crate) fn of(text: String) -> Self {
        Self(text)
    }

    pub(crate) async fn scrape(url: &str) -> Self {
        let response = reqwest::get(format!("{url}/metrics"))
            .await
            .expect("GET /metrics");
        assert_eq!(response.status(), 200);
        let content_type = response.headers()["content-type"]
            .to_str()
            .unwrap()
            .to_owned();
        assert!(content_type.starts_with("text/plain"), "{content_type}");
        Self(response.text().await.unwrap())
    }

    /// The samples `name{labels}` whose labels include all of `labels`, each with its value.
    pub(crate) fn samples(&self, name: &str, labels: &[(&str, &str)]) -> Vec<(String, f64)> {
        let wanted: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
        let samples = self.0.lines().filter(|l| !l.starts_with('#'));
        let matching = samples.filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (metric, rest) = series.split_once('{').unwrap_or((series, "}"));
            let found = metric == name && wanted.iter().all(|w| rest.contains(w.as_str()));
            found.then(|| (series.to_owned(), value.parse().expect("a sample value")))
        });
        matching.collect()
    }

    /// The sum of the samples `name{labels}` whose labels include all of `labels` (as
    /// PromQL's `sum` of a selector); 0 when none is rendered.
    pub(crate) fn get(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let samples = self.samples(name, labels);
        samples.iter().map(|(_, value)| value).sum()
    }

    fn calls(&self, outcome: &str) -> f64 {
        self.get("idempotency_calls_total", &[("outcome", outcome)])
    }
}

/// Scrapes until `check` holds (the gauges move after a sweep), at most 10 s.
pub(crate) async fn eventually(url: &str, what: &str, check: impl Fn(&Metrics) -> bool) -> Metrics {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let metrics = Metrics::scrape(url).await;
        if check(&metrics) {
            return metrics;
        }
        assert!(
            Instant::now() < deadline,
            "{what} never held:\n{}",
            metrics.0
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

const FAST_SWEEP: (&str, &str) = ("AIWG_IDEMPOTENCY_SWEEP_INTERVAL_MS", "200");

fn send(id: u64, message_id: &str, text: &str) -> String {
    send_with(id, "message/send", message_id, text, json!({}))
}

/// A governed call passed to its method without deduplication (the extension optional and
/// not activated, or off) is counted as such, once a call (found by helper-45: such calls,
/// which may run twice, moved no metric).
#[tokio::test]
async fn calls_run_without_deduplication_are_counted_as_such() {
    for (mode, activated) in [("optional", false), ("off", true)] {
        let server = ServerProcess::start_with(&["--idempotency", mode], &[]);
        let key = new_id();
        for _ in 0..2 {
            let body = send_body(&key, "twice");
            let reply = match activated {
                true => post_activated(&server.url, body).await,
                false => post(&server.url, body, &[]).await,
            };
            assert_eq!(reply.status, 200, "{mode}: {}", reply.describe());
        }
        let m = Metrics::scrape(&server.url).await;
        let undeduplicated = [("method", "message/send"), ("outcome", "undeduplicated")];
        assert_eq!(
            m.get("idempotency_calls_total", &undeduplicated),
            2.0,
            "{mode}"
        );
        assert_eq!(m.calls("executed"), 0.0, "{mode}");
    }
}

#[tokio::test]
async fn each_outcome_moves_its_own_counter_and_no_label_names_a_key() {
    let wait = ("AIWG_IDEMPOTENCY_IN_FLIGHT_WAIT_MS", "200");
    let server = ServerProcess::start(&[FAST_SWEEP, wait]);
    let url = &server.url;
    let key = new_id();
    let (send, method) = (&[("method", "message/send")], "message/send");

    assert_eq!(
        post_activated(url, send_body(&key, "survey")).await.status,
        200
    );
    let m = Metrics::scrape(url).await;
    assert_eq!(
        m.get(
            "idempotency_calls_total",
            &[send[0], ("outcome", "executed")]
        ),
        1.0
    );
    assert_eq!(m.get("idempotency_claim_seconds_count", send), 1.0);
    assert_eq!(m.get("idempotency_commit_seconds_count", send), 1.0);
    assert_eq!(m.calls("replayed"), 0.0);
    // Histograms, as the README lists them: buckets that add up across replicas.
    for timing in ["idempotency_claim_seconds", "idempotency_commit_seconds"] {
        let declared = format!("# TYPE {timing} histogram");
        assert!(m.0.lines().any(|l| l == declared), "{}", m.0);
        let all = [send[0], ("le", "+Inf")];
        assert_eq!(m.get(&format!("{timing}_bucket"), &all), 1.0);
    }

    // The first resend of the same bytes is a retry by key (the guard claims it), which
    // teaches the memory tier its bytes; the next one is answered by the HTTP layer, and the
    // same params under another id by the RPC layer: neither claims anything.
    let replay = post_activated(url, send_body(&key, "survey")).await;
    assert!(replay.replayed());
    let claims = |m: &Metrics| m.get("idempotency_claim_seconds_count", send);
    assert_eq!(
        claims(&Metrics::scrape(url).await),
        2.0,
        "the first retry, by key"
    );
    let resend = post_activated(url, send_body(&key, "survey")).await;
    assert!(resend.replayed());
    assert_eq!(resend.body, replay.body);
    let again = post_activated(url, self::send(2, &key, "survey")).await;
    assert!(again.replayed());
    let m = Metrics::scrape(url).await;
    assert_eq!(claims(&m), 2.0, "answered from memory by their bytes");
    assert_eq!(m.calls("replayed"), 3.0);
    assert_eq!(m.calls("executed"), 1.0, "a replay executes nothing");

    let collision = post_activated(url, send_body(&key, "another payload")).await;
    assert_eq!(collision.status, 422);
    let malformed = post_activated(url, send_body("not-a-uuid", "x")).await;
    assert_eq!(malformed.status, 400);
    let unactivated = post(url, send_body(&new_id(), "x"), &[]).await;
    assert_eq!(unactivated.error_code(), -32008);
    // A duplicate of a call still running past the in-flight wait: 409, after a wait.
    let slow = send_with(
        1,
        "message/send",
        &new_id(),
        "slow",
        json!({"delayMs": 1500}),
    );
    let (first_url, first_body) = (url.clone(), slow.clone());
    let original = tokio::spawn(async move { post_activated(&first_url, first_body).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(post_activated(url, slow).await.status, 409);
    assert_eq!(original.await.unwrap().status, 200);
    let m = Metrics::scrape(url).await;
    let waits = [("method", method), ("result", "still_running")];
    assert_eq!(m.get("idempotency_in_flight_waits_total", &waits), 1.0);
    assert_eq!(m.calls("collision"), 1.0);
    assert_eq!(m.calls("rejected"), 3.0);
    for (code, n) in [
        ("IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_PAYLOAD", 1.0),
        ("IDEMPOTENCY_KEY_MALFORMED", 1.0),
        ("EXTENSION_SUPPORT_REQUIRED", 1.0),
        ("IDEMPOTENCY_REQUEST_IN_PROGRESS", 1.0),
    ] {
        let labels = [("method", method), ("code", code)];
        assert_eq!(m.get("idempotency_rejections_total", &labels), n, "{code}");
    }

    // A stream's retry while the original runs attaches to it, after a wait.
    let stream_key = new_id();
    let body = stream_request(7, &stream_key, "long", json!({"durationMs": 1500}));
    let activated = &[("A2A-Extensions", URI)];
    let mut first = SseReply::open(url, body.clone(), activated).await;
    let opening = first.next_event().await.expect("the first event");
    let mut retry = SseReply::open(url, body, activated).await;
    assert!(retry.replayed());
    let stream = [("method", "message/stream")];
    let m = Metrics::scrape(url).await;
    assert_eq!(
        m.get(
            "idempotency_calls_total",
            &[stream[0], ("outcome", "attached")]
        ),
        1.0
    );
    let waits = [stream[0], ("result", "attached")];
    assert_eq!(m.get("idempotency_in_flight_waits_total", &waits), 1.0);
    // A stream refused in a batch is a rejected call too, counted by its refusal.
    let batched = format!("[{}]", stream_request(8, &new_id(), "x", json!({})));
    let refused = post_activated(url, batched).await;
    assert_eq!(
        refused.json()[0]["error"]["data"]["code"],
        "IDEMPOTENCY_STREAM_IN_BATCH"
    );
    let m = Metrics::scrape(url).await;
    let rejected = [stream[0], ("outcome", "rejected")];
    assert_eq!(m.get("idempotency_calls_total", &rejected), 1.0);
    let in_batch = [stream[0], ("code", "IDEMPOTENCY_STREAM_IN_BATCH")];
    assert_eq!(m.get("idempotency_rejections_total", &in_batch), 1.0);
    assert_eq!(
        m.get("idempotency_in_flight_wait_seconds_count", &stream),
        1.0
    );
    let mut original = vec![opening];
    original.extend(first.rest().await);
    assert_eq!(
        original,
        retry.rest().await,
        "the retry follows the same events"
    );

    // Two entries, whose bytes the gauge counts once a sweep has run.
    let m = eventually(url, "two entries", |m| {
        m.get("idempotency_entries", &[]) == 2.0
    })
    .await;
    assert!(m.get("idempotency_stored_bytes", &[]) > 400.0, "{}", m.0);
    assert!(m.get("idempotency_sweep_seconds_count", &[]) >= 1.0);
    assert!(!m.0.contains(&key) && !m.0.contains(&stream_key), "{}", m.0);
    assert!(
        m.0.contains("# HELP idempotency_calls_total"),
        "described: {}",
        m.0
    );
}

#[tokio::test]
async fn evictions_are_counted_by_reason() {
    let env = [
        FAST_SWEEP,
        ("AIWG_IDEMPOTENCY_TTL", "1"),
        ("AIWG_IDEMPOTENCY_MAX_ENTRIES", "2"),
    ];
    let server = ServerProcess::start(&env);
    for _ in 0..3 {
        assert_eq!(
            post_activated(&server.url, send_body(&new_id(), "x"))
                .await
                .status,
            200
        );
    }
    let m = Metrics::scrape(&server.url).await;
    assert_eq!(
        m.get("idempotency_evictions_total", &[("reason", "lru")]),
        1.0
    );
    // Past the TTL, the sweep deletes the two left.
    let m = eventually(&server.url, "the TTL sweep", |m| {
        m.get("idempotency_evictions_total", &[("reason", "ttl")]) == 2.0
    })
    .await;
    assert_eq!(m.get("idempotency_entries", &[]), 0.0, "{}", m.0);
}

/// The counters' series of the governed methods are rendered at zero from the start: one that
/// first appeared at 1 had no increase, so an alert on `increase(...{outcome="collision"}[5m])
/// > 0` missed a server's first 422, and a dashboard showed no replays as no data.
#[tokio::test]
async fn the_counters_series_are_rendered_at_zero_before_any_call() {
    let server = ServerProcess::start(&[]);
    let m = Metrics::scrape(&server.url).await;
    let send = ("method", "message/send");
    for (name, labels) in [
        ("idempotency_calls_total", [send, ("outcome", "collision")]),
        ("idempotency_calls_total", [send, ("outcome", "replayed")]),
        (
            "idempotency_in_flight_waits_total",
            [send, ("result", "still_running")],
        ),
        (
            "idempotency_calls_total",
            [("method", "message/stream"), ("outcome", "executed")],
        ),
        (
            "idempotency_rejections_total",
            [send, ("code", "IDEMPOTENCY_REQUEST_IN_PROGRESS")],
        ),
    ] {
        let samples = m.samples(name, &labels);
        assert_eq!(samples.len(), 1, "{name} {labels:?}:\n{}", m.0);
        assert_eq!(samples[0].1, 0.0, "{samples:?}");
    }
    for (name, label) in [
        ("idempotency_store_errors_total", ("kind", "commit")),
        ("idempotency_evictions_total", ("reason", "lru")),
    ] {
        assert_eq!(
            m.samples(name, &[label]).len(),
            1,
            "{name} {label:?}:\n{}",
            m.0
        );
    }
}

/// The store's size is in its gauges as soon as the server serves, not a sweep (60 s by
/// default) later: before, a restarted server showed none for its first minute.
#[tokio::test]
async fn the_size_gauges_hold_the_store_s_figures_from_the_start() {
    let mut server = ServerProcess::start(&[]);
    for _ in 0..2 {
        let sent = post_activated(&server.url, send_body(&new_id(), "x")).await;
        assert_eq!(sent.status, 200, "{}", sent.describe());
    }
    let url = server.restart();
    let m = eventually(&url, "the size gauges, without a sweep", |m| {
        let sampled = |name: &str| m.0.lines().any(|line| line.starts_with(name));
        sampled("idempotency_entries ") && sampled("idempotency_stored_bytes ")
    })
    .await;
    assert_eq!(m.get("idempotency_entries", &[]), 2.0, "{}", m.0);
    assert!(m.get("idempotency_stored_bytes", &[]) > 0.0, "{}", m.0);
}

/// The deepest params the guard accepts (`MAX_DEPTH`: 127 levels, serde_json's own limit)
/// run, and the task they leave, whose history nests the message one level deeper, is read
/// and completes; one level more is the 400 that names the limit, not jsonrpsee's -32602.
#[tokio::test]
async fn params_nested_to_the_limit_run_and_one_level_more_get_an_error_naming_it() {
    let server = ServerProcess::start(&[]);
    let reply = post_activated(&server.url, nested_send(&new_id(), 127)).await;
    assert_eq!(reply.status, 200, "{}", reply.describe());
    let task_id = deep_json(&reply.body)["result"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    until_completed(&server.url, &task_id, Duration::from_secs(10)).await;

    let reply = post_activated(&server.url, nested_send(&new_id(), 128)).await;
    assert_eq!(reply.status, 400, "{}", reply.describe());
    let error = &reply.json()["error"];
    assert_eq!(
        error["data"]["code"],
        "IDEMPOTENCY_PAYLOAD_NOT_CANONICALIZABLE"
    );
    assert_eq!(error["data"]["max_depth"], 127);
    let reason = error["data"]["reason"].as_str().unwrap();
    assert!(reason.contains("127 levels"), "{reason}");
}

/// A `message/send` whose params nest `depth` levels: `params{message{metadata{"n": [[…]]}}}`,
/// the arrays from the fourth level on, and a mission of 50 ms.
fn nested_send(key: &str, depth: usize) -> String {
    let arrays = depth - 3;
    let nest = format!("{}{}", "[".repeat(arrays), "]".repeat(arrays));
    let message = format!(
        r#"{{"kind":"message","messageId":"{key}","role":"user","parts":[{{"kind":"text","text":"deep"}}],"metadata":{{"n":{nest}}}}}"#
    );
    format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"message/send","params":{{"message":{message},"metadata":{{"durationMs":50}}}}}}"#
    )
}

fn send_body(key: &str, text: &str) -> String {
    send(1, key, text)
}

/// The tool asks on the terminal, as `rm -i` does, whatever stdout goes to: the question
/// went to stdout, so with the output redirected the tool waited with nothing on the screen
/// (helper-110). With stderr redirected, no one would see it: refused, not asked. Run under
/// `script`, which gives the tool a terminal.
#[tokio::test]
async fn the_admin_tool_asks_on_the_terminal_not_into_redirected_output() {
    let server = ServerProcess::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let (out, err) = (dir.path().join("out"), dir.path().join("err"));
    let tool = env!("CARGO_BIN_EXE_idem-admin");
    let db = server.db().display().to_string();
    let in_a_terminal = |command: String, typed: &str| {
        let mut script = Command::new("script")
            .args(["-qec", &command, "/dev/null"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("script (util-linux), for a terminal");
        use std::io::Write;
        let mut stdin = script.stdin.take().unwrap();
        stdin.write_all(typed.as_bytes()).unwrap();
        let output = script.wait_with_output().unwrap();
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
        )
    };
    let purge = format!("'{tool}' --db '{db}' purge --expired");
    let (code, screen) = in_a_terminal(format!("{purge} > '{}'", out.display()), "y\n");
    let written = std::fs::read_to_string(&out).unwrap();
    assert_eq!(code, Some(0), "{screen}");
    assert!(
        screen.contains("every expired entry") && screen.contains("[y/N]"),
        "{screen}"
    );
    assert!(
        !written.contains("[y/N]"),
        "asked into the output: {written}"
    );
    assert!(written.contains("purged 0 expired entries"), "{written}");

    let (code, screen) = in_a_terminal(format!("{purge} 2> '{}'", err.display()), "");
    let said = std::fs::read_to_string(&err).unwrap();
    assert_eq!(code, Some(2), "{screen}");
    assert!(said.contains("pass --yes"), "{said}");
}

/// A named pipe given as the database is refused at once: opening it waited for a writer for
/// ever (helper-110).
#[test]
fn the_admin_tool_refuses_a_named_pipe_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo.db");
    let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(made.success());
    let tool = Command::new(env!("CARGO_BIN_EXE_idem-admin"))
        .args(["--db", &fifo.display().to_string(), "stats"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let output = crate::support::exited_within_30_s(tool, "still waiting on the pipe");
    let said = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{said}");
    assert!(said.contains("is not a regular file"), "{said}");
}

/// Runs `idem-admin` with these arguments (stdin closed: no terminal to confirm on).
pub(crate) fn admin(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_idem-admin"))
        .args(args)
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run idem-admin")
}

pub(crate) fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The epoch seconds `idem-admin show` prints on its `name` line (the line's first number:
/// what follows it, "in 86399 s", moves with the second the tool runs in).
fn shown_seconds(show: &str, name: &str) -> u64 {
    let line = show.lines().find(|line| line.starts_with(name));
    let number = line.and_then(|line| line[name.len()..].split_whitespace().next());
    number
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no {name} line in:\n{show}"))
}

#[tokio::test]
async fn the_admin_tool_reads_and_purges_a_database_while_it_is_served() {
    let mut server = ServerProcess::start(&[]);
    let db = server.db().display().to_string();
    let (kept, purged) = (new_id(), new_id());
    let answered = post_activated(&server.url, send_body(&kept, "kept")).await;
    post_activated(&server.url, send_body(&purged, "purged")).await;

    let stats = admin(&["--db", &db, "stats"], &[]);
    assert!(stats.status.success(), "{stats:?}");
    let text = stdout(&stats);
    assert!(text.contains("entries              2"), "{text}");
    assert!(text.contains("message/send           2"), "{text}");

    let show = admin(&["--db", &db, "show", &kept, "--body"], &[]);
    assert!(show.status.success(), "{show:?}");
    let text = stdout(&show);
    let hash = idem_conformance::request_hash::request_hash(&send_body(&kept, "kept")).unwrap();
    assert!(text.contains(&format!("request_hash  {hash}")), "{text}");
    assert!(text.contains("state         live, HTTP 200"), "{text}");
    assert_eq!(
        shown_seconds(&text, "expires_at"),
        shown_seconds(&text, "inserted_at") + 86_400,
        "expires a day after it was stored:\n{text}"
    );
    let body = String::from_utf8(answered.body.clone()).unwrap();
    assert!(
        text.contains(&body),
        "the stored body is what was answered:\n{text}"
    );

    // In the server's memory: a resend is answered from there.
    assert!(post_activated(&server.url, send_body(&purged, "purged"))
        .await
        .replayed());

    // Destructive commands need --yes where nobody can answer a prompt.
    let unconfirmed = admin(&["--db", &db, "purge", &purged], &[]);
    assert_eq!(unconfirmed.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&unconfirmed.stderr).contains("--yes"));
    assert!(admin(&["--db", &db, "show", &purged], &[]).status.success());
    let purge = admin(&["--db", &db, "purge", &purged, "--yes"], &[]);
    assert!(purge.status.success(), "{purge:?}");
    assert_eq!(
        admin(&["--db", &db, "show", &purged], &[]).status.code(),
        Some(1)
    );
    assert_eq!(
        admin(&["--db", &db, "purge", &purged, "--yes"], &[])
            .status
            .code(),
        Some(1)
    );

    // The serving process forgot it: the purged key executes again, the other still replays.
    let again = post_activated(&server.url, send_body(&purged, "purged")).await;
    assert!(!again.replayed(), "{}", again.describe());
    assert!(post_activated(&server.url, send_body(&kept, "kept"))
        .await
        .replayed());
    // And after a restart, from the file: both replay.
    let url = server.restart();
    let replayed = post_activated(&url, send_body(&purged, "purged")).await;
    assert!(replayed.replayed());
    assert_eq!(replayed.body, again.body);

    // What is expired is by the servers' TTL, recorded in the database, not by the shell's:
    // with the shell's at 1 s, the live entries stay (before, both went, and ran again).
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let shell_ttl = [("AIWG_IDEMPOTENCY_TTL", "1")];
    let kept_live = admin(&["--db", &db, "purge", "--expired", "--yes"], &shell_ttl);
    assert!(kept_live.status.success(), "{kept_live:?}");
    let said = String::from_utf8_lossy(&kept_live.stderr);
    assert!(said.contains("keep entries 86400 s"), "{said}");
    assert!(stdout(&kept_live).contains("purged 0 expired entries"));
    assert!(post_activated(&url, send_body(&kept, "kept"))
        .await
        .replayed());

    // A server that keeps entries 1 s records it: two seconds on, both are expired, and the
    // purge returns once the serving process has forgotten what it held.
    server.kill();
    let env = [
        ("AIWG_IDEMPOTENCY_TTL", "1"),
        ("AIWG_IDEMPOTENCY_SWEEP_INTERVAL_MS", "3600000"),
    ];
    let _short = ServerProcess::start_on(Some(&db), &[], &env);
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let stats = stdout(&admin(&["--db", &db, "stats"], &[]));
    assert!(
        stats.contains("ttl                  1 s (as the servers recorded it)"),
        "{stats}"
    );
    let expired = admin(&["--db", &db, "purge", "--expired", "--yes"], &[]);
    assert!(expired.status.success(), "{expired:?}");
    assert!(
        stdout(&expired).contains("purged 2 expired entries"),
        "{expired:?}"
    );
    let conn = rusqlite::Connection::open(&db).unwrap();
    let (generation, seen): (i64, i64) = conn
        .query_row("SELECT generation, seen FROM idempotency_purges", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap();
    assert_eq!(generation, seen, "the serving process confirmed the purge");
    assert!(stdout(&admin(&["--db", &db, "stats"], &[])).contains("entries              0"));
}

/// A stream being recorded has no entry yet: a purge of its key says so, and what the stream
/// holds so far, instead of "nothing is stored" beside a `show` that lists it.
/// A process serves the file although no lock file beside the name given says so: its lock
/// file was deleted, or the file renamed while served. The tool answered "purged" at once
/// while the server still replayed the key, or, on the new name, wrote its purge into a log
/// of its own (found by helper-89). It refuses, saying why, and the server's entry stands.
#[tokio::test]
async fn the_admin_tool_refuses_a_file_served_where_no_lock_file_says_so() {
    let server = ServerProcess::start(&[]);
    let db = server.db().to_path_buf();
    let key = new_id();
    let answered = post_activated(&server.url, send_body(&key, "kept")).await;
    let lock = std::fs::canonicalize(&db).unwrap().display().to_string() + ".lock";
    std::fs::remove_file(&lock).unwrap();
    let moved = db.with_file_name("moved.db");
    for (name, renamed) in [(&db, false), (&moved, true)] {
        if renamed {
            std::fs::rename(&db, &moved).unwrap();
        }
        let name = name.display().to_string();
        let purge = admin(&["--db", &name, "purge", &key, "--yes"], &[]);
        assert_eq!(purge.status.code(), Some(2), "{purge:?}");
        let stderr = String::from_utf8_lossy(&purge.stderr);
        assert!(
            stderr.contains("renamed while served, or its lock file deleted"),
            "{stderr}"
        );
    }
    std::fs::rename(&moved, &db).unwrap();
    let again = post_activated(&server.url, send_body(&key, "kept")).await;
    assert!(again.replayed(), "{}", again.describe());
    assert_eq!(again.body, answered.body);
}

#[tokio::test]
async fn a_purge_of_a_key_whose_stream_is_being_recorded_says_so() {
    let server = ServerProcess::start(&[]);
    let db = server.db().display().to_string();
    let key = new_id();
    let body = stream_request(1, &key, "go", json!({"durationMs": 3000}));
    let mut stream = SseReply::open(&server.url, body, crate::support::ACTIVATED).await;
    assert!(stream.next_event().await.is_some());
    let purge = admin(&["--db", &db, "purge", &key, "--yes"], &[]);
    assert_eq!(purge.status.code(), Some(1), "{purge:?}");
    let said = String::from_utf8_lossy(&purge.stderr);
    assert!(
        said.contains("a stream is being recorded under it (1 events so far)"),
        "{said}"
    );
}

#[test]
fn the_admin_tool_refuses_a_missing_file_and_a_bad_command() {
    let key = new_id();
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("none.db").display().to_string();
    let output = admin(&["--db", &missing, "stats"], &[]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains(&missing));
    assert!(
        !dir.path().join("none.db").exists(),
        "never creates a database"
    );
    let refusals = [
        (
            vec!["show", "not-a-uuid"],
            "\"not-a-uuid\" is not a messageId",
        ),
        (
            vec!["--principal", "", "show", &key],
            "--principal needs a name",
        ),
        (
            vec!["--principal", "bob", "stats"],
            "stats and purge --expired cover every",
        ),
        (
            vec!["--principal", "bob", "purge", "--expired", "--yes"],
            "stats and purge --expired cover every",
        ),
    ];
    for (args, said) in refusals {
        let output = admin(&[&["--db", &missing][..], &args].concat(), &[]);
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(said), "{args:?}: {stderr}");
    }
}

/// What the tool cannot work on as a served file is refused, saying what to give instead:
/// a URI or a second name of the file would hide the server's lock (a purge would not wait
/// for it to forget the key), a file without the cache is no server's, one with an earlier
/// version's tables needs a server of this version first.
#[test]
fn the_admin_tool_refuses_what_no_server_serves_by_that_name() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a2a.db");
    std::fs::write(&file, b"").unwrap();
    let path = file.display().to_string();
    let linked = dir.path().join("other-name.db");
    let uri = format!("file:{path}");
    let earlier_file = dir.path().join("earlier.db");
    let earlier = earlier_file.display().to_string();
    rusqlite::Connection::open(&earlier_file)
        .unwrap()
        .execute_batch("CREATE TABLE idempotency_cache (message_id TEXT PRIMARY KEY)")
        .unwrap();
    let cases = [
        (
            vec!["--db", &uri, "stats"],
            "a URI: give the database file's path",
        ),
        (vec!["--db", &path, "stats"], "holds no idempotency cache"),
        (vec!["--db", &earlier, "stats"], "an earlier version"),
        (
            vec!["--db", &path, "--db", &path, "stats"],
            "--db is given twice",
        ),
        (vec![], "hard links"),
    ];
    for (args, said) in cases {
        let args = match args.is_empty() {
            true => {
                std::fs::hard_link(&file, &linked).unwrap();
                vec!["--db", linked.to_str().unwrap(), "stats"]
            }
            false => args,
        };
        let output = admin(&args, &[]);
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(said), "{args:?}: {stderr}");
    }
    let inline = admin(&[&format!("--db={path}.missing"), "stats"], &[]);
    let stderr = String::from_utf8_lossy(&inline.stderr);
    assert!(stderr.contains(&format!("{path}.missing")), "{stderr}");
}

/// The tool reads the TTL alone from the environment: a malformed setting it does not use (in
/// a shell that shares the servers' environment) does not stop it; a malformed TTL does only
/// where it would count, in a database where no server recorded its own (found by helper-45:
/// the tool refused a database whose servers' TTL it would have used).
#[test]
fn the_admin_tool_minds_only_the_setting_it_uses() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a2a.db").display().to_string();
    let config = idem::IdempotencyConfig::default();
    drop(idem::store::SqliteStore::open(&path, &config).unwrap()); // records its TTL
    let other = admin(
        &["--db", &path, "stats"],
        &[("AIWG_IDEMPOTENCY_DISK_TIMEOUT_MS", "abc")],
    );
    assert!(other.status.success(), "{other:?}");
    let bad_ttl = [("AIWG_IDEMPOTENCY_TTL", "abc")];
    let recorded = admin(&["--db", &path, "stats"], &bad_ttl);
    assert!(recorded.status.success(), "{recorded:?}");
    let stderr = String::from_utf8_lossy(&recorded.stderr);
    assert!(
        stderr.contains("the TTL the servers recorded, 86400 s, counts"),
        "{stderr}"
    );

    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute("DELETE FROM idempotency_settings", [])
        .unwrap();
    let unrecorded = admin(&["--db", &path, "stats"], &bad_ttl);
    assert_eq!(unrecorded.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&unrecorded.stderr);
    assert!(
        stderr.contains("AIWG_IDEMPOTENCY_TTL=\"abc\" is invalid"),
        "{stderr}"
    );
}

/// A PostgreSQL URL's password, in its user part or as a parameter, is not printed when the
/// database cannot be reached (a purge's confirmation prints the URL the same way).
#[test]
fn the_admin_tool_prints_no_postgres_password() {
    let port = crate::support::free_port();
    for url in [
        format!("postgres://idem:s3cret-pw@127.0.0.1:{port}/db"),
        format!("postgresql://idem@127.0.0.1:{port}/db?password=s3cret-pw&connect_timeout=5"),
    ] {
        for args in [
            vec!["--db", &url, "stats"],
            vec!["--db", &url, "purge", "--expired"],
        ] {
            let output = admin(&args, &[]);
            assert_eq!(output.status.code(), Some(2), "{args:?}");
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert!(!stderr.contains("s3cret-pw"), "{stderr}");
            assert!(stderr.contains(&format!("127.0.0.1:{port}/db")), "{stderr}");
            assert!(stderr.contains("***"), "{stderr}");
        }
    }
}

/// A PostgreSQL that accepts the connection and never answers (a stopped process) holds the
/// tool for the URL's `connect_timeout` (10 s without one), not for ever.
#[test]
fn the_admin_tool_gives_up_on_a_database_that_never_answers() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap(); // accepts, says nothing
    let port = silent.local_addr().unwrap().port();
    let url = format!("postgres://idem@127.0.0.1:{port}/db?connect_timeout=1");
    let started = std::time::Instant::now();
    let output = admin(&["--db", &url, "stats"], &[]);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("did not answer within 1 s"), "{stderr}");
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
}

/// The tool's output to a reader that went away, or to a full disk, is no panic: a closed
/// pipe (`| head`) is the reader's choice, a full disk is said; an argument that is not UTF-8
/// is a usage error; an error said to a stderr that cannot take it still exits 2.
#[test]
fn the_admin_tool_writes_to_a_closed_pipe_or_a_full_disk_without_panicking() {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let closed = Command::new(env!("CARGO_BIN_EXE_idem-admin"))
        .arg("--help")
        .stdout(writer)
        .output()
        .unwrap();
    assert_eq!(closed.status.code(), Some(0), "{closed:?}");
    let full = Command::new(env!("CARGO_BIN_EXE_idem-admin"))
        .arg("--help")
        .stdout(std::fs::File::create("/dev/full").unwrap())
        .output()
        .unwrap();
    assert_eq!(full.status.code(), Some(2), "{full:?}");
    assert!(String::from_utf8_lossy(&full.stderr).contains("cannot write the output"));
    use std::os::unix::ffi::OsStrExt;
    let not_utf8 = std::ffi::OsStr::from_bytes(b"/tmp/\xff.db");
    let output = Command::new(env!("CARGO_BIN_EXE_idem-admin"))
        .arg("--db")
        .arg(not_utf8)
        .arg("stats")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert!(String::from_utf8_lossy(&output.stderr).contains("UTF-8"));
    // Its errors to a stderr that cannot take them: the exit status still tells (found by
    // helper-74: 101, a panic).
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let missing = ["--db", "/nonexistent/admin.db", "stats"];
    let closed = Command::new(env!("CARGO_BIN_EXE_idem-admin"))
        .args(missing)
        .stderr(writer)
        .output()
        .unwrap();
    let full = Command::new(env!("CARGO_BIN_EXE_idem-admin"))
        .args(missing)
        .stderr(std::fs::File::create("/dev/full").unwrap())
        .output()
        .unwrap();
    assert_eq!(
        (closed.status.code(), full.status.code()),
        (Some(2), Some(2))
    );
}

/// A table another session holds locked fails the tool within its bound (the URL's
/// `connect_timeout`, 10 s by default), exit 2 with PostgreSQL's words: it waited for as long
/// as the lock was held (helper-114).
#[tokio::test]
async fn on_postgres_a_locked_table_fails_the_admin_tool_in_bounded_time() {
    let what = "the admin tool on PostgreSQL";
    let Some(db) = crate::replicas::Database::shared("idem_admin_locked", what).await else {
        return;
    };
    let server = ServerProcess::start_on(Some(db.url()), &[], &[]);
    let key = new_id();
    post_activated(&server.url, send_body(&key, "x")).await;
    let locker = idem_conformance::postgres::connect(db.url()).await;
    let lock = "BEGIN; LOCK TABLE idempotency_cache IN ACCESS EXCLUSIVE MODE";
    locker.batch_execute(lock).await.unwrap();
    let url = format!("{}?connect_timeout=2", db.url());
    for command in [
        vec!["stats"],
        vec!["show", &key],
        vec!["purge", &key, "--yes"],
    ] {
        let args: Vec<String> = ["--db", &url]
            .into_iter()
            .chain(command)
            .map(str::to_owned)
            .collect();
        let tool = tokio::task::spawn_blocking(move || {
            admin(&args.iter().map(String::as_str).collect::<Vec<_>>(), &[])
        });
        let output = tokio::time::timeout(Duration::from_secs(30), tool).await;
        let output = output
            .expect("still waiting on the lock after 30 s")
            .unwrap();
        let said = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{said}");
        assert!(said.contains("lock timeout"), "{said}");
    }
    locker.batch_execute("ROLLBACK").await.unwrap();
    let show = admin(&["--db", db.url(), "show", &key], &[]);
    assert!(show.status.success(), "{show:?}");
}

#[tokio::test]
async fn on_postgres_a_purge_is_seen_by_the_serving_replica_at_once() {
    let what = "the admin tool on PostgreSQL";
    let Some(db) = crate::replicas::Database::shared("idem_admin", what).await else {
        return;
    };
    let server = ServerProcess::start_on(Some(db.url()), &[], &[]);
    let key = new_id();
    post_activated(&server.url, send_body(&key, "x")).await;
    let stats = stdout(&admin(&["--db", db.url(), "stats"], &[]));
    assert!(stats.contains("entries              1"), "{stats}");
    let show = stdout(&admin(&["--db", db.url(), "show", &key], &[]));
    assert!(show.contains("method        message/send"), "{show}");
    assert_eq!(
        shown_seconds(&show, "expires_at"),
        shown_seconds(&show, "inserted_at") + 86_400,
        "the row's own expiry, a day on:\n{show}"
    );
    let purge = admin(&["--db", db.url(), "purge", &key, "--yes"], &[]);
    assert!(purge.status.success(), "{purge:?}");
    // No replica keeps entries in memory: the key executes again, at once.
    let again = post_activated(&server.url, send_body(&key, "x")).await;
    assert!(!again.replayed(), "{}", again.describe());
    assert_eq!(again.status, 200);
    // A call in flight holds its key in the database: shown as running, and not purged.
    let slow = new_id();
    let body = send_with(1, "message/send", &slow, "x", json!({"delayMs": 3000}));
    let url = server.url.clone();
    let running = tokio::spawn(async move { post_activated(&url, body).await });
    let deadline = Instant::now() + Duration::from_secs(2);
    let show = loop {
        let show = admin(&["--db", db.url(), "show", &slow], &[]);
        if show.status.success() || Instant::now() > deadline {
            break show;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(stdout(&show).contains("running on a replica"), "{show:?}");
    let purge = admin(&["--db", db.url(), "purge", &slow, "--yes"], &[]);
    assert_eq!(purge.status.code(), Some(1), "{purge:?}");
    let refused = String::from_utf8_lossy(&purge.stderr);
    assert!(refused.contains("still running"), "{refused}");
    let ran = running.await.unwrap();
    assert_eq!(ran.status, 200, "{}", ran.describe());
    let shown = stdout(&admin(&["--db", db.url(), "show", &slow], &[]));
    assert!(shown.contains("live, HTTP 200"), "{shown}");
}
