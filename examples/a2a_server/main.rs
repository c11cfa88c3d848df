//! An A2A agent on jsonrpsee whose sends are deduplicated by the idempotency/v1 extension.
//!
//! ```sh
//! cargo run --release --example a2a_server -- --listen 127.0.0.1:8080 --db ./a2a-example.db
//! ```
//!
//! One database holds the idempotency cache, the tasks and the mission outbox: a SQLite file,
//! or with `--db postgres://...` a PostgreSQL database that several replicas share. Prints
//! `listening on http://ADDR` once it serves; stops cleanly on SIGTERM or Ctrl-C. A bad flag,
//! bad environment or unusable database or address exits with status 2.

mod agent;
mod body_timeout;
mod card;
mod cli;
mod clock;
mod errors;
mod front;
mod metrics;
mod mission;
mod model;
mod principal;
mod push;
mod relay;
mod retention;
mod shapes;
mod task_locks;
mod tasks;
mod version;

use std::io::{IsTerminal, Write};
use std::net::SocketAddr;
use std::process::ExitCode;

use idem::{Idempotency, IdempotencyConfig};
use jsonrpsee::server::middleware::rpc::RpcServiceBuilder;
use jsonrpsee::server::{Server, ServerHandle};
use mimalloc::MiMalloc;
use tokio::signal::unix::{signal, Signal, SignalKind};
use tower::ServiceBuilder;
use tracing_subscriber::EnvFilter;

use crate::agent::{A2aServer, Agent};
use crate::body_timeout::BodyTimeoutLayer;
use crate::card::agent_card;
use crate::cli::{Cli, Command, Db, Mode};
use crate::front::FrontLayer;
use crate::mission::Missions;
use crate::push::PushConfigs;
use crate::tasks::TaskStore;

/// A server's allocations are many and short-lived, made on one thread and freed on another
/// (a call's writes are built on a worker and dropped by the store's writer): glibc's
/// allocator spent a fifth of a fresh call's CPU on them, mimalloc a fraction of that.
#[global_allocator]
static ALLOCATOR: MiMalloc = MiMalloc;

/// Exit status of a usage or startup error.
const STARTUP_ERROR: u8 = 2;

#[tokio::main]
async fn main() -> ExitCode {
    if let Err(error) = init_logging() {
        eprintln!("a2a_server: {error}");
        return ExitCode::from(STARTUP_ERROR);
    }
    let cli = match cli::utf8(std::env::args_os().skip(1)).and_then(cli::parse) {
        Ok(Command::Serve(cli)) => cli,
        Ok(Command::Help) => {
            print!("{}", cli::USAGE);
            return ExitCode::SUCCESS;
        }
        Err(error) => {
            eprintln!("a2a_server: {error}\n\n{}", cli::USAGE);
            return ExitCode::from(STARTUP_ERROR);
        }
    };
    match serve(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("a2a_server: {error}");
            ExitCode::from(STARTUP_ERROR)
        }
    }
}

