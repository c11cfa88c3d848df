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

use std::cell::Cell;

use rusqlite::hooks::{AuthAction, AuthContext, Authorization};
use rusqlite::Connection;

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
    /// An application's write is running on this thread (the writer's).
    static RUNNING: Cell<bool> = const { Cell::new(false) };
}

/// Installs the check on the writer's connection, once: setting an authorizer expires the
/// connection's prepared statements, so it is never set and cleared around each write.
pub(super) fn guard(conn: &Connection) {
    conn.authorizer(Some(|context: AuthContext<'_>| {
        match RUNNING.with(Cell::get) && refused(&context.action) {
            true => Authorization::Deny,
            false => Authorization::Allow,
        }
    }));
}

/// Runs `write`, an application's, under the check.
pub(crate) fn running<T>(write: impl FnOnce() -> T) -> T {
    struct Ended;
    impl Drop for Ended {
        fn drop(&mut self) {
            RUNNING.with(|running| running.set(false));
        }
    }
    RUNNING.with(|running| running.set(true));
    let _ended = Ended;
    write()
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
