//! The unit of work: the database writes of one call, committed in the very transaction that
//! stores its cache entry, so that a call's side effects and its cached response are durable
//! together or not at all (spec §6.1: a replay never re-executes a side effect, even after a
//! crash).
//!
//! The RPC layer gives every governed call a unit in its `Extensions`; the body stages writes
//! into it; the guard commits them. A write cannot run earlier: the writer thread applies it in
//! its next group-committed batch; when a write fails, the batch is redone with a savepoint
//! per call, so one call's failing write never touches another's.

use std::sync::{Arc, Mutex};

use jsonrpsee::types::ErrorObjectOwned;
use jsonrpsee::Extensions;

use crate::error::{ErrorCode, IdempotencyError};
use crate::layers::scope::GuardReach;
use crate::store::sqlite::application_writes;
use crate::store::{Store, StoreError};

/// Why a staged write refused to commit: any error, `rusqlite::Error` included (so `?` works).
pub type WriteError = Box<dyn std::error::Error + Send + Sync>;

type WriteFn = dyn FnMut(&rusqlite::Connection) -> Result<(), WriteError> + Send;

/// A write on PostgreSQL: an async closure over the call's transaction.
#[cfg(feature = "postgres")]
type PostgresFn = dyn for<'t> FnOnce(
        &'t tokio_postgres::Transaction<'t>,
    ) -> futures::future::BoxFuture<'t, Result<(), WriteError>>
    + Send;

/// One staged write: runs inside the transaction that commits the call (on SQLite, on the
/// store's writer thread).
pub struct SqlWrite {
    kind: Kind,
}

enum Kind {
    /// Whether it may run again after a rolled-back attempt (it writes through the connection
    /// only). One that may not is run once, under a savepoint of its own.
    Sqlite { run: Box<WriteFn>, rerunnable: bool },
    #[cfg(feature = "postgres")]
    Postgres(Box<PostgresFn>),
}

impl SqlWrite {
    /// A write that may run more than once before it commits: everything it does goes
    /// through the connection, so a rolled-back attempt leaves nothing behind.
    pub fn rerunnable(
        write: impl FnMut(&rusqlite::Connection) -> Result<(), WriteError> + Send + 'static,
    ) -> Self {
        let run = Box::new(write);
        Self {
            kind: Kind::Sqlite {
                run,
                rerunnable: true,
            },
        }
    }

    /// A write that runs exactly once (it hands a value out of the transaction, say).
    pub fn once(
        write: impl FnOnce(&rusqlite::Connection) -> Result<(), WriteError> + Send + 'static,
    ) -> Self {
        let mut write = Some(write);
        let run = Box::new(move |conn: &rusqlite::Connection| match write.take() {
            Some(write) => write(conn),
            None => Err("a write that runs once was run twice".into()),
        });
        Self {
            kind: Kind::Sqlite {
                run,
                rerunnable: false,
            },
        }
    }

    /// A write on a PostgreSQL store: it runs once, in the call's transaction.
    #[cfg(feature = "postgres")]
    pub fn postgres(
        write: impl for<'t> FnOnce(
                &'t tokio_postgres::Transaction<'t>,
            ) -> futures::future::BoxFuture<'t, Result<(), WriteError>>
            + Send
            + 'static,
    ) -> Self {
        Self {
            kind: Kind::Postgres(Box::new(write)),
        }
    }

    /// Whether it may run again after a rolled-back attempt.
    pub fn is_rerunnable(&self) -> bool {
        match &self.kind {
            Kind::Sqlite { rerunnable, .. } => *rerunnable,
            #[cfg(feature = "postgres")]
            Kind::Postgres(_) => false,
        }
    }

    /// Runs it on a SQLite connection. A write that panics fails as one that returns an
    /// error does: it runs on the store's one writer thread, which every call needs.
    pub fn run(&mut self, conn: &rusqlite::Connection) -> Result<(), WriteError> {
        match &mut self.kind {
            Kind::Sqlite { run, .. } => {
                let run =
                    std::panic::AssertUnwindSafe(|| application_writes::running(|| run(conn)));
                let ran = std::panic::catch_unwind(run);
                ran.unwrap_or_else(|panic| Err(panicked(panic)))
            }
            #[cfg(feature = "postgres")]
            Kind::Postgres(_) => Err(wrong_backend("PostgreSQL", "SQLite")),
        }
    }

    /// Runs it in a PostgreSQL transaction; a panic fails it, as on SQLite.
    #[cfg(feature = "postgres")]
    pub async fn run_postgres(
        self,
        tx: &tokio_postgres::Transaction<'_>,
    ) -> Result<(), WriteError> {
        use futures::FutureExt;
        match self.kind {
            Kind::Postgres(write) => std::panic::AssertUnwindSafe(async move { write(tx).await })
                .catch_unwind()
                .await
                .unwrap_or_else(|panic| Err(panicked(panic))),
            Kind::Sqlite { .. } => Err(wrong_backend("SQLite", "PostgreSQL")),
        }
    }
}

