//! What an application's write may not do on the writer's connection, which every call's
//! commit shares: end or release the writer's own savepoint, change the connection's
//! lasting settings, attach or detach databases. Each is refused as the write prepares it
//! ("not authorized"), and the write fails alone, as any failing write does.
//!
//! The writer runs each job under a savepoint of its name; a write's own savepoint of that
//! name (it was `job`) took the writer's `ROLLBACK TO` and `RELEASE`: a write that failed
//! left half of its rows in the batch, committed, and each retry wrote them again. A
//! `PRAGMA query_only = ON` in one write, failing or not, failed every later call of the
//! process; `busy_timeout = 0` or `locking_mode = EXCLUSIVE` as well (found by helper-86).
//!
//! And how long it may hold the writer: every call's commit waits for it, so a write whose SQL
//! ran for seconds failed every other call of the process, past the disk timeout, with an
//! error that blamed the disk (found by helper-112). A write that runs SQLite's machine past
//! its bound, half the disk timeout, is interrupted and fails ([`Overran`]), and is not run
//! again (the writer's careful pass ran it a second bound: helper-118). A statement that
//! writes, interrupted, rolls the batch's transaction back, as any write that ends it does.
//! What a write does outside SQLite (a sleep, a network call) no one can interrupt.

use std::cell::Cell;
use std::time::{Duration, Instant};

use rusqlite::hooks::{AuthAction, AuthContext, Authorization};
use rusqlite::Connection;

use crate::unit_of_work::WriteError;

/// The savepoint each job runs under.
pub(super) const SAVEPOINT: &str = "SAVEPOINT idem_writer_job";
pub(super) const RELEASE: &str = "RELEASE idem_writer_job";
pub(super) const ROLLBACK_TO: &str = "ROLLBACK TO idem_writer_job";
const SAVEPOINT_NAME: &str = "idem_writer_job";

/// `PRAGMA`s that take a value and change nothing that outlasts the transaction: the
/// schema's reads, the two header fields a rollback restores, `defer_foreign_keys` (reset at
/// the transaction's end) and `foreign_keys` (a no-op inside one; both in SQLite's own recipe
/// for rebuilding a table).
const PRAGMAS_WITH_A_VALUE: &[&str] = &[
    "defer_foreign_keys",
    "foreign_keys",
    "table_info",
    "table_xinfo",
    "table_list",
    "index_list",
    "index_info",
    "index_xinfo",
    "foreign_key_list",
    "foreign_key_check",
    "integrity_check",
    "quick_check",
    "user_version",
    "application_id",
];

thread_local! {
    /// When the application's write running on this thread (the writer's) started.
    static STARTED: Cell<Option<Instant>> = const { Cell::new(None) };
    /// The bound the running write was interrupted for, if it was.
    static INTERRUPTED: Cell<Option<Duration>> = const { Cell::new(None) };
}

/// How many steps of SQLite's machine run between two looks at the clock.
const STEPS_BETWEEN_LOOKS: i32 = 1000;

/// Installs the checks on the writer's connection, once: setting an authorizer expires the
/// connection's prepared statements, so it is never set and cleared around each write.
/// `bound`: how long an application's write may run.
pub(super) fn guard(conn: &Connection, bound: Duration) {
    conn.authorizer(Some(|context: AuthContext<'_>| {
        match STARTED.with(Cell::get).is_some() && refused(&context.action) {
            true => Authorization::Deny,
            false => Authorization::Allow,
        }
    }));
    conn.progress_handler(STEPS_BETWEEN_LOOKS, Some(move || overran(bound)));
}

/// Whether the running write, if any, has run past `bound`: then SQLite interrupts it.
fn overran(bound: Duration) -> bool {
    let over = STARTED
        .with(Cell::get)
        .is_some_and(|started| started.elapsed() > bound);
    if over {
        INTERRUPTED.with(|interrupted| interrupted.set(Some(bound)));
    }
    over
}

/// Runs `write`, an application's, under the checks. Interrupted, it fails, whatever it made
/// of SQLite's error: its savepoint is rolled back.
pub(crate) fn running(write: impl FnOnce() -> Result<(), WriteError>) -> Result<(), WriteError> {
    struct Ended;
    impl Drop for Ended {
        fn drop(&mut self) {
            STARTED.with(|started| started.set(None));
        }
    }
    INTERRUPTED.with(|interrupted| interrupted.set(None));
    STARTED.with(|started| started.set(Some(Instant::now())));
    let _ended = Ended;
    let written = write();
    match INTERRUPTED.with(Cell::get) {
        Some(bound) => Err(Box::new(Overran {
            bound,
            error: written.err(),
        })),
        None => written,
    }
}

/// Whether `error` is a write's that was interrupted for its bound ([`Overran`]).
pub(crate) fn was_interrupted(error: &crate::store::StoreError) -> bool {
    matches!(error, crate::store::StoreError::Write(write) if write.is::<Overran>())
}

/// An application's write interrupted for running past its bound on the store's writer.
#[derive(Debug)]
struct Overran {
    bound: Duration,
    /// What the write returned, SQLite's interruption most often.
    error: Option<WriteError>,
}

impl std::fmt::Display for Overran {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the write ran past {} ms on the store's one writer, which every call's commit \
             waits for (half of AIWG_IDEMPOTENCY_DISK_TIMEOUT_MS), and was interrupted: make \
             it faster, or do the slow part outside the unit of work",
            self.bound.as_millis()
        )
    }
}

impl std::error::Error for Overran {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.error.as_deref().map(|error| error as _)
    }
}

fn refused(action: &AuthAction<'_>) -> bool {
    match action {
        AuthAction::Savepoint { savepoint_name, .. } => {
            savepoint_name.eq_ignore_ascii_case(SAVEPOINT_NAME)
        }
        AuthAction::Pragma {
            pragma_name,
            pragma_value: Some(_),
        } => !PRAGMAS_WITH_A_VALUE
            .iter()
            .any(|allowed| pragma_name.eq_ignore_ascii_case(allowed)),
        AuthAction::Attach { .. } | AuthAction::Detach { .. } => true,
        _ => false,
    }
}
