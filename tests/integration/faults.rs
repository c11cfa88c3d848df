//! File-system faults under a serving example server: a full disk, a read-only database file,
//! a deleted one. Governed calls get the store's error and nothing of them is stored, nothing
//! runs twice, nothing is acknowledged that is not durable, `/metrics` and the log show it,
//! and service comes back by itself once the fault is gone.
//!
//! The first two run on a real ext4 file system of 8 MiB, loop-mounted: that takes root and a
//! loop device. Without them they say so loudly and pass, unless `IDEM_REQUIRE_FAULTS=1`
//! (which `.ci/run` sets wherever it can mount one).

use std::path::{Path, PathBuf};
use std::process::Command;

use idem_conformance::server_process::ServerProcess;
use idem_conformance::side_effects::{Counts, SideEffects};

use crate::support::{
    metric, new_id, post, post_activated, send, try_post, until_completed, Reply, ACTIVATED,
};

/// A small ext4 file system, mounted on a temporary directory; unmounted on drop.
struct SmallFs {
    mount: PathBuf,
    _dir: tempfile::TempDir,
}

impl SmallFs {
    fn mount(what: &str) -> Option<Self> {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let image = dir.path().join("fs.img");
        let mount = dir.path().join("mnt");
        std::fs::create_dir(&mount).unwrap();
        let steps: [&[&str]; 3] = [
            &["truncate", "-s", "8M", path(&image)],
            &["mkfs.ext4", "-q", "-F", path(&image)],
            &["mount", "-o", "loop", path(&image), path(&mount)],
        ];
        for step in steps {
            if let Err(why) = run(step) {
                let message = format!("cannot mount a small file system for {what}: {why}");
                if std::env::var("IDEM_REQUIRE_FAULTS").as_deref() == Ok("1") {
                    panic!("{message} (IDEM_REQUIRE_FAULTS=1)");
                }
                eprintln!("*** SKIPPED: {message} (root and a loop device needed) ***");
                return None;
            }
        }
        Some(Self { mount, _dir: dir })
    }

    fn file(&self, name: &str) -> PathBuf {
        self.mount.join(name)
    }

    /// Writes a file until the file system has no room left.
    fn fill(&self) -> PathBuf {
        use std::io::Write;
        let filler = self.file("filler");
        let mut file = std::fs::File::create(&filler).unwrap();
        let chunk = vec![0u8; 16 * 1024];
        while file
            .write_all(&chunk)
            .and_then(|()| file.sync_all())
            .is_ok()
        {}
        filler
    }
}

/// The small file system frozen (`fsfreeze`, as a snapshot or a hung disk holds one): every
/// write to it waits until it thaws, on drop.
struct Frozen<'a>(&'a SmallFs);

impl<'a> Frozen<'a> {
    fn freeze(fs: &'a SmallFs) -> Self {
        run(&["fsfreeze", "-f", path(&fs.mount)]).expect("fsfreeze on ext4");
        Self(fs)
    }
}

impl Drop for Frozen<'_> {
    fn drop(&mut self) {
        let _ = run(&["fsfreeze", "-u", path(&self.0.mount)]);
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = run(&["umount", "-l", path(&self.mount)]);
    }
}

fn path(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 temporary path")
}

