//! The example A2A server (`examples/a2a_server`) as a real process: its command line, its stop
//! on SIGTERM, the agent behind the extension (tasks, outbox, errors, both A2A versions), its
//! AgentCard and its `--idempotency` modes. The conformance scenarios (`conformance.rs`), the
//! `.http` files and the SDK interop are not repeated here.
//!
//! Runs the built example: `cargo build --examples` before `cargo test --test integration`.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::{
    exited_within_30_s, new_id, post, post_activated, send, send_with, until_completed, Reply,
    SseReply, URI,
};
use idem_conformance::server_process::{example_binary, ServerProcess};

const TIMEOUT: Duration = Duration::from_secs(30);

/// The server must refuse to start: exit status 2, nothing on stdout. Returns its stderr.
/// `--listen` and `--db` are added where `args` has none (a flag given twice is refused).
fn refused(args: &[&str], env: &[(&str, &str)]) -> String {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let mut server = Command::new(example_binary("a2a_server"));
    if !args.contains(&"--listen") {
        server.args(["--listen", "127.0.0.1:0"]);
    }
    if !args.iter().any(|arg| arg.starts_with("--db")) {
        server.arg("--db").arg(dir.path().join("a2a.db"));
    }
    let output = server
        .args(args)
        .envs(env.iter().copied())
        .current_dir(dir.path())
        .output()
        .expect("run the example server");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(output.stdout.is_empty(), "{stderr}");
    stderr
}

/// A server that cannot start says why without the password of its PostgreSQL URL, and one
/// that cannot listen leaves no database file behind (found by helper-45: the password was in
/// every start's log line and error, and a busy port left the file and its lock).
#[test]
fn a_refused_start_shows_no_password_and_leaves_no_file() {
    let start = |args: &[&str]| {
        let output = Command::new(example_binary("a2a_server"))
            .args(args)
            .output()
            .expect("run the example server");
        assert_eq!(output.status.code(), Some(2), "{output:?}");
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy = busy.local_addr().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a2a.db");
    let stderr = start(&["--listen", &busy, "--db", file.to_str().unwrap()]);
    assert!(stderr.contains("cannot listen on"), "{stderr}");
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "{stderr}"
    );

    let closed = crate::support::free_port();
    for url in [
        format!("postgresql://idem:s3cret-pw@127.0.0.1:{closed}/db"),
        format!("postgres://idem@127.0.0.1:{closed}/db?password=s3cret-pw"),
    ] {
        let stderr = start(&["--listen", "127.0.0.1:0", "--db", &url]);
        assert!(stderr.contains("cannot open database"), "{stderr}");
        assert!(!stderr.contains("s3cret-pw"), "{stderr}");
        assert!(stderr.contains("***"), "{stderr}");
    }
}

/// `--help` names every variable the configuration reads (it once named 3 of the 5).
#[test]
fn help_names_every_configuration_variable() {
    let output = Command::new(example_binary("a2a_server"))
        .arg("--help")
        .output()
        .expect("run the example server");
    assert!(output.status.success());
    let help = String::from_utf8_lossy(&output.stdout);
    use idem::config::*;
    for name in [
        TTL_ENV,
        MAX_ENTRIES_ENV,
        CLAIM_LEASE_ENV,
        SWEEP_INTERVAL_ENV,
        IN_FLIGHT_WAIT_ENV,
        MEMORY_TIER_BYTES_ENV,
    ] {
        assert!(help.contains(name), "{name} in:\n{help}");
    }
}

