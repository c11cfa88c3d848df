//! How a store fails: the cause the guard answers -32603 with, and the metric's `kind`.

use std::path::PathBuf;

use crate::store::WriteError;

/// The store failed; the guard answers -32603 rather than pretend an outcome is cached.
///
/// ```
/// use idem_runtime::store::{SqliteStore, StoreError};
/// use idem_runtime::IdempotencyConfig;
/// let dir = tempfile::tempdir().unwrap();
/// let path = dir.path().join("a2a.db");
/// let config = IdempotencyConfig::default();
/// let _serving = SqliteStore::open(&path, &config).unwrap();
/// let refused = SqliteStore::open(&path, &config).err().expect("the file is served");
/// assert!(matches!(refused, StoreError::InUse { .. }));
/// assert_eq!(refused.kind(), "in_use"); // the `kind` label of idempotency_store_errors_total
/// eprintln!("{refused}"); // names the file, its lock and the process that serves it
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    #[error("{backend}: {}", causes(cause.as_ref()))]
    /// The database refused an operation, or could not be reached.
    ///
    /// Its message carries the whole chain of what the database said (tokio-postgres says
    /// `db error` and leaves the reason to its source), so it names no `source()`: a report
    /// that walks the chain, as anyhow's `{:#}` does, would print each cause twice.
    Backend {
        /// Which database: `sqlite` or `postgres`.
        backend: &'static str,
        /// What it said: downcast it to the driver's error for its details.
        cause: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error(
        "the claim of {0} expired and another process took it over; nothing of this call was stored"
    )]
    /// The call's lease was taken over (it ran past it): nothing of it was committed.
    ClaimLost(String),
    #[error("{0}")]
    /// A configuration value the store cannot be served with.
    Config(#[from] crate::config::ConfigError),
    #[error("io: {0}")]
    /// The database file could not be created or opened.
    Io(#[from] std::io::Error),
    #[error("the store is closed")]
    /// The store was closed; nothing more is written.
    Closed,
    #[error("commit failed: {0}")]
    /// A write transaction failed; nothing in it was stored.
    Commit(String),
    #[error("a staged write failed: {}", causes(.0.as_ref()))]
    /// A write the call staged refused; nothing of the call was stored.
    Write(WriteError),
    #[error(
        "the stores that opened this database last keyed calls {}, and this one would key \
         them {} (scope_keys_by_principal), while the database holds keys (entries, open \
         streams or claims): their retries would find nothing under the new keys and run \
         again; keep the setting, or change it on a database that holds none (every retry of \
         the calls it held then runs again)",
        if *scoped { "in one global key space" } else { "scoped by principal" },
        if *scoped { "scoped by principal" } else { "in one global key space" }
    )]
    /// The database holds keys, and its stores recorded another key scoping than this one's.
    ScopingChanged {
        /// Whether this store scopes keys by principal.
        scoped: bool,
    },
    #[error(
        "another replica serves this database and keeps entries for {theirs} s, where this \
         one is configured for {ours} s: replicas that share a database must keep entries for \
         the same time (AIWG_IDEMPOTENCY_TTL), or the shorter TTL's sweep deletes entries the \
         others still replay; to change it, stop them all first"
    )]
    /// A live replica on the same PostgreSQL database keeps entries for another TTL.
    TtlMismatch {
        /// This store's TTL, in seconds.
        ours: u64,
        /// The other replica's, as its sessions name it.
        theirs: u64,
    },
    #[error(
        "another replica serves this database and keys calls {}, where this one would key \
         them {} (scope_keys_by_principal): a retry served by another replica than the one \
         that answered would find nothing and run again; replicas that share a database must \
         key calls alike, so to change it, stop them all first",
        if *scoped { "in one global key space" } else { "scoped by principal" },
        if *scoped { "scoped by principal" } else { "in one global key space" }
    )]
    /// A live replica on the same PostgreSQL database scopes keys otherwise.
    ScopingMismatch {
        /// Whether this store scopes keys by principal.
        scoped: bool,
    },
    #[error(
        "database {} is already served by process {pid} (it holds the lock on {}); \
         one process serves a database file at a time",
        path.display(),
        lock.display()
    )]
    /// Another live process serves the database file (it holds its lock).
    InUse {
        /// The database file.
        path: PathBuf,
        /// The lock file.
        lock: PathBuf,
        /// The process that holds the lock, as it wrote it in the lock file.
        pid: String,
    },
    #[error(
        "database file {} is served by another process, which holds the file's own lock but \
         not its lock file: that lock file was deleted, or the database was renamed or moved \
         while served (SQLite names the file's log after the name it was opened by); stop \
         that process before serving the file again",
        path.display()
    )]
    /// Another live process serves the database file, under the name it had or after its
    /// lock file was deleted (it holds the file's own lock).
    ServedElsewhere {
        /// The database file.
        path: PathBuf,
    },
    #[error(
        "database file {} has {links} names (hard links): SQLite names the file's log after \
         the name it is opened by, so each name would get a log of its own over one file, and \
         a process of its own; give the database one name",
        path.display()
    )]
    /// The database file has more than one name; one process per file cannot be enforced.
    HardLinked {
        /// The database file.
        path: PathBuf,
        /// How many names it has.
        links: u64,
    },
    #[error(
        "database file {} was deleted or replaced while this process served it; nothing more \
         is stored until the server restarts",
        .0.display()
    )]
    /// The database file, or its `-wal` or `-shm` file, is no longer at its path: what would
    /// be committed to it is lost once the process ends (or written beside another process
    /// that cannot see this one), so nothing is.
    Vanished(PathBuf),
    #[error(
        "the purge is done: deleted from {}; but process {pid}, which serves the file, did \
         not confirm within {} s that it forgot the entries it holds in memory: until it does, \
         it may still answer what was purged from memory (restart it to be sure)",
        path.display(),
        waited.as_secs()
    )]
    /// An operator's purge committed, but the process serving the SQLite file did not say in
    /// time that it emptied its memory tier.
    PurgeUnconfirmed {
        /// The database file.
        path: PathBuf,
        /// The serving process, as it wrote itself in the lock file.
        pid: String,
        /// How long the purge waited.
        waited: std::time::Duration,
    },
    #[error("{}: {reason}", path.display())]
    /// The store or the operator's tool was pointed at what it cannot work on as a served
    /// database: a URI, `:memory:`, a file with other names, a file without the cache's table.
    NotServable {
        /// What the tool was given.
        path: PathBuf,
        /// Why not, and what to give instead.
        reason: String,
    },
    #[error("corrupt row for {message_id}: {detail}")]
    /// A row that cannot be read back as an entry.
    Corrupt {
        /// The row's key.
        message_id: String,
        /// Which column is wrong.
        detail: String,
    },
}

