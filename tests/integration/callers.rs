//! Who calls: keys scoped by the authenticated principal an application's auth layer puts in
//! the request's extensions, and the §7.4 option that hides the replay header from callers
//! marked unauthenticated. Through a real jsonrpsee server whose stand-in auth layer reads the
//! principal from a header (`support::PRINCIPAL_HEADER`).

use idem::IdempotencyConfig;

use crate::support::*;

fn as_caller(principal: &str) -> Vec<(&'static str, String)> {
    vec![
        ("A2A-Extensions", URI.to_owned()),
        (PRINCIPAL_HEADER, principal.to_owned()),
    ]
}

async fn post_as(url: &str, principal: &str, body: String) -> Reply {
    let headers = as_caller(principal);
    let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
    post(url, body, &headers).await
}

fn scoped() -> IdempotencyConfig {
    IdempotencyConfig::default().with(|c| c.scope_keys_by_principal = true)
}

#[tokio::test]
async fn one_message_id_from_two_principals_is_two_keys_that_never_meet() {
    let db = Db::new();
    let server = db.server(scoped()).await;
    let mid = new_id();
    let (alice_send, bob_send) = (send(1, &mid, "alpha"), send(1, &mid, "beta"));

    let alice = post_as(&server.url, "alice", alice_send.clone()).await;
    assert_eq!(alice.status, 200);
    // Bob's different payload under Alice's messageId is not her 422: it is his own call.
    let bob = post_as(&server.url, "bob", bob_send.clone()).await;
    assert_eq!(bob.status, 200, "{}", bob.describe());
    assert!(!bob.replayed());
    assert_eq!(server.executions(), 2);

    // Alice's very bytes from Bob: his key holds his own entry, so this is a 422 against his
    // payload, and the hashes it reports are his, never hers.
    let probe = post_as(&server.url, "bob", alice_send.clone()).await;
    assert_eq!(probe.status, 422);
    let data = &probe.json()["error"]["data"];
    let hash = |body: &str| idem_conformance::request_hash::request_hash(body).unwrap();
    assert_eq!(data["original_request_hash"], hash(&bob_send));
    assert_eq!(
        data["message_id"],
        mid.as_str(),
        "the client's messageId, unscoped"
    );
    assert_ne!(data["original_request_hash"], hash(&alice_send));

    // Each replays their own answer; nothing ran again.
    let again = post_as(&server.url, "alice", alice_send.clone()).await;
    assert!(again.replayed());
    assert_eq!(again.body, alice.body);
    let again = post_as(&server.url, "bob", bob_send).await;
    assert_eq!(again.body, bob.body);
    assert_eq!(server.executions(), 2);

    // Callers without a principal share the spec's global key space, apart from both.
    let anonymous = post_as(&server.url, "-", send(1, &mid, "gamma")).await;
    assert_eq!(anonymous.status, 200);
    assert!(!anonymous.replayed());
    assert_eq!(server.executions(), 3);
}

/// With keys scoped, a request that reaches the extension without any `Caller` (an auth layer
/// installed after the HTTP layer, or none) is refused for governed methods, its resend too:
/// in the global keys it would replay or collide with every other such caller's entries.
/// Other methods are served.
#[tokio::test]
async fn with_keys_scoped_a_governed_call_without_a_caller_is_refused() {
    let db = Db::new();
    let server = db.server(scoped()).await;
    let mid = new_id();
    let body = send(1, &mid, "alpha");
    let anonymous = post_as(&server.url, "-", body.clone()).await;
    assert_eq!(anonymous.status, 200, "{}", anonymous.describe());
    for _ in 0..2 {
        let refused = post_activated(&server.url, body.clone()).await;
        let error = &refused.json()["error"];
        assert_eq!(
            error["data"]["code"], "IDEMPOTENCY_LAYER_MISSING",
            "{error}"
        );
        assert!(error["data"]["reason"]
            .as_str()
            .unwrap()
            .contains("without a Caller"));
        assert!(!refused.replayed());
    }
    assert_eq!(server.executions(), 1);
    let other = r#"{"jsonrpc":"2.0","id":1,"method":"tasks/get"}"#;
    let served = post_activated(&server.url, other).await;
    assert!(
        served.json().get("result").is_some(),
        "{}",
        served.describe()
    );
}

#[tokio::test]
async fn by_default_keys_are_global_as_the_spec_says() {
    let db = Db::new();
    let server = db.server(IdempotencyConfig::default()).await;
    let mid = new_id();
    let alice = post_as(&server.url, "alice", send(1, &mid, "alpha")).await;
    let bob = post_as(&server.url, "bob", send(1, &mid, "alpha")).await;
    assert!(
        bob.replayed(),
        "one key space: Bob's identical call is a replay"
    );
    assert_eq!(bob.body, alice.body);
    let other = post_as(&server.url, "bob", send(1, &mid, "beta")).await;
    assert_eq!(other.status, 422);
    assert_eq!(server.executions(), 1);
}

#[tokio::test]
async fn replays_to_callers_marked_unauthenticated_can_go_unmarked() {
    let db = Db::new();
    let config = IdempotencyConfig::default().with(|c| c.mark_replays_to_unauthenticated = false);
    let server = db.server(config).await;
    let mid = new_id();
    let first = post_as(&server.url, "-", send(1, &mid, "x")).await;
    // The same bytes (a retry by key, then the HTTP layer's resend path) and another id.
    for body in [send(1, &mid, "x"), send(1, &mid, "x"), send(2, &mid, "x")] {
        let replay = post_as(&server.url, "-", body).await;
        assert_eq!(replay.status, 200);
        assert!(
            !replay.replayed(),
            "no Idempotent-Replayed: {}",
            replay.describe()
        );
        assert_eq!(replay.json()["result"], first.json()["result"]);
    }
    assert_eq!(server.executions(), 1, "still deduplicated");
    // An authenticated caller, or one the application did not mark, still sees the header.
    assert!(post_as(&server.url, "alice", send(1, &mid, "x"))
        .await
        .replayed());
    assert!(post_activated(&server.url, send(1, &mid, "x"))
        .await
        .replayed());
}

#[tokio::test]
async fn the_admin_tool_finds_a_principal_s_key() {
    use crate::operations::{admin, stdout};
    let db = Db::new();
    let server = db.server(scoped()).await;
    let mid = new_id();
    let body = send(1, &mid, "alpha");
    post_as(&server.url, "alice", body.clone()).await;
    let path = db.path.display().to_string();
    let show = admin(&["--db", &path, "show", &mid, "--principal", "alice"], &[]);
    assert!(show.status.success(), "{show:?}");
    let hash = idem_conformance::request_hash::request_hash(&body).unwrap();
    assert!(stdout(&show).contains(&hash), "{}", stdout(&show));
    assert!(
        !stdout(&show).contains("alice"),
        "the principal is not stored"
    );
    let unscoped = admin(&["--db", &path, "show", &mid], &[]);
    assert_eq!(unscoped.status.code(), Some(1), "no global entry for it");
    let bob = admin(&["--db", &path, "show", &mid, "--principal", "bob"], &[]);
    assert_eq!(bob.status.code(), Some(1));
    // Named exactly, as the runtime keys it; spaces at its ends, which a server that trims
    // its header never keeps, are pointed out (found by helper-45: ` alice ` found nothing,
    // and said nothing of why).
    let padded = ["--db", &path, "show", &mid, "--principal", " alice "];
    let padded = admin(&padded, &[]);
    assert_eq!(padded.status.code(), Some(1));
    let said = String::from_utf8_lossy(&padded.stderr);
    assert!(said.contains("has spaces at its ends"), "{said}");
}
