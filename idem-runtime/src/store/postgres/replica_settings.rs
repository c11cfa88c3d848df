//! Replicas on one database serve with one TTL and one key scoping.
//!
//! The TTL: each row carries its own `expires_at`, which every replica honours, so a replica
//! of another TTL admitted all the same (the check sees live sessions only: not those a
//! database restart ended until they reconnect) sweeps nothing early; but one key kept for a
//! day or 3 s, by whichever replica stored it, is no configuration anyone means.
//!
//! The key scoping: two replicas that key calls apart (one by principal, one globally) run
//! a retry again when another replica serves it than the one that answered. `settings.rs`
//! refuses a store keyed otherwise than the keys the database holds; a database that holds
//! none yet takes either setting, and a second replica of the other setting, started beside
//! a live one before its first call, would be admitted (helper-108).
//!
//! So each replica names its sessions by both ([`named`]), and one that finds a live session
//! of another TTL or scoping on the database refuses to open ([`refuse_another`]).

use deadpool_postgres::GenericClient;

use crate::store::StoreError;

const APPLICATION_PREFIX: &str = "idem ttl=";

/// The names of the live sessions, other than this one, of replicas that name another
/// setting than `$1` ([`Serving::application_name`]), on the same database.
const OTHER_SETTINGS: &str = "
SELECT DISTINCT application_name FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid()
  AND application_name LIKE 'idem ttl=%' AND application_name <> $1";

/// What replicas on one database must agree on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Serving {
    /// How long entries are kept, in seconds.
    pub(crate) ttl_seconds: u64,
    /// Whether keys are scoped by principal.
    pub(crate) scoped: bool,
}

impl Serving {
    /// What a replica's sessions are named: how another replica, opening the same database,
    /// sees what it serves with while it lives.
    fn application_name(self) -> String {
        let keys = if self.scoped { "scoped" } else { "global" };
        format!("{APPLICATION_PREFIX}{} keys={keys}", self.ttl_seconds)
    }

    /// The TTL a session named by [`application_name`](Self::application_name) serves with,
    /// and its scoping if the name says (a replica of an earlier version names its TTL only).
    fn of(application_name: &str) -> Option<(u64, Option<bool>)> {
        let named = application_name.strip_prefix(APPLICATION_PREFIX)?;
        let (ttl, keys) = match named.split_once(' ') {
            Some((ttl, keys)) => (ttl, Some(keys)),
            None => (named, None),
        };
        let scoped = match keys {
            None => None,
            Some("keys=scoped") => Some(true),
            Some("keys=global") => Some(false),
            Some(_) => return None,
        };
        Some((ttl.parse().ok()?, scoped))
    }

    /// The refusal a replica of this setting owes to a live session named `other`, if any.
    fn refusal(self, other: &str) -> Option<StoreError> {
        // A name of the prefix that does not parse says another TTL than ours, as before.
        let (theirs, scoped) = Self::of(other).unwrap_or((0, None));
        if theirs != self.ttl_seconds {
            return Some(StoreError::TtlMismatch {
                ours: self.ttl_seconds,
                theirs,
            });
        }
        (scoped == Some(!self.scoped)).then_some(StoreError::ScopingMismatch {
            scoped: self.scoped,
        })
    }
}

/// The connection settings of `url`, its sessions named by what the replica serves with
/// (unless the URL names them: then other replicas cannot see it).
pub(crate) fn named(url: &str, serving: Serving) -> Result<tokio_postgres::Config, StoreError> {
    let mut config: tokio_postgres::Config = url.parse()?;
    if config.get_application_name().is_none() {
        config.application_name(serving.application_name());
    }
    Ok(config)
}

/// [`StoreError::TtlMismatch`] if a live replica of another TTL serves the database, and
/// [`StoreError::ScopingMismatch`] if one of the same TTL keys calls otherwise. Run under the
/// schema lock, which orders replicas that open at once.
pub(crate) async fn refuse_another(
    client: &impl GenericClient,
    serving: Serving,
) -> Result<(), StoreError> {
    let ours = serving.application_name();
    let others = client.query(OTHER_SETTINGS, &[&ours]).await?;
    let names = others.iter().map(|row| row.get::<_, &str>(0));
    let mut refusals = names.filter_map(|name| serving.refusal(name));
    refusals.next().map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_name_gives_back_what_its_replica_serves_with() {
        for ttl_seconds in [86_400, u64::MAX] {
            for scoped in [true, false] {
                let serving = Serving {
                    ttl_seconds,
                    scoped,
                };
                let name = serving.application_name();
                assert_eq!(Serving::of(&name), Some((ttl_seconds, Some(scoped))));
                assert!(name.len() < 64, "PostgreSQL cuts names at 63 bytes");
            }
        }
        assert_eq!(Serving::of("idem ttl=3"), Some((3, None)));
        assert_eq!(Serving::of("idem ttl=3 keys=other"), None);
        assert_eq!(Serving::of("psql"), None);
        assert!(OTHER_SETTINGS.contains(&format!("'{APPLICATION_PREFIX}%'")));
    }

    #[test]
    fn a_replica_is_refused_beside_another_ttl_or_scoping_not_beside_an_unsaid_one() {
        let ours = Serving {
            ttl_seconds: 60,
            scoped: true,
        };
        let refusal = |name: &str| ours.refusal(name).map(|error| error.kind());
        assert_eq!(refusal("idem ttl=60 keys=scoped"), None);
        assert_eq!(refusal("idem ttl=60"), None, "an earlier version's replica");
        assert_eq!(refusal("idem ttl=60 keys=global"), Some("scoping_mismatch"));
        assert_eq!(refusal("idem ttl=3 keys=scoped"), Some("ttl_mismatch"));
        assert_eq!(refusal("idem ttl=3"), Some("ttl_mismatch"));
        assert_eq!(refusal("idem ttl=x"), Some("ttl_mismatch"));
    }
}
