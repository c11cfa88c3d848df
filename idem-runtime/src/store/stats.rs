//! What a store holds, in figures: the gauges after each sweep, and the admin tool's `stats`.
//!
//! The statements are written once, in the dialect both databases read (`$1` is a positional
//! parameter in PostgreSQL and the first named one in SQLite), and run on any connection to
//! the database: the store's own readers, or the admin tool's connection beside the servers.

use crate::store::expired_before;
#[cfg(feature = "postgres")]
use crate::store::ReadAt;

/// The figures of one store, as of `now`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreStats {
    /// Entries held, expired ones included until swept.
    pub entries: u64,
    /// Bytes of their response bodies.
    pub bytes: u64,
    /// Entries past their TTL, not swept yet (answered as misses).
    pub expired: u64,
    /// Live entries whose TTL ends within the hour.
    pub expiring_within_hour: u64,
    /// The `inserted_at` of the oldest entry, in Unix epoch seconds.
    pub oldest_inserted_at: Option<u64>,
    /// Streams being recorded (or left open by a process that died).
    pub open_streams: u64,
    /// The methods with the most entries, most first (at most [`TOP_METHODS`]).
    pub top_methods: Vec<(String, u64)>,
}

/// How many methods [`StoreStats::top_methods`] lists.
pub const TOP_METHODS: usize = 5;

/// Totals, an entry counted expired, or expiring within the hour, by the SQL given.
macro_rules! totals {
    ($expired:literal, $expiring:literal) => {
        concat!(
            "SELECT CAST(count(*) AS BIGINT),
                    CAST(coalesce(sum(length(response_body)), 0) AS BIGINT),
                    CAST(coalesce(sum(CASE WHEN ",
            $expired,
            " THEN 1 ELSE 0 END), 0) AS BIGINT),
                    CAST(coalesce(sum(CASE WHEN ",
            $expiring,
            " THEN 1 ELSE 0 END), 0) AS BIGINT),
                    min(inserted_at)
             FROM idempotency_cache"
        )
    };
}

/// Totals on SQLite: `$1` is the time before which an entry was inserted if it is expired now
/// (`expired_before`: spec §4.4, expired when `inserted_at + ttl < now`).
const TOTALS: &str = totals!(
    "inserted_at < $1",
    "inserted_at >= $1 AND inserted_at < $1 + 3600"
);

/// Totals on PostgreSQL, where each row has its own `expires_at` (`$2` is now), unless an
/// earlier version stored it (none, or one left behind: see `ReadAt::expired`); then `$1`
/// decides, as on SQLite.
#[cfg(feature = "postgres")]
const POSTGRES_TOTALS: &str = totals!(
    "CASE WHEN expires_at >= inserted_at THEN expires_at < $2 ELSE inserted_at < $1 END",
    "CASE WHEN expires_at >= inserted_at THEN expires_at >= $2 AND expires_at < $2 + 3600
          ELSE inserted_at >= $1 AND inserted_at < $1 + 3600 END"
);

pub(crate) const OPEN_STREAMS: &str =
    "SELECT CAST(count(*) AS BIGINT) FROM idempotency_open_streams";

pub(crate) const TOP: &str = "
SELECT method, CAST(count(*) AS BIGINT) AS n FROM idempotency_cache
GROUP BY method ORDER BY n DESC, method LIMIT $1";

impl StoreStats {
    /// Reads the figures on a SQLite connection.
    pub(crate) fn read_sqlite(
        conn: &rusqlite::Connection,
        now: u64,
        ttl: u64,
    ) -> rusqlite::Result<Self> {
        let params = rusqlite::named_params! {"$1": expired_before(ttl, now)};
        let mut stats = conn.query_row(TOTALS, params, |row| {
            Ok(Self::from_totals(
                row.get(0)?,
                row.get(1)?,
                row.get(2)?,
                row.get(3)?,
                row.get(4)?,
            ))
        })?;
        stats.open_streams = conn.query_row(OPEN_STREAMS, [], |row| row.get::<_, i64>(0))? as u64;
        let mut top = conn.prepare(TOP)?;
        stats.top_methods = top
            .query_map([TOP_METHODS as i64], |row| {
                Ok((row.get(0)?, row.get::<_, i64>(1)? as u64))
            })?
            .collect::<rusqlite::Result<_>>()?;
        Ok(stats)
    }

    /// Reads the figures on a PostgreSQL connection, in one snapshot.
    #[cfg(feature = "postgres")]
    pub(crate) async fn read_postgres(
        client: &impl tokio_postgres::GenericClient,
        now: u64,
        ttl: u64,
    ) -> Result<Self, tokio_postgres::Error> {
        let at = ReadAt { now, ttl };
        let (before, now) = (at.before_param(), at.now_param());
        let row = client.query_one(POSTGRES_TOTALS, &[&before, &now]).await?;
        let mut stats =
            Self::from_totals(row.get(0), row.get(1), row.get(2), row.get(3), row.get(4));
        stats.open_streams = client.query_one(OPEN_STREAMS, &[]).await?.get::<_, i64>(0) as u64;
        stats.top_methods = client
            .query(TOP, &[&(TOP_METHODS as i64)])
            .await?
            .iter()
            .map(|row| (row.get(0), row.get::<_, i64>(1) as u64))
            .collect();
        Ok(stats)
    }

    fn from_totals(
        entries: i64,
        bytes: i64,
        expired: i64,
        expiring: i64,
        oldest: Option<i64>,
    ) -> Self {
        Self {
            entries: entries as u64,
            bytes: bytes as u64,
            expired: expired as u64,
            expiring_within_hour: expiring as u64,
            oldest_inserted_at: oldest.map(|t| t.max(0) as u64),
            ..Self::default()
        }
    }
}
