//! One message at a time per task, in this process. A message that continues a task reads it,
//! appends itself, and stages the change, applied only if the row is unchanged when its unit
//! of work commits. Two such messages at once both read the same row and one of them fails
//! (uncached, so its retry runs): 13 of 16 concurrent continuations of one task did. Holding
//! the task's lock from the read until the unit has committed (or was dropped) makes them
//! take turns instead, each until it commits (its `delayMs` included, so they are answered
//! one after another). A cancel and a mission's completion take no turn: they read and write
//! in one transaction of the store's writer, and must not wait behind a held-back answer (a
//! review saw a completion 5 s past its deadline when they did); a continuation they overtake
//! fails, uncached, and its retry reads the task as they left it. Replicas on a shared
//! database do not share these locks: there the check on the row stays the guarantee, and a
//! conflict fails the later call, uncached.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::OwnedMutexGuard;

/// The locks of the tasks being continued.
#[derive(Clone, Default)]
pub struct TaskLocks {
    inner: Arc<Mutex<Locks>>,
}

#[derive(Default)]
struct Locks {
    /// Weak: a task's lock lives while someone holds it or waits for it.
    by_task: HashMap<String, Weak<tokio::sync::Mutex<()>>>,
    /// The map's size at which the locks no one holds any more are dropped from it.
    prune_at: usize,
}

/// The task's turn: others wait until it is dropped.
pub type Turn = OwnedMutexGuard<()>;

/// Dropped from the map when it grows past twice what is live, and never below this.
const MIN_PRUNE_AT: usize = 64;

impl TaskLocks {
    /// Waits for `task_id`'s turn.
    pub async fn turn(&self, task_id: &str) -> Turn {
        self.lock_of(task_id).lock_owned().await
    }

    fn lock_of(&self, task_id: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.inner.lock().expect("task locks");
        if let Some(lock) = locks.by_task.get(task_id).and_then(Weak::upgrade) {
            return lock;
        }
        let lock = Arc::new(tokio::sync::Mutex::new(()));
        locks
            .by_task
            .insert(task_id.to_owned(), Arc::downgrade(&lock));
        if locks.by_task.len() >= locks.prune_at {
            locks.by_task.retain(|_, lock| lock.strong_count() > 0);
            locks.prune_at = (2 * locks.by_task.len()).max(MIN_PRUNE_AT);
        }
        lock
    }
}
