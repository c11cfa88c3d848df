//! Executions in flight: what the table holds of one, and what a call that finds its key
//! held waits on.

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::hash::RequestHash;
use crate::message_id::MessageId;
use crate::store::{Elsewhere, Entry, Store};

/// An execution in flight, as the table holds it.
#[derive(Clone)]
pub(super) struct Flight {
    pub(super) method: String,
    pub(super) request_hash: RequestHash,
    pub(super) phase: watch::Receiver<Phase>,
}

/// Where a running execution is; waiters watch it without polling.
#[derive(Clone)]
pub(super) enum Phase {
    Running,
    /// Sharing live progress (a stream's recording, for one).
    Progressing(Progress),
    /// Stored: the entry that answers duplicates.
    Done(Arc<Entry>),
}

/// Live progress an executor shares with the calls that wait on it.
pub type Progress = Arc<dyn Any + Send + Sync>;

/// What a wait on a running execution saw.
pub enum Waited {
    /// It finished and stored this entry.
    Done(Arc<Entry>),
    /// It shares live progress (asked for with `attach`).
    Progressing(Progress),
    /// It gave up without an outcome: claim again.
    Released,
    /// Still running after the bound.
    StillRunning,
}

impl Waited {
    /// The `result` label of the in-flight wait metric.
    pub(crate) fn label(&self) -> &'static str {
        match self {
            Self::Done(_) => "done",
            Self::Progressing(_) => "attached",
            Self::Released => "released",
            Self::StillRunning => "still_running",
        }
    }
}

/// A call that holds the key and is still running.
pub struct InFlight(pub(super) Holder);

/// Where the running call is.
pub(super) enum Holder {
    /// In this process: its phase is watched.
    Here(Flight),
    /// In another process sharing the store: the store waits for it.
    Elsewhere {
        store: Arc<dyn Store>,
        key: MessageId,
        method: String,
        request_hash: RequestHash,
    },
}

impl InFlight {
    /// The same holder, answering for the call of `method` with `request_hash`.
    pub(super) fn bound_to(self, method: String, request_hash: RequestHash) -> Self {
        InFlight(match self.0 {
            Holder::Here(flight) => Holder::Here(Flight {
                method,
                request_hash,
                ..flight
            }),
            Holder::Elsewhere { store, key, .. } => Holder::Elsewhere {
                store,
                key,
                method,
                request_hash,
            },
        })
    }

    /// The method the running call was made with.
    pub fn method(&self) -> &str {
        match &self.0 {
            Holder::Here(flight) => &flight.method,
            Holder::Elsewhere { method, .. } => method,
        }
    }

    /// The request hash of the running call.
    pub fn request_hash(&self) -> &RequestHash {
        match &self.0 {
            Holder::Here(flight) => &flight.request_hash,
            Holder::Elsewhere { request_hash, .. } => request_hash,
        }
    }

    /// Whether it answers a call of `method` whose params hash to `hash`.
    // Only the store suite, which runs on both backends, calls it.
    #[cfg(all(test, feature = "postgres"))]
    pub fn matches(&self, method: &str, hash: &RequestHash) -> bool {
        self.method() == method && self.request_hash() == hash
    }

    /// Waits, without polling, at most `bound`, for the running call to finish or, with
    /// `attach`, to share live progress (only a call in this process shares it).
    pub async fn wait(self, bound: Duration, attach: bool) -> Waited {
        match self.0 {
            Holder::Here(flight) => wait_here(flight, bound, attach).await,
            Holder::Elsewhere { store, key, .. } => match store.wait_elsewhere(&key, bound).await {
                Ok(Elsewhere::Done(entry)) => Waited::Done(entry),
                Ok(Elsewhere::StillRunning) => Waited::StillRunning,
                // A store that cannot be read is met again, and answered, by the next claim.
                Ok(Elsewhere::Released) | Err(_) => Waited::Released,
            },
        }
    }
}

async fn wait_here(mut flight: Flight, bound: Duration, attach: bool) -> Waited {
    let seen = tokio::time::timeout(
        bound,
        flight.phase.wait_for(|phase| match phase {
            Phase::Running => false,
            Phase::Progressing(_) => attach,
            Phase::Done(_) => true,
        }),
    )
    .await;
    match seen {
        Err(_elapsed) => Waited::StillRunning,
        Ok(Err(_released)) => Waited::Released,
        Ok(Ok(phase)) => match &*phase {
            Phase::Done(entry) => Waited::Done(entry.clone()),
            Phase::Progressing(progress) => Waited::Progressing(progress.clone()),
            Phase::Running => Waited::StillRunning,
        },
    }
}
