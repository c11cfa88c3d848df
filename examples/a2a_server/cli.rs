//! Command-line flags.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

pub const USAGE: &str = "\
usage: a2a_server [--listen ADDR] [--public-url URL] [--db PATH|URL]
                  [--idempotency required|optional|off]
                  [--max-in-flight N] [--body-timeout SECONDS] [--shutdown-grace SECONDS]
                  [--principal-header NAME] [--outbox-retention SECONDS]
                  [--outbox-give-up SECONDS]

  --listen ADDR          address to serve on (default 127.0.0.1:8080; port 0 picks a free one)
  --public-url URL       the URL the agent card names (default http:// and the address
                         bound): where clients reach this agent, behind a proxy or a load
                         balancer, or when listening on 0.0.0.0
  --db PATH|URL          where tasks, outbox and idempotency cache live: a SQLite file
                         (default ./a2a-example.db), or a PostgreSQL database
                         (postgres://user@host:port/db) that several replicas may share
  --idempotency MODE     required: governed calls must activate idempotency/v1 (default)
                         optional: calls that do not activate it run undeduplicated
                         off:      the agent without the extension
  --max-in-flight N      HTTP requests served at once (default 4096); one more is answered
                         429 at once (a durable call is in flight until its group commit
                         is done)
  --body-timeout S       how long a request's body may send nothing (default 30, as
                         for its headers): then the request fails and its connection closes
  --shutdown-grace S     how long SIGTERM waits for calls in flight (default 75; a blocking
                         send runs its mission, 60 s at most, and its delayMs, 10 s at
                         most): then the connections still open (a client that never
                         finished its request) are closed and the process exits
  --principal-header H   scope idempotency keys by caller: the value of request header H
                         names the caller (a request without it shares the global keys).
                         This agent authenticates nobody: set it only behind a proxy that
                         authenticates callers and sets H itself
  --outbox-retention S   how long delivered outbox events are kept before they are
                         deleted (default 86400, a day)
  --outbox-give-up S     how long an outbox event whose delivery keeps failing is retried,
                         in the backoff waited between its attempts (default 86400, a day:
                         17,285 attempts; time the agent was down does not count): then it
                         is given up, logged and counted in a2a_outbox_abandoned_total

environment: AIWG_IDEMPOTENCY_TTL (seconds), AIWG_IDEMPOTENCY_MAX_ENTRIES,
             AIWG_IDEMPOTENCY_CLAIM_LEASE_MS, AIWG_IDEMPOTENCY_SWEEP_INTERVAL_MS,
             AIWG_IDEMPOTENCY_IN_FLIGHT_WAIT_MS, AIWG_IDEMPOTENCY_DISK_TIMEOUT_MS
             (milliseconds),
             AIWG_IDEMPOTENCY_MEMORY_TIER_BYTES (see the README),
             RUST_LOG (logs go to stderr)
";

/// How the server offers the idempotency/v1 extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Required,
    Optional,
    Off,
}

#[derive(Debug, Clone)]
pub struct Cli {
    pub listen: SocketAddr,
    /// The URL the agent card names, where it is not the address bound.
    pub public_url: Option<String>,
    pub db: Db,
    pub mode: Mode,
    /// `IdempotencyConfig::max_requests_in_flight`, and jsonrpsee's `max_connections` with
    /// it: HTTP requests in flight, not connections.
    pub max_in_flight: u32,
    /// How long a request's body may send nothing before it fails.
    pub body_timeout: Duration,
    /// How long a stop waits for calls in flight and executions still running.
    pub shutdown_grace: Duration,
    /// The request header that names the caller, where keys are scoped by caller.
    pub principal_header: Option<http::HeaderName>,
    /// How long delivered outbox events are kept.
    pub outbox_retention: Duration,
    /// How long an event whose delivery keeps failing is retried, in backoff waited.
    pub outbox_give_up: Duration,
}

/// Where the server keeps its state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Db {
    /// A SQLite file, served by this process alone.
    File(PathBuf),
    /// A PostgreSQL database URL, shared by every replica.
    Postgres(String),
}

