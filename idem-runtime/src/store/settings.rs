//! What the serving stores record of their configuration in the database, for the operator's
//! tool: the TTL they keep entries for. The admin tool runs in another shell, whose
//! `AIWG_IDEMPOTENCY_TTL` may differ from the servers' (a review purged live entries "as
//! expired" with `AIWG_IDEMPOTENCY_TTL=5` in the operator's shell, and their keys executed
//! again). So each store records its TTL when it opens the database, and the tool counts
//! what is expired by that (`admin.rs`). Several replicas on one database serve with one TTL:
//! a replica whose TTL is shorter would expire, and sweep, what the others still replay (a
//! probe started one with `AIWG_IDEMPOTENCY_TTL=3` beside two of 24 h: its first sweep
//! deleted every entry, and keys ran again on all three). So on PostgreSQL each replica names
//! its sessions by its TTL ([`application_name`]), and one that finds a live session of
//! another TTL refuses to open ([`OTHER_TTL`]).

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

/// A TTL as the table holds it: seconds, at most `i64::MAX` (the configuration refuses more).
pub(crate) fn stored(ttl_seconds: u64) -> i64 {
    i64::try_from(ttl_seconds).unwrap_or(i64::MAX)
}

#[cfg(feature = "postgres")]
/// What a replica's PostgreSQL sessions are named, by its TTL: how another replica, opening
/// the same database, sees the TTL it serves with while it lives.
pub(crate) fn application_name(ttl_seconds: u64) -> String {
    format!("{APPLICATION_PREFIX}{ttl_seconds}")
}

#[cfg(feature = "postgres")]
const APPLICATION_PREFIX: &str = "idem ttl=";

#[cfg(feature = "postgres")]
/// The name of a live session, other than this one, of a replica with another TTL than `$1`
/// names ([`application_name`]), on the same database; none when all agree.
pub(crate) const OTHER_TTL: &str = "
SELECT application_name FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid()
  AND application_name LIKE 'idem ttl=%' AND application_name <> $1
LIMIT 1";

#[cfg(feature = "postgres")]
/// The TTL that a session named by [`application_name`] serves with.
pub(crate) fn ttl_of(application_name: &str) -> Option<u64> {
    application_name
        .strip_prefix(APPLICATION_PREFIX)?
        .parse()
        .ok()
}

#[cfg(feature = "postgres")]
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_name_gives_back_its_ttl() {
        assert_eq!(ttl_of(&application_name(86_400)), Some(86_400));
        assert_eq!(ttl_of(&application_name(u64::MAX)), Some(u64::MAX));
        assert_eq!(ttl_of("psql"), None);
        assert!(OTHER_TTL.contains(&format!("'{APPLICATION_PREFIX}%'")));
    }
}
