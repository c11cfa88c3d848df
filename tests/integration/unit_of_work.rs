//! The unit of work through a real server: a call's staged writes commit with its cache entry
//! or not at all, a failing write fails its own call only (uncached, the retry runs), and a
//! call that is not deduplicated still commits its writes, on its own.

use idem::IdempotencyConfig;
use serde_json::{json, Value};

use crate::support::*;

fn with_effect(id: u64, message_id: &str, text: &str, effect: &str) -> String {
    send_with(
        id,
        "message/send",
        message_id,
        text,
        json!({"effect": effect}),
    )
}

/// Runs `sql` with `name` on the test agent's table beside the server, as another writer would.
async fn change_effects(server: &TestServer, sql: &'static str, name: &str) {
    let name = name.to_owned();
    let db = server.idem.database().unwrap();
    db.transact(move |db| db.execute(sql, [name]))
        .await
        .unwrap();
}

async fn insert_effect(server: &TestServer, name: &str) {
    change_effects(server, "INSERT INTO effects (name) VALUES (?1)", name).await;
}

async fn delete_effect(server: &TestServer, name: &str) {
    change_effects(server, "DELETE FROM effects WHERE name = ?1", name).await;
}

#[tokio::test]
async fn a_failing_staged_write_commits_nothing_caches_nothing_and_the_retry_runs() {
    let db = Db::new();
    let server = db.server(IdempotencyConfig::default()).await;
    insert_effect(&server, "taken").await;
    let mid = new_id();
    let body = with_effect(1, &mid, "go", "taken");

    let failed = post_activated(&server.url, body.clone()).await;
    assert_eq!(failed.status, 200);
    assert_eq!(failed.error_code(), -32603);
    assert_eq!(failed.data_code(), "IDEMPOTENCY_WRITE_FAILED");
    assert!(!failed.replayed());
    assert!(
        db.row(&mid).is_none(),
        "a failed unit of work is not cached"
    );
    assert_eq!(
        db.effects(),
        ["taken"],
        "the first staged row was rolled back too"
    );

    delete_effect(&server, "taken").await;
    let retried = post_activated(&server.url, body.clone()).await;
    assert_eq!(
        retried.json()["result"]["execution"],
        2,
        "the retry executed"
    );
    assert!(!retried.replayed());
    assert_eq!(db.effects(), ["before:taken", "taken"]);
    assert!(db.row(&mid).is_some());

    let replay = post_activated(&server.url, body).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, retried.body);
    assert_eq!(server.executions(), 2);
    assert_eq!(
        db.effects(),
        ["before:taken", "taken"],
        "a replay writes nothing"
    );
}

#[tokio::test]
async fn one_failing_call_in_a_batch_leaves_the_others_committed() {
    let db = Db::new();
    let server = db.server(IdempotencyConfig::default()).await;
    insert_effect(&server, "b").await;
    let ids = [new_id(), new_id(), new_id()];
    let calls: Vec<Value> = ids
        .iter()
        .zip(["a", "b", "c"])
        .enumerate()
        .map(|(n, (mid, effect))| {
            serde_json::from_str(&with_effect(n as u64, mid, "go", effect)).unwrap()
        })
        .collect();
    let reply = post_activated(&server.url, Value::Array(calls).to_string()).await;
    assert_eq!(reply.status, 200);
    let answers = reply.json();
    let by_id = |id: u64| reply.batch_answer(id);
    assert!(by_id(0)["result"].is_object(), "{answers}");
    assert_eq!(
        by_id(1)["error"]["data"]["code"],
        "IDEMPOTENCY_WRITE_FAILED"
    );
    assert!(by_id(2)["result"].is_object(), "{answers}");
    assert_eq!(db.effects(), ["a", "b", "before:a", "before:c", "c"]);
    assert!(db.row(&ids[0]).is_some() && db.row(&ids[2]).is_some());
    assert!(db.row(&ids[1]).is_none());
}

#[tokio::test]
async fn an_error_from_the_body_is_cached_and_its_staged_writes_are_discarded() {
    let db = Db::new();
    let server = db.server(IdempotencyConfig::default()).await;
    let mid = new_id();
    let body = with_effect(1, &mid, "fail", "never");
    let first = post_activated(&server.url, body.clone()).await;
    assert_eq!(first.error_code(), -32000);
    assert!(db.effects().is_empty(), "an Err discards the unit of work");
    let replay = post_activated(&server.url, body).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, first.body);
}

/// A failing call's staged write, discarded with its error, had captured a value whose
/// `Drop` panics: the panic unwound through the guard, and the call went unanswered and
/// uncached, to run again at its retry (found by helper-86).
#[tokio::test]
async fn a_discarded_write_whose_capture_panics_on_drop_leaves_the_error_cached() {
    let db = Db::new();
    let server = db.server(IdempotencyConfig::default()).await;
    let metadata = json!({"stagePanicsOnDrop": true});
    let body = send_with(1, "message/send", &new_id(), "fail", metadata);
    let first = post_activated(&server.url, body.clone()).await;
    assert_eq!(first.error_code(), -32000);
    let replay = post_activated(&server.url, body).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, first.body);
    assert_eq!(server.executions(), 1);
}

