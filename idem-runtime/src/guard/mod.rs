//! The guard that `#[idempotent]` wraps around a method body: where replay, the 422 collision,
//! the wait or 409, and execute-then-store are decided.
//!
//! The body is a lazy future: on a replay or a refusal it is dropped unpolled and never runs.
//! What "executing" and "replaying" mean depends on what the method returns: one JSON-RPC
//! response ([`crate::Replayable`], in `unary.rs`) or an event stream ([`crate::EventStream`],
//! in `stream.rs`); both go through [`decide`] and share the helpers below.

pub(crate) mod recording;
pub(crate) mod replayable;
pub(crate) mod sse;
pub(crate) mod stream;
pub(crate) mod unary;

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Instant;

use futures::future::Either;
use futures::FutureExt;
use jsonrpsee::types::{ErrorObjectOwned, Id};
use jsonrpsee::Extensions;
use tracing::Instrument;

use crate::claim::{Claim, Progress, Ticket, Waited};
use crate::error::{ErrorCode, IdempotencyError};
use crate::hash::{Glimpse, RequestHash, Spelling};
use crate::layers::scope::{CallId, GovernedCall, GuardReach, HttpScope, Outcome, Undeduplicated};
use crate::store::{Entry, StoreError, StoredResponse};
use crate::telemetry;
use crate::unit_of_work::UnitOfWork;
use crate::wire::{decode, response_bytes, Payload, JSON};

/// What an `#[idempotent]` method may return: [`crate::Replayable`] or [`crate::EventStream`]
/// in an `RpcResult`. The trait decides what executing and replaying mean for it; it is sealed
/// (the runtime must know how to store and replay each).
#[diagnostic::on_unimplemented(
    message = "`#[idempotent]` cannot store and replay a `{Self}`",
    label = "this method returns a type that #[idempotent] cannot store",
    note = "an #[idempotent] method returns `RpcResult<Replayable<T>>` (one answer) or \
            `RpcResult<EventStream<T>>` (a stream), with `T: Serialize`; `Ok(value.into())` \
            makes a `Replayable`, and an error of another type becomes an `ErrorObjectOwned` \
            with `.map_err(Into::into)`"
)]
pub trait Guarded: sealed::Sealed + Sized + Send + 'static {
    /// Runs `body` under the guard described by `ctx`. Not called directly.
    #[doc(hidden)]
    fn run<F>(ctx: CallContext, body: F) -> impl Future<Output = Self> + Send
    where
        F: Future<Output = Self> + Send;
}

pub(crate) mod sealed {
    /// Only the runtime's return types are [`Guarded`](super::Guarded).
    pub trait Sealed {}
}

/// What the layers told the guard about one call. Not a public API.
#[doc(hidden)]
pub struct CallContext {
    pub(crate) governed: Option<GovernedCall>,
    /// Set when the call runs undeduplicated by design.
    pub(crate) undeduplicated: Option<Undeduplicated>,
    pub(crate) scope: Option<HttpScope>,
    /// The call's unit of work (none where the server has no database).
    pub(crate) unit: Option<UnitOfWork>,
    /// The layers are installed, and the method is not among those they govern.
    pub(crate) ungoverned: bool,
}

/// Wraps `body` (the user's method body) in the idempotency guard: [`Guard::of`], then
/// [`Guard::run`].
pub fn guard<F>(ext: &Extensions, body: F) -> impl Future<Output = F::Output> + Send
where
    F: Future + Send,
    F::Output: Guarded,
{
    Guard::of(ext).run(body)
}

/// Calls `body` once: an `#[idempotent]` body runs in a closure taken as `FnOnce`, so that it
/// may return what it reborrows from its captures (`&mut self`), as the method it was could.
/// Not a public API.
#[doc(hidden)]
pub fn once<R>(body: impl FnOnce() -> R) -> R {
    body()
}

/// The guard of one call, as the layers described it. Not a public API.
#[doc(hidden)]
pub struct Guard {
    ctx: CallContext,
    span: tracing::Span,
    /// The call was taken by the guard of the `#[idempotent]` method that called this one:
    /// that guard claims, stores and commits; this one runs its body alone. Guarded too, it
    /// waited on its own call's claim, then stored the 409 it got as the outcome (helper-82).
    nested: bool,
}

impl Guard {
    /// Reads what the layers put in `ext`, now: the guard, and the future it runs, borrow
    /// nothing from the caller.
    pub fn of(ext: &Extensions) -> Self {
        let nested = ext.get::<GuardReach>().is_some_and(GuardReach::mark);
        let governed = ext.get::<GovernedCall>().cloned();
        let span = match &governed {
            Some(call) => telemetry::call_span(&call.method, call.key.as_str(), call.hash.as_str()),
            None => tracing::Span::none(),
        };
        let ctx = CallContext {
            governed,
            undeduplicated: ext.get::<Undeduplicated>().cloned(),
            scope: ext.get::<HttpScope>().cloned(),
            unit: ext.get::<UnitOfWork>().cloned(),
            ungoverned: ext.get::<CallId>().is_some(),
        };
        Self { ctx, span, nested }
    }

