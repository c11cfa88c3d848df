//! The application's staged writes, run in a call's transaction, and the errors that are
//! theirs rather than the store's.

use crate::store::StoreError;
use crate::unit_of_work::SqlWrite;

/// `error`, as the staged writes' failure where it is theirs: a statement refused because one
/// of them swallowed its own error (the transaction aborted, 25P02), or a `COMMIT` that a
/// deferred constraint of theirs refused (class 23). Otherwise the store's, as it was.
pub(super) fn the_staged_writes(error: StoreError) -> StoreError {
    let StoreError::Backend { cause, backend } = error else {
        return error;
    };
    let code = cause
        .downcast_ref::<tokio_postgres::Error>()
        .and_then(tokio_postgres::Error::code);
    match code {
        Some(code) if *code == tokio_postgres::error::SqlState::IN_FAILED_SQL_TRANSACTION => {
            StoreError::Write(
                format!(
                    "a staged write's statement failed and the write went on without returning \
                     its error, so the transaction was aborted ({})",
                    crate::store::error::causes(cause.as_ref())
                )
                .into(),
            )
        }
        Some(code) if code.code().starts_with("23") => StoreError::Write(cause),
        _ => StoreError::Backend { backend, cause },
    }
}

pub(super) async fn apply_writes(
    tx: &deadpool_postgres::Transaction<'_>,
    writes: Vec<SqlWrite>,
) -> Result<(), StoreError> {
    let mut writes = writes.into_iter();
    while let Some(write) = writes.next() {
        if let Err(error) = write.run_postgres(tx).await {
            // The writes not run are dropped on the call's task: a captured value whose
            // `Drop` panics must not unwind through the guard (found by helper-88).
            crate::unit_of_work::drop_caught(writes, "a staged write");
            return Err(StoreError::Write(error));
        }
    }
    Ok(())
}