#[tokio::test]
async fn calls_that_are_not_deduplicated_commit_their_writes_on_their_own() {
    let db = Db::new();
    let optional = IdempotencyConfig::default().with(|c| c.required = false);
    let server = db.server(optional).await;
    let mid = new_id();
    let ok = post(&server.url, with_effect(1, &mid, "go", "free"), &[]).await;
    assert!(ok.json()["result"].is_object(), "{}", ok.json());
    assert_eq!(db.effects(), ["before:free", "free"]);
    assert!(db.row(&mid).is_none(), "not deduplicated, not cached");

    let refused = post(&server.url, with_effect(2, &new_id(), "go", "free"), &[]).await;
    assert_eq!(refused.data_code(), "IDEMPOTENCY_WRITE_FAILED");
    assert_eq!(db.effects(), ["before:free", "free"]);
}

/// Under `Idempotency::off()` there is no database, so no unit of work: asking for one is
/// refused with a reason that says so, not only that the layers are missing, which they are
/// not (helper-112).
#[tokio::test]
async fn under_off_a_unit_of_work_is_refused_saying_there_is_no_database() {
    let (agent, executions) = Agent::counting();
    let server = TestServer::serve_on(idem::Idempotency::off(), agent.into_rpc(), executions);
    let server = server.await;
    let refused = post(&server.url, with_effect(1, &new_id(), "go", "off"), &[]).await;
    assert_eq!(
        refused.data_code(),
        "IDEMPOTENCY_LAYER_MISSING",
        "{}",
        refused.describe()
    );
    let reason = refused.json()["error"]["data"]["reason"].to_string();
    assert!(
        reason.contains("no database (Idempotency::off)"),
        "{reason}"
    );
    let plain = post(
        &server.url,
        send(2, &new_id(), "no unit of work asked for"),
        &[],
    )
    .await;
    assert!(plain.json()["result"].is_object(), "{}", plain.describe());
}

/// A call that is not deduplicated commits its writes only with an answer the client gets:
/// one too large for jsonrpsee to send, or a panic, was answered with an error after its
/// writes committed, and a client's retry wrote them again (found by helper-80).
#[tokio::test]
async fn a_call_that_is_not_deduplicated_and_fails_to_answer_commits_nothing() {
    let db = Db::new();
    let small = IdempotencyConfig::default().with(|c| {
        c.required = false;
        c.max_response_body_bytes = 2048;
    });
    let server = db.server(small).await;
    let big = "x".repeat(4096);
    let too_large = post(&server.url, with_effect(1, &new_id(), &big, "big"), &[]).await;
    assert_eq!(too_large.data_code(), "IDEMPOTENCY_RESPONSE_TOO_LARGE");
    assert_eq!(too_large.json()["error"]["data"]["limit_bytes"], 2048);
    let panicked = post(&server.url, with_effect(2, &new_id(), "panic", "p"), &[]).await;
    assert_eq!(panicked.data_code(), "IDEMPOTENCY_EXECUTION_PANICKED");
    assert_eq!(db.effects(), Vec::<String>::new(), "nothing was written");
    let fits = post(&server.url, with_effect(3, &new_id(), "go", "fits"), &[]).await;
    assert_eq!(fits.json()["result"]["echo"], "go", "{}", fits.describe());
    assert_eq!(db.effects(), ["before:fits", "fits"]);
}

/// The staged writes and the entry are one transaction, not two in a row: with the entry's
/// insert refused (a trigger beside the server), the writes that went before it are not
/// committed either. A store that committed them first, then the entry, passed every test
/// here, caught by the crash soak alone (found by helper-81).
#[tokio::test]
async fn the_staged_writes_and_the_entry_commit_in_one_transaction() {
    let db = Db::new();
    let server = db.server(IdempotencyConfig::default()).await;
    let mid = new_id();
    let refuse = format!(
        "CREATE TRIGGER refuse_entry BEFORE INSERT ON idempotency_cache
         WHEN NEW.message_id = '{mid}' BEGIN SELECT RAISE(ABORT, 'refused'); END"
    );
    let store = server.idem.database().unwrap();
    store
        .transact(move |db| db.execute_batch(&refuse))
        .await
        .unwrap();
    let body = with_effect(1, &mid, "go", "one");
    let failed = post_activated(&server.url, body.clone()).await;
    assert!(failed.json()["error"].is_object(), "{}", failed.describe());
    assert!(!failed.replayed());
    assert_eq!(
        db.effects(),
        Vec::<String>::new(),
        "no write without its entry"
    );
    assert!(db.row(&mid).is_none());

    let drop_trigger = |db: &rusqlite::Connection| db.execute_batch("DROP TRIGGER refuse_entry");
    store.transact(drop_trigger).await.unwrap();
    let retried = post_activated(&server.url, body).await;
    assert!(
        retried.json()["result"].is_object(),
        "{}",
        retried.describe()
    );
    assert_eq!(db.effects(), ["before:one", "one"]);
    assert!(db.row(&mid).is_some());
}