#[test]
fn an_unknown_flag_exits_2_naming_it() {
    let stderr = refused(&["--bogus"], &[]);
    assert!(stderr.contains(r#"unknown argument "--bogus""#), "{stderr}");
}

#[test]
fn a_bad_idempotency_mode_exits_2_naming_it() {
    let stderr = refused(&["--idempotency", "sometimes"], &[]);
    assert!(
        stderr.contains(r#"--idempotency "sometimes" is not one of"#),
        "{stderr}"
    );
}

#[test]
fn a_principal_header_that_is_no_header_name_exits_2_naming_it() {
    let stderr = refused(&["--principal-header", "x principal"], &[]);
    assert!(
        stderr.contains(r#"--principal-header "x principal" is not an HTTP header name"#),
        "{stderr}"
    );
}

#[test]
fn a_max_in_flight_of_zero_exits_2_naming_it() {
    let stderr = refused(&["--max-in-flight", "0"], &[]);
    assert!(
        stderr.contains(r#"--max-in-flight "0" is not a positive number"#),
        "{stderr}"
    );
}

/// Waits past a day, or none at all for a body, are refused at start with the range: at
/// `u64::MAX` the deadline they set overflowed the clock, panicking the connection (or, for the
/// grace, the stop) instead.
#[test]
fn waits_out_of_range_exit_2_naming_the_range() {
    for (flag, value, least) in [
        ("--body-timeout", "18446744073709551615", 1),
        ("--body-timeout", "0", 1),
        ("--shutdown-grace", "86401", 0),
    ] {
        let stderr = refused(&[flag, value], &[]);
        let said =
            format!("{flag} \"{value}\" is not a whole number of seconds from {least} to 86400");
        assert!(stderr.contains(&said), "{stderr}");
    }
}

#[test]
fn a_malformed_ttl_exits_2_naming_the_variable() {
    let stderr = refused(&[], &[("AIWG_IDEMPOTENCY_TTL", "abc")]);
    assert!(stderr.contains("AIWG_IDEMPOTENCY_TTL"), "{stderr}");
}

#[test]
fn an_unusable_db_exits_2_naming_it() {
    let stderr = refused(&["--db", "/nonexistent/dir/x.db"], &[]);
    assert!(stderr.contains("/nonexistent/dir/x.db"), "{stderr}");
}

/// A file whose tables of the example's or the store's names are another schema's: exit 2,
/// one line with SQLite's reason and no SQL (it printed 40 lines of the schema: helper-63).
#[test]
fn a_file_of_another_schema_exits_2_in_one_line() {
    for foreign in [
        "CREATE TABLE tasks (x INT)",
        "CREATE TABLE idempotency_cache (message_id TEXT PRIMARY KEY, foo INT)",
    ] {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("other.db");
        let conn = rusqlite::Connection::open(&file).unwrap();
        conn.execute_batch(foreign).unwrap();
        drop(conn);
        let stderr = refused(&["--db", file.to_str().unwrap()], &[]);
        assert!(stderr.contains("no such column"), "{stderr}");
        assert!(stderr.contains("other.db"), "{stderr}");
        assert!(!stderr.contains("CREATE"), "{stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    }
}

#[tokio::test]
async fn a_second_server_on_the_same_database_is_refused_naming_the_file_and_the_first() {
    let server = ServerProcess::start(&[]);
    let output = Command::new(example_binary("a2a_server"))
        .args(["--listen", "127.0.0.1:0", "--db"])
        .arg(server.db())
        .output()
        .expect("run a second example server");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(output.stdout.is_empty(), "{stderr}");
    assert!(
        stderr.contains(&server.db().display().to_string()),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("already served by process {}", server.pid())),
        "{stderr}"
    );
    // The first one serves on, undisturbed.
    let message = json!({"kind": "message", "messageId": new_id(), "role": "user",
                         "parts": [{"kind": "text", "text": "still here"}]});
    let reply = post_activated(
        &server.url,
        rpc("message/send", json!({"message": message})),
    )
    .await;
    assert_eq!(reply.json()["result"]["status"]["state"], "working");
}

/// Arguments the server cannot take as they are: each refused by name with exit 2 (a name
/// not in UTF-8 panicked; a repeated flag silently won; `--db --help` served a file named
/// `--help`; a `RUST_LOG` that does not parse was read as `info`: helper-121).
#[test]
fn arguments_it_cannot_take_as_they_are_are_refused_by_name() {
    use std::os::unix::ffi::OsStrExt;

    let dir = tempfile::tempdir().unwrap();
    let not_utf8 = std::ffi::OsStr::from_bytes(b"a\xffb.db");
    let output = Command::new(example_binary("a2a_server"))
        .args(["--listen", "127.0.0.1:0", "--db"])
        .arg(not_utf8)
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("arguments must be UTF-8 text"), "{stderr}");
    let twice = refused(&["--db", "first.db", "--db=second.db"], &[]);
    assert!(twice.contains("--db is given twice"), "{twice}");
    let flag = refused(&["--db", "--help"], &[]);
    assert!(
        flag.contains("--db needs a value, not the flag --help"),
        "{flag}"
    );
    let log = refused(&[], &[("RUST_LOG", "a2a_server=loud")]);
    assert!(log.starts_with("a2a_server: RUST_LOG:"), "{log}");
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "no file made"
    );
}

/// The served file named as a URI (`file:NAME`) from its folder: SQLite opened the file while
/// the lock was taken at the literal name, so both servers served it and each ran the other's
/// retries again (helper-121). Refused, as `:memory:` is, and nothing made at either name.
#[tokio::test]
async fn the_served_file_named_as_a_uri_or_memory_is_refused() {
    let server = ServerProcess::start(&[]);
    let dir = server.db().parent().unwrap().to_owned();
    let name = server
        .db()
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned();
    let before = files_in(&dir);
    for (db, says) in [
        (format!("file:{name}"), "a URI"),
        (":memory:".into(), "not a file"),
    ] {
        let other = Command::new(example_binary("a2a_server"))
            .args(["--listen", "127.0.0.1:0", "--db", &db])
            .current_dir(&dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let exited = exited_within_30_s(other, &format!("it served {db} beside {name}"));
        let stderr = String::from_utf8_lossy(&exited.stderr);
        assert_eq!(exited.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(says), "{stderr}");
    }
    assert_eq!(files_in(&dir), before);
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn listen_on_port_0_prints_one_line_with_the_bound_address() {
    let mut server = ServerProcess::start(&[]);
    let url = server.url.clone();
    let port: u16 = url
        .strip_prefix("http://127.0.0.1:")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("{url}"));
    assert_ne!(port, 0);
    assert_eq!(card(&url).await["url"], format!("{url}/"));
    let status = server.terminate();
    assert_eq!((status.code(), server.more_stdout()), (Some(0), vec![]));
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_lets_the_call_in_flight_finish_and_be_stored() {
    let mut server = ServerProcess::start(&[]);
    let (url, db) = (server.url.clone(), server.db().to_owned());
    let body = send_with(
        1,
        "message/send",
        &new_id(),
        "slow",
        json!({"delayMs": 1500}),
    );
    let call = tokio::spawn({
        let (url, body) = (url.clone(), body.clone());
        async move { post_activated(&url, body).await }
    });
    // The task is stored before the delay: once it is, the call is in flight.
    let deadline = Instant::now() + TIMEOUT;
    while count(&db, "SELECT COUNT(*) FROM tasks", &[]) == 0 {
        assert!(Instant::now() < deadline, "{}", server.stderr());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Wait for the exit off the runtime's threads: the call in flight needs them meanwhile.
    let stopped = tokio::task::block_in_place(|| server.terminate());
    let first = call.await.expect("the call");
    assert_eq!(
        first.status,
        200,
        "{}",
        String::from_utf8_lossy(&first.body)
    );
    assert_eq!(first.json()["result"]["status"]["state"], "working");
    assert_eq!(stopped.code(), Some(0), "{}", server.stderr());

    let url = server.restart();
    let replay = post_activated(&url, body).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, first.body);
}

/// A client that never finishes its request (headers of a body that never comes, or half of
/// its headers) holds its connection open; SIGTERM waits for it no longer than the shutdown
/// grace, then exits, and what was stored before is still answered. Before, the stop waited
/// for such a connection for ever.
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_does_not_wait_past_its_grace_for_a_client_that_never_finishes() {
    use tokio::io::AsyncWriteExt;
    let mut server = ServerProcess::start_with(&["--shutdown-grace", "1"], &[]);
    let body = send_with(1, "message/send", &new_id(), "before", json!({}));
    let first = post_activated(&server.url, body.clone()).await;
    assert_eq!(first.status, 200);
    let address = server.url.trim_start_matches("http://").to_owned();
    let mut stalled = Vec::new();
    for request in [
        "POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n",
        "POST / HTTP/1.1\r\nHost: x\r\nContent-Ty",
    ] {
        let mut socket = tokio::net::TcpStream::connect(&address).await.unwrap();
        socket.write_all(request.as_bytes()).await.unwrap();
        stalled.push(socket);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let stopped = tokio::task::block_in_place(|| server.terminate());
    assert_eq!(stopped.code(), Some(0), "{}", server.stderr());
    assert!(
        server.stderr().contains("shutdown grace"),
        "{}",
        server.stderr()
    );

    let url = server.restart();
    let replay = post_activated(&url, body).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, first.body);
}

/// A body that stops coming fails after `--body-timeout` with a 408 that says so, and its
/// connection closes; one
/// that comes slowly, but within it at every step, is served. Before, a client that announced
/// a body and sent none held its connection (and a place among `--max-in-flight`) for ever.
#[tokio::test]
async fn a_body_that_stops_coming_fails_and_a_slow_one_is_served() {
    use tokio::io::AsyncWriteExt;
    let server = ServerProcess::start_with(&["--body-timeout", "1"], &[]);
    let address = server.url.trim_start_matches("http://").to_owned();
    let body = send_with(1, "message/send", &new_id(), "slow", json!({}));
    let head = format!(
        "POST / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\
         Content-Type: application/json\r\nA2A-Extensions: {}\r\nContent-Length: {}\r\n\r\n",
        URI,
        body.len()
    );
    // Sends the head and half the body, then the rest after `pause` (never, if `None`).
    let exchange = |pause: Option<Duration>| {
        let (address, head, body) = (address.clone(), head.clone(), body.clone());
        async move {
            let mut socket = tokio::net::TcpStream::connect(&address).await.unwrap();
            socket.write_all(head.as_bytes()).await.unwrap();
            let (first, rest) = body.as_bytes().split_at(body.len() / 2);
            socket.write_all(first).await.unwrap();
            if let Some(pause) = pause {
                tokio::time::sleep(pause).await;
                socket.write_all(rest).await.unwrap();
            }
            answer_on(&mut socket).await
        }
    };
    // The second half 0.4 s after the first: within the timeout.
    let served = exchange(Some(Duration::from_millis(400))).await;
    assert!(served.starts_with("HTTP/1.1 200"), "{served}");
    // The second half never: the request fails and the connection closes.
    let stalled = exchange(None).await;
    assert!(stalled.starts_with("HTTP/1.1 408"), "{stalled}");
    assert!(stalled.contains("sent nothing for 1 s"), "{stalled}");
    let echo = format!("a2a-extensions: {URI}");
    assert!(stalled.to_ascii_lowercase().contains(&echo), "{stalled}");
}

/// A body in a content coding is refused with 415 and the one coding read (`identity`),
/// before anything runs; `identity` itself is no coding. Before, a gzip body was parsed as
/// sent, and answered -32700 Parse error.
#[tokio::test]
async fn a_body_in_a_content_coding_gets_415_and_identity_is_read() {
    let server = ServerProcess::start(&[]);
    let body = send_with(1, "message/send", &new_id(), "coded", json!({}));
    let coded = [("A2A-Extensions", URI), ("Content-Encoding", "gzip")];
    let refused = post(&server.url, body.clone(), &coded).await;
    assert_eq!(refused.status, 415, "{}", refused.describe());
    assert_eq!(refused.headers["accept-encoding"], "identity");
    assert_eq!(
        refused.headers["a2a-extensions"], URI,
        "the activation is echoed"
    );
    assert_eq!(refused.json()["error"]["data"]["content_encoding"], "gzip");
    assert_eq!(count(server.db(), "SELECT COUNT(*) FROM tasks", &[]), 0);
    let identity = [("A2A-Extensions", URI), ("Content-Encoding", "identity")];
    let served = post(&server.url, body, &identity).await;
    assert_eq!(served.status, 200, "{}", served.describe());
}

/// The card's and the metrics' paths answer GET and HEAD, and POST as JSON-RPC on every path:
/// any other method there gets a JSON-RPC 405 that names them (before, jsonrpsee's `Allow:
/// POST` left GET out), echoing the activation.
#[tokio::test]
async fn another_method_on_a_get_path_gets_405_naming_get_head_and_post() {
    let server = ServerProcess::start(&[]);
    let http = reqwest::Client::new();
    let base = server.url.trim_end_matches('/');
    for path in ["/.well-known/agent-card.json", "/metrics"] {
        let url = format!("{base}{path}");
        let got = http.get(&url).send().await.unwrap();
        assert_eq!(got.status(), 200, "GET {path}");
        let content_type = got.headers()["content-type"].clone();
        let head = http.head(&url).send().await.unwrap();
        assert_eq!(head.status(), 200, "HEAD {path}");
        assert_eq!(head.headers()["content-type"], content_type, "HEAD {path}");
        assert!(
            head.bytes().await.unwrap().is_empty(),
            "HEAD {path}: no body"
        );
        for method in [reqwest::Method::PUT, reqwest::Method::DELETE] {
            let refused = http
                .request(method.clone(), &url)
                .header("A2A-Extensions", URI);
            let refused = refused.send().await.unwrap();
            assert_eq!(refused.status(), 405, "{method} {path}");
            let headers = refused.headers().clone();
            assert_eq!(headers["allow"], "GET, HEAD, POST", "{method} {path}");
            assert_eq!(headers["a2a-extensions"], URI, "{method} {path}");
            let error: Value = refused.json().await.unwrap();
            assert_eq!(error["error"]["code"], -32600, "{error}");
            assert_eq!(error["error"]["data"]["method"], method.as_str(), "{error}");
        }
        // POST there is JSON-RPC, as on every path.
        let body = send_with(1, "message/send", &new_id(), "posted", json!({}));
        let posted = post(&url, body, &[("A2A-Extensions", URI)]).await;
        assert_eq!(posted.status, 200, "{}", posted.describe());
        assert!(
            posted.json()["result"]["id"].is_string(),
            "{}",
            posted.describe()
        );
    }
}

/// With `--principal-header`, the header names the caller and keys are scoped by it: one
/// messageId from two callers is two keys (two tasks), each replayed to its caller alone; a
/// request without the header is in the global keys; the admin tool finds a caller's key.
#[tokio::test]
async fn a_principal_header_scopes_keys_by_caller() {
    let server = ServerProcess::start_with(&["--principal-header", "X-Principal"], &[]);
    let key = new_id();
    let body = send_with(1, "message/send", &key, "scoped", json!({}));
    let by = |who: &'static str| [("A2A-Extensions", URI), ("X-Principal", who)];
    let alice = post(&server.url, body.clone(), &by("alice")).await;
    let bob = post(&server.url, body.clone(), &by("bob")).await;
    assert!(!alice.replayed() && !bob.replayed(), "{}", bob.describe());
    let task = |reply: &Reply| reply.json()["result"]["id"].as_str().unwrap().to_owned();
    assert_ne!(task(&alice), task(&bob), "one task per caller");
    let again = post(&server.url, body.clone(), &by("alice")).await;
    assert!(again.replayed(), "{}", again.describe());
    assert_eq!(again.body, alice.body);
    // A proxy that appends its header after the client's: the last one names the caller.
    let appended = [
        ("A2A-Extensions", URI),
        ("X-Principal", "bob"),
        ("X-Principal", "alice"),
    ];
    let as_alice = post(&server.url, body.clone(), &appended).await;
    assert!(as_alice.replayed(), "{}", as_alice.describe());
    assert_eq!(as_alice.body, alice.body);
    let global = post_activated(&server.url, body).await;
    assert!(!global.replayed(), "no header: the global keys");
    assert_eq!(tasks_naming(server.db(), &key), 3);

    let db = server.db().display().to_string();
    let show = ["--db", &db, "show", &key, "--body", "--principal", "alice"];
    let shown = crate::operations::admin(&show, &[]);
    assert!(shown.status.success(), "{shown:?}");
    let shown = crate::operations::stdout(&shown);
    assert!(shown.contains(&task(&alice)), "{shown}");
}

/// A principal whose name is not ASCII is a caller of its own: `josé` and `zoë` in UTF-8, and
/// `jos\xe9` in Latin-1, each get their own task, none replays another's entry or the global
/// keys' (they all fell into the global keys, where each replayed the first one's: a review).
#[tokio::test]
async fn a_principal_that_is_not_ascii_is_a_caller_of_its_own() {
    let server = ServerProcess::start_with(&["--principal-header", "X-Principal"], &[]);
    let key = new_id();
    let body = send_with(1, "message/send", &key, "scoped", json!({}));
    let as_caller = |principal: Option<&[u8]>| {
        let mut request = format!(
            "POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
             Connection: close\r\nA2A-Extensions: {URI}\r\nContent-Length: {}\r\n",
            body.len()
        )
        .into_bytes();
        if let Some(name) = principal {
            request.extend_from_slice(b"X-Principal: ");
            request.extend_from_slice(name);
            request.extend_from_slice(b"\r\n");
        }
        request.extend_from_slice(b"\r\n");
        request.extend_from_slice(body.as_bytes());
        request
    };
    let callers: [Option<&[u8]>; 4] = [
        Some("josé".as_bytes()),
        Some("zoë".as_bytes()),
        Some(b"jos\xe9"),
        None,
    ];
    let mut first = Vec::new();
    for caller in callers {
        let answer = exchange(&server.url, as_caller(caller)).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        let replayed = answer
            .to_ascii_lowercase()
            .contains("idempotent-replayed: true");
        assert!(
            !replayed,
            "{caller:?} replayed another caller's entry: {answer}"
        );
        first.push(answer.split_once("\r\n\r\n").expect("a body").1.to_owned());
    }
    assert_eq!(tasks_naming(server.db(), &key), 4, "one task per caller");
    for (caller, body) in callers.into_iter().zip(first.iter()) {
        let answer = exchange(&server.url, as_caller(caller)).await;
        let replayed = answer
            .to_ascii_lowercase()
            .contains("idempotent-replayed: true");
        assert!(replayed, "{caller:?}: {answer}");
        assert_eq!(answer.split_once("\r\n\r\n").expect("a body").1, body);
    }
    // The admin tool finds the Latin-1 caller's key, named as the README says (the example
    // named it with a NUL, which no argument can carry: helper-94).
    let db = server.db().display().to_string();
    let show = [
        "--db",
        &db,
        "show",
        &key,
        "--body",
        "--principal",
        "\u{7f}6a6f73e9",
    ];
    let shown = crate::operations::admin(&show, &[]);
    assert!(shown.status.success(), "{shown:?}");
    let latin1: Value = serde_json::from_str(&first[2]).unwrap();
    let task = latin1["result"]["id"].as_str().unwrap();
    assert!(
        crate::operations::stdout(&shown).contains(task),
        "{shown:?}"
    );
}

/// A body that is not UTF-8 is not JSON (RFC 8259 §8.1), wherever the bytes are: -32700 and
/// HTTP 400, nothing run. jsonrpsee skips the members it does not read unchecked, so such a
/// call ran (a review: a new task). The same call in UTF-8 then runs.
#[tokio::test]
async fn a_body_that_is_not_utf8_is_a_parse_error_and_never_runs() {
    let server = ServerProcess::start(&[]);
    for padding in [0, 70 * 1024] {
        let key = new_id();
        let valid = send_with(1, "message/send", &key, &"t".repeat(padding), json!({}));
        let with_member = |value: &[u8]| {
            let mut body = br#"{"zz":""#.to_vec();
            body.extend_from_slice(value);
            body.extend_from_slice(b"\",");
            body.extend_from_slice(&valid.as_bytes()[1..]);
            body
        };
        let refused = post_activated(&server.url, with_member(b"\xff\xfe")).await;
        assert_eq!(refused.status, 400, "{}", refused.describe());
        let error = refused.json();
        assert_eq!(error["id"], Value::Null, "{error}");
        assert_eq!(error["error"]["code"], -32700, "{error}");
        let reason = error["error"]["data"]["reason"].as_str().unwrap();
        assert!(reason.contains("at byte 7"), "{reason}");
        assert_eq!(tasks_naming(server.db(), &key), 0, "never run");
        let served = post_activated(&server.url, with_member("é".as_bytes())).await;
        assert_eq!(served.status, 200, "{}", served.describe());
        assert_eq!(
            served.json()["result"]["kind"],
            "task",
            "{}",
            served.describe()
        );
        assert_eq!(tasks_naming(server.db(), &key), 1, "run once");
    }
}

/// A chunked body whose framing breaks is the client's error: 400 with a JSON-RPC -32600 that
/// says so (it was a 500 Internal error), and nothing runs.
#[tokio::test]
async fn a_body_whose_chunks_break_gets_400_not_500() {
    let server = ServerProcess::start(&[]);
    let key = new_id();
    let body = send_with(1, "message/send", &key, "chunked", json!({}));
    let head = format!(
        "POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         A2A-Extensions: {URI}\r\nTransfer-Encoding: chunked\r\n\r\n"
    );
    let chunked = format!("{head}{:x}\r\n{body}\r\nzz\r\n", body.len());
    let answer = exchange(&server.url, &chunked).await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    let (_, json) = answer.split_once("\r\n\r\n").expect("a body");
    let error: Value = serde_json::from_str(json).expect("a JSON-RPC error");
    assert_eq!(error["error"]["code"], -32600, "{error}");
    let reason = error["error"]["data"]["reason"].as_str().unwrap();
    assert!(reason.contains("could not be read"), "{reason}");
    assert_eq!(tasks_naming(server.db(), &key), 0, "never run");
}

/// Sends `request` as it is to the server at `url`; what it answers until it closes.
async fn exchange(url: &str, request: impl AsRef<[u8]>) -> String {
    use tokio::io::AsyncWriteExt;
    let address = url.trim_start_matches("http://").trim_end_matches('/');
    let mut socket = tokio::net::TcpStream::connect(address).await.unwrap();
    socket.write_all(request.as_ref()).await.unwrap();
    answer_on(&mut socket).await
}

/// The head of the answer the server sends on `socket`, which must come within 5 s.
async fn answer_head(socket: &mut tokio::net::TcpStream) -> String {
    use tokio::io::AsyncReadExt;
    let mut answer = Vec::new();
    let head = async {
        let mut chunk = [0u8; 1024];
        while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
            match socket.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => answer.extend_from_slice(&chunk[..n]),
            }
        }
    };
    let answered = tokio::time::timeout(Duration::from_secs(5), head).await;
    assert!(answered.is_ok(), "no answer within 5 s: {answer:?}");
    String::from_utf8_lossy(&answer).into_owned()
}

/// What the server sends on `socket` until it closes it: within 20 s, never a hang.
async fn answer_on(socket: &mut tokio::net::TcpStream) -> String {
    use tokio::io::AsyncReadExt;
    let mut answer = Vec::new();
    let read = socket.read_to_end(&mut answer);
    tokio::time::timeout(Duration::from_secs(20), read)
        .await
        .expect("an answer or a close, not a hang")
        .ok();
    String::from_utf8_lossy(&answer).into_owned()
}

/// How many tasks name `key` (their message's): the executions of its call.
fn tasks_naming(db: &Path, key: &str) -> i64 {
    let sql = "SELECT COUNT(*) FROM tasks WHERE task_json LIKE ?1";
    count(db, sql, &[&format!("%{key}%")])
}

/// `SELECT COUNT(*) …` on the server's database; 0 while the table does not exist yet.
fn count(db: &Path, sql: &str, params: &[&str]) -> i64 {
    let conn = rusqlite::Connection::open(db).expect("open the database");
    conn.query_row(sql, rusqlite::params_from_iter(params), |row| row.get(0))
        .unwrap_or(0)
}

fn rpc(method: &str, params: Value) -> String {
    json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": params}).to_string()
}

/// A call of a method outside the extension (no activation needed).
async fn call(url: &str, method: &str, params: Value) -> Reply {
    post(url, rpc(method, params), &[]).await
}

#[tokio::test]
async fn a_send_assigns_a_working_task_that_completes_with_an_echo() {
    let server = ServerProcess::start(&[]);
    let message_id = new_id();
    let message = json!({"kind": "message", "messageId": message_id, "role": "user",
        "parts": [{"kind": "text", "text": "north"}, {"kind": "text", "text": "ridge"}]});
    let params = json!({"message": message, "metadata": {"durationMs": 300}});
    let task = post_activated(&server.url, rpc("message/send", params)).await;
    let task = task.json()["result"].clone();
    assert_eq!(
        (&task["kind"], &task["status"]["state"]),
        (&json!("task"), &json!("working"))
    );
    assert_eq!(task["history"][0]["messageId"], message_id);
    let id = task["id"].as_str().unwrap();
    let outbox = "SELECT COUNT(*) FROM outbox WHERE task_id = ?1 AND event_type = ?2";
    assert_eq!(count(server.db(), outbox, &[id, "mission.assigned"]), 1);

    tokio::time::sleep(Duration::from_millis(300)).await;
    let task = until_completed(&server.url, id, Duration::from_secs(10)).await;
    let texts: Vec<_> = task["artifacts"][0]["parts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["text"].clone())
        .collect();
    assert_eq!(texts, [json!("north"), json!("ridge")]);
}

/// `params.metadata` is read for `durationMs` and `delayMs` alone: a client's other members,
/// however nested, are skipped; a protobuf-style `200.0` is 200; anything else is -32602 with
/// the member it is about, and nothing runs.
#[tokio::test]
async fn send_metadata_is_read_for_its_orders_and_checked() {
    let server = ServerProcess::start(&[]);
    let send = |metadata: Value| {
        let message = json!({"kind": "message", "messageId": new_id(), "role": "user",
            "parts": [{"kind": "text", "text": "orders"}]});
        rpc(
            "message/send",
            json!({"message": message, "metadata": metadata}),
        )
    };
    let client = json!({"trace": {"id": "t-1", "spans": [1, 2.5, {"deep": [null, true]}]},
        "tenant": "acme", "durationMs": 200.0});
    let task = post_activated(&server.url, send(client)).await.json();
    let id = task["result"]["id"].as_str().unwrap().to_owned();
    until_completed(&server.url, &id, Duration::from_secs(10)).await;
    for (metadata, about) in [
        (json!("fast"), "params.metadata to be an object"),
        (json!([200, 0]), "params.metadata to be an object"),
        (
            json!({"durationMs": 1.5}),
            "params.metadata.durationMs must be a whole number",
        ),
        (
            json!({"delayMs": -1}),
            "params.metadata.delayMs must be a whole number",
        ),
        (json!({"durationMs": 60_001}), "from 0 to 60000"),
    ] {
        let reply = post_activated(&server.url, send(metadata.clone()))
            .await
            .json();
        assert_eq!(reply["error"]["code"], -32602, "{metadata}: {reply}");
        assert!(
            reply["error"].to_string().contains(about),
            "{metadata}: {reply}"
        );
    }
    let tasks = count(server.db(), "SELECT COUNT(*) FROM tasks", &[]);
    assert_eq!(tasks, 1, "a refused send creates no task");
}

#[tokio::test]
async fn tasks_get_history_length_keeps_the_most_recent_messages() {
    let server = ServerProcess::start(&[]);
    let id = &working_task(&server.url, "first").await;
    let reply = post_activated(&server.url, continuation(id, "second")).await;
    assert_eq!(reply.status, 200);
    let history = |n| history_texts(&server.url, id, n);
    assert_eq!(history(None).await, ["first", "second"]);
    assert_eq!(history(Some(1)).await, ["second"]);
    assert_eq!(history(Some(0)).await, Vec::<String>::new());
}

/// A task that works for a minute, assigned by a message of `text`: its id.
async fn working_task(url: &str, text: &str) -> String {
    let first = send_with(
        1,
        "message/send",
        &new_id(),
        text,
        json!({"durationMs": 60000}),
    );
    let task = post_activated(url, first).await.json()["result"].clone();
    task["id"].as_str().expect("a task id").to_owned()
}

/// A `message/send` that continues task `id` with `text`.
fn continuation(id: &str, text: &str) -> String {
    let message = json!({"kind": "message", "messageId": new_id(), "role": "user",
        "taskId": id, "parts": [{"kind": "text", "text": text}]});
    rpc("message/send", json!({"message": message}))
}

/// A stream's first Task honours `configuration.historyLength` as a send's does (A2A: the
/// server MUST NOT return more messages than asked); both streaming methods ignored it
/// (found by helper-87).
#[tokio::test]
async fn a_stream_s_first_task_honours_history_length() {
    let server = ServerProcess::start(&[]);
    for (method, version) in [("message/stream", "0.3"), ("SendStreamingMessage", "1.0")] {
        let message = json!({"messageId": new_id(), "role": "ROLE_USER", "parts": [{"text": "h"}]});
        let params = json!({"message": message, "configuration": {"historyLength": 0},
                            "metadata": {"durationMs": 100}});
        let headers = [("A2A-Extensions", URI), ("A2A-Version", version)];
        let mut stream = SseReply::open(&server.url, rpc(method, params), &headers).await;
        let first = stream.next_event().await.expect("a first event");
        let task = match version {
            "0.3" => &first["result"],
            _ => &first["result"]["task"],
        };
        assert_eq!(task["history"], json!([]), "{method}: {first}");
        stream.rest().await;
    }
}

/// The texts of task `id`'s history, as `tasks/get` with `historyLength` answers it.
async fn history_texts(url: &str, id: &str, history_length: Option<u32>) -> Vec<String> {
    let params = json!({"id": id, "historyLength": history_length});
    let task = call(url, "tasks/get", params).await.json()["result"].clone();
    let texts = task["history"].as_array().expect("a history").iter();
    texts
        .map(|m| m["parts"][0]["text"].as_str().unwrap().to_owned())
        .collect()
}

/// Messages that continue one task at once take turns: each reads the task as the one before
/// left it, so none fails and the history holds them all. Before, each read the same row and
/// all but the first to commit failed (13 of 16 in a review), uncached, to be sent again.
#[tokio::test]
async fn concurrent_continuations_of_one_task_all_succeed() {
    let server = ServerProcess::start(&[]);
    let id = working_task(&server.url, "first").await;
    let continuations = (0..16).map(|n| {
        let (url, body) = (server.url.clone(), continuation(&id, &format!("next {n}")));
        tokio::spawn(async move { post_activated(&url, body).await })
    });
    for reply in futures::future::join_all(continuations).await {
        let reply = reply.unwrap();
        assert_eq!(reply.status, 200, "{}", reply.describe());
        assert_eq!(reply.json()["result"]["id"], id, "{}", reply.describe());
    }
    let mut texts = history_texts(&server.url, &id, None).await;
    texts.sort();
    let mut expected: Vec<String> = (0..16).map(|n| format!("next {n}")).collect();
    expected.push("first".into());
    expected.sort();
    assert_eq!(texts, expected, "every message in the history, once");
}

#[tokio::test]
async fn a_failed_mission_is_an_error_creates_no_task_and_is_replayed() {
    let server = ServerProcess::start(&[]);
    let body = send_with(1, "message/send", &new_id(), "fail", json!({}));
    let first = post_activated(&server.url, body.clone()).await;
    assert_eq!(first.error_code(), -32000);
    assert!(!first.replayed());
    assert_eq!(count(server.db(), "SELECT COUNT(*) FROM tasks", &[]), 0);
    let retry = post_activated(&server.url, body).await;
    assert!(retry.replayed());
    assert_eq!(retry.body, first.body);
}

#[tokio::test]
async fn unknown_task_ids_are_task_not_found() {
    let server = ServerProcess::start(&[]);
    let unknown = new_id();
    let message = json!({"kind": "message", "messageId": new_id(), "role": "user",
        "taskId": unknown, "parts": [{"kind": "text", "text": "more"}]});
    let body = rpc("message/send", json!({"message": message}));
    assert_eq!(post_activated(&server.url, body).await.error_code(), -32001);
    for method in ["tasks/get", "tasks/cancel"] {
        let reply = call(&server.url, method, json!({"id": unknown})).await;
        assert_eq!(reply.error_code(), -32001, "{method}");
    }
}

#[tokio::test]
async fn a_working_task_is_canceled_once() {
    let server = ServerProcess::start(&[]);
    let body = send_with(
        1,
        "message/send",
        &new_id(),
        "long",
        json!({"durationMs": 60000}),
    );
    let task = post_activated(&server.url, body).await.json()["result"].clone();
    let id = json!({"id": task["id"]});
    let canceled = call(&server.url, "tasks/cancel", id.clone()).await.json();
    assert_eq!(
        canceled["result"]["status"]["state"], "canceled",
        "{canceled}"
    );
    let again = call(&server.url, "tasks/cancel", id).await;
    assert_eq!(again.error_code(), -32002);
}

/// A stream's retry whose params hash as the stream's but do not decode (`1.0` where the
/// method takes the integer `1`) is the same request: it gets the stream, as a replay, and
/// one that comes while the stream runs follows it (found by helper-48: it was answered as a
/// corrupt store).
#[tokio::test]
async fn a_stream_s_retry_spelled_so_that_it_does_not_decode_gets_the_stream() {
    let server = ServerProcess::start(&[]);
    let mid = new_id();
    let body = |history: &str| {
        let request = crate::support::stream_request(1, &mid, "go", json!({"durationMs": 600}));
        let mut request: Value = serde_json::from_str(&request).unwrap();
        let history: Value = serde_json::from_str(history).unwrap();
        request["params"]["configuration"] = json!({"historyLength": history});
        request.to_string()
    };
    let activated = [("A2A-Extensions", URI)];
    let mut first = SseReply::open(&server.url, body("1"), &activated).await;
    first.next_event().await.unwrap();
    let mut following = SseReply::open(&server.url, body("1.0"), &activated).await;
    assert!(
        following.replayed(),
        "{}",
        String::from_utf8_lossy(following.raw())
    );
    let (_, _) = tokio::join!(first.rest(), following.rest());
    assert_eq!(following.raw(), first.raw(), "followed to its end");
    let mut replay = SseReply::open(&server.url, body("1.0"), &activated).await;
    replay.rest().await;
    assert!(replay.replayed());
    assert_eq!(replay.raw(), first.raw(), "byte for byte");
}

/// A streamed task's mission ends once, and is logged so once: its stream and its timer both
/// complete it, and the second finds it ended (found by helper-45: logged twice).
#[tokio::test]
async fn a_streamed_mission_is_logged_as_ended_once() {
    let server = ServerProcess::start(&[]);
    let body = crate::support::stream_request(1, &new_id(), "short", json!({"durationMs": 300}));
    let mut stream = SseReply::open(&server.url, body, &[("A2A-Extensions", URI)]).await;
    let task = stream.next_event().await.unwrap()["result"]["id"].clone();
    let task = task.as_str().unwrap().to_owned();
    stream.rest().await;
    tokio::time::sleep(Duration::from_millis(800)).await; // past the timer's deadline too
    let ended = |log: &str| {
        let lines = log.lines();
        lines
            .filter(|l| l.contains("mission ended") && l.contains(&task))
            .count()
    };
    assert_eq!(ended(&server.stderr()), 1, "{}", server.stderr());
}

/// A task stream closes when its task is terminal: a cancel ends it at once with the final
/// `canceled` status, never a `working` update after it (which a stream sent at halfway,
/// then held open to the old deadline); the replay is that same stream.
#[tokio::test]
async fn a_streamed_task_canceled_mid_way_ends_its_stream_at_once() {
    let server = ServerProcess::start(&[]);
    let body = crate::support::stream_request(1, &new_id(), "long", json!({"durationMs": 20000}));
    let started = Instant::now();
    let mut stream = SseReply::open(&server.url, body.clone(), &[("A2A-Extensions", URI)]).await;
    let task = stream.next_event().await.unwrap()["result"].clone();
    let canceled = call(&server.url, "tasks/cancel", json!({"id": task["id"]})).await;
    assert_eq!(canceled.json()["result"]["status"]["state"], "canceled");
    let rest = stream.rest().await;
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "ended at the cancel, not at the 10 s halfway or the 20 s deadline"
    );
    let states: Vec<_> = rest
        .iter()
        .map(|e| e["result"]["status"]["state"].clone())
        .collect();
    assert_eq!(states, [json!("canceled")], "{rest:?}");
    assert_eq!(rest[0]["result"]["final"], true);
    let mut replay = SseReply::open(&server.url, body, &[("A2A-Extensions", URI)]).await;
    replay.rest().await;
    assert!(replay.replayed());
    assert_eq!(replay.raw(), stream.raw());
}

/// A resubscription closes when its task is terminal too: a cancel ends it at once with the
/// final `canceled` status, not at the mission's old deadline.
#[tokio::test]
async fn a_resubscription_ends_at_once_when_its_task_is_canceled() {
    let server = ServerProcess::start(&[]);
    let sent = post(
        &server.url,
        send_with(
            1,
            "message/send",
            &new_id(),
            "long",
            json!({"durationMs": 20000}),
        ),
        &[("A2A-Extensions", URI)],
    )
    .await;
    let id = json!({"id": sent.json()["result"]["id"]});
    let started = Instant::now();
    let resubscribe =
        json!({"jsonrpc": "2.0", "id": 2, "method": "tasks/resubscribe", "params": id});
    let mut following = SseReply::open(&server.url, resubscribe.to_string(), &[]).await;
    let now = following.next_event().await.unwrap();
    assert_eq!(now["result"]["status"]["state"], "working", "{now}");
    let canceled = call(&server.url, "tasks/cancel", id).await;
    assert_eq!(canceled.json()["result"]["status"]["state"], "canceled");
    let rest = following.rest().await;
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "ended at the cancel, not at the 20 s deadline"
    );
    let last = rest.last().unwrap_or_else(|| panic!("an end: {rest:?}"));
    assert_eq!(last["result"]["status"]["state"], "canceled", "{rest:?}");
    assert_eq!(last["result"]["final"], true);
}

const V1_0: &[(&str, &str)] = &[("A2A-Extensions", URI), ("A2A-Version", "1.0")];

/// 1.0's shapes; and a 1.0 send waits for its task's end unless `returnImmediately` (1.0.1
/// §3.2.2), where 0.3's waits only with `blocking: true`.
#[tokio::test]
async fn a2a_1_0_send_and_get_have_the_1_0_shapes() {
    let server = ServerProcess::start(&[]);
    let message = json!({"messageId": new_id(), "role": "ROLE_USER", "parts": [{"text": "hi"}]});
    let body = rpc(
        "SendMessage",
        json!({"message": message, "metadata": {"durationMs": 300}}),
    );
    let waited = post(&server.url, body, V1_0).await.json()["result"].clone();
    let state = &waited["task"]["status"]["state"];
    assert_eq!(state, "TASK_STATE_COMPLETED", "by default: {waited}");
    let message = json!({"messageId": new_id(), "role": "ROLE_USER", "parts": [{"text": "hi"}]});
    let configuration = json!({"returnImmediately": true});
    let body = rpc(
        "SendMessage",
        json!({"message": message, "configuration": configuration}),
    );
    let sent = post(&server.url, body, V1_0).await.json()["result"].clone();
    let task = &sent["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_WORKING", "{sent}");
    assert_eq!(task["history"][0]["role"], "ROLE_USER");
    assert!(!has_kind(&sent), "{sent}");

    let get = rpc("GetTask", json!({"id": task["id"]}));
    let got = post(&server.url, get, V1_0).await.json()["result"].clone();
    assert_eq!(got["id"], task["id"]);
    assert_eq!(got["status"]["state"], "TASK_STATE_WORKING", "{got}");
    assert!(!has_kind(&got), "{got}");
}

#[tokio::test]
async fn an_unsupported_a2a_version_is_refused_before_anything_runs() {
    let server = ServerProcess::start(&[]);
    let message = json!({"messageId": new_id(), "role": "ROLE_USER", "parts": [{"text": "hi"}]});
    let body = rpc("SendMessage", json!({"message": message}));
    for other in ["1.1.0", "1.0.x", "1", "1.0."] {
        let headers = [("A2A-Extensions", URI), ("A2A-Version", other)];
        let refused = post(&server.url, body.clone(), &headers).await;
        assert_eq!(refused.error_code(), -32009, "{other}");
    }
    // Asked as a request parameter instead of the header (A2A 1.0 §3.6.1): the parameter was
    // not read, and the send ran (found by helper-87).
    let asking = |query: &str, body: String| {
        let url = format!("{}/?{query}", server.url.trim_end_matches('/'));
        let request = reqwest::Client::new().post(url).body(body);
        let request = request.header("content-type", "application/json");
        async move {
            let answer = request.header("A2A-Extensions", URI).send().await.unwrap();
            answer.json::<Value>().await.unwrap()
        }
    };
    let asked = asking("A2A-Version=9.9", body.clone()).await;
    assert_eq!(asked["error"]["code"], -32009, "{asked}");
    let get = rpc("GetTask", json!({"id": "nowhere"}));
    let served = asking("a2a-version=1.0", get).await;
    assert_eq!(
        served["error"]["code"], -32001,
        "task not found: served, {served}"
    );
    let headers = [("A2A-Extensions", URI), ("A2A-Version", "9.9")];
    let refused = post(&server.url, body.clone(), &headers).await;
    assert_eq!(refused.error_code(), -32009);
    assert_eq!(refused.json()["error"]["data"]["requested"], "9.9");
    assert_eq!(refused.json()["id"], 7, "under the call's own id");
    assert!(
        refused.echoes_extension(),
        "answered in front, by the layer's rule"
    );
    // A batch gets one error per call, each under its id; a body that is not JSON, id null.
    let second = rpc("GetTask", json!({"id": "t"})).replacen(r#""id":7"#, r#""id":"b""#, 1);
    let batch = post(&server.url, format!("[{body},{second}]"), &headers).await;
    let answers = batch.json();
    assert_eq!(answers[0]["id"], 7, "{answers}");
    assert_eq!(answers[1]["id"], "b", "{answers}");
    assert_eq!(answers[1]["error"]["code"], -32009, "{answers}");
    let unread = post(&server.url, "{not json", &headers).await;
    assert_eq!(
        (unread.error_code(), unread.json()["id"].clone()),
        (-32009, json!(null))
    );
    // A notification is not answered (JSON-RPC 2.0 §4.1), alone or in a batch.
    let notification = r#"{"jsonrpc":"2.0","method":"tasks/get","params":{"id":"t"}}"#;
    let alone = post(&server.url, notification, &headers).await;
    assert_eq!((alone.status, alone.body.len()), (204, 0));
    let mixed = post(&server.url, format!("[{body},{notification}]"), &headers).await;
    let answers = mixed.json();
    assert_eq!(answers.as_array().map(Vec::len), Some(1), "{answers}");
    assert_eq!(answers[0]["id"], 7, "{answers}");
    // An object that names no method is no notification but no Request either: answered
    // (found by helper-56: `{}` got 204).
    for not_a_request in ["{}", r#"[{"foo":1}]"#] {
        let answered = post(&server.url, not_a_request, &headers).await;
        assert_eq!(
            answered.status,
            200,
            "{not_a_request}: {}",
            answered.describe()
        );
        let text = String::from_utf8_lossy(&answered.body).into_owned();
        assert!(text.contains("-32009"), "{not_a_request}: {text}");
    }
    assert_eq!(count(server.db(), "SELECT COUNT(*) FROM tasks", &[]), 0);
    // What is refused whatever the version comes first (found by helper-40): another method
    // than POST is a 405, and a body over the limit a 413.
    let client = reqwest::Client::new();
    let got = client.get(&server.url).header("A2A-Version", "9.9").send();
    assert_eq!(got.await.unwrap().status(), 405);
    let huge = format!("[{}]", "1,".repeat(6 * 1024 * 1024) + "1");
    let too_large = post(&server.url, huge, &headers).await;
    assert_eq!(too_large.status, 413, "{}", too_large.describe());
    assert_eq!(too_large.data_code(), "IDEMPOTENCY_REQUEST_TOO_LARGE");
    let empty = [("A2A-Extensions", URI), ("A2A-Version", "")];
    let served = post(&server.url, body, &empty).await;
    assert_eq!(served.status, 200, "an empty A2A-Version is 0.3");
    assert!(served.json()["result"]["task"].is_object());
    // A patch number is not considered (A2A §3.6; found by helper-77: 1.0.1 was refused).
    for version in ["0.3.0", "1.0.0", "1.0.1", "0.3.12"] {
        let message =
            json!({"messageId": new_id(), "role": "ROLE_USER", "parts": [{"text": "hi"}]});
        let body = rpc("SendMessage", json!({"message": message}));
        let headers = [("A2A-Extensions", URI), ("A2A-Version", version)];
        let served = post(&server.url, body, &headers).await;
        let task = &served.json()["result"]["task"];
        assert!(task.is_object(), "{version}: {}", served.describe());
    }
}

#[tokio::test]
async fn a_stream_that_continues_a_task_follows_it_to_its_end() {
    let server = ServerProcess::start(&[]);
    let first = send_with(
        1,
        "message/send",
        &new_id(),
        "first",
        json!({"durationMs": 600}),
    );
    let task = post_activated(&server.url, first).await.json()["result"].clone();
    let more = json!({"kind": "message", "messageId": new_id(), "role": "user",
        "taskId": task["id"], "parts": [{"kind": "text", "text": "more"}]});
    let body = rpc("message/stream", json!({"message": more}));
    let mut stream = SseReply::open(&server.url, body, &[("A2A-Extensions", URI)]).await;
    let events = stream.rest().await;
    let last = &events.last().expect("events")["result"];
    assert_eq!(last["kind"], "status-update", "{events:?}");
    assert_eq!(
        (last["final"].clone(), last["status"]["state"].clone()),
        (json!(true), json!("completed"))
    );
    let artifact = events
        .iter()
        .find(|e| e["result"]["kind"] == "artifact-update")
        .expect("an artifact");
    let texts: Vec<_> = artifact["result"]["artifact"]["parts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["text"].clone())
        .collect();
    assert_eq!(texts, [json!("first"), json!("more")]);
}

/// Whether any object in `value` has a `kind` member (0.3 has them, 1.0 none).
fn has_kind(value: &Value) -> bool {
    match value {
        Value::Object(map) => map.contains_key("kind") || map.values().any(has_kind),
        Value::Array(items) => items.iter().any(has_kind),
        _ => false,
    }
}

async fn card(url: &str) -> Value {
    let response = reqwest::get(format!("{url}/.well-known/agent-card.json"));
    let response = response.await.expect("the server answers");
    assert_eq!(response.status(), 200);
    response.json().await.expect("a JSON card")
}

/// The idempotency/v1 entry of the card's `capabilities.extensions`, if any.
fn extension(card: &Value) -> Option<&Value> {
    let extensions = card["capabilities"]["extensions"].as_array()?;
    extensions.iter().find(|e| e["uri"] == URI)
}

#[tokio::test]
async fn the_agent_card_has_both_versions_fields_and_the_effective_config() {
    let env = [
        ("AIWG_IDEMPOTENCY_TTL", "7"),
        ("AIWG_IDEMPOTENCY_MAX_ENTRIES", "50"),
    ];
    let server = ServerProcess::start(&env);
    let card = card(&server.url).await;
    for field in ["protocolVersion", "name", "description", "version"] {
        assert!(
            card[field].as_str().is_some_and(|s| !s.is_empty()),
            "{field}: {card}"
        );
    }
    for field in ["defaultInputModes", "defaultOutputModes", "skills"] {
        assert!(
            card[field].as_array().is_some_and(|a| !a.is_empty()),
            "{field}: {card}"
        );
    }
    let url = format!("{}/", server.url);
    assert_eq!(card["url"], url);
    assert_eq!(card["preferredTransport"], "JSONRPC");
    assert_eq!(card["capabilities"]["streaming"], true);
    assert_eq!(card["supportsAuthenticatedExtendedCard"], false, "{card}");
    assert_eq!(card["capabilities"]["extendedAgentCard"], false, "{card}");
    let interface =
        |version| json!({"url": url, "protocolBinding": "JSONRPC", "protocolVersion": version});
    let interfaces = card["supportedInterfaces"]
        .as_array()
        .expect("supportedInterfaces");
    assert!(interfaces.contains(&interface("1.0")), "{card}");
    assert!(interfaces.contains(&interface("0.3")), "{card}");
    let entry = extension(&card).unwrap_or_else(|| panic!("no extension entry: {card}"));
    assert_eq!(entry["required"], true);
    assert_eq!(entry["params"]["ttl_seconds"], 7);
    assert_eq!(entry["params"]["max_cache_entries"], 50);
}

/// The card says there is no extended card, and asking for one anyway gets A2A's -32007 in
/// both spellings, with or without params, not jsonrpsee's -32601.
#[tokio::test]
async fn the_extended_card_is_not_configured_in_either_version() {
    let server = ServerProcess::start(&[]);
    for method in ["agent/getAuthenticatedExtendedCard", "GetExtendedAgentCard"] {
        for params in [json!({}), json!([])] {
            let reply = call(&server.url, method, params).await;
            assert_eq!(reply.status, 200, "{method}");
            assert_eq!(reply.error_code(), -32007, "{method}: {}", reply.json());
        }
    }
}

/// Behind a proxy, or bound to a wildcard address, the card names where clients reach the
/// agent, not the address bound (found by helper-77: `http://0.0.0.0:PORT/`).
#[tokio::test]
async fn the_agent_card_names_the_public_url_where_one_is_given() {
    let public = "https://agents.example.com/a2a/";
    let server = ServerProcess::start_with(&["--public-url", public], &[]);
    let card = card(&server.url).await;
    assert_eq!(card["url"], public);
    let interfaces = card["supportedInterfaces"].as_array().unwrap();
    assert!(interfaces.iter().all(|i| i["url"] == public), "{card}");
    for bad in [
        "agents.example.com",
        "ftp://x/",
        "https://",
        "https:///a2a",
        "http://a b/",
        "http://:8080/",
        "http://user@/",
    ] {
        let stderr = refused(&["--public-url", bad], &[]);
        let said = format!("--public-url {bad:?} is not an http:// or https:// URL with a host");
        assert!(stderr.contains(&said), "{stderr}");
    }
}

/// Posts the same send twice with `headers`: both must run, each creating its own task.
async fn twice_executed(url: &str, db: &Path, headers: &[(&str, &str)]) -> [Reply; 2] {
    let body = send_with(1, "message/send", &new_id(), "again", json!({}));
    let first = post(url, body.clone(), headers).await;
    let second = post(url, body, headers).await;
    for reply in [&first, &second] {
        assert_eq!(
            reply.status,
            200,
            "{}",
            String::from_utf8_lossy(&reply.body)
        );
        assert!(!reply.replayed());
    }
    assert_ne!(first.json()["result"]["id"], second.json()["result"]["id"]);
    assert_eq!(count(db, "SELECT COUNT(*) FROM tasks", &[]), 2);
    [first, second]
}

#[tokio::test]
async fn optional_mode_runs_calls_without_activation_undeduplicated() {
    let server = ServerProcess::start_with(&["--idempotency", "optional"], &[]);
    let (url, db) = (&server.url, server.db());
    let card = card(url).await;
    let entry = extension(&card).unwrap_or_else(|| panic!("no extension entry: {card}"));
    assert_eq!(entry["required"], false);
    twice_executed(url, db, &[]).await;
}

#[tokio::test]
async fn off_mode_has_no_extension_and_no_replay() {
    let server = ServerProcess::start_with(&["--idempotency", "off"], &[]);
    let (url, db) = (&server.url, server.db());
    let card = card(url).await;
    assert_eq!(card["capabilities"]["extensions"], json!([]), "{card}");
    for reply in twice_executed(url, db, &[("A2A-Extensions", URI)]).await {
        assert!(!reply.echoes_extension());
    }
}

/// An 11 MB body (over the default 10 MiB): 413 with a JSON-RPC error, not a reset connection.
#[tokio::test]
async fn an_oversized_request_gets_413_not_a_reset() {
    let server = ServerProcess::start(&[]);
    let text = "x".repeat(11 * 1024 * 1024);
    let body = crate::support::send(1, &crate::support::new_id(), &text);
    let reply = crate::support::post_activated(&server.url, body).await;
    assert_eq!(reply.status, 413);
    assert_eq!(reply.data_code(), "IDEMPOTENCY_REQUEST_TOO_LARGE");
    assert_eq!(
        reply.json()["error"]["data"]["limit_bytes"],
        10 * 1024 * 1024
    );
}

/// JSON-RPC 2.0 §5 and §4.1, where jsonrpsee alone answers otherwise (`invalid_request.rs`).
/// A single Invalid Request is HTTP 400 whatever its shape (jsonrpsee said 400 to `42` and
/// 200 to `{}`); inside a batch's array, 200.
#[tokio::test]
async fn invalid_requests_get_32600_and_notifications_no_answer() {
    let server = ServerProcess::start_with(&["--idempotency", "optional"], &[]);
    let invalid = json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32600, "message": "Invalid request"}});
    for body in [
        r#"{"jsonrpc":"1.0","method":"tasks/get","params":{"id":"x"}}"#,
        r#"{"jsonrpc":"2.0","params":{"id":"x"}}"#,
        "42",
        "null",
        "{}",
        "[]",
    ] {
        let reply = post(&server.url, body, &[]).await;
        assert_eq!(
            (reply.status, reply.json()),
            (400, invalid.clone()),
            "{body}"
        );
    }
    // Where jsonrpsee read the id, the error carries it, however long.
    let long = "a".repeat(300);
    let body = format!(r#"{{"jsonrpc":"2.0","id":"{long}","params":{{}}}}"#);
    let reply = post(&server.url, body, &[]).await;
    assert_eq!(
        (reply.status, reply.json()["id"].clone()),
        (400, json!(long))
    );
    let mut with_id = invalid.clone();
    with_id["id"] = json!(7);
    for body in [
        r#"{"jsonrpc":"1.0","id":7,"method":"tasks/get","params":{"id":"x"}}"#,
        r#"{"jsonrpc":"2.0","id":7,"params":{"id":"x"}}"#,
        // A member given twice, which jsonrpsee refuses: no Request either.
        r#"{"jsonrpc":"2.0","id":7,"method":"tasks/get","params":{"id":"x"},"params":{"id":"y"}}"#,
        r#"{"jsonrpc":"2.0","id":7,"method":"tasks/get","method":"tasks/get","params":{"id":"x"}}"#,
    ] {
        let reply = post(&server.url, body, &[]).await;
        assert_eq!(
            (reply.status, reply.json()),
            (400, with_id.clone()),
            "{body}"
        );
    }
    let batch = post(&server.url, "[1]", &[]).await;
    assert_eq!((batch.status, batch.json()), (200, json!([invalid])));
    // An id named twice is said to be so, not of the wrong type (helper-101).
    let twice = r#"{"jsonrpc":"2.0","id":5,"id":6,"method":"tasks/get","params":{"id":"x"}}"#;
    let reason = "the request names its id more than once; the call was not run";
    let mut duplicated = invalid.clone();
    duplicated["error"]["data"] = json!({ "reason": reason });
    let reply = post(&server.url, twice, &[]).await;
    assert_eq!((reply.status, reply.json()), (400, duplicated.clone()));
    let reply = post(&server.url, format!("[{twice}]"), &[]).await;
    assert_eq!((reply.status, reply.json()), (200, json!([duplicated])));
    // Ids jsonrpsee cannot read: it answered nothing, as to a notification, and ran nothing.
    let reason = "the request's id must be a string, an integer from 0 to 18446744073709551615, or null; the call was not run";
    let mut unreadable = invalid.clone();
    unreadable["error"]["data"] = json!({ "reason": reason });
    let ids = [
        r#"{"a":1}"#,
        "[1]",
        "-1",
        "1.5",
        "1e2",
        "-0",
        "18446744073709551616",
        "true",
        r#""\ud800""#,
    ];
    for id in ids {
        let body =
            format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tasks/get","params":{{"id":"x"}}}}"#);
        let reply = post(&server.url, body, &[]).await;
        assert_eq!(
            (reply.status, reply.json()),
            (400, unreadable.clone()),
            "id {id}"
        );
    }
    let key = new_id();
    let send = send_with(1, "message/send", &key, "never run", json!({}));
    let negative = send.replacen(r#""id":1"#, r#""id":-1"#, 1);
    assert_eq!(
        post_activated(&server.url, negative).await.json(),
        unreadable
    );
    assert_eq!(
        tasks_naming(server.db(), &key),
        0,
        "a call whose id jsonrpsee cannot read never runs"
    );
    // Found by fuzz/rpc_admission: a governed call, activated, whose id is an object.
    let fuzzed = r#"{"jsonrpc":"2.0","id":{"a":1},"method":"message/send","params":{"message":{"messageId":"not-a-uuid"}}}"#;
    assert_eq!(post_activated(&server.url, fuzzed).await.json(), unreadable);
    // And one whose other members jsonrpsee skips unread.
    let skipped = r#"{"jsonrpc":"2.0","id":{"a":1},"method":"message/send","par#ms":{";message":{"messageId":"not-a-uuid"}}}"#;
    assert_eq!(
        post_activated(&server.url, skipped).await.json(),
        unreadable
    );
    // Past 64 KiB as well (the HTTP layer read only smaller bodies, and jsonrpsee's `null`
    // went out as the answer).
    let padding = "p".repeat(70 * 1024);
    for id in ["[1]", "-1"] {
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tasks/get","params":{{"id":"x","pad":"{padding}"}}}}"#
        );
        let reply = post(&server.url, body, &[]).await;
        assert_eq!(
            (reply.status, reply.json()),
            (400, unreadable.clone()),
            "id {id}"
        );
    }
    // Text that is not JSON is a parse error, HTTP 400 whatever it starts with (jsonrpsee
    // answered 200 when it started as JSON does).
    for text in [r#"{"jsonrpc":"2.0","id":1,"method":"#, "[{]", "hello", ""] {
        let refused = post(&server.url, text, &[]).await;
        assert_eq!(refused.status, 400, "{text}: {}", refused.describe());
        assert_eq!(refused.json()["error"]["code"], -32700, "{text}");
    }
    // A notification, alone or in a batch, is not answered; a batch's bad id still is.
    for body in [
        r#"{"jsonrpc":"2.0","method":"tasks/get","params":{"id":"x"}}"#,
        r#"[{"jsonrpc":"2.0","method":"tasks/get","params":{"id":"x"}}]"#,
    ] {
        let reply = post(&server.url, body, &[]).await;
        assert_eq!((reply.status, reply.body.len()), (204, 0), "{body}");
    }
    // Nor run (jsonrpsee dispatches no notification): a message/send without an id, activated
    // or not, creates no task.
    let key = new_id();
    let unanswerable =
        send_with(1, "message/send", &key, "never run", json!({})).replacen(r#""id":1,"#, "", 1);
    assert!(!unanswerable.contains(r#""id""#), "{unanswerable}");
    for reply in [
        post_activated(&server.url, unanswerable.clone()).await,
        post(&server.url, unanswerable, &[]).await,
    ] {
        assert_eq!((reply.status, reply.body.len()), (204, 0));
    }
    assert_eq!(
        tasks_naming(server.db(), &key),
        0,
        "a notification never runs"
    );
    let mixed = r#"[{"jsonrpc":"2.0","id":{},"method":"tasks/get","params":{"id":"x"}},{"jsonrpc":"2.0","method":"tasks/get","params":{"id":"x"}}]"#;
    assert_eq!(
        post(&server.url, mixed, &[]).await.json(),
        json!([unreadable])
    );
    // Beside calls jsonrpsee answers, each call it could not read gets its error too.
    let answered = r#"[{"jsonrpc":"2.0","id":-1,"method":"tasks/get","params":{"id":"x"}},{"jsonrpc":"2.0","id":7,"method":"tasks/get","params":{"id":"x"}},{"jsonrpc":"2.0","id":1.5,"method":"tasks/get","params":{"id":"x"}}]"#;
    let answers = post(&server.url, answered, &[]).await.json();
    let answers = answers.as_array().unwrap();
    assert_eq!(answers.len(), 3, "{answers:?}");
    assert_eq!(answers[1]["id"], 7, "in the order of the calls");
    assert_eq!(answers[1]["error"]["code"], -32001);
    assert_eq!([&answers[0], &answers[2]], [&unreadable, &unreadable]);
    // Each entry answered once (found by helper-40): an entry jsonrpsee answered as invalid is
    // not answered again for its id, and an entry that is not an object does not hide the
    // call beside it whose id jsonrpsee could not read.
    let bad_id_call = r#"{"jsonrpc":"2.0","id":[1],"method":"tasks/get","params":{"id":"x"}}"#;
    for (batch, expected) in [
        (r#"[{"id":[1]}]"#.to_owned(), json!([invalid])),
        ("[[{}]]".to_owned(), json!([invalid])),
        (
            r#"[{"jsonrpc":"1.0","id":-1,"method":"tasks/get"}]"#.to_owned(),
            json!([invalid]),
        ),
        (format!("[1,{bad_id_call}]"), json!([invalid, unreadable])),
        (
            format!(r#"["x",{bad_id_call}]"#),
            json!([invalid, unreadable]),
        ),
        // jsonrpsee read `[1]` as an object with id 1: no entry that is not an object has one.
        ("[[1]]".to_owned(), json!([invalid])),
        (r#"[["a"]]"#.to_owned(), json!([invalid])),
        // ... and `["2.0","m"]` as a notification, which it left unanswered (helper-41).
        (r#"[["2.0","tasks/get"]]"#.to_owned(), json!([invalid])),
        (
            format!(r#"[["2.0","tasks/get",{{"id":"x"}}],{bad_id_call}]"#),
            json!([invalid, unreadable]),
        ),
    ] {
        let reply = post(&server.url, batch.clone(), &[]).await;
        assert_eq!((reply.status, reply.json()), (200, expected), "{batch}");
    }
    // A batch of a replay and of a call whose id jsonrpsee could not read is not all replays:
    // no `Idempotent-Replayed` (the error is not from the cache).
    let key = new_id();
    let send = send_with(1, "message/send", &key, "once", json!({}));
    assert!(!post_activated(&server.url, send.clone()).await.replayed());
    let replays = post_activated(&server.url, format!("[{send}]")).await;
    assert!(replays.replayed(), "{}", replays.describe());
    let mixed = post_activated(&server.url, format!("[{send},{bad_id_call}]")).await;
    assert_eq!(mixed.json()[1], unreadable);
    assert!(!mixed.replayed(), "{}", mixed.describe());
    // An ordinary call's error, as small, is untouched.
    let call = r#"{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{"id":"x"}}"#;
    let not_found = post(&server.url, call, &[]).await;
    assert_eq!((not_found.status, not_found.error_code()), (200, -32001));
}

/// Delivered outbox events are deleted once past `--outbox-retention`; the tasks stay, and a
/// replay of the call that made them is the same.
#[tokio::test]
async fn delivered_outbox_events_are_deleted_past_their_retention() {
    let server = ServerProcess::start_with(&["--outbox-retention", "1"], &[]);
    let body = blocking_send("message/send", &new_id(), 50);
    let reply = post_activated(&server.url, body.clone()).await;
    let id = reply.json()["result"]["id"].as_str().unwrap().to_owned();
    assert_eq!(outbox_events(&server, "mission.completed"), 1);
    let deadline = Instant::now() + Duration::from_secs(20);
    while outbox_events(&server, "mission.assigned") + outbox_events(&server, "mission.completed")
        > 0
    {
        assert!(Instant::now() < deadline, "the outbox was not pruned");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let got = call(&server.url, "tasks/get", json!({"id": id})).await;
    assert_eq!(got.json()["result"]["status"]["state"], "completed");
    let replay = post_activated(&server.url, body).await;
    assert_eq!(replay.body, reply.body);
}

/// How many outbox events of `event_type` the server's SQLite file holds.
fn outbox_events(server: &ServerProcess, event_type: &str) -> i64 {
    let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY;
    let conn = rusqlite::Connection::open_with_flags(server.db(), flags).unwrap();
    conn.busy_timeout(TIMEOUT).unwrap();
    let sql = "SELECT COUNT(*) FROM outbox WHERE event_type = ?1";
    conn.query_row(sql, [event_type], |row| row.get(0)).unwrap()
}

fn blocking_send(method: &str, message_id: &str, duration_ms: u64) -> String {
    let message = json!({"kind": "message", "messageId": message_id, "role": "user",
        "parts": [{"kind": "text", "text": "wait for it"}]});
    let params = json!({"message": message, "configuration": {"blocking": true},
        "metadata": {"durationMs": duration_ms}});
    rpc(method, params)
}

#[tokio::test]
async fn a_blocking_send_answers_the_finished_task_committed_with_both_its_events() {
    let server = ServerProcess::start(&[]);
    let started = Instant::now();
    let body = blocking_send("message/send", &new_id(), 300);
    let reply = post_activated(&server.url, body.clone()).await;
    assert!(started.elapsed() >= Duration::from_millis(300));
    let task = &reply.json()["result"];
    assert_eq!(task["status"]["state"], "completed", "{}", reply.describe());
    assert_eq!(task["artifacts"][0]["parts"][0]["text"], "wait for it");
    let id = task["id"].as_str().unwrap();
    let got = call(&server.url, "tasks/get", json!({"id": id})).await;
    assert_eq!(got.json()["result"]["status"]["state"], "completed");
    assert_eq!(outbox_events(&server, "mission.assigned"), 1);
    assert_eq!(outbox_events(&server, "mission.completed"), 1);
    let replay = post_activated(&server.url, body).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, reply.body);
    // A2A 1.0 the same, in its shape.
    let v10 = blocking_send("SendMessage", &new_id(), 100);
    let reply = post(
        &server.url,
        v10,
        &[("A2A-Extensions", URI), ("A2A-Version", "1.0")],
    )
    .await;
    let state = &reply.json()["result"]["task"]["status"]["state"];
    assert_eq!(state, "TASK_STATE_COMPLETED", "{}", reply.describe());
}

#[tokio::test]
async fn a_blocking_send_killed_before_its_end_leaves_nothing_and_its_retry_runs_once() {
    let mut server = ServerProcess::start(&[]);
    let body = blocking_send("message/send", &new_id(), 1500);
    let url = server.url.clone();
    let first = tokio::spawn({
        let body = body.clone();
        async move { crate::support::try_post(&url, body, &[("A2A-Extensions", URI)]).await }
    });
    tokio::time::sleep(Duration::from_millis(400)).await;
    let url = server.restart();
    assert!(
        first.await.unwrap().is_err(),
        "the killed call was never answered"
    );
    assert_eq!(
        outbox_events(&server, "mission.assigned"),
        0,
        "nothing committed"
    );
    let retry = post_activated(&url, body.clone()).await;
    assert!(!retry.replayed());
    assert_eq!(retry.json()["result"]["status"]["state"], "completed");
    assert!(post_activated(&url, body).await.replayed());
    assert_eq!(outbox_events(&server, "mission.assigned"), 1);
    assert_eq!(outbox_events(&server, "mission.completed"), 1);
}

/// jsonrpsee counts HTTP requests in flight against `max_connections` (100 by default) and
/// answers the rest 429: under load, requests of clients that left still wait for their
/// commit while new ones arrive. The example serves far more at once (`--max-in-flight`).
#[tokio::test]
async fn more_calls_in_flight_than_jsonrpsee_default_limit_are_all_served() {
    let server = ServerProcess::start_with(&["--idempotency", "off"], &[]);
    let calls = (0..150).map(|_| {
        let (url, body) = (
            server.url.clone(),
            blocking_send("message/send", &new_id(), 800),
        );
        tokio::spawn(async move { post(&url, body, &[]).await })
    });
    let replies = futures::future::join_all(calls).await;
    for reply in replies {
        let reply = reply.unwrap();
        assert_eq!(reply.status, 200, "{}", reply.describe());
        assert_eq!(reply.json()["result"]["status"]["state"], "completed");
    }
    assert_eq!(outbox_events(&server, "mission.completed"), 150);

    // The limit holds where it is set: one call past it is refused, not queued.
    let server = ServerProcess::start_with(&["--idempotency", "off", "--max-in-flight", "1"], &[]);
    let url = server.url.clone();
    let long = tokio::spawn(async move {
        post(&url, blocking_send("message/send", &new_id(), 2000), &[]).await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let refused = post(
        &server.url,
        blocking_send("message/send", &new_id(), 0),
        &[],
    )
    .await;
    assert_eq!(refused.status, 429, "{}", refused.describe());
    // As JSON-RPC, where jsonrpsee answered plain text.
    assert_eq!(refused.headers["content-type"], "application/json");
    assert_eq!(refused.headers["retry-after"], "1");
    let error = refused.json();
    assert_eq!(error["id"], Value::Null, "{error}");
    assert_eq!(error["error"]["code"], -32603, "{error}");
    let reason = error["error"]["data"]["reason"].as_str().unwrap();
    assert!(reason.contains("nothing of this one ran"), "{reason}");
    // Refused on its headers, its body never waited for: the HTTP layer read whole bodies
    // before jsonrpsee counted them, and held any number of them (helper-85).
    use tokio::io::AsyncWriteExt;
    let address = server
        .url
        .trim_start_matches("http://")
        .trim_end_matches('/');
    let mut socket = tokio::net::TcpStream::connect(address).await.unwrap();
    let head = "POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
                Content-Length: 1000000\r\n\r\n{\"jsonrpc\":";
    socket.write_all(head.as_bytes()).await.unwrap();
    let answer = answer_head(&mut socket).await;
    assert!(answer.starts_with("HTTP/1.1 429"), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("retry-after: 1"),
        "{answer}"
    );
    // One the example refuses in front for its A2A-Version, whose body it reads for the ids
    // (found by helper-88: read without the bound).
    let mut socket = tokio::net::TcpStream::connect(address).await.unwrap();
    let versioned = head.replacen("\r\n\r\n", "\r\nA2A-Version: 9.9\r\n\r\n", 1);
    socket.write_all(versioned.as_bytes()).await.unwrap();
    let answer = answer_head(&mut socket).await;
    assert!(answer.starts_with("HTTP/1.1 429"), "{answer}");
    // A WebSocket upgrade past the limit too.
    let upgrade = "GET / HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, close\r\n\
                   Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\
                   Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n";
    let answer = exchange(&server.url, upgrade).await;
    assert!(answer.starts_with("HTTP/1.1 429"), "{answer}");
    assert!(answer.contains("application/json"), "{answer}");
    assert!(answer.contains("-32603"), "{answer}");
    assert_eq!(long.await.unwrap().status, 200);
}

#[tokio::test]
async fn a_part_the_agent_cannot_read_is_refused_before_anything_happens() {
    let server = ServerProcess::start(&[]);
    for (part, kind) in [
        (
            json!({"kind": "file", "file": {"uri": "https://example.com/a.png", "mimeType": "image/png"}}),
            "file",
        ),
        (json!({"kind": "data", "data": {"x": 1}}), "data"),
        // Read by their kind, not by a stray member: these ran as text (helper-117).
        (
            json!({"kind": "file", "file": {"uri": "https://example.com/a.pdf"}, "text": "x"}),
            "file",
        ),
        (
            json!({"kind": "data", "data": {"x": 1}, "text": "x"}),
            "data",
        ),
        // 1.0's `data` is any value, `null` too (helper-118).
        (json!({"data": null}), "data"),
    ] {
        let message = json!({"kind": "message", "messageId": new_id(), "role": "user",
            "parts": [{"kind": "text", "text": "look"}, part]});
        let body = rpc("message/send", json!({"message": message}));
        let reply = post_activated(&server.url, body.clone()).await;
        let error = &reply.json()["error"];
        assert_eq!(error["code"], -32005, "{}", reply.describe());
        assert_eq!(
            (error["data"]["part"].clone(), error["data"]["kind"].clone()),
            (json!(1), json!(kind))
        );
        // The refusal is the call's outcome: cached and replayed like any other.
        let again = post_activated(&server.url, body).await;
        assert!(again.replayed());
        assert_eq!(again.body, reply.body);
    }
    assert_eq!(outbox_events(&server, "mission.assigned"), 0);
}

/// A message that is not of A2A's shape is invalid params (-32602), and runs nothing: a
/// part whose kind's member is missing, a message of another kind, metadata that is not an
/// object (each was accepted: helper-117).
#[tokio::test]
async fn a_message_of_the_wrong_shape_is_invalid_params_and_runs_nothing() {
    let server = ServerProcess::start(&[]);
    let text = json!({"kind": "text", "text": "x"});
    let wrong = [
        json!({"kind": "message", "parts": [{"kind": "file", "text": "x"}]}),
        json!({"kind": "message", "parts": [{"kind": "data"}]}),
        json!({"kind": "message", "parts": [{"kind": "image", "text": "x"}]}),
        json!({"parts": [{"text": "x", "data": {}}]}),
        json!({"kind": "task", "parts": [text]}),
        json!({"kind": "message", "metadata": 7, "parts": [text]}),
        json!({"kind": "message", "parts": [{"kind": "text", "text": "x", "metadata": "s"}]}),
    ];
    for mut message in wrong {
        message["messageId"] = json!(new_id());
        message["role"] = json!("user");
        let reply = post_activated(
            &server.url,
            rpc("message/send", json!({"message": message})),
        )
        .await;
        assert_eq!(
            reply.json()["error"]["code"],
            -32602,
            "{message}: {}",
            reply.describe()
        );
    }
    assert_eq!(outbox_events(&server, "mission.assigned"), 0);
}

#[tokio::test]
async fn a_client_whose_stream_broke_follows_its_task_again_even_across_a_crash() {
    let mut server = ServerProcess::start(&[]);
    let body =
        crate::support::stream_request(1, &new_id(), "follow me", json!({"durationMs": 1200}));
    let mut first = SseReply::open(&server.url, body, &[("A2A-Extensions", URI)]).await;
    let task = first.next_event().await.expect("the task");
    let task_id = task["result"]["id"].as_str().unwrap().to_owned();
    drop(first); // the stream broke

    // The server dies too; the restarted one resumes the mission, and the client follows it.
    let url = server.restart();
    let resubscribe = rpc("tasks/resubscribe", json!({"id": task_id}));
    let mut follow = SseReply::open(&url, resubscribe.clone(), &[]).await;
    assert_eq!(follow.content_type(), "text/event-stream");
    let events = follow.rest().await;
    assert!(
        events.iter().all(|e| e["id"] == 7),
        "framed for this call: {events:?}"
    );
    assert_eq!(events[0]["result"]["kind"], "task");
    assert_eq!(events[0]["result"]["status"]["state"], "working");
    let last = &events.last().unwrap()["result"];
    assert_eq!(
        (last["final"].clone(), last["status"]["state"].clone()),
        (json!(true), json!("completed"))
    );
    assert!(
        events
            .iter()
            .any(|e| e["result"]["kind"] == "artifact-update"),
        "{events:?}"
    );

    // Once it ended: the task and its final status, at once; in 1.0's shapes too.
    let events = SseReply::open(&url, resubscribe, &[]).await.rest().await;
    assert_eq!(events.len(), 3, "task, artifact, final status: {events:?}");
    assert_eq!(events[0]["result"]["status"]["state"], "completed");
    // 1.0 (§3.1.6) has no subscription to a task that ended: -32004.
    let v10 = rpc("SubscribeToTask", json!({"id": task_id}));
    let refused = post(&url, v10, &[("A2A-Version", "1.0")]).await;
    assert_eq!(refused.error_code(), -32004, "{}", refused.describe());
    assert_eq!(refused.json()["error"]["data"]["state"], "completed");
    // A running task's, in 1.0's shapes.
    let body = send_with(
        2,
        "message/send",
        &new_id(),
        "again",
        json!({"durationMs": 800}),
    );
    let running = post(&url, body, &[("A2A-Extensions", URI)]).await;
    let v10 = rpc(
        "SubscribeToTask",
        json!({"id": running.json()["result"]["id"]}),
    );
    let events = SseReply::open(&url, v10, &[("A2A-Version", "1.0")])
        .await
        .rest()
        .await;
    assert_eq!(
        events[0]["result"]["task"]["status"]["state"],
        "TASK_STATE_WORKING"
    );
    let last = &events.last().unwrap()["result"]["statusUpdate"];
    assert_eq!(
        last["status"]["state"], "TASK_STATE_COMPLETED",
        "{events:?}"
    );

    // An unknown task is an ordinary JSON-RPC error.
    let unknown = post(&url, rpc("tasks/resubscribe", json!({"id": "nope"})), &[]).await;
    assert_eq!(unknown.json()["error"]["code"], -32001);
}

/// Spec §7.2: a messageId that a counter made, not a random source, is served (no one value
/// proves its entropy) and logged under `idem::key_anomaly` for operators; a random one is not.
#[tokio::test]
async fn a_counter_made_message_id_is_served_and_logged_as_a_key_anomaly() {
    let server = ServerProcess::start(&[]);
    let counted = "12345678-1234-1234-1234-123456789012";
    let random = new_id();
    // Logged as each call is parsed, before it is answered: a line for the random id would
    // come before the last counted one's, so seeing that line is seeing all before it.
    let last = "00000000-0000-0000-0000-000000000003";
    for (n, id) in [(1, counted), (2, random.as_str()), (3, last)] {
        let reply = post_activated(&server.url, send(n, id, "served")).await;
        assert!(reply.json()["result"].is_object(), "{}", reply.describe());
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    let anomaly = |log: &str, id: &str| {
        log.lines()
            .any(|line| line.contains("idem::key_anomaly") && line.contains(id))
    };
    while !anomaly(&server.stderr(), last) {
        assert!(
            Instant::now() < deadline,
            "not logged:\n{}",
            server.stderr()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(anomaly(&server.stderr(), counted), "{}", server.stderr());
    assert!(!anomaly(&server.stderr(), &random), "{}", server.stderr());

    // A messageId that is no UUID is refused (400) and logged there too, quoted, so that no
    // value forges a line of the log (found by helper-47: refused ids went unlogged).
    let forged = "zzz\n2026-12-07T00:00:00Z  INFO forged line";
    let reply = post_activated(&server.url, send(4, forged, "refused")).await;
    assert_eq!(reply.status, 400, "{}", reply.describe());
    let deadline = Instant::now() + Duration::from_secs(5);
    while !anomaly(&server.stderr(), "messageId refused") {
        assert!(
            Instant::now() < deadline,
            "not logged:\n{}",
            server.stderr()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        anomaly(&server.stderr(), r#""zzz\n2026"#),
        "{}",
        server.stderr()
    );
    let forged_line = server
        .stderr()
        .lines()
        .any(|l| l.contains("INFO forged line") && !l.contains("zzz"));
    assert!(!forged_line, "{}", server.stderr());
}
