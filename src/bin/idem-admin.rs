//! `idem-admin`: the operator's tool over a database the servers serve (see `idem::admin`).
//!
//! ```sh
//! idem-admin --db ./a2a-example.db stats
//! idem-admin --db postgres://idem@127.0.0.1:5432/a2a show 0190b5a4-7c3e-7d2a-9f11-2b3c4d5e6f70 --body
//! idem-admin --db ./a2a-example.db purge --expired --yes
//! ```
//!
//! Exit status: 0 done, 1 the key holds nothing (show, purge), 2 usage or database error, or
//! a purge not confirmed.

use std::fmt::Write as _;
use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use idem::admin::{Admin, EntryInfo, EntryState};
use idem::config::{env_value, TTL_ENV};
use idem::message_id::MessageId;
use idem::store::{redacted_url, StoreStats};
use idem::IdempotencyConfig;

const USAGE: &str = "\
usage: idem-admin --db PATH|URL [--principal NAME] COMMAND
commands:
  stats                   the TTL, entries, bytes, expired but not yet swept, expiring
                          within the hour, the oldest, open streams, top methods
  show MESSAGE_ID [--body]  what holds the key (with --body, the stored response too)
  purge MESSAGE_ID [--yes]  delete the key's entry, so that the key executes again
  purge --expired [--yes]   delete every expired entry now (the servers' sweep also ends dead streams)
Where servers scope keys by principal, --principal NAME names whose key show and purge mean.
Without --yes, a purge asks for confirmation on the terminal (and is refused elsewhere).
What counts as expired is the TTL the servers recorded in the database when they opened it;
AIWG_IDEMPOTENCY_TTL here only where none did (a database of an earlier version).
";

/// What the command line asks for.
enum Command {
    Stats,
    Show { key: MessageId, body: bool },
    Purge { key: MessageId, yes: bool },
    PurgeExpired { yes: bool },
}

/// `eprintln!` with the tool's name before the line, that never panics: a stderr that cannot
/// be written (a closed pipe, a full disk) is no reason to exit 101, and the exit status
/// still says how the command went.
macro_rules! note {
    ($($arg:tt)*) => {{
        let line = format!($($arg)*);
        let _ = writeln!(std::io::stderr().lock(), "idem-admin: {line}");
    }};
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args: Result<Vec<String>, _> = std::env::args_os()
        .skip(1)
        .map(|a| a.into_string())
        .collect();
    let Ok(args) = args else {
        return fail(&format!("arguments must be UTF-8 text\n\n{USAGE}"));
    };
    if args.iter().any(|a| a == "--help" || a == "-h") {
        return emit(USAGE.to_owned(), ExitCode::SUCCESS);
    }
    let (db, command) = match parse(&args) {
        Ok(parsed) => parsed,
        Err(error) => return fail(&format!("{error}\n\n{USAGE}")),
    };
    // The TTL alone (where no server recorded one): a setting the tool does not use, malformed
    // in the servers' environment, is no reason to refuse the operator.
    let ttl_only = |name: &str| env_value(name).filter(|_| name == TTL_ENV);
    // Malformed, the TTL here refuses the operator only where it would count.
    let (config, malformed) = match IdempotencyConfig::from_lookup(ttl_only) {
        Ok(config) => (config, None),
        Err(error) => (IdempotencyConfig::default(), Some(error)),
    };
    let admin = match Admin::open(&db, &config).await {
        Ok(admin) => admin,
        Err(error) => {
            let db = redacted_url(&db);
            return fail(&format!("cannot open database {db}: {error}"));
        }
    };
    match (malformed, admin.ttl_seconds()) {
        (None, _) => warn_of_another_ttl(&admin, &config),
        (Some(error), (_, false)) => return fail(&error.to_string()),
        (Some(error), (ttl, true)) => {
            note!("{error}; the TTL the servers recorded, {ttl} s, counts")
        }
    }
    match run(&admin, &db, command).await {
        Ok(code) => code,
        Err(error) => fail(&error.to_string()),
    }
}

/// The shell's `AIWG_IDEMPOTENCY_TTL` does not decide what is expired where the servers
/// recorded theirs: says so where the two differ.
fn warn_of_another_ttl(admin: &Admin, config: &IdempotencyConfig) {
    let (ttl, recorded) = admin.ttl_seconds();
    let set_here = std::env::var_os(TTL_ENV).is_some();
    if recorded && set_here && config.ttl_seconds != ttl {
        note!(
            "{TTL_ENV} here is {} s, but the servers of this database keep \
             entries {ttl} s: expired means past {ttl} s",
            config.ttl_seconds
        );
    }
}

fn fail(message: &str) -> ExitCode {
    note!("{message}");
    ExitCode::from(2)
}

/// Writes `text` to stdout and exits with `code`. A reader that went away (`| head`) is no
/// failure of the command, which has done its work by now; any other write error is said.
fn emit(text: String, code: ExitCode) -> ExitCode {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            fail(&format!("cannot write the output: {e}"))
        }
        _ => code,
    }
}

