//! The connections: where the store connects, and the pool whose sessions the server bounds.

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Hook, HookError, Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::NoTls;

use crate::store::postgres::replica_settings::{named, Serving};
use crate::store::StoreError;

/// Where and how the PostgreSQL store connects.
///
/// ```
/// use idem_runtime::store::PostgresOptions;
/// let options = PostgresOptions::new("postgres://app@127.0.0.1:5432/a2a");
/// assert_eq!(options.pool_size, 16);
/// assert!(options.listen_url.is_none());
/// ```
#[derive(Clone)]
#[non_exhaustive]
pub struct PostgresOptions {
    /// The database the pool connects to, as a URL (`postgres://user@host:port/db`) or a
    /// libpq key-value string. TLS is not built in: use a loopback or Unix-socket address, or
    /// a TLS-terminating proxy.
    pub url: String,
    /// A direct connection for `LISTEN`, where a pooler in transaction mode (which does not
    /// carry it) stands in front of the database; `url` then goes through a session-mode pool,
    /// since each session's bounds are session settings. `None` listens on `url`.
    pub listen_url: Option<String>,
    /// Most pooled connections.
    pub pool_size: usize,
}

/// Shown with the passwords masked ([`redacted_url`](fn@crate::store::redacted_url)): options end
/// up in logs.
impl std::fmt::Debug for PostgresOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use crate::store::redacted_url;
        f.debug_struct("PostgresOptions")
            .field("url", &redacted_url(&self.url))
            .field("listen_url", &self.listen_url.as_deref().map(redacted_url))
            .field("pool_size", &self.pool_size)
            .finish()
    }
}

impl PostgresOptions {
    /// Options for the database at `url`, listening on the same address.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            listen_url: None,
            pool_size: 16,
        }
    }
}

/// A pool of `size` connections to the database `options` names, whose sessions the server
/// ends when one of their transactions has been idle for `lease` (at least a second), and
/// whose statements it cancels past two leases.
///
/// A replica frozen mid-commit (SIGSTOP, a VM paused, a partition with the socket still up)
/// holds the row lock of its claim; the replica taking the claim over waits on that lock, so
/// without this bound a retry would hang until the frozen one came back. Once its lease has
/// run out, a frozen holder's claim is another's to take anyway, and fencing keeps whatever
/// it sends after waking from committing.
///
/// A statement that waits longer (a table another session holds locked) fails its call with
/// `IDEMPOTENCY_STORE_UNAVAILABLE` instead of holding it for as long as the lock is held: by
/// then the call's own lease has run out twice. A database host that stops answering (a
/// partition) is given up by TCP after two leases too.
pub(super) fn pool_of(
    options: &PostgresOptions,
    size: usize,
    lease: Duration,
    serving: Serving,
) -> Result<Pool, StoreError> {
    let mut config = named(&options.url, serving)?;
    bound_the_link(&mut config, lease);
    let set: Arc<str> = session_settings(lease).into();
    let set_idle_bound = Hook::async_fn(move |client, _| {
        let set = set.clone();
        Box::pin(async move { client.batch_execute(&set).await.map_err(HookError::Backend) })
    });
    let manager = Manager::from_config(
        config,
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    // Bounded waits: with the database down, a call fails in seconds instead of hanging.
    let bound = Some(Duration::from_secs(5));
    Pool::builder(manager)
        .max_size(size)
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .wait_timeout(bound)
        .create_timeout(bound)
        .recycle_timeout(bound)
        .post_create(set_idle_bound)
        .build()
        .map_err(|error| StoreError::Backend {
            backend: "postgres",
            cause: Box::new(error),
        })
}

/// What every session of the pool runs with: the server's bounds (see [`pool_of`]), and READ
/// COMMITTED whatever the database's default, which the claims' statements rely on (at
/// SERIALIZABLE, concurrent claims and lease renewals failed calls: helper-90). `SET`s once
/// connected, not startup options: poolers refuse startup options they do not know.
pub(super) fn session_settings(lease: Duration) -> String {
    let (idle, statement) = session_bounds(lease);
    format!(
        "SET idle_in_transaction_session_timeout = {}; SET statement_timeout = {}; \
         SET default_transaction_isolation = 'read committed'",
        idle.as_millis(),
        statement.as_millis()
    )
}

/// tokio-postgres's keepalive idle time unless a URL sets another: the system's own.
const SYSTEM_KEEPALIVE_IDLE: Duration = Duration::from_secs(2 * 60 * 60);

/// `config`, its link given up after about two leases once the database host stops
/// answering (a partition, a NAT entry gone): while sending, by TCP's user timeout; while
/// idle, as the listener's connection mostly is, by keepalive probes (the system's own wait
/// two hours first, and every wake-up meanwhile was lost). Values the URL sets are kept.
pub(super) fn bound_the_link(config: &mut tokio_postgres::Config, lease: Duration) {
    let (_, bound) = session_bounds(lease);
    if config.get_tcp_user_timeout().is_none() {
        config.tcp_user_timeout(bound);
    }
    if config.get_keepalives_idle() == SYSTEM_KEEPALIVE_IDLE {
        // Half the bound idle, then three probes a sixth of it apart; the system counts
        // both in whole seconds, and refuses 0.
        let second = Duration::from_secs(1);
        config
            .keepalives(true)
            .keepalives_idle((bound / 2).max(second))
            .keepalives_interval((bound / 6).max(second))
            .keepalives_retries(3);
    }
}

/// The server's bounds on a session's idle transaction (the lease) and on its statements (two
/// leases), each from a second to PostgreSQL's largest timeout.
pub(super) fn session_bounds(lease: Duration) -> (Duration, Duration) {
    let largest = Duration::from_millis(crate::config::MAX_POSTGRES_TIMEOUT_MS);
    let bound = |d: Duration| d.clamp(Duration::from_secs(1), largest);
    (bound(lease), bound(lease.saturating_mul(2)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_is_given_up_after_two_leases_unless_the_url_says_otherwise() {
        let lease = Duration::from_secs(9);
        let mut config: tokio_postgres::Config = "postgres://app@db/a2a".parse().unwrap();
        bound_the_link(&mut config, lease);
        assert_eq!(config.get_tcp_user_timeout(), Some(&(lease * 2)));
        assert!(config.get_keepalives());
        assert_eq!(config.get_keepalives_idle(), lease);
        assert_eq!(config.get_keepalives_interval(), Some(lease / 3));
        assert_eq!(config.get_keepalives_retries(), Some(3));
        let mut short: tokio_postgres::Config = "postgres://app@db/a2a".parse().unwrap();
        bound_the_link(&mut short, Duration::from_millis(600));
        assert_eq!(
            short.get_keepalives_idle(),
            Duration::from_secs(1),
            "whole seconds"
        );
        assert_eq!(
            short.get_keepalives_interval(),
            Some(Duration::from_secs(1))
        );
        let url = "postgres://app@db/a2a?tcp_user_timeout=5&keepalives_idle=60";
        let mut own: tokio_postgres::Config = url.parse().unwrap();
        bound_the_link(&mut own, lease);
        assert_eq!(own.get_tcp_user_timeout(), Some(&Duration::from_secs(5)));
        assert_eq!(own.get_keepalives_idle(), Duration::from_secs(60));
    }
}