    /// Runs `body` under the guard. A governed call runs in its span (see
    /// [`crate::telemetry`]).
    pub fn run<F>(self, body: F) -> impl Future<Output = F::Output> + Send
    where
        F: Future + Send,
        F::Output: Guarded,
    {
        match self.nested {
            true => Either::Left(body),
            false => Either::Right(F::Output::run(self.ctx, body).instrument(self.span)),
        }
    }
}

/// A result or event that serde cannot write: the method's bug, answered (and cached) as such.
pub(crate) fn not_serializable(error: &serde_json::Error) -> ErrorObjectOwned {
    tracing::error!(%error, "an #[idempotent] method's result does not serialize");
    IdempotencyError::new(ErrorCode::ResultNotSerializable)
        .with_detail("reason", error.to_string())
        .into()
}

/// The error of a guarded method called where the layers do not govern it: loud, never
/// silent. The body does not run.
pub(crate) fn layer_missing(ungoverned: bool) -> ErrorObjectOwned {
    let reason = match ungoverned {
        true => {
            "the method is #[idempotent] but not governed: name it with \
             IdempotencyBuilder::govern, or take #[idempotent] off"
        }
        false => {
            "the idempotency layers are not both installed: Idempotency::http_layer in \
             set_http_middleware, Idempotency::rpc_layer in set_rpc_middleware"
        }
    };
    tracing::error!(reason, "#[idempotent] method refused");
    IdempotencyError::new(ErrorCode::LayerMissing)
        .with_detail("reason", reason)
        .into()
}

/// What to do with a governed call, once the key is claimed or found taken.
pub(crate) enum Decision {
    /// The key is ours: run the body and complete the ticket.
    Execute(Ticket),
    /// A stored outcome answers this call.
    Replay(Arc<Entry>),
    /// The same call is running and shares live progress (streams only).
    Attach(Progress),
    /// Refused (collision, 409, store failure); already recorded in the scope.
    Refuse(ErrorObjectOwned),
}

/// Claims the call's key and decides. A same-hash duplicate of a running call waits for it
/// without polling; with `attach`, it stops waiting as soon as the call shares live progress.
pub(crate) async fn decide(call: &GovernedCall, attach: bool) -> Decision {
    // One bound for the whole wait: a wake by an original that gave up without an outcome,
    // then another found running, did not start it again (helper-80, helper-84).
    let deadline = Instant::now().checked_add(call.in_flight_wait);
    loop {
        let started = Instant::now();
        let claim = call.cache.claim(&call.key, &call.method, &call.hash).await;
        telemetry::claimed(&call.method, started.elapsed());
        let flight = match claim {
            Err(e) => return Decision::Refuse(store_failure(call, e)),
            Ok(Claim::Execute(ticket)) => return Decision::Execute(ticket),
            Ok(Claim::Cached(entry)) => return replay_or_collide(call, entry),
            Ok(Claim::InFlight(flight)) => flight,
        };
        if let Some(collision) = collision(call, flight.method(), flight.request_hash()) {
            return Decision::Refuse(collision);
        }
        let started = Instant::now();
        let left = deadline.map_or(call.in_flight_wait, |d| {
            d.saturating_duration_since(started)
        });
        let waited = flight.wait(left, attach).await;
        telemetry::waited(&call.method, waited.label(), started.elapsed());
        match waited {
            Waited::Done(entry) => return replay_or_collide(call, entry),
            Waited::Progressing(progress) => return Decision::Attach(progress),
            // The first call gave up without an outcome: claim again.
            Waited::Released => continue,
            Waited::StillRunning => {
                let busy = IdempotencyError::new(ErrorCode::RequestInProgress);
                return Decision::Refuse(reject(call, busy));
            }
        }
    }
}

/// The outcome of a call whose params jsonrpsee refused before its body ran (their types did
/// not decode): stored and replayed as any failure is (spec §4.3: failed responses are
/// cached too), so that its retry is a replay, and another payload under its key the 422.
pub(crate) async fn store_refusal(call: &GovernedCall, refusal: ErrorObjectOwned) -> Payload {
    match decide(call, true).await {
        Decision::Execute(ticket) => store_json(call, ticket, Err(refusal), None).await,
        Decision::Replay(entry) if !stream::is_event_stream(&entry) => replay_json(call, &entry),
        // A stream's params spelled so that they hash alike and do not decode (`1.0` where the
        // method takes an integer `1`): the same request, answered with the stream's events.
        Decision::Replay(entry) => stream::replayed_unguarded(call, &entry),
        Decision::Attach(progress) => stream::attached_unguarded(call, progress),
        Decision::Refuse(error) => Err(error),
    }
}