fn parse(args: &[String]) -> Result<(String, Command), String> {
    let mut db = None;
    let mut principal = None;
    let mut words = Vec::new();
    let mut flags = Vec::new();
    let mut rest = args.iter().map(String::as_str);
    while let Some(arg) = rest.next() {
        // `--db PATH` and `--db=PATH` alike.
        let (name, inline) = match arg.split_once('=') {
            Some((name, value)) if name.starts_with("--") => (name, Some(value)),
            _ => (arg, None),
        };
        let mut value = |what: &str| {
            inline
                .or_else(|| rest.next())
                .filter(|v| !v.is_empty())
                .ok_or(format!("{name} needs {what}"))
        };
        match name {
            "--db" => once(&mut db, value("a path or URL")?, name)?,
            "--principal" => once(&mut principal, value("a name")?, name)?,
            flag if flag.starts_with("--") => flags.push(arg),
            word => words.push(word),
        }
    }
    let db = db.ok_or("--db PATH|URL is required")?;
    // Named exactly, as the runtime keys it; a server may have trimmed it from a header (the
    // example does), so spaces at its ends are most likely a slip.
    if let Some(name) = principal.filter(|p| p.trim() != *p) {
        note!(
            "note: --principal {name:?} has spaces at its ends, and names exactly \
             that principal"
        );
    }
    let flag = |name: &str| flags.contains(&name);
    let key = |word: &str| {
        let id = MessageId::parse_str(word)
            .map_err(|e| format!("{word:?} is not a messageId the servers accept ({e})"))?;
        Ok::<_, String>(principal.map_or_else(|| id.clone(), |p| id.for_principal(p)))
    };
    let command = match (words.as_slice(), flags.as_slice()) {
        (["stats"], []) => Command::Stats,
        (["show", id], _) if flags.iter().all(|f| *f == "--body") => Command::Show {
            key: key(id)?,
            body: flag("--body"),
        },
        (["purge", id], _) if flags.iter().all(|f| *f == "--yes") => Command::Purge {
            key: key(id)?,
            yes: flag("--yes"),
        },
        (["purge"], _)
            if flag("--expired") && flags.iter().all(|f| ["--expired", "--yes"].contains(f)) =>
        {
            Command::PurgeExpired { yes: flag("--yes") }
        }
        _ => return Err(format!("cannot read the command {:?}", args.join(" "))),
    };
    if principal.is_some() && matches!(command, Command::Stats | Command::PurgeExpired { .. }) {
        return Err(
            "--principal names whose key show and purge mean: stats and purge \
                    --expired cover every principal"
                .into(),
        );
    }
    Ok((db.to_owned(), command))
}

/// An option given once: a second is refused, not silently the one that counts.
fn once<'a>(slot: &mut Option<&'a str>, value: &'a str, name: &str) -> Result<(), String> {
    match slot.replace(value) {
        Some(_) => Err(format!("{name} is given twice: keep one")),
        None => Ok(()),
    }
}

async fn run(admin: &Admin, db: &str, command: Command) -> Result<ExitCode, String> {
    let error = |e: idem::store::StoreError| e.to_string();
    match command {
        Command::Stats => {
            let stats = admin.stats().await.map_err(error)?;
            Ok(emit(
                stats_text(&stats, admin.ttl_seconds()),
                ExitCode::SUCCESS,
            ))
        }
        Command::Show { key, body } => match admin.show(&key).await.map_err(error)? {
            Some(info) => Ok(emit(entry_text(&key, &info, body), ExitCode::SUCCESS)),
            None => nothing_for(&key),
        },
        Command::Purge { key, yes } => {
            // Asked before anything is deleted: a key held again (its expired row not swept
            // yet) was purged, "purged", while its call went on (helper-94). Asked again once
            // confirmed: the key may have been taken while the operator read the prompt
            // (helper-96).
            if let Some(refused) = held(admin, &key).await? {
                return refused;
            }
            let db = redacted_url(db);
            if !confirmed(yes, &format!("delete the entry of {key} in {db}"))? {
                return Err("not confirmed; nothing deleted".into());
            }
            if let Some(refused) = held(admin, &key).await? {
                return refused;
            }
            match admin.purge(&key).await.map_err(error)? {
                true => Ok(emit(format!("purged {key}\n"), ExitCode::SUCCESS)),
                false => nothing_for(&key),
            }
        }
        Command::PurgeExpired { yes } => {
            let db = redacted_url(db);
            if !confirmed(yes, &format!("delete every expired entry in {db}"))? {
                return Err("not confirmed; nothing deleted".into());
            }
            let deleted = admin.purge_expired().await.map_err(error)?;
            Ok(emit(
                format!("purged {deleted} expired entries\n"),
                ExitCode::SUCCESS,
            ))
        }
    }
}

fn nothing_for(key: &MessageId) -> Result<ExitCode, String> {
    let scoped = match key.as_str() == key.message_id() {
        true => "; where the servers scope keys by principal, name whose with --principal",
        false => "",
    };
    note!(
        "nothing is stored for {key}{scoped} (a call still running on SQLite \
         shows once it stored its outcome)"
    );
    Ok(ExitCode::from(1))
}

