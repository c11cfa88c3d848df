//! What the layers hand each other about one HTTP request and each governed call in it.
//!
//! The HTTP layer puts a [`HttpScope`] into the `http::Request` extensions; jsonrpsee copies
//! them into every call's `Extensions`, where the RPC layer and the guard record outcomes (and
//! a streaming call leaves its events); the HTTP layer then turns them into the response.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jsonrpsee::types::Id;

use crate::caller::CallerPolicy;
use crate::claim::IdempotencyCache;
use crate::error::ErrorCode;
use crate::guard::recording::Recording;
use crate::hash::{Glimpse, RequestHash, Sent, Spelling};
use crate::message_id::MessageId;

/// What happened to one governed call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Ran and was stored.
    Executed,
    /// Answered from the cache.
    Replayed,
    /// A stream's retry that follows the running original's live events.
    Attached,
    /// Refused by the extension with this error.
    Rejected(ErrorCode),
    /// Passed to the method without deduplication: the extension is off, or optional and
    /// not activated by the request.
    Undeduplicated,
}

/// One HTTP request's view of the extension.
#[derive(Clone)]
pub(crate) struct HttpScope(Arc<ScopeInner>);

struct ScopeInner {
    activated: bool,
    caller: CallerPolicy,
    /// The whole request body, when the HTTP layer read it: once its single call is answered
    /// with the stored bytes, a resend of the same request is answered with them.
    request: Option<Sent>,
    /// Whether jsonrpsee dispatched a call of the request to the RPC layer: its answer is
    /// then the call's, never jsonrpsee's refusal of the body.
    dispatched: AtomicBool,
    state: Mutex<ScopeState>,
}

#[derive(Default)]
struct ScopeState {
    /// For a batch, how many answers it gets (its calls and the entries refused as they are).
    batch: Option<usize>,
    outcomes: Vec<Outcome>,
    stream: Option<StreamSource>,
    /// The HTTP layer will not answer: its client hung up while the call ran.
    hung_up: bool,
}

/// Events that replace jsonrpsee's JSON response with an SSE one.
pub(crate) struct StreamSource {
    pub(crate) recording: Arc<Recording>,
    /// Re-id every event for this caller (replays and attached retries); `None` for the
    /// original caller, whose id the events already carry.
    pub(crate) reframe_for: Option<Id<'static>>,
}

impl HttpScope {
    pub(crate) fn new(activated: bool, caller: CallerPolicy, request: Option<Sent>) -> Self {
        Self(Arc::new(ScopeInner {
            activated,
            caller,
            request,
            dispatched: AtomicBool::new(false),
            state: Mutex::default(),
        }))
    }

    pub(crate) fn mark_dispatched(&self) {
        self.0.dispatched.store(true, Ordering::Relaxed);
    }

    pub(crate) fn dispatched(&self) -> bool {
        self.0.dispatched.load(Ordering::Relaxed)
    }

