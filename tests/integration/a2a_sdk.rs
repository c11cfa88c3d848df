//! Interop with the official A2A Python SDK (`a2a-sdk` 1.3.0): its A2A 1.0 JSON-RPC client and
//! its 0.3 compatibility client against the example server as a real child process
//! (`tests/interop/a2a_sdk_client.py` has the checks).
//!
//! `tests/interop/setup.sh` makes the venv on first use (needs PyPI; later runs are a no-op);
//! `IDEM_VENV` chooses where it lives. The example server must be built: `cargo test` builds
//! the examples, `cargo test --test integration` alone does not (`cargo build --example a2a_server`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

use idem_conformance::server_process::ServerProcess;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn show(output: &Output) -> String {
    format!(
        "exit status: {}\n--- stdout\n{}\n--- stderr\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Runs `setup.sh` and returns the venv's python (the last line it prints).
fn venv_python() -> PathBuf {
    let output = Command::new("bash")
        .arg(repo().join("tests/interop/setup.sh"))
        .output()
        .expect("run bash tests/interop/setup.sh");
    assert!(
        output.status.success(),
        "tests/interop/setup.sh failed\n{}",
        show(&output)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let python = PathBuf::from(stdout.lines().last().unwrap_or_default().trim());
    assert!(
        python.is_file(),
        "setup.sh did not print the venv's python\n{}",
        show(&output)
    );
    python
}

#[test]
fn official_python_sdk_sends_replays_gets_and_streams() {
    let started = Instant::now();
    let python = venv_python();
    let server = ServerProcess::start(&[]);
    let output = Command::new(&python)
        .arg(repo().join("tests/interop/a2a_sdk_client.py"))
        .arg(&server.url)
        .current_dir(repo().join("tests/interop"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("run the venv's python");
    drop(server);
    assert!(
        output.status.success(),
        "the a2a-sdk interop script failed against the example server\n{}",
        show(&output)
    );
    println!(
        "{}\n(total {:.1}s)",
        String::from_utf8_lossy(&output.stdout),
        started.elapsed().as_secs_f64()
    );
}