/// A stream's recording is not an entry: what it ends with is stored, or, if its process
/// died, the next claim of the key closes it as interrupted.
fn still_streaming(key: &MessageId, events: u64) -> Result<ExitCode, String> {
    note!(
        "{key} has no entry to purge: a stream is being recorded under it \
         ({events} events so far); its outcome is stored when it ends, or, if the process \
         recording it died, the next call of the key closes it as interrupted"
    );
    Ok(ExitCode::from(1))
}

/// A call in flight has stored nothing yet; what it ends with is stored.
/// The answer to a purge of `key` where nothing of it may be purged: a stream or a call holds
/// it, or nothing is stored for it.
async fn held(admin: &Admin, key: &MessageId) -> Result<Option<Result<ExitCode, String>>, String> {
    Ok(
        match admin
            .show(key)
            .await
            .map_err(|e| e.to_string())?
            .map(|info| info.state)
        {
            Some(EntryState::OpenStream(events)) => Some(still_streaming(key, events)),
            Some(EntryState::Running) => Some(still_running(key)),
            None => Some(nothing_for(key)),
            Some(EntryState::Live(_) | EntryState::Expired(_)) => None,
        },
    )
}

fn still_running(key: &MessageId) -> Result<ExitCode, String> {
    note!(
        "{key} has no entry to purge: a call holds it on a replica and is still \
         running; its outcome is stored when it ends (purge it then)"
    );
    Ok(ExitCode::from(1))
}

/// `--yes`, or a `y` typed on the terminal; never a guess from a pipe. The question goes to
/// stderr, as `rm -i` asks: with stdout redirected it was asked into the file, and the tool
/// waited with nothing on the screen (helper-110).
fn confirmed(yes: bool, what: &str) -> Result<bool, String> {
    if yes {
        return Ok(true);
    }
    if !std::io::stdin().is_terminal() || !std::io::stderr().is_terminal() {
        return Err(format!(
            "{what}: pass --yes to confirm (stdin or stderr is not a terminal, so no one \
             would see the question or answer it)"
        ));
    }
    let mut stderr = std::io::stderr().lock();
    write!(stderr, "{what}? [y/N] ")
        .and_then(|()| stderr.flush())
        .map_err(|e| e.to_string())?;
    let mut answer = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut answer)
        .map_err(|e| e.to_string())?;
    Ok(matches!(answer.trim(), "y" | "Y" | "yes"))
}

/// One line of the output, written to a `String` (which cannot fail to take it).
macro_rules! say {
    ($out:expr, $($arg:tt)*) => {{
        let _ = writeln!($out, $($arg)*);
    }};
}

fn stats_text(stats: &StoreStats, (ttl, recorded): (u64, bool)) -> String {
    let mut out = String::new();
    let source = match recorded {
        true => "as the servers recorded it".to_owned(),
        false => format!("{TTL_ENV} here: no server recorded one"),
    };
    say!(out, "ttl                  {ttl} s ({source})");
    say!(out, "entries              {}", stats.entries);
    say!(out, "bytes                {}", stats.bytes);
    say!(out, "expired (unswept)    {}", stats.expired);
    say!(out, "expiring within 1 h  {}", stats.expiring_within_hour);
    match stats.oldest_inserted_at {
        Some(at) => say!(out, "oldest               {} ({})", at, age(at)),
        None => say!(out, "oldest               -"),
    }
    say!(out, "open streams         {}", stats.open_streams);
    say!(out, "top methods");
    for (method, count) in &stats.top_methods {
        say!(out, "  {method:<22} {count}");
    }
    out
}

fn entry_text(key: &MessageId, info: &EntryInfo, body: bool) -> String {
    let mut out = String::new();
    let state = match info.state {
        EntryState::Live(status) => format!("live, HTTP {status}"),
        EntryState::Expired(status) => format!("expired, HTTP {status}"),
        EntryState::OpenStream(events) => format!("open stream, {events} events recorded"),
        EntryState::Running => "running on a replica, nothing stored yet".to_owned(),
    };
    say!(out, "message_id    {}", key.message_id());
    if key.as_str() != key.message_id() {
        say!(out, "stored as     {key}");
    }
    say!(out, "method        {}", info.method);
    say!(out, "request_hash  {}", info.request_hash);
    say!(out, "state         {state}");
    match info.state {
        EntryState::Running => say!(out, "lease_until   {}", info.inserted_at),
        _ => say!(
            out,
            "inserted_at   {} ({})",
            info.inserted_at,
            age(info.inserted_at)
        ),
    }
    if let Some(at) = info.expires_at {
        say!(out, "expires_at    {} ({})", at, age(at));
    }
    say!(out, "bytes         {}", info.bytes);
    if body {
        say!(out, "body");
        say!(out, "{}", String::from_utf8_lossy(&info.body));
    }
    out
}

/// A time as seen from now: `93 s ago`, or `in 86307 s`.
fn age(at: u64) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    match at > now {
        true => format!("in {} s", at - now),
        false => format!("{} s ago", now - at),
    }
}