/// The error of a write that panicked, with what it said.
fn panicked(panic: Box<dyn std::any::Any + Send>) -> WriteError {
    let said = match (panic.downcast_ref::<&str>(), panic.downcast_ref::<String>()) {
        (Some(text), _) => text,
        (_, Some(text)) => text.as_str(),
        _ => "",
    };
    format!("the staged write panicked: {said}").into()
}

/// A write staged for one database and committed on the other: the application's mistake,
/// refused rather than dropped.
#[cfg(feature = "postgres")]
fn wrong_backend(staged_for: &str, store: &str) -> WriteError {
    format!("a write staged for {staged_for} cannot commit in a {store} store").into()
}

type Hook = Box<dyn FnOnce() + Send>;

/// The writes a call stages, committed with its cache entry (or, where the call is not
/// deduplicated, on their own through the same writer).
///
/// `Ok` from the body commits them; an `Err` or a panic discards them (the error is still
/// cached, spec §4.3). A staged write that fails fails the whole call: nothing of it is
/// committed, the client gets `IDEMPOTENCY_WRITE_FAILED`, nothing is cached, and a retry runs.
///
/// ```
/// use idem_runtime::UnitOfWork;
/// use jsonrpsee::{core::RpcResult, Extensions};
///
/// /// Called from an `#[idempotent]` body with the `ext` it receives.
/// fn assign(ext: &Extensions, task_id: String) -> RpcResult<()> {
///     let unit = UnitOfWork::of(ext)?;
///     unit.stage(move |db| {
///         db.execute("INSERT INTO tasks (id) VALUES (?1)", [&task_id])?;
///         Ok(())
///     })?;
///     unit.after_commit(|| println!("the task is durable"))
/// }
///
/// // Outside a governed call there is no unit of work: a clear error, not a silent no-op.
/// assert!(assign(&Extensions::new(), "t-1".into()).is_err());
/// ```
#[derive(Clone)]
pub struct UnitOfWork {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn Store>,
    staged: Mutex<Staged>,
}

#[derive(Default)]
struct Staged {
    sealed: bool,
    pending: Sealed,
}

/// The writes taken out of a unit for one commit, and what runs once it is durable.
#[derive(Default)]
pub(crate) struct Sealed {
    pub(crate) writes: Vec<SqlWrite>,
    hooks: Vec<Hook>,
}

impl Drop for Sealed {
    /// What is dropped uncommitted (the body failed, or the call ended before its commit) is
    /// dropped on the call's task: a value a write or hook captured whose `Drop` panics
    /// unwound through the guard, and the call went unanswered and uncached, to run again at
    /// its retry (found by helper-86). Logged instead; the call's answer stands.
    fn drop(&mut self) {
        let left = (
            std::mem::take(&mut self.writes),
            std::mem::take(&mut self.hooks),
        );
        if !left.0.is_empty() || !left.1.is_empty() {
            drop_caught(left, "a staged write or after_commit hook");
        }
    }
}