/// Logs go to stderr so that stdout carries only the `listening on` line. `info` unless
/// `RUST_LOG` says otherwise; a `RUST_LOG` that does not parse is refused, not read as `info`
/// without a word (helper-121).
fn init_logging() -> Result<(), String> {
    let filter = match std::env::var_os(EnvFilter::DEFAULT_ENV) {
        None => EnvFilter::new("info"),
        Some(_) => EnvFilter::try_from_default_env().map_err(|e| format!("RUST_LOG: {e}"))?,
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    Ok(())
}

/// Starts the server, runs it until a signal, and stops it. Errors are startup errors.
async fn serve(cli: Cli) -> Result<(), String> {
    // The address first: a server that cannot listen leaves no database file behind. Clients
    // that connect while the store opens wait in the listen queue until it serves.
    let listener = tokio::net::TcpListener::bind(cli.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", cli.listen))?;
    // The recorder next: the store reports its size as it opens.
    let metrics = metrics::install()?;
    // Then the idempotency store creates the database file, with mode 0600, and locks it.
    let idem = idempotency(&cli).await?;
    let database = idem.database().expect("every mode opens the store");
    let store = TaskStore::open(database)
        .await
        .map_err(|e| format!("cannot open tables in {}: {e}", cli.db))?;
    let missions = Missions::new(store.clone());
    let push = PushConfigs::new(store.clone());
    let resumed = missions.resume().await.map_err(|e| {
        let why = e.message();
        format!(
            "cannot read the tasks in {}: {why} (the log says why)",
            cli.db
        )
    })?;
    if store.shared() {
        missions.sweep_overdue();
    }
    let mut signals = Signals::new()?;
    retention::spawn(store.clone(), cli.outbox_retention);
    relay::spawn(store, push.clone(), cli.outbox_give_up);
    let agent = Agent::new(missions, push);
    let (handle, addr) = start(listener, &cli, &idem, agent, metrics).await?;
    tracing::info!(%addr, db = %cli.db, mode = ?cli.mode, resumed, "serving");
    announce(addr)?;
    signals.recv().await;
    tracing::info!("shutting down");
    let deadline = tokio::time::Instant::now() + cli.shutdown_grace;
    stop(handle, deadline).await;
    // Streams whose clients left run on after the server stopped: let them finish and store.
    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
    if !idem.quiesce(left).await {
        tracing::warn!("executions still running at shutdown were not stored");
    }
    // The last handle on the cache: dropping it commits what is queued and joins the writer.
    drop(idem);
    Ok(())
}

/// The extension as the mode asks, configured by `AIWG_IDEMPOTENCY_*` (checked in every mode:
/// a malformed value is a mistake even where it has no effect). Every mode opens the store:
/// its writer commits the tasks, deduplicated or not.
async fn idempotency(cli: &Cli) -> Result<Idempotency, String> {
    let config = IdempotencyConfig::from_env().map_err(|e| e.to_string())?;
    let required = !matches!(cli.mode, Mode::Optional);
    let scoped = cli.principal_header.is_some();
    let builder = Idempotency::builder(config.with(|c| {
        c.required = required;
        c.scope_keys_by_principal = scoped;
        c.max_requests_in_flight = cli.max_in_flight;
    }));
    let builder = match cli.mode {
        Mode::Off => builder.without_deduplication(),
        Mode::Required | Mode::Optional => builder,
    };
    let idem = match &cli.db {
        Db::File(path) => builder.sqlite(path),
        Db::Postgres(url) => builder.postgres(url).await,
    };
    idem.map_err(|e| format!("cannot open database {}: {e}", cli.db))
}

/// The URL the card names: `--public-url`, or the address bound. A wildcard address is no
/// place a client can reach (found by helper-77: the card named `http://0.0.0.0:PORT/`).
fn card_url(cli: &Cli, bound: SocketAddr) -> String {
    if let Some(url) = &cli.public_url {
        return url.clone();
    }
    if bound.ip().is_unspecified() {
        tracing::warn!(%bound, "the agent card names a wildcard address, which clients cannot \
            call: pass --public-url with the URL they reach this agent at");
    }
    format!("http://{bound}/")
}

/// Serves on `listener`, bound first because the card must name the address actually bound
/// (`--listen :0`).
async fn start(
    listener: tokio::net::TcpListener,
    cli: &Cli,
    idem: &Idempotency,
    agent: Agent,
    metrics: metrics_exporter_prometheus::PrometheusHandle,
) -> Result<(ServerHandle, SocketAddr), String> {
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let listener = listener.into_std().map_err(|e| e.to_string())?;
    let card = agent_card(
        &card_url(cli, addr),
        idem.agent_card_extension().into_iter().collect(),
    );
    // jsonrpsee cuts at the sizes the extension does, so what it stores is what is sent, and
    // counts the requests in flight it does (`--max-in-flight`).
    let config = idem.server_config().build();
    let server = Server::builder()
        .set_config(config)
        .set_http_middleware(
            ServiceBuilder::new()
                .layer(BodyTimeoutLayer {
                    idle: cli.body_timeout,
                })
                .layer(FrontLayer::new(
                    &card,
                    metrics,
                    idem.http_layer(),
                    usize::try_from(idem.config().max_request_body_bytes).unwrap_or(usize::MAX),
                ))
                .layer(principal::layer(cli.principal_header.clone()))
                .layer(idem.http_layer()),
        )
        .set_rpc_middleware(RpcServiceBuilder::new().layer(idem.rpc_layer()))
        .build_from_tcp(listener)
        .map_err(|e| format!("cannot serve on {addr}: {e}"))?;
    Ok((server.start(agent.into_rpc()), addr))
}

/// The one line on stdout that tells a parent process the server is up, and where.
fn announce(addr: SocketAddr) -> Result<(), String> {
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "listening on http://{addr}")
        .and_then(|()| stdout.flush())
        .map_err(|e| format!("cannot write to stdout: {e}"))
}

/// Stops accepting, then waits until every in-flight call has answered (and so was stored),
/// until `deadline`: a client that never finishes its request (a body that never comes) would
/// hold its connection, and the stop, open for ever.
async fn stop(handle: ServerHandle, deadline: tokio::time::Instant) {
    if handle.stop().is_err() {
        return;
    }
    if tokio::time::timeout_at(deadline, handle.stopped())
        .await
        .is_err()
    {
        tracing::warn!("connections still open at the end of the shutdown grace are closed");
    }
}

/// SIGTERM and Ctrl-C, installed before the server announces itself so that neither is missed.
struct Signals {
    terminate: Signal,
    interrupt: Signal,
}

impl Signals {
    fn new() -> Result<Self, String> {
        let install =
            |kind| signal(kind).map_err(|e| format!("cannot install signal handler: {e}"));
        Ok(Self {
            terminate: install(SignalKind::terminate())?,
            interrupt: install(SignalKind::interrupt())?,
        })
    }

    async fn recv(&mut self) {
        tokio::select! {
            _ = self.terminate.recv() => tracing::info!("SIGTERM"),
            _ = self.interrupt.recv() => tracing::info!("SIGINT"),
        }
    }
}