impl StoreError {
    /// [`StoreError::NotServable`]: `path`, and why it cannot be served.
    pub(crate) fn not_servable(path: &std::path::Path, reason: impl Into<String>) -> Self {
        Self::NotServable {
            path: path.to_path_buf(),
            reason: reason.into(),
        }
    }

    /// The `kind` label of the store-error metric.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Backend { .. } => "backend",
            Self::ClaimLost(_) => "claim_lost",
            Self::Config(_) => "config",
            Self::Io(_) => "io",
            Self::Closed => "closed",
            Self::Commit(_) => "commit",
            Self::Write(_) => "write",
            Self::TtlMismatch { .. } => "ttl_mismatch",
            Self::ScopingChanged { .. } => "scoping_changed",
            Self::ScopingMismatch { .. } => "scoping_mismatch",
            Self::InUse { .. } => "in_use",
            Self::ServedElsewhere { .. } => "served_elsewhere",
            Self::HardLinked { .. } => "hard_linked",
            Self::Vanished(_) => "vanished",
            Self::PurgeUnconfirmed { .. } => "purge_unconfirmed",
            Self::NotServable { .. } => "not_servable",
            Self::Corrupt { .. } => "corrupt",
        }
    }
}

/// An error and the errors under it, as one line: PostgreSQL's own words ("database \"a2a\"
/// does not exist") are a source or two below the "db error" its client says at the top.
///
/// ```
/// use idem_runtime::store::{causes, StoreError};
/// let failed = StoreError::Io(std::io::Error::other("disk full"));
/// assert_eq!(causes(&failed), "io: disk full");
/// ```
pub fn causes(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let said = cause.to_string();
        if !text.contains(&said) {
            text = format!("{text}: {said}");
        }
        source = cause.source();
    }
    text
}

impl From<rusqlite::Error> for StoreError {
    fn from(error: rusqlite::Error) -> Self {
        Self::Backend {
            backend: "sqlite",
            cause: Box::new(error),
        }
    }
}

#[cfg(feature = "postgres")]
impl From<tokio_postgres::Error> for StoreError {
    fn from(error: tokio_postgres::Error) -> Self {
        Self::Backend {
            backend: "postgres",
            cause: Box::new(error),
        }
    }
}

#[cfg(feature = "postgres")]
impl From<deadpool_postgres::PoolError> for StoreError {
    fn from(error: deadpool_postgres::PoolError) -> Self {
        Self::Backend {
            backend: "postgres",
            cause: Box::new(error),
        }
    }
}
