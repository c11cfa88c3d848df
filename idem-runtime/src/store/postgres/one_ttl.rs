//! Replicas on one database serve with one TTL. Each row carries its own `expires_at`, which
//! every replica honours, so a replica of another TTL admitted all the same (the check sees
//! live sessions only: not those a database restart ended until they reconnect) sweeps
//! nothing early; but one key kept for a day or 3 s, by whichever replica stored it, is no
//! configuration anyone means. So each replica names its sessions by its TTL ([`named`]), and
//! one that finds a live session of another TTL on the database refuses to open
//! ([`refuse_another`]).

use deadpool_postgres::GenericClient;

use crate::store::StoreError;

const APPLICATION_PREFIX: &str = "idem ttl=";

/// The name of a live session, other than this one, of a replica with another TTL than `$1`
/// names ([`application_name`]), on the same database; none when all agree.
const OTHER_TTL: &str = "
SELECT application_name FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid()
  AND application_name LIKE 'idem ttl=%' AND application_name <> $1
LIMIT 1";

/// The connection settings of `url`, its sessions named by the replica's TTL (unless the URL
/// names them: then other replicas cannot see its TTL).
pub(crate) fn named(url: &str, ttl_seconds: u64) -> Result<tokio_postgres::Config, StoreError> {
    let mut config: tokio_postgres::Config = url.parse()?;
    if config.get_application_name().is_none() {
        config.application_name(application_name(ttl_seconds));
    }
    Ok(config)
}

/// [`StoreError::TtlMismatch`] if a live replica of another TTL than `ttl_seconds` serves the
/// database. Run under the schema lock, which orders replicas that open at once.
pub(crate) async fn refuse_another(
    client: &impl GenericClient,
    ttl_seconds: u64,
) -> Result<(), StoreError> {
    let ours = application_name(ttl_seconds);
    match client.query_opt(OTHER_TTL, &[&ours]).await? {
        None => Ok(()),
        Some(other) => Err(StoreError::TtlMismatch {
            ours: ttl_seconds,
            theirs: ttl_of(other.get(0)).unwrap_or_default(),
        }),
    }
}

/// What a replica's sessions are named, by its TTL: how another replica, opening the same
/// database, sees the TTL it serves with while it lives.
fn application_name(ttl_seconds: u64) -> String {
    format!("{APPLICATION_PREFIX}{ttl_seconds}")
}

/// The TTL that a session named by [`application_name`] serves with.
fn ttl_of(application_name: &str) -> Option<u64> {
    application_name
        .strip_prefix(APPLICATION_PREFIX)?
        .parse()
        .ok()
}

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
