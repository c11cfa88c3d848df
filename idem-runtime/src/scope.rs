//! What the layers hand each other about one HTTP request and each governed call in it.
//!
//! The HTTP layer puts a [`HttpScope`] into the `http::Request` extensions; jsonrpsee copies
//! them into every call's `Extensions`, where the RPC layer and the guard record outcomes; the
//! HTTP layer then turns the outcomes into a status and headers.

use std::sync::{Arc, Mutex};

use jsonrpsee::types::Id;

use crate::canonical_hash::RequestHash;
use crate::error::ErrorCode;
use crate::idempotency::State;
use crate::message_id::MessageId;

/// What happened to one governed call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Ran and was stored.
    Executed,
    /// Answered from the cache.
    Replayed,
    /// Refused by the extension with this error.
    Rejected(ErrorCode),
}

/// One HTTP request's view of the extension.
#[derive(Clone)]
pub(crate) struct HttpScope(Arc<ScopeInner>);

struct ScopeInner {
    activated: bool,
    outcomes: Mutex<Outcomes>,
}

#[derive(Default)]
struct Outcomes {
    batch: bool,
    list: Vec<Outcome>,
}

impl HttpScope {
    pub(crate) fn new(activated: bool) -> Self {
        Self(Arc::new(ScopeInner {
            activated,
            outcomes: Mutex::default(),
        }))
    }

    pub(crate) fn activated(&self) -> bool {
        self.0.activated
    }

    pub(crate) fn record(&self, outcome: Outcome) {
        self.0
            .outcomes
            .lock()
            .expect("outcomes lock")
            .list
            .push(outcome);
    }

    pub(crate) fn mark_batch(&self) {
        self.0.outcomes.lock().expect("outcomes lock").batch = true;
    }

    /// The single governed outcome of a non-batch request, if there is one.
    pub(crate) fn single_outcome(&self) -> Option<Outcome> {
        let outcomes = self.0.outcomes.lock().expect("outcomes lock");
        match (outcomes.batch, outcomes.list.as_slice()) {
            (false, [one]) => Some(*one),
            _ => None,
        }
    }
}

/// A governed call the RPC layer has checked: what the guard needs to run it.
#[derive(Clone)]
pub(crate) struct GovernedCall {
    pub(crate) state: Arc<State>,
    pub(crate) scope: HttpScope,
    pub(crate) id: Id<'static>,
    pub(crate) method: String,
    pub(crate) key: MessageId,
    pub(crate) hash: RequestHash,
}

/// A governed method called without activation on a server where the extension is optional:
/// the guard runs the body undeduplicated.
#[derive(Clone, Copy)]
pub(crate) struct Undeduplicated;