fn replay_or_collide(call: &GovernedCall, entry: Arc<Entry>) -> Decision {
    match collision(call, &entry.method, &entry.request_hash) {
        Some(collision) => Decision::Refuse(collision),
        None => Decision::Replay(entry),
    }
}

/// Runs a body, turning a panic into the cached failure of spec §7.5 instead of a dead server.
pub(crate) async fn run_catching<F: Future>(
    call_name: &str,
    body: F,
) -> Result<F::Output, ErrorObjectOwned> {
    AssertUnwindSafe(body)
        .catch_unwind()
        .await
        .map_err(|_panic| {
            tracing::error!(method = call_name, "#[idempotent] method panicked");
            IdempotencyError::new(ErrorCode::ExecutionPanicked).into()
        })
}

/// Stores a JSON-RPC response durably, with the unit's staged writes when the call succeeded
/// (a failure discards them); answers with the stored outcome, or with the store's failure
/// (never with an outcome that is not stored).
pub(crate) async fn store_json(
    call: &GovernedCall,
    mut ticket: Ticket,
    payload: Payload,
    unit: Option<&UnitOfWork>,
) -> Payload {
    let (payload, body) = within_limit(call, payload);
    let response = StoredResponse {
        status: 200,
        headers: vec![("content-type".into(), JSON.into())],
        body,
    };
    let sealed = unit.map(UnitOfWork::seal).filter(|_| payload.is_ok());
    let writes = sealed
        .map(|sealed| ticket.commits(sealed))
        .unwrap_or_default();
    let completed = ticket.complete_with(response, writes);
    let completed = telemetry::committed(&call.method, completed).await;
    match completed {
        // The stored bytes were serialized from this very payload: answering with it is
        // answering with what is stored. Its bytes are spelled if a retry comes
        // (`replay_json`): most never do.
        Ok(_) => {
            call.record(Outcome::Executed);
            payload
        }
        Err(e) => Err(store_failure(call, e)),
    }
}

/// The payload of call `id` and its response bytes; where those are more than `limit`, what
/// jsonrpsee would send, the failure that says so instead: what is stored (or committed with)
/// must be what the client gets.
fn within_limit(call: &GovernedCall, payload: Payload) -> (Payload, Vec<u8>) {
    let body = response_bytes(&call.id, &payload);
    match over_limit(&call.method, call.max_response_bytes, body.len()) {
        None => (payload, body),
        Some(too_large) => {
            let payload = Err(too_large);
            let body = response_bytes(&call.id, &payload);
            (payload, body)
        }
    }
}

/// The failure that answers a response of `size` bytes, where that is over `limit`.
pub(crate) fn over_limit(method: &str, limit: usize, size: usize) -> Option<ErrorObjectOwned> {
    if size <= limit {
        return None;
    }
    tracing::error!(
        method,
        response_bytes = size,
        limit_bytes = limit,
        "an #[idempotent] method's response is over max_response_body_bytes"
    );
    let too_large = IdempotencyError::new(ErrorCode::ResponseTooLarge)
        .with_detail("limit_bytes", limit)
        .with_detail("response_bytes", size);
    Some(too_large.into())
}

/// Replays a stored single JSON-RPC response.
pub(crate) fn replay_json(call: &GovernedCall, entry: &Entry) -> Payload {
    match decode(&entry.response.body) {
        Some(payload) => {
            call.record(Outcome::Replayed);
            note_spellings(call, entry, &payload);
            payload
        }
        None => Err(corrupt(call)),
    }
}

/// Remembers the bytes that asked for `answered`, the call's entry, and answered `payload`:
/// its params, and the whole request where the entry's very bytes answer that request (its
/// JSON-RPC id is the stored one). Spelled only where the store keeps spellings, and not for
/// a batch's call (a batch is never answered from them).
fn note_spellings(call: &GovernedCall, answered: &Entry, payload: &Payload) {
    let store = call.cache.store();
    if !store.keeps_spellings() || call.scope.is_batch() {
        return;
    }
    let caller = call.scope.caller();
    let params = (call.params.glimpse, caller.spelling(call.params.spelling()));
    match verbatim_request(&call.scope, &call.id, answered, payload) {
        Some(request) => store.note_spellings(answered, &[params, request]),
        None => store.note_spellings(answered, &[params]),
    }
}

/// The glimpse and spelling of the whole request where `payload`, the answer to its single
/// call `id`, is `answered`'s very bytes (the stored JSON-RPC id is the call's): a resend of
/// that request may then be answered with them.
pub(crate) fn verbatim_request(
    scope: &HttpScope,
    id: &Id<'_>,
    answered: &Entry,
    payload: &Payload,
) -> Option<(Glimpse, Spelling)> {
    let verbatim = response_bytes(id, payload) == answered.response.body;
    scope.single_request_spelling().filter(|_| verbatim)
}

