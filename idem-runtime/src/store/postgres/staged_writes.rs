//! The application's staged writes, run in a call's transaction, the errors that are theirs
//! rather than the store's, and the session they ran on, given back to the pool as it was.

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Object;
use tokio_postgres::SimpleQueryMessage;

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

/// Undoes on a session what staged writes may have left on it past their transaction: a plain
/// `SET` lasts once it commits (`synchronous_commit = off` lost later calls' answered writes
/// in a crash; `default_transaction_read_only` failed one call in sixteen until a restart:
/// helper-90), and a `DEALLOCATE`, an advisory lock or a cursor outlast a rollback too. Then
/// sets `settings`, the pool's own, again, and counts the session's prepared statements: the
/// store's (prepared by the protocol) and the writes' own (by `PREPARE`).
pub(super) fn restore_sql(settings: &str) -> Arc<str> {
    format!(
        "SET SESSION AUTHORIZATION DEFAULT; RESET ALL; {settings}; CLOSE ALL; UNLISTEN *; \
         SELECT pg_advisory_unlock_all(); DISCARD TEMP; DISCARD SEQUENCES; \
         SELECT count(*) FILTER (WHERE NOT from_sql), count(*) FILTER (WHERE from_sql) \
         FROM pg_prepared_statements"
    )
    .into()
}

/// Gives `client`, whose transaction ran staged writes and committed, back to the pool as
/// the pool made it ([`restore_sql`]), in a task of its own: the call's answer waits for
/// none of it, and the next call to take the session waits for all of it. A session is
/// closed instead where it is not restored within `bound`, where it lost statements the
/// store prepared on it (the writes' `DEALLOCATE ALL`, whose every later use failed), or where
/// the writes prepared statements of their own (the same write's `PREPARE` failed on the
/// session's next call: helper-96).
pub(super) fn hand_back(client: Object, restore: Arc<str>, bound: Duration) {
    tokio::spawn(async move {
        let restored = tokio::time::timeout(bound, client.simple_query(&restore)).await;
        let prepared = match restored {
            Ok(Ok(messages)) => prepared_statements(&messages),
            Ok(Err(error)) => {
                tracing::warn!(%error, "a session could not be restored after staged writes: closed");
                None
            }
            Err(_) => None,
        };
        let cached = client.statement_cache.size();
        if prepared.is_none_or(|(store, writes)| store < cached || writes > 0) {
            discard(client);
        }
    });
}

/// Closes `client` instead of giving it back: its transaction ran staged writes and failed,
/// and what they left on the session (a `DEALLOCATE`, an advisory lock) outlasts the rollback.
pub(super) fn discard(client: Object) {
    drop(Object::take(client));
}

/// The counts [`restore_sql`] ends with: the protocol's prepared statements, then `PREPARE`'s.
fn prepared_statements(messages: &[SimpleQueryMessage]) -> Option<(usize, usize)> {
    let row = messages.iter().rev().find_map(|message| match message {
        SimpleQueryMessage::Row(row) => Some(row),
        _ => None,
    })?;
    Some((row.get(0)?.parse().ok()?, row.get(1)?.parse().ok()?))
}
