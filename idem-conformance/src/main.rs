//! `conformance --url http://HOST:PORT [--restart-cmd CMD] [--db PATH|URL]`: see `cli.rs`.

fn main() -> std::process::ExitCode {
    idem_conformance::cli::main()
}