impl Db {
    fn parse(value: &str) -> Self {
        match value.starts_with("postgres://") || value.starts_with("postgresql://") {
            true => Self::Postgres(value.to_owned()),
            false => Self::File(PathBuf::from(value)),
        }
    }
}

/// As logs and errors show it: a URL's password masked.
impl std::fmt::Display for Db {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Db::File(path) => write!(f, "{}", path.display()),
            Db::Postgres(url) => f.write_str(&idem::store::redacted_url(url)),
        }
    }
}

/// What the command line asks for.
#[derive(Debug)]
pub enum Command {
    Serve(Cli),
    Help,
}

/// jsonrpsee's own default (100) answered 429 to a load of 64 clients: requests of clients
/// that had left were still in flight, waiting for their commit, while new ones arrived.
const DEFAULT_MAX_IN_FLIGHT: u32 = 4096;

/// As long as hyper gives a request's headers.
const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(30);

/// A blocking send answers after its mission (60 s at most) and its `delayMs` (10 s at most):
/// with 65 s, a SIGTERM dropped one accepted just before, unanswered (found by helper-77).
const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(75);

/// A day, as long as an idempotency entry lives by default.
const DEFAULT_OUTBOX_RETENTION: Duration = Duration::from_secs(86_400);

/// A day: a webhook down for longer is not coming back for these events.
const DEFAULT_OUTBOX_GIVE_UP: Duration = Duration::from_secs(86_400);

/// The arguments as text: one that is not UTF-8 (a legal Unix file name) is refused by name,
/// where `std::env::args` panicked (helper-121).
pub fn utf8(args: impl IntoIterator<Item = OsString>) -> Result<Vec<String>, String> {
    args.into_iter()
        .map(|arg| {
            arg.into_string()
                .map_err(|arg| format!("arguments must be UTF-8 text: {arg:?} is not"))
        })
        .collect()
}

/// Reads the flags (`--flag value` or `--flag=value`); the error says what is wrong. A flag
/// given twice is refused (the last one silently won), and so is a flag where a value is due
/// (`--db --help` served a file named `--help`: helper-121).
pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Command, String> {
    let mut cli = Cli {
        listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
        public_url: None,
        db: Db::File(PathBuf::from("a2a-example.db")),
        mode: Mode::Required,
        max_in_flight: DEFAULT_MAX_IN_FLIGHT,
        body_timeout: DEFAULT_BODY_TIMEOUT,
        shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
        principal_header: None,
        outbox_retention: DEFAULT_OUTBOX_RETENTION,
        outbox_give_up: DEFAULT_OUTBOX_GIVE_UP,
    };
    let mut given = Vec::new();
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) => (flag.to_owned(), Some(value.to_owned())),
            None => (arg, None),
        };
        if flag == "-h" || flag == "--help" {
            return Ok(Command::Help);
        }
        // The flag is checked before its value is taken, so a typo is named as such.
        let flag = Flag::parse(&flag)?;
        if given.contains(&flag) {
            return Err(format!("{} is given twice", flag.name()));
        }
        given.push(flag);
        let value = match inline {
            Some(value) => value,
            None => next_value(flag, args.next())?,
        };
        match flag {
            Flag::Listen => cli.listen = listen(&value)?,
            Flag::PublicUrl => cli.public_url = Some(public_url(&value)?),
            Flag::Db => cli.db = Db::parse(&value),
            Flag::Idempotency => cli.mode = mode(&value)?,
            Flag::MaxInFlight => cli.max_in_flight = max_in_flight(&value)?,
            Flag::BodyTimeout => cli.body_timeout = seconds(flag, &value, 1)?,
            Flag::ShutdownGrace => cli.shutdown_grace = seconds(flag, &value, 0)?,
            Flag::PrincipalHeader => cli.principal_header = Some(header_name(&value)?),
            Flag::OutboxRetention => cli.outbox_retention = seconds(flag, &value, 1)?,
            Flag::OutboxGiveUp => cli.outbox_give_up = seconds(flag, &value, 1)?,
        }
    }
    Ok(Command::Serve(cli))
}

