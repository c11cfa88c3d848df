//! The conformance harness's command line (crate `idem-conformance`), also as an example of the
//! facade, so that `cargo test` builds it for the tests that run it:
//! `cargo run --example conformance -- --url http://127.0.0.1:8080`.

fn main() -> std::process::ExitCode {
    idem_conformance::cli::main()
}