/// Drops `value`, an application's, on a call's task: a panic in its `Drop` is logged as
/// `what`'s, instead of unwinding through the guard.
pub(crate) fn drop_caught<T>(value: T, what: &str) {
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(value))).is_err() {
        tracing::error!("{what} panicked as it was dropped");
    }
}

impl UnitOfWork {
    pub(crate) fn new(store: Arc<dyn Store>) -> Self {
        Self {
            inner: Arc::new(Inner {
                store,
                staged: Mutex::default(),
            }),
        }
    }

    /// The unit of work of the governed call whose `Extensions` these are.
    ///
    /// Refused (`IDEMPOTENCY_METHOD_NOT_GUARDED`) in a governed method that is not
    /// `#[idempotent]`: no guard would commit what it stages.
    pub fn of(ext: &Extensions) -> Result<Self, ErrorObjectOwned> {
        if ext
            .get::<GuardReach>()
            .is_some_and(|reach| !reach.reached())
        {
            tracing::error!(
                "a unit of work asked for outside the guard: the governed method is not \
                 #[idempotent], and nothing it stages would be committed"
            );
            return Err(IdempotencyError::new(ErrorCode::NotGuarded).into());
        }
        if let Some(unit) = ext.get::<Self>() {
            return Ok(unit.clone());
        }
        // The layers passed the call down, with no unit: they have no store. Told that the
        // layers were missing, a server under `Idempotency::off()` looked for what it had
        // (helper-112).
        if ext.get::<GuardReach>().is_some() {
            let reason = "this server has no database (Idempotency::off), so no unit of work: \
                          serve on a store without deduplication \
                          (Idempotency::builder(config).without_deduplication()) for one";
            tracing::error!("{reason}");
            let error = IdempotencyError::new(ErrorCode::LayerMissing);
            return Err(error.with_detail("reason", reason).into());
        }
        tracing::error!(
            "no unit of work: the method is not governed, or the idempotency layers are missing"
        );
        Err(IdempotencyError::new(ErrorCode::LayerMissing).into())
    }

    /// Stages `write`: it runs when the call commits, in the transaction of its cache entry.
    /// It writes through the connection only: a batch whose commit a failing write stopped
    /// is rolled back and redone, so a write may run more than once before it commits.
    pub fn stage(
        &self,
        write: impl FnMut(&rusqlite::Connection) -> Result<(), WriteError> + Send + 'static,
    ) -> Result<(), ErrorObjectOwned> {
        self.with_open(|staged| staged.pending.writes.push(SqlWrite::rerunnable(write)))
    }

