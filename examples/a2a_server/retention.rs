//! How long delivered outbox events are kept: the outbox is a queue, not a log, and without
//! this it grew by two rows a task for ever. Every replica prunes; two at once delete the same
//! rows once.

use std::time::Duration;

use crate::clock;
use crate::tasks::TaskStore;

/// How often the outbox is pruned, at most (a retention shorter than this, more often).
const PRUNE_EVERY: Duration = Duration::from_secs(60);

/// Starts the pruning; it runs as long as the process.
pub fn spawn(store: TaskStore, retention: Duration) {
    let every = retention.min(PRUNE_EVERY);
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(every).await;
            let before = clock::now_ms().saturating_sub(retention.as_millis() as u64);
            match store.prune_delivered(before).await {
                Ok(0) => {}
                Ok(pruned) => tracing::debug!(pruned, "outbox: delivered events deleted"),
                Err(error) => tracing::warn!(?error, "outbox: delivered events not deleted"),
            }
        }
    });
}
