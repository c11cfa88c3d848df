//! The application's own access to the store's database file: writes through the store's one
//! writer (so they never contend with it for SQLite's single write lock, and ride its group
//! commit), reads on its read connections. For work that does not belong to one call: a timer
//! that completes a task, a resume at startup, a read-only method.

use std::sync::{Arc, Mutex};

use crate::store::sqlite::application_writes::was_interrupted;
use crate::store::{Store, StoreError};
use crate::unit_of_work::SqlWrite;

/// A handle on the database the store lives in; see [`crate::Idempotency::database`].
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use idem_runtime::{Idempotency, IdempotencyConfig};
/// use idem_runtime::store::TransactError;
/// let dir = tempfile::tempdir().unwrap();
/// let idem = Idempotency::open(dir.path().join("a2a.db"), IdempotencyConfig::default()).unwrap();
/// let db = idem.database().unwrap();
/// db.transact(|conn| conn.execute_batch("CREATE TABLE notes (text TEXT)"))
///     .await
///     .unwrap();
/// let added = db
///     .transact(|conn| conn.execute("INSERT INTO notes VALUES ('hello')", []))
///     .await
///     .unwrap();
/// assert_eq!(added, 1);
/// let count: i64 = db
///     .read(|conn| conn.query_row("SELECT COUNT(*) FROM notes", [], |row| row.get(0)))
///     .await
///     .unwrap();
/// assert_eq!(count, 1);
/// // An error from the closure rolls its writes back and comes back as `Refused`.
/// let refused = db
///     .transact(|conn| {
///         conn.execute("INSERT INTO notes VALUES ('lost')", [])?;
///         conn.execute("INSERT INTO nowhere VALUES (1)", [])
///     })
///     .await;
/// assert!(matches!(refused, Err(TransactError::Refused(_))));
/// # }
/// ```
#[derive(Clone)]
pub struct Database {
    store: Arc<dyn Store>,
}

/// Why [`Database::transact`] or [`Database::read`] did not return a value.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TransactError<E> {
    /// The closure returned this error; its writes were rolled back.
    #[error("{0}")]
    Refused(E),
    /// The store failed (closed, disk full, I/O), or, on SQLite, another write in the same
    /// group commit rolled the whole transaction back (a `ROLLBACK` of its own, an
    /// `INSERT OR ROLLBACK` that conflicted), after this closure ran: it runs once, so it is
    /// not run again. Either way nothing of the closure was committed, and the caller may run
    /// it again. Two failures of the closure's own come here too, as [`StoreError::Write`],
    /// whose text says which, and which the same closure run again meets again: it panicked
    /// (helper-112), or on SQLite it ran past its bound, half of
    /// [`IdempotencyConfig::disk_timeout`](crate::IdempotencyConfig::disk_timeout), on the one
    /// writer that every call's commit waits for, and was interrupted.
    #[error("{0}")]
    Store(StoreError),
}

impl Database {
    pub(crate) fn new(store: Arc<dyn Store>) -> Self {
        Self { store }
    }