/// The word after `flag`, as its value: not another flag (`--flag=--value` gives one that
/// starts so).
fn next_value(flag: Flag, next: Option<String>) -> Result<String, String> {
    match next {
        Some(value) if !value.starts_with("--") => Ok(value),
        Some(other) => Err(format!(
            "{} needs a value, not the flag {other} (write {}=VALUE for a value that starts \
             with --)",
            flag.name(),
            flag.name()
        )),
        None => Err(format!("{} needs a value", flag.name())),
    }
}

/// The flags that take a value.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Flag {
    Listen,
    PublicUrl,
    Db,
    Idempotency,
    MaxInFlight,
    BodyTimeout,
    ShutdownGrace,
    PrincipalHeader,
    OutboxRetention,
    OutboxGiveUp,
}

impl Flag {
    const ALL: [Flag; 10] = [
        Flag::Listen,
        Flag::PublicUrl,
        Flag::Db,
        Flag::Idempotency,
        Flag::MaxInFlight,
        Flag::BodyTimeout,
        Flag::ShutdownGrace,
        Flag::PrincipalHeader,
        Flag::OutboxRetention,
        Flag::OutboxGiveUp,
    ];

    fn parse(arg: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|flag| flag.name() == arg)
            .ok_or_else(|| format!("unknown argument {arg:?}"))
    }

    fn name(self) -> &'static str {
        match self {
            Flag::Listen => "--listen",
            Flag::PublicUrl => "--public-url",
            Flag::Db => "--db",
            Flag::Idempotency => "--idempotency",
            Flag::MaxInFlight => "--max-in-flight",
            Flag::BodyTimeout => "--body-timeout",
            Flag::ShutdownGrace => "--shutdown-grace",
            Flag::PrincipalHeader => "--principal-header",
            Flag::OutboxRetention => "--outbox-retention",
            Flag::OutboxGiveUp => "--outbox-give-up",
        }
    }
}

fn header_name(value: &str) -> Result<http::HeaderName, String> {
    http::HeaderName::try_from(value)
        .map_err(|_| format!("--principal-header {value:?} is not an HTTP header name"))
}

fn listen(value: &str) -> Result<SocketAddr, String> {
    value
        .parse()
        .map_err(|_| format!("--listen {value:?} is not an IP:PORT address"))
}

/// An absolute http(s) URL with a host, as clients are to call it (`http://:8080/` has none:
/// found by helper-78).
fn public_url(value: &str) -> Result<String, String> {
    let uri = value.parse::<http::Uri>().ok();
    let http = uri
        .as_ref()
        .is_some_and(|uri| matches!(uri.scheme_str(), Some("http" | "https")));
    let host = uri.as_ref().and_then(http::Uri::host).unwrap_or_default();
    match http && !host.is_empty() {
        true => Ok(value.to_owned()),
        false => Err(format!(
            "--public-url {value:?} is not an http:// or https:// URL with a host"
        )),
    }
}

fn mode(value: &str) -> Result<Mode, String> {
    match value {
        "required" => Ok(Mode::Required),
        "optional" => Ok(Mode::Optional),
        "off" => Ok(Mode::Off),
        _ => Err(format!(
            "--idempotency {value:?} is not one of required, optional, off"
        )),
    }
}

fn max_in_flight(value: &str) -> Result<u32, String> {
    match value.parse() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!(
            "--max-in-flight {value:?} is not a positive number"
        )),
    }
}

/// The longest wait a flag takes: a day. Far longer is a typo, and at `u64::MAX` the deadline
/// it sets would overflow the clock.
const MAX_SECONDS: u64 = 86_400;

fn seconds(flag: Flag, value: &str, least: u64) -> Result<Duration, String> {
    match value.parse() {
        Ok(seconds) if (least..=MAX_SECONDS).contains(&seconds) => Ok(Duration::from_secs(seconds)),
        _ => Err(format!(
            "{} {value:?} is not a whole number of seconds from {least} to {MAX_SECONDS}",
            flag.name()
        )),
    }
}
