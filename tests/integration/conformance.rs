//! The conformance harness (`examples/conformance`) against the example A2A server running as a
//! real child process: one test per scenario, each with its own process and SQLite file, with
//! side effects counted in that file. Also the harness's command line, end to end.
//!
//! The tests run the built example binaries: `cargo test` builds the examples first, but
//! `cargo test --test integration` alone does not (`cargo build --examples` before it).

#[path = "../../examples/conformance/harness.rs"]
pub mod harness;
#[path = "../../examples/conformance/server_process.rs"]
pub mod server_process;

use std::process::Command;

use futures::FutureExt;
use harness::{check, Outcome, Restart, Scenario, Target};
use server_process::{example_binary, ServerProcess, SHORT_TTL};

/// Runs `scenario` against a fresh server started with `env`; it must pass (not be skipped).
async fn passes(scenario: Scenario, env: &[(&str, &str)]) {
    let server = ServerProcess::start(env);
    let outcome = check(scenario, &target(&server), None).await;
    assert_eq!(outcome, Outcome::Pass, "{}", scenario.name());
}

fn target(server: &ServerProcess) -> Target {
    Target::new(&server.url, Some(server.db().to_owned()))
}

#[tokio::test]
async fn agent_card_declares_the_extension() {
    passes(Scenario::AgentCard, &[]).await;
}

#[tokio::test]
async fn ac1_identical_retry_is_replayed() {
    passes(Scenario::Ac1, &[]).await;
}

#[tokio::test]
async fn ac2_other_payload_is_422() {
    passes(Scenario::Ac2, &[]).await;
}

#[tokio::test]
async fn ac3_past_the_ttl_the_request_is_new() {
    passes(Scenario::Ac3, SHORT_TTL).await;
}

#[tokio::test]
async fn ac4_cache_survives_sigkill_and_restart() {
    let mut server = ServerProcess::start(&[]);
    let target = target(&server);
    let process = &mut server;
    let restart: Restart = Box::new(move || async move { Ok(process.restart()) }.boxed());
    let outcome = check(Scenario::Ac4, &target, Some(restart)).await;
    assert_eq!(outcome, Outcome::Pass);
}

#[tokio::test]
async fn malformed_message_ids_are_400() {
    passes(Scenario::MalformedMessageId, &[]).await;
}

#[tokio::test]
async fn not_activated_is_refused() {
    passes(Scenario::NotActivated, &[]).await;
}

#[tokio::test]
async fn concurrent_duplicates_execute_once() {
    passes(Scenario::ConcurrentDuplicates, &[]).await;
}

#[test]
fn scenario_names_are_unique_and_namespaced() {
    let mut names: Vec<&str> = Scenario::ALL.iter().map(|s| s.name()).collect();
    assert!(names.iter().all(|n| n.starts_with("idempotency-v1-")));
    names.sort();
    names.dedup();
    assert_eq!(names.len(), Scenario::ALL.len());
}

/// The CLI on the default TTL without a restart command: AC-3 and AC-4 are skipped, the rest pass.
#[test]
fn cli_reports_each_scenario_and_exits_zero() {
    let server = ServerProcess::start(&[]);
    let output = run_cli(&["--url", &server.url, "--db", server.db().to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    for scenario in Scenario::ALL {
        let expected = match scenario {
            Scenario::Ac3 | Scenario::Ac4 => format!("SKIP {}: ", scenario.name()),
            _ => format!("PASS {}\n", scenario.name()),
        };
        assert!(stdout.contains(&expected), "{expected:?} in:\n{stdout}");
    }
    assert!(
        stdout.ends_with("6 passed, 0 failed, 2 skipped\n"),
        "{stdout}"
    );
}

#[test]
fn cli_exits_non_zero_when_scenarios_fail() {
    // A port that was free a moment ago: nothing answers, every scenario fails on the AgentCard.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port();
    let output = run_cli(&["--url", &format!("http://127.0.0.1:{port}")]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("FAIL idempotency-v1-ac1: AgentCard: "),
        "{stdout}"
    );
    assert!(stdout.ends_with("0 passed, 8 failed\n"), "{stdout}");
}

fn run_cli(args: &[&str]) -> std::process::Output {
    Command::new(example_binary("conformance"))
        .args(args)
        .output()
        .expect("run the conformance example")
}