    /// The PostgreSQL pool, when the store is on PostgreSQL: the application's own work
    /// runs its transactions on it (a unit of work's writes go through
    /// [`UnitOfWork::stage_postgres`](crate::UnitOfWork::stage_postgres) instead).
    /// [`transact`](Self::transact) and [`read`](Self::read) are SQLite's. Its sessions are
    /// the store's: they run READ COMMITTED unless a transaction says otherwise, and what the
    /// application sets on one for longer than a transaction (`SET` rather than `SET LOCAL`)
    /// the store's calls then run under.
    ///
    /// ```no_run
    /// # async fn run(idem: idem_runtime::Idempotency) -> Result<(), Box<dyn std::error::Error>> {
    /// const NOTES: &str = "CREATE TABLE IF NOT EXISTS notes (text TEXT)";
    /// let db = idem.database().expect("a store");
    /// match db.postgres() {
    ///     Some(pool) => pool.get().await?.batch_execute(NOTES).await?,
    ///     None => db
    ///         .transact(|conn| conn.execute_batch(NOTES))
    ///         .await
    ///         .map_err(|e| e.to_string())?,
    /// }
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "postgres")]
    pub fn postgres(&self) -> Option<deadpool_postgres::Pool> {
        self.store.postgres_pool()
    }

    /// Runs `work` in the writer's next transaction, under a savepoint of its own; returns its
    /// value once the transaction has committed. That commit is `work`'s own, never a call's:
    /// in an `#[idempotent]` body it stays even when the call's entry does not commit, and the
    /// retry runs it again; a body writes through its [`UnitOfWork`](crate::UnitOfWork). A
    /// disk that has not answered within
    /// [`IdempotencyConfig::disk_timeout`](crate::IdempotencyConfig::disk_timeout) fails it
    /// with [`TransactError::Store`] while the transaction stays queued: `work` may still
    /// commit once the disk answers, as a write whose answer was lost.
    pub async fn transact<T, E>(
        &self,
        work: impl FnOnce(&rusqlite::Connection) -> Result<T, E> + Send + 'static,
    ) -> Result<T, TransactError<E>>
    where
        T: Send + 'static,
        E: Send + 'static,
    {
        let slot = Slot::default();
        let filled = slot.clone();
        let write = SqlWrite::once(move |conn| {
            let result = work(conn);
            let refused = result.is_err();
            filled.fill(result);
            match refused {
                true => Err("refused by the application".into()),
                false => Ok(()),
            }
        });
        let committed = self.store.apply(vec![write]).await;
        let result = slot.take();
        match (committed, result) {
            (Ok(()), Some(Ok(value))) => Ok(value),
            // Interrupted past its bound: that, not SQLite's "interrupted", says what to do.
            (Err(failure), _) if was_interrupted(&failure) => Err(TransactError::Store(failure)),
            (Err(StoreError::Write(_)), Some(Err(refused))) => Err(TransactError::Refused(refused)),
            (Err(failure), _) => Err(TransactError::Store(failure)),
            (Ok(()), _) => Err(TransactError::Store(StoreError::Commit(
                "the transaction committed without running its work".into(),
            ))),
        }
    }

    /// Runs `work` on one of the store's read connections; past
    /// [`IdempotencyConfig::disk_timeout`](crate::IdempotencyConfig::disk_timeout) without an
    /// answer from the disk, fails with [`TransactError::Store`] (`work` stays queued, and may
    /// still run once the disk answers; its value is then dropped). The application's reads
    /// take at most all but one of the read connections at once, so that they never hold the
    /// store's own lookups back: one past them waits for a place, within the same bound.
    pub async fn read<T, E>(
        &self,
        work: impl FnOnce(&rusqlite::Connection) -> Result<T, E> + Send + 'static,
    ) -> Result<T, TransactError<E>>
    where
        T: Send + 'static,
        E: Send + 'static,
    {
        let slot = Slot::default();
        let filled = slot.clone();
        let job = Box::new(move |conn: &rusqlite::Connection| filled.fill(work(conn)));
        self.store.read(job).await.map_err(TransactError::Store)?;
        match slot.take() {
            Some(result) => result.map_err(TransactError::Refused),
            None => Err(TransactError::Store(StoreError::Closed)),
        }
    }
}

/// Where a closure run on a store thread leaves its result for the caller.
struct Slot<T>(Arc<Mutex<Option<T>>>);

impl<T> Default for Slot<T> {
    fn default() -> Self {
        Self(Arc::new(Mutex::new(None)))
    }
}

impl<T> Clone for Slot<T> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<T> Slot<T> {
    fn fill(&self, value: T) {
        *self.0.lock().expect("slot lock") = Some(value);
    }

    fn take(&self) -> Option<T> {
        self.0.lock().expect("slot lock").take()
    }
}