    /// The glimpse and spelling of the request's body (the caller's, where keys are scoped),
    /// if it is a single call (not a batch).
    pub(crate) fn single_request_spelling(&self) -> Option<(Glimpse, Spelling)> {
        let request = self.0.request.as_ref().filter(|_| !self.is_batch())?;
        Some((request.glimpse, self.0.caller.spelling(request.spelling())))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ScopeState> {
        self.0.state.lock().expect("scope lock")
    }

    pub(crate) fn activated(&self) -> bool {
        self.0.activated
    }

    /// What the request's caller changes.
    pub(crate) fn caller(&self) -> CallerPolicy {
        self.0.caller
    }

    /// Records what happened to a governed call of `method`: for the response, and counted.
    pub(crate) fn record(&self, method: &str, outcome: Outcome) {
        crate::telemetry::outcome(method, outcome);
        self.lock().outcomes.push(outcome);
    }

    /// Marks the request a batch of `answers` answers.
    pub(crate) fn mark_batch(&self, answers: usize) {
        self.lock().batch = Some(answers);
    }

    /// `added` answers went into the batch's response beside jsonrpsee's (to calls whose id
    /// it could not read): none of them a replay.
    pub(crate) fn answered_beside_jsonrpsee(&self, added: usize) {
        if let Some(answers) = self.lock().batch.as_mut() {
            *answers += added;
        }
    }

    pub(crate) fn is_batch(&self) -> bool {
        self.lock().batch.is_some()
    }

    /// The events that answer the request; where its client has hung up, no one reads them.
    pub(crate) fn set_stream(&self, recording: Arc<Recording>, reframe_for: Option<Id<'static>>) {
        let mut state = self.lock();
        match state.hung_up {
            true => recording.never_read(),
            false => {
                state.stream = Some(StreamSource {
                    recording,
                    reframe_for,
                })
            }
        }
    }

    /// The client hung up before its answer was sent: a stream the call leaves, now or later
    /// (it runs on in a task of its own), is read by no one.
    pub(crate) fn hang_up(&self) {
        let mut state = self.lock();
        state.hung_up = true;
        if let Some(stream) = state.stream.take() {
            stream.recording.never_read();
        }
    }

    pub(crate) fn take_stream(&self) -> Option<StreamSource> {
        self.lock().stream.take()
    }

    /// The single governed outcome of a non-batch request, if there is one.
    pub(crate) fn single_outcome(&self) -> Option<Outcome> {
        let state = self.lock();
        match (state.batch, state.outcomes.as_slice()) {
            (None, [one]) => Some(*one),
            _ => None,
        }
    }

    /// Whether the request is a batch whose every answer was a replay: a response served
    /// from the cache as a whole (spec §4.3), where one answer that is not makes it not.
    pub(crate) fn replayed_whole_batch(&self) -> bool {
        let state = self.lock();
        let replayed = state.outcomes.iter().all(|o| *o == Outcome::Replayed);
        state.batch == Some(state.outcomes.len()) && !state.outcomes.is_empty() && replayed
    }
}

/// A governed call the RPC layer has checked: what the guard needs to run it.
#[derive(Clone)]
pub(crate) struct GovernedCall {
    pub(crate) cache: IdempotencyCache,
    pub(crate) in_flight_wait: Duration,
    /// `IdempotencyConfig::max_response_body_bytes`.
    pub(crate) max_response_bytes: usize,
    pub(crate) scope: HttpScope,
    pub(crate) id: Id<'static>,
    pub(crate) method: String,
    pub(crate) key: MessageId,
    pub(crate) hash: RequestHash,
    /// The raw params: once an entry answers the call by its key, a resend of these very
    /// bytes is recognised without hashing.
    pub(crate) params: Sent,
}

impl GovernedCall {
    pub(crate) fn record(&self, outcome: Outcome) {
        self.scope.record(&self.method, outcome);
    }
}

/// Marked by the guard when it takes a governed call (deduplicated or not). A governed call
/// answered without it had its params refused by jsonrpsee, or its method is not
/// `#[idempotent]` (the attribute left off, or put on the `#[rpc]` trait, which drops it).
#[derive(Clone, Default)]
pub(crate) struct GuardReach(Arc<AtomicBool>);

impl GuardReach {
    /// Marks the call taken; `true` if a guard had taken it already: an `#[idempotent]`
    /// method called by another, with its `Extensions`.
    pub(crate) fn mark(&self) -> bool {
        self.0.swap(true, Ordering::Relaxed)
    }

    pub(crate) fn reached(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// A governed method called where it runs undeduplicated by design (the extension is off, or
/// optional and not activated): the call's id, which a stream's events need, and what its
/// answer is measured against before its staged writes commit.
#[derive(Clone)]
pub(crate) struct Undeduplicated {
    pub(crate) id: Id<'static>,
    pub(crate) method: String,
    pub(crate) max_response_bytes: usize,
}

/// The id of a call outside the methods the extension governs, on any transport: a method
/// that streams without being deduplicated ([`crate::EventStream::live`]) frames its events
/// with it, and a guard that finds it knows the layers are installed, and the method not
/// governed.
#[derive(Clone)]
pub(crate) struct CallId(pub(crate) Id<'static>);

/// A WebSocket connection: its calls share the upgrade request's extensions, so no per-request
/// scope can be kept, and governed calls are refused on it.
#[derive(Clone, Copy)]
pub(crate) struct WebSocket;
