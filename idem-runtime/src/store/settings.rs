//! What the serving stores record of their configuration in the database, for the operator's
//! tool: the TTL they keep entries for. The admin tool runs in another shell, whose
//! `AIWG_IDEMPOTENCY_TTL` may differ from the servers' (a review purged live entries "as
//! expired" with `AIWG_IDEMPOTENCY_TTL=5` in the operator's shell, and their keys executed
//! again). So each store records its TTL when it opens the database, and the tool counts
//! what is expired by that (`admin.rs`). Several replicas on one database serve with one TTL
//! (`postgres/replica_settings.rs` refuses a replica of another); the last to open records it.
//!
//! And whether keys are scoped by principal: switched on a database that holds entries, every
//! authenticated caller's keys change, and the retries of calls answered before the switch
//! would find nothing and run again (helper-107). A store that opens such a database with the
//! other setting is refused while it holds keys ([`scoping_kept`]); on PostgreSQL, a replica
//! beside a live one of the other setting is refused too (`postgres/replica_settings.rs`).

use crate::store::StoreError;

/// The table, in both backends.
pub(crate) const TABLE: &str = "
CREATE TABLE IF NOT EXISTS idempotency_settings (
    name  TEXT NOT NULL PRIMARY KEY,
    value BIGINT NOT NULL
);";

/// Records the TTL, `$1`, in seconds (run after [`TABLE`]).
pub(crate) const RECORD_TTL: &str = "
INSERT INTO idempotency_settings (name, value) VALUES ('ttl_seconds', $1)
ON CONFLICT (name) DO UPDATE SET value = excluded.value";

/// The TTL the stores recorded, if one did.
pub(crate) const RECORDED_TTL: &str =
    "SELECT value FROM idempotency_settings WHERE name = 'ttl_seconds'";

/// Records whether keys are scoped by principal, `$1` (1 or 0; run after [`TABLE`]).
pub(crate) const RECORD_SCOPING: &str = "
INSERT INTO idempotency_settings (name, value) VALUES ('keys_scoped_by_principal', $1)
ON CONFLICT (name) DO UPDATE SET value = excluded.value";

/// Whether the stores that stored the entries scoped keys by principal, if one recorded it.
pub(crate) const RECORDED_SCOPING: &str =
    "SELECT value FROM idempotency_settings WHERE name = 'keys_scoped_by_principal'";

/// Whether the database holds a key: an entry, or a stream left open by a process that died
/// (its retry must get the interrupted outcome, under its key: helper-108).
pub(crate) const HOLDS_KEYS: &str = "SELECT EXISTS (SELECT 1 FROM idempotency_cache)
    OR EXISTS (SELECT 1 FROM idempotency_open_streams)";

/// [`StoreError::ScopingChanged`] where the database holds keys and the stores recorded
/// another setting (`recorded`, 1 or 0) than this store's (`scoped`). A database without a
/// record (new, or of an earlier version) takes either: the first store records its own.
pub(crate) fn scoping_kept(
    recorded: Option<i64>,
    scoped: bool,
    holds_keys: bool,
) -> Result<(), StoreError> {
    match recorded {
        Some(recorded) if (recorded != 0) != scoped && holds_keys => {
            Err(StoreError::ScopingChanged { scoped })
        }
        _ => Ok(()),
    }
}

/// A TTL as the table holds it: seconds, at most `i64::MAX` (the configuration refuses more).
pub(crate) fn stored(ttl_seconds: u64) -> i64 {
    i64::try_from(ttl_seconds).unwrap_or(i64::MAX)
}