fn run(command: &[&str]) -> Result<(), String> {
    let output = Command::new(command[0])
        .args(&command[1..])
        .output()
        .map_err(|e| format!("{}: {e}", command[0]))?;
    match output.status.success() {
        true => Ok(()),
        false => Err(format!(
            "{command:?}: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        )),
    }
}

/// The store's error, and nothing else: a governed call that was not stored.
fn assert_store_error(reply: &Reply) {
    let json = reply.json();
    assert_eq!(
        json["error"]["data"]["code"],
        "IDEMPOTENCY_STORE_UNAVAILABLE",
        "{}",
        reply.describe()
    );
    assert!(!reply.replayed());
}

fn counts(server: &ServerProcess) -> Counts {
    let effects = SideEffects {
        db: Some(server.side_effects_db()),
    };
    effects.snapshot().unwrap().expect("a database")
}

/// How many of the server's tasks are still working: their missions not yet completed.
fn working(server: &ServerProcess) -> i64 {
    let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY;
    let conn = rusqlite::Connection::open_with_flags(server.db(), flags).unwrap();
    conn.busy_timeout(std::time::Duration::from_secs(5))
        .unwrap();
    let sql = "SELECT COUNT(*) FROM tasks WHERE state = 'working'";
    conn.query_row(sql, [], |row| row.get(0)).unwrap()
}

/// Waits (at most 5 s: stderr is read on a thread of its own) until the server logged `text`.
async fn logged(server: &ServerProcess, text: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !server.stderr().contains(text) {
        assert!(
            std::time::Instant::now() < deadline,
            "never logged {text:?}:\n{}",
            server.stderr()
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// The calls that failed under a fault: retried once it is gone, each runs once and then
/// replays; a SIGKILL later, every answer is still there, byte for byte.
async fn recovered(server: &mut ServerProcess, failed: &[String], before: Counts) {
    let mut answers = Vec::new();
    for body in failed {
        let retry = post_activated(&server.url, body.clone()).await;
        assert!(retry.json()["result"].is_object(), "{}", retry.describe());
        assert!(!retry.replayed(), "it was never stored, so it runs now");
        answers.push(retry.body);
    }
    let added = failed.len() as i64;
    let expected = Counts {
        tasks: before.tasks + added,
        assigned: before.assigned + added,
    };
    assert_eq!(
        counts(server),
        expected,
        "each failed call ran exactly once"
    );
    let url = server.restart();
    for (body, answer) in failed.iter().zip(answers) {
        let replay = post_activated(&url, body.clone()).await;
        assert!(replay.replayed());
        assert_eq!(replay.body, answer, "durable before it was answered");
    }
    assert_eq!(counts(server), expected);
}

#[tokio::test]
async fn a_full_disk_fails_the_calls_it_cannot_store_and_service_resumes_when_room_returns() {
    let Some(fs) = SmallFs::mount("the full-disk test") else {
        return;
    };
    let db = fs.file("a2a.db");
    let mut server = ServerProcess::start_on(Some(path(&db)), &[], &[]);
    let stored = send(1, &new_id(), "stored before");
    let answered = post_activated(&server.url, stored.clone()).await;
    let before = counts(&server);

    let filler = fs.fill();
    // Larger than anything the log has room for: the commit must grow it.
    let big = "x".repeat(256 * 1024);
    let failed: Vec<String> = (0..3).map(|_| send(1, &new_id(), &big)).collect();
    for body in &failed {
        assert_store_error(&post_activated(&server.url, body.clone()).await);
    }
    assert_eq!(
        counts(&server),
        before,
        "no task or outbox row of a failed call"
    );
    let replay = post_activated(&server.url, stored.clone()).await;
    assert_eq!(
        replay.body, answered.body,
        "what was stored is still answered"
    );
    let url = server.url.clone();
    assert_eq!(
        metric(&url, "idempotency_store_errors_total{kind=\"commit\"}").await,
        3.0
    );
    let series = "idempotency_calls_total{method=\"message/send\",outcome=\"store_error\"}";
    assert_eq!(metric(&url, series).await, 3.0);
    assert!(
        server.stderr().contains("database or disk is full"),
        "{}",
        server.stderr()
    );

    std::fs::remove_file(filler).unwrap();
    recovered(&mut server, &failed, before).await;
}

/// A file-size limit (`ulimit -f`, systemd's `LimitFSIZE=`) that the store's files reach is
/// a disk without room, not a kill: by default SIGXFSZ killed the server at its first write
/// past it, every call in flight lost with its connection (helper-110), and once the file and
/// its log had both reached it, a restart under it at every start, before it served
/// (helper-113). No root needed.
#[tokio::test]
async fn a_file_size_limit_fails_the_calls_it_cannot_store_and_kills_nothing() {
    // 2 or 4 MiB (the shell's blocks are 512 or 1024 bytes): room for a few calls.
    let mut server = ServerProcess::start_after("ulimit -f 4096", &[]);
    let stored = send(1, &new_id(), "stored before");
    let answered = post_activated(&server.url, stored.clone()).await;
    assert!(
        answered.json()["result"].is_object(),
        "{}",
        answered.describe()
    );
    let big = "x".repeat(64 * 1024);
    let mut refused = Vec::new();
    // Until both the file and its log are full: the checkpointer copies the log back into the
    // file every 250 ms.
    for _ in 0..200 {
        let body = send(1, &new_id(), &big);
        match try_post(&server.url, body, ACTIVATED).await {
            Ok(reply) if reply.json()["error"].is_object() => refused.push(reply),
            Ok(_) => {}
            Err(error) => panic!(
                "{error}; the server {:?}:\n{}",
                server.exited(),
                server.stderr()
            ),
        }
        if refused.len() == 5 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    }
    assert_eq!(refused.len(), 5, "the limit reached within 12 MiB of calls");
    refused.iter().for_each(assert_store_error);
    assert_eq!(server.exited(), None, "{}", server.stderr());
    let replay = post_activated(&server.url, stored.clone()).await;
    assert_eq!(
        replay.body, answered.body,
        "what was stored is still answered"
    );
    let errors = "idempotency_store_errors_total{kind=\"commit\"}";
    assert!(metric(&server.url, errors).await >= 1.0);

    let url = server.restart(); // SIGKILL, then a start under the same limit
    let replay = post_activated(&url, stored).await;
    assert!(replay.replayed(), "{}", replay.describe());
    assert_eq!(replay.body, answered.body, "durable before it was answered");
}

#[tokio::test]
async fn a_read_only_database_file_fails_the_calls_and_service_resumes_when_writable() {
    let Some(fs) = SmallFs::mount("the read-only file test") else {
        return;
    };
    let db = fs.file("a2a.db");
    let mut server = ServerProcess::start_on(Some(path(&db)), &[], &[]);
    post_activated(&server.url, send(1, &new_id(), "first")).await;
    let before = counts(&server);
    let files = [path(&db).to_owned(), format!("{}-wal", path(&db))];
    let chattr = |flag: &str| {
        for file in &files {
            run(&["chattr", flag, file]).expect("chattr on ext4");
        }
    };
    chattr("+i");
    let failed: Vec<String> = (0..2)
        .map(|i| send(1, &new_id(), &format!("ro {i}")))
        .collect();
    for body in &failed {
        assert_store_error(&post_activated(&server.url, body.clone()).await);
    }
    assert_eq!(counts(&server), before);
    assert!(metric(&server.url, "idempotency_store_errors_total").await >= 2.0);
    chattr("-i");
    recovered(&mut server, &failed, before).await;
}

/// A stream whose mission's completion meets a read-only file (one failed write) keeps trying,
/// as the mission's timer does, and ends with its completed task once the file is writable,
/// not with an error that would be its cached outcome.
#[tokio::test]
async fn a_stream_whose_completion_fails_once_ends_completed_once_it_commits() {
    let Some(fs) = SmallFs::mount("the stream completion test") else {
        return;
    };
    let db = fs.file("a2a.db");
    let server = ServerProcess::start_on(Some(path(&db)), &[], &[]);
    let body =
        crate::support::stream_request(1, &new_id(), "go", serde_json::json!({"durationMs": 1600}));
    let headers = [("A2A-Extensions", crate::support::URI)];
    let mut stream = crate::support::SseReply::open(&server.url, body.clone(), &headers).await;
    let started = std::time::Instant::now();
    stream.next_event().await.expect("the task");
    let halfway = stream
        .next_event()
        .await
        .expect("the working status at halfway");
    assert_eq!(halfway["result"]["status"]["state"], "working");
    let files = [path(&db).to_owned(), format!("{}-wal", path(&db))];
    let chattr = |flag: &str| {
        for file in &files {
            run(&["chattr", flag, file]).expect("chattr on ext4");
        }
    };
    chattr("+i");
    // Past the deadline: the completion has failed at least once.
    tokio::time::sleep(std::time::Duration::from_millis(2000).saturating_sub(started.elapsed()))
        .await;
    chattr("-i");
    let rest = stream.rest().await;
    let last = rest.last().unwrap_or_else(|| panic!("an end: {rest:?}"));
    assert_eq!(last["result"]["status"]["state"], "completed", "{rest:?}");
    assert_eq!(last["result"]["final"], true);
    let mut replay = crate::support::SseReply::open(&server.url, body, &headers).await;
    replay.rest().await;
    assert!(replay.replayed());
    assert_eq!(
        replay.raw(),
        stream.raw(),
        "the completed stream is what is cached"
    );
}

#[tokio::test]
async fn a_deleted_database_file_is_never_written_to_again() {
    let mut server = ServerProcess::start(&[]);
    let db = server.db().to_path_buf();
    post_activated(&server.url, send(1, &new_id(), "before")).await;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", db.display()));
    }
    // Anything committed now would be lost with the process: nothing is, nothing is answered.
    let after = send(1, &new_id(), "after");
    assert_store_error(&post_activated(&server.url, after.clone()).await);
    logged(&server, "was deleted or replaced").await;
    let series = "idempotency_store_errors_total{kind=\"commit\"}";
    assert_eq!(metric(&server.url, series).await, 1.0);
    // A restart serves a new file, where the unanswered call runs, once.
    let url = server.restart();
    let retry = post_activated(&url, after.clone()).await;
    assert!(retry.json()["result"].is_object(), "{}", retry.describe());
    assert!(post_activated(&url, after).await.replayed());
    assert_eq!(counts(&server).tasks, 1);
}

/// The same for the log or the shared-memory index alone (found by helper-75). A deleted log
/// took the calls answered after it, lost at the next crash, and a deleted index let
/// `idem-admin purge` write the log beside the server, which then started the log over beneath
/// the purge: reported done, it came back after a restart. Now nothing more is answered as
/// stored; what was answered before is kept (a log deleted alone is still copied back), and a
/// purge made meanwhile holds.
#[tokio::test]
async fn a_deleted_log_or_index_file_is_never_written_to_again() {
    for (suffix, graceful) in [("-wal", false), ("-shm", false), ("-shm", true)] {
        let mut server = ServerProcess::start(&[]);
        let db = server.db().to_path_buf();
        let before = send(1, &new_id(), "before");
        let answered = post_activated(&server.url, before.clone()).await;
        let purged_id = new_id();
        let purged = send(2, &purged_id, "to purge");
        assert!(post_activated(&server.url, purged.clone()).await.json()["result"].is_object());
        // Copied back (the checkpointer runs every 250 ms) before the file goes.
        tokio::time::sleep(std::time::Duration::from_millis(600)).await;
        std::fs::remove_file(format!("{}{suffix}", db.display())).unwrap();
        let after = send(3, &new_id(), "after");
        assert_store_error(&post_activated(&server.url, after.clone()).await);
        logged(&server, "was deleted or replaced").await;
        let db_arg = db.to_str().unwrap();
        let purge = crate::operations::admin(&["--db", db_arg, "purge", &purged_id, "--yes"], &[]);
        let said = String::from_utf8_lossy(&purge.stderr);
        assert!(purge.status.code() != Some(1), "{suffix}: {said}");
        tokio::time::sleep(std::time::Duration::from_millis(600)).await;
        // Killed, or stopped as an operator stops it (its last checkpoint started the log
        // over beneath the purge, with an index that did not see it), then served again.
        let (url, _next) = match graceful {
            false => (server.restart(), None),
            true => {
                assert!(server.terminate().success());
                let next = ServerProcess::start_on(Some(db_arg), &[], &[]);
                (next.url.clone(), Some(next))
            }
        };
        let again = post_activated(&url, before).await;
        assert!(
            again.replayed(),
            "{suffix} {graceful}: {}",
            again.describe()
        );
        assert_eq!(again.body, answered.body);
        let retry = post_activated(&url, after).await;
        assert!(
            !retry.replayed() && retry.json()["result"].is_object(),
            "{suffix} {graceful}"
        );
        let rerun = post_activated(&url, purged).await;
        let held = rerun.describe();
        assert!(
            !rerun.replayed(),
            "{suffix} {graceful}: the purge held: {held}"
        );
    }
}

/// A disk that stops answering (its file system frozen): a governed call is answered with the
/// store's error once the disk timeout has passed, not whenever the disk comes back, and its
/// key stays held while its writes may still commit, so that its retry gets 409 meanwhile and
/// never runs it again. Thawed, the writes land (and what waited for their commit runs), and
/// the retry replays them. An undeduplicated
/// call is answered in bounded time too (its writes land later, and its mission starts then),
/// and a replay that the memory tier holds as ever.
#[tokio::test]
async fn a_frozen_disk_fails_calls_in_bounded_time_and_no_retry_runs_them_again() {
    let Some(fs) = SmallFs::mount("the frozen-disk test") else {
        return;
    };
    let db = fs.file("a2a.db");
    let env = [
        ("AIWG_IDEMPOTENCY_DISK_TIMEOUT_MS", "1000"),
        ("AIWG_IDEMPOTENCY_IN_FLIGHT_WAIT_MS", "200"),
    ];
    let args = ["--idempotency", "optional"];
    let mut server = ServerProcess::start_on(Some(path(&db)), &args, &env);
    let in_memory = send(1, &new_id(), "stored and in the memory tier");
    let answered = post_activated(&server.url, in_memory.clone()).await;
    let before = counts(&server);

    let frozen = Frozen::freeze(&fs);
    let started = std::time::Instant::now();
    let call = send(2, &new_id(), "during the freeze");
    assert_store_error(&post_activated(&server.url, call.clone()).await);
    let undeduplicated = post(&server.url, send(3, &new_id(), "not deduplicated"), &[]).await;
    assert_store_error(&undeduplicated);
    let waited = started.elapsed();
    assert!(waited < std::time::Duration::from_secs(8), "{waited:?}");
    let retry = post_activated(&server.url, call.clone()).await;
    assert_eq!(retry.status, 409, "{}", retry.describe());
    let code = &retry.json()["error"]["data"]["code"];
    assert_eq!(code, "IDEMPOTENCY_REQUEST_IN_PROGRESS");
    let replay = post_activated(&server.url, in_memory).await;
    assert_eq!(
        replay.body, answered.body,
        "a replay from memory needs no disk"
    );
    logged(&server, "no answer from the database file in 1000 ms").await;

    drop(frozen);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let landed = loop {
        let retry = post_activated(&server.url, call.clone()).await;
        if retry.status != 409 || std::time::Instant::now() > deadline {
            break retry;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert!(landed.replayed(), "{}", landed.describe());
    assert!(landed.json()["result"].is_object(), "{}", landed.describe());
    // The call's after-commit hook ran once its writes landed: its mission started, and the
    // task completes without a restart.
    let task = landed.json()["result"]["id"].as_str().unwrap().to_owned();
    until_completed(&server.url, &task, std::time::Duration::from_secs(20)).await;
    // Both calls' writes land once the disk answers (the second may commit a batch later):
    // the governed one ran once, and the undeduplicated one, answered with an error, committed
    // as a lost answer would have.
    let expected = Counts {
        tasks: before.tasks + 2,
        assigned: before.assigned + 2,
    };
    while counts(&server) != expected && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(counts(&server), expected);
    // The undeduplicated call's hook ran too, though it was answered with an error: its
    // mission completes in this process, with no restart to resume it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while working(&server) > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "a mission never started"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let url = server.restart();
    let replay = post_activated(&url, call).await;
    assert_eq!(replay.body, landed.body, "durable, byte for byte");
    assert_eq!(counts(&server), expected);
}
