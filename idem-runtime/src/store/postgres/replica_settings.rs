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
//! So each replica names its sessions by both ([`named`]): `idem ttl=N`, as an earlier
//! version named every replica, where keys are global (the spec's default), and `idem ttl=N
//! keys=scoped` where they are scoped. A replica of an earlier version, serving beside one of
//! this version, then still finds the name it knows (it refused the one that named both
//! alike: helper-113). One that finds a live session of another TTL or scoping on the
//! database refuses to open ([`refuse_another`]); a name without the scoping (a global
//! replica, or an earlier version's of either setting) is held to the setting the database
//! recorded ([`crate::store::settings::RECORD_SCOPING`]).

use deadpool_postgres::GenericClient;

use crate::store::StoreError;

const APPLICATION_PREFIX: &str = "idem ttl=";
/// What follows the TTL in the name of a replica that scopes keys by principal.
const SCOPED: &str = " keys=scoped";

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
        let ttl = self.ttl_seconds;
        match self.scoped {
            true => format!("{APPLICATION_PREFIX}{ttl}{SCOPED}"),
            false => format!("{APPLICATION_PREFIX}{ttl}"),
        }
    }

    /// The TTL a session named by [`application_name`](Self::application_name) serves with,
    /// and whether the name says its keys are scoped.
    fn of(application_name: &str) -> Option<(u64, bool)> {
        let named = application_name.strip_prefix(APPLICATION_PREFIX)?;
        let (ttl, scoped) = match named.strip_suffix(SCOPED) {
            Some(ttl) => (ttl, true),
            None => (named, false),
        };
        Some((ttl.parse().ok()?, scoped))
    }

    /// The refusal a replica of this setting owes to a live session named `other`, if any;
    /// `recorded`: the scoping the database recorded, which a name without it is held to.
    fn refusal(self, other: &str, recorded: Option<bool>) -> Option<StoreError> {
        // A name of the prefix that does not parse says another TTL than ours, as before.
        let (theirs, says_scoped) = Self::of(other).unwrap_or((0, false));
        if theirs != self.ttl_seconds {
            return Some(StoreError::TtlMismatch {
                ours: self.ttl_seconds,
                theirs,
            });
        }
        let scoped = if says_scoped { Some(true) } else { recorded };
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
/// [`StoreError::ScopingMismatch`] if one of the same TTL keys calls otherwise (where its name
/// does not say, by the setting the database `recorded`). Run under the schema lock, which
/// orders replicas that open at once.
pub(crate) async fn refuse_another(
    client: &impl GenericClient,
    serving: Serving,
    recorded: Option<bool>,
) -> Result<(), StoreError> {
    let ours = serving.application_name();
    let others = client.query(OTHER_SETTINGS, &[&ours]).await?;
    let names = others.iter().map(|row| row.get::<_, &str>(0));
    let mut refusals = names.filter_map(|name| serving.refusal(name, recorded));
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
                assert_eq!(Serving::of(&name), Some((ttl_seconds, scoped)));
                assert!(name.len() < 64, "PostgreSQL cuts names at 63 bytes");
            }
        }
        let global = Serving {
            ttl_seconds: 3,
            scoped: false,
        };
        assert_eq!(
            global.application_name(),
            "idem ttl=3",
            "an earlier version's name"
        );
        assert_eq!(Serving::of("idem ttl=3 keys=other"), None);
        assert_eq!(Serving::of("psql"), None);
        assert!(OTHER_SETTINGS.contains(&format!("'{APPLICATION_PREFIX}%'")));
    }

    #[test]
    fn a_replica_is_refused_beside_another_ttl_or_scoping() {
        let scoped = Serving {
            ttl_seconds: 60,
            scoped: true,
        };
        let refusal = |ours: Serving, name: &str, recorded: Option<bool>| {
            ours.refusal(name, recorded).map(|error| error.kind())
        };
        assert_eq!(
            refusal(scoped, "idem ttl=60 keys=scoped", Some(false)),
            None
        );
        assert_eq!(
            refusal(scoped, "idem ttl=3 keys=scoped", None),
            Some("ttl_mismatch")
        );
        assert_eq!(refusal(scoped, "idem ttl=3", None), Some("ttl_mismatch"));
        assert_eq!(refusal(scoped, "idem ttl=x", None), Some("ttl_mismatch"));
        // A name that does not say: by the record (a global replica, or an earlier version's).
        let mismatch = Some("scoping_mismatch");
        assert_eq!(refusal(scoped, "idem ttl=60", Some(false)), mismatch);
        assert_eq!(refusal(scoped, "idem ttl=60", Some(true)), None);
        assert_eq!(
            refusal(scoped, "idem ttl=60", None),
            None,
            "nothing recorded yet"
        );
        let global = Serving {
            scoped: false,
            ..scoped
        };
        assert_eq!(
            refusal(global, "idem ttl=60 keys=scoped", Some(false)),
            mismatch
        );
        assert_eq!(refusal(global, "idem ttl=60", Some(true)), mismatch);
        assert_eq!(refusal(global, "idem ttl=60", Some(false)), None);
    }
}