    /// Stages `write` for a PostgreSQL store: it runs once, in the transaction that stores
    /// the call's cache entry (and ends its claim), so the rows and the entry commit together.
    /// It must not say `COMMIT` or `ROLLBACK`: that would end the call's transaction before
    /// the claim's fence is checked. It runs on one of the store's pooled sessions, at READ
    /// COMMITTED, and must not raise the transaction's isolation: the claim's lease renewals
    /// then conflict with the call's commit. What it sets for the session (a plain `SET`, an
    /// advisory lock, a temporary table) does not outlast the call: the session is restored
    /// before it serves another, or closed; a setting meant for the write is `SET LOCAL`.
    ///
    /// ```
    /// use idem_runtime::UnitOfWork;
    /// use jsonrpsee::core::RpcResult;
    ///
    /// fn assign(unit: &UnitOfWork, task_id: String) -> RpcResult<()> {
    ///     unit.stage_postgres(move |tx| {
    ///         Box::pin(async move {
    ///             tx.execute("INSERT INTO tasks (id) VALUES ($1)", &[&task_id]).await?;
    ///             Ok(())
    ///         })
    ///     })
    /// }
    /// ```
    #[cfg(feature = "postgres")]
    pub fn stage_postgres(
        &self,
        write: impl for<'t> FnOnce(
                &'t tokio_postgres::Transaction<'t>,
            ) -> futures::future::BoxFuture<'t, Result<(), WriteError>>
            + Send
            + 'static,
    ) -> Result<(), ErrorObjectOwned> {
        self.with_open(|staged| staged.pending.writes.push(SqlWrite::postgres(write)))
    }

    /// Runs `hook` once the unit has committed (never if it did not): the place to start work
    /// that needs the staged rows to exist, such as a timer over a new task. A commit the disk
    /// did not answer in time fails the call, and the hook runs if it lands after all; on
    /// PostgreSQL, which does not learn of such a commit, the hook then never runs (work that
    /// must follow the commit belongs in an outbox row staged with it).
    pub fn after_commit(
        &self,
        hook: impl FnOnce() + Send + 'static,
    ) -> Result<(), ErrorObjectOwned> {
        self.with_open(|staged| staged.pending.hooks.push(Box::new(hook)))
    }

    fn with_open(&self, add: impl FnOnce(&mut Staged)) -> Result<(), ErrorObjectOwned> {
        let mut staged = self.inner.staged.lock().expect("unit of work lock");
        if staged.sealed {
            let error = IdempotencyError::new(ErrorCode::WriteFailed).with_detail(
                "reason",
                "staged after the call's unit of work was committed",
            );
            return Err(error.into());
        }
        add(&mut staged);
        Ok(())
    }

    /// Takes what is staged for the commit; later stages are refused.
    pub(crate) fn seal(&self) -> Sealed {
        let mut staged = self.inner.staged.lock().expect("unit of work lock");
        staged.sealed = true;
        std::mem::take(&mut staged.pending)
    }

    /// Drops what is staged (the body failed): nothing of it is ever written.
    pub(crate) fn discard(&self) {
        drop(self.seal());
    }

    /// Commits the staged writes on their own, for a call that is not deduplicated.
    pub(crate) async fn commit_alone(&self) -> Result<(), StoreError> {
        self.commit_sealed(self.seal()).await
    }

    /// Commits on their own the writes [`seal`](Self::seal) took.
    pub(crate) async fn commit_sealed(&self, mut sealed: Sealed) -> Result<(), StoreError> {
        let writes = sealed.take_writes();
        if writes.is_empty() {
            sealed.committed();
            return Ok(());
        }
        // Shared with the store: should it stop waiting for the disk, and the writes commit
        // after all, it runs the hooks then. One of the two runs them; never both.
        let hooks = Arc::new(Mutex::new(Some(sealed)));
        let if_late = hooks.clone();
        let if_late = Box::new(move || Sealed::run_once(&if_late));
        self.inner.store.apply_or_later(writes, if_late).await?;
        Sealed::run_once(&hooks);
        Ok(())
    }
}

impl Sealed {
    /// Splits off the writes for the store; the hooks stay to run after the commit.
    pub(crate) fn take_writes(&mut self) -> Vec<SqlWrite> {
        std::mem::take(&mut self.writes)
    }

    /// The commit is durable: run what waited for it. A hook that panics is logged, and the
    /// hooks after it still run: the commit they wait for happened all the same.
    pub(crate) fn committed(mut self) {
        for hook in std::mem::take(&mut self.hooks) {
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(hook)).is_err() {
                tracing::error!("an after_commit hook panicked; the hooks after it still run");
            }
        }
    }

    /// [`committed`](Self::committed), unless another holder of `sealed` ran it first.
    fn run_once(sealed: &Mutex<Option<Sealed>>) {
        let taken = sealed.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(sealed) = taken {
            sealed.committed();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[test]
    fn a_hook_that_panics_leaves_the_hooks_after_it_to_run() {
        let ran = Arc::new(AtomicUsize::new(0));
        let counted = |ran: &Arc<AtomicUsize>| -> Hook {
            let ran = ran.clone();
            Box::new(move || {
                ran.fetch_add(1, Ordering::SeqCst);
            })
        };
        let sealed = Sealed {
            writes: Vec::new(),
            hooks: vec![
                counted(&ran),
                Box::new(|| panic!("a bug in a hook")),
                counted(&ran),
            ],
        };
        sealed.committed();
        assert_eq!(ran.load(Ordering::SeqCst), 2);
    }
}