pub(crate) fn corrupt(call: &GovernedCall) -> ErrorObjectOwned {
    let error = StoreError::Corrupt {
        message_id: call.key.to_string(),
        detail: "response_body is not what this method stores".into(),
    };
    store_failure(call, error)
}

/// The one 422 decision (spec §4.3, §4.5): `None` when the call holding the key (cached or
/// running) is this call's method and request hash; else the collision, recorded in the
/// call's scope. The holder is untouched either way.
pub(crate) fn collision(
    call: &GovernedCall,
    held_method: &str,
    held_hash: &RequestHash,
) -> Option<ErrorObjectOwned> {
    if held_method == call.method && *held_hash == call.hash {
        return None;
    }
    let mut error = IdempotencyError::new(ErrorCode::KeyReusedWithDifferentPayload)
        .with_detail("original_request_hash", held_hash.as_str())
        .with_detail("submitted_request_hash", call.hash.as_str());
    // The same params under another method: the hashes alone (equal) would not say why.
    if held_method != call.method {
        error = error
            .with_detail("original_method", held_method)
            .with_detail("submitted_method", call.method.as_str());
    }
    tracing::warn!(
        target: crate::message_id::KEY_ANOMALY,
        message_id = %call.key,
        method = call.method,
        original_method = held_method,
        original_request_hash = held_hash.as_str(),
        submitted_request_hash = call.hash.as_str(),
        "messageId reused with a different payload: 422"
    );
    Some(reject(call, error))
}

pub(crate) fn reject(call: &GovernedCall, error: IdempotencyError) -> ErrorObjectOwned {
    let error = error.with_detail("message_id", call.key.message_id());
    call.record(Outcome::Rejected(error.code));
    error.to_error_object()
}

/// The store failed a governed call: nothing of it is cached, and the key is released (once a
/// write the disk did not answer in time has settled: it may still land, and is then replayed).
/// Counted as the call's outcome.
pub(crate) fn store_failure(call: &GovernedCall, error: StoreError) -> ErrorObjectOwned {
    telemetry::store_error(Some(&call.method), &error);
    named_failure(&call.key, &error)
}

/// The store failed a stream of `key` mid-way: the error its last event carries. Counted as a
/// store error only: the call was counted when it started (`executed`).
pub(crate) fn key_failure(
    key: &crate::message_id::MessageId,
    error: &StoreError,
) -> ErrorObjectOwned {
    telemetry::store_error(None, error);
    named_failure(key, error)
}

/// The failure, naming the key; `IDEMPOTENCY_CLAIM_LOST` when another process took the claim
/// over.
fn named_failure(key: &crate::message_id::MessageId, error: &StoreError) -> ErrorObjectOwned {
    tracing::error!(message_id = %key, error = %error, "idempotency cache failed");
    failure(error)
        .with_detail("message_id", key.message_id())
        .into()
}

/// The staged writes of a call that is not deduplicated failed: nothing of them is stored,
/// unless the disk only did not answer in time (they may then still land).
pub(crate) fn undeduplicated_failure(error: StoreError) -> ErrorObjectOwned {
    tracing::error!(error = %error, "a call's unit of work could not be committed");
    telemetry::store_error(None, &error);
    failure(&error).into()
}

/// A staged write that refused is the call's failure; anything else is the store's.
fn failure(error: &StoreError) -> IdempotencyError {
    match error {
        StoreError::Write(_) => IdempotencyError::new(ErrorCode::WriteFailed),
        StoreError::ClaimLost(_) => IdempotencyError::new(ErrorCode::ClaimLost),
        _ => IdempotencyError::new(ErrorCode::StoreUnavailable),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message_id::MessageId;

    /// A stream whose event or close another replica fenced out ends with the claim-lost
    /// error the README documents, naming the key, and not with the store's outage.
    #[test]
    fn a_store_failure_of_a_key_names_a_lost_claim_as_such() {
        let key = MessageId::parse_str("0b5f3c8e-8f0e-4d47-9a43-6c2f1f3a7b10").unwrap();
        let data = |error: StoreError| {
            let failure = key_failure(&key, &error);
            let data: serde_json::Value =
                serde_json::from_str(failure.data().expect("data").get()).unwrap();
            (data["code"].clone(), data["message_id"].clone())
        };
        let lost = data(StoreError::ClaimLost(key.to_string()));
        assert_eq!(lost.0, "IDEMPOTENCY_CLAIM_LOST");
        assert_eq!(lost.1, key.message_id());
        let closed = data(StoreError::Closed);
        assert_eq!(closed.0, "IDEMPOTENCY_STORE_UNAVAILABLE");
        assert_eq!(closed.1, key.message_id());
    }
}
