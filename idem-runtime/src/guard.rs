//! The guard that `#[idempotent]` wraps around a method body: where replay, the 422 collision,
//! the wait or 409, and execute-then-store are decided.
//!
//! The body is a lazy future: on a replay or a refusal it is dropped unpolled and never runs.
//! An executed outcome (success, error, or panic) is stored durably before it is answered, and
//! the answer is made of the stored bytes, so the first answer and every replay are the same.

use std::future::Future;
use std::panic::AssertUnwindSafe;

use futures::FutureExt;
use jsonrpsee::types::{ErrorObjectOwned, Response, ResponsePayload};
use jsonrpsee::Extensions;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::value::RawValue;

use crate::cache::{Claim, Ticket};
use crate::error::{ErrorCode, IdempotencyError};
use crate::replayable::Replayable;
use crate::scope::{GovernedCall, Outcome, Undeduplicated};
use crate::store::{Entry, StoreError, StoredResponse};

/// A JSON-RPC outcome in its wire form: the raw `result`, or the `error` object.
pub type Payload = Result<Box<RawValue>, ErrorObjectOwned>;

/// What an `#[idempotent]` method may return: how its outcome becomes stored bytes and back.
pub trait Guarded: Sized + Send + 'static {
    /// The outcome in wire form, serialized once.
    fn into_payload(self) -> Payload;
    /// The outcome rebuilt from wire form (a replay, or the stored first answer).
    fn from_payload(payload: Payload) -> Self;
}

impl<T: Serialize + Send + 'static> Guarded for Result<Replayable<T>, ErrorObjectOwned> {
    fn into_payload(self) -> Payload {
        let value = self?;
        serde_json::value::to_raw_value(&value).map_err(|e| {
            tracing::error!(error = %e, "the method's result does not serialize");
            ErrorObjectOwned::owned(
                -32603,
                format!("result does not serialize: {e}"),
                None::<()>,
            )
        })
    }

    fn from_payload(payload: Payload) -> Self {
        payload.map(Replayable::stored)
    }
}

/// Wraps `body` (the user's method body) in the idempotency guard.
///
/// Reads the governed call that the RPC layer put in `ext` synchronously, so the returned
/// future borrows nothing from the caller.
pub fn guard<F>(ext: &Extensions, body: F) -> impl Future<Output = F::Output> + Send
where
    F: Future + Send,
    F::Output: Guarded,
{
    let call = ext.get::<GovernedCall>().cloned();
    let undeduplicated = ext.get::<Undeduplicated>().is_some();
    async move {
        match call {
            Some(call) => F::Output::from_payload(run(&call, body).await),
            None if undeduplicated => body.await,
            None => {
                tracing::error!(
                    "#[idempotent] method called without the idempotency layers; \
                     install Idempotency::http_layer and Idempotency::rpc_layer"
                );
                F::Output::from_payload(Err(IdempotencyError::new(ErrorCode::LayerMissing).into()))
            }
        }
    }
}

async fn run<F>(call: &GovernedCall, body: F) -> Payload
where
    F: Future,
    F::Output: Guarded,
{
    let mut body = Some(body);
    loop {
        let claim = call
            .state
            .cache
            .claim(&call.key, &call.method, &call.hash)
            .await;
        match claim {
            Err(e) => return store_failure(call, e),
            Ok(Claim::Cached(entry)) => return answer_from(call, &entry),
            Ok(Claim::InFlight(flight)) => {
                if !flight.matches(&call.method, &call.hash) {
                    return collision(call, flight.method(), flight.request_hash().as_str());
                }
                match flight.wait(call.state.config.in_flight_wait).await {
                    Ok(Some(entry)) => return answer_from(call, &entry),
                    // The first call gave up without an outcome: claim again.
                    Ok(None) => continue,
                    Err(()) => {
                        return reject(call, IdempotencyError::new(ErrorCode::RequestInProgress))
                    }
                }
            }
            Ok(Claim::Execute(ticket)) => {
                let body = body.take().expect("a call executes at most once");
                return execute(call, ticket, body).await;
            }
        }
    }
}

/// Runs the body, stores its outcome durably, and answers with the stored bytes.
async fn execute<F>(call: &GovernedCall, ticket: Ticket, body: F) -> Payload
where
    F: Future,
    F::Output: Guarded,
{
    let payload = match AssertUnwindSafe(body).catch_unwind().await {
        Ok(output) => output.into_payload(),
        Err(_panic) => {
            tracing::error!(method = %call.method, message_id = %call.key, "#[idempotent] method panicked");
            Err(IdempotencyError::new(ErrorCode::ExecutionPanicked).into())
        }
    };
    let response = StoredResponse {
        status: 200,
        headers: vec![("content-type".into(), "application/json".into())],
        body: response_bytes(call, &payload),
    };
    match ticket.complete(response).await {
        Ok(entry) => {
            call.scope.record(Outcome::Executed);
            decode(&entry.response.body).unwrap_or(payload)
        }
        Err(e) => store_failure(call, e),
    }
}

/// The JSON-RPC response as jsonrpsee writes it, under the first caller's id.
fn response_bytes(call: &GovernedCall, payload: &Payload) -> Vec<u8> {
    let payload = match payload {
        Ok(raw) => ResponsePayload::<&RawValue>::success(raw.as_ref()),
        Err(error) => ResponsePayload::<&RawValue>::error(error.clone()),
    };
    serde_json::to_vec(&Response::new(payload, call.id.clone()))
        .expect("JSON-RPC response serializes")
}

fn answer_from(call: &GovernedCall, entry: &Entry) -> Payload {
    if !entry.matches(&call.method, &call.hash) {
        return collision(call, &entry.method, entry.request_hash.as_str());
    }
    match decode(&entry.response.body) {
        Some(payload) => {
            call.scope.record(Outcome::Replayed);
            payload
        }
        None => store_failure(
            call,
            StoreError::Corrupt {
                message_id: call.key.to_string(),
                detail: "response_body is not a JSON-RPC response".into(),
            },
        ),
    }
}

/// Spec §4.3: another payload (or method) under a key in use. The original entry is untouched.
fn collision(call: &GovernedCall, original_method: &str, original_hash: &str) -> Payload {
    let mut error = IdempotencyError::new(ErrorCode::KeyReusedWithDifferentPayload)
        .with_detail("original_request_hash", original_hash)
        .with_detail("submitted_request_hash", call.hash.as_str());
    if original_method != call.method {
        error = error.with_detail("original_method", original_method);
    }
    reject(call, error)
}

fn reject(call: &GovernedCall, error: IdempotencyError) -> Payload {
    let error = error.with_detail("message_id", call.key.as_str());
    call.scope.record(Outcome::Rejected(error.code));
    Err(error.to_error_object())
}

fn store_failure(call: &GovernedCall, error: StoreError) -> Payload {
    tracing::error!(message_id = %call.key, error = %error, "idempotency cache failed");
    Err(IdempotencyError::new(ErrorCode::StoreUnavailable)
        .with_detail("message_id", call.key.as_str())
        .into())
}

/// The `result` or `error` of a stored JSON-RPC response, as raw as it was stored.
fn decode(body: &[u8]) -> Option<Payload> {
    #[derive(Deserialize)]
    struct Stored {
        #[serde(default, deserialize_with = "present")]
        result: Option<Box<RawValue>>,
        error: Option<StoredError>,
    }
    #[derive(Deserialize)]
    struct StoredError {
        code: i32,
        message: String,
        #[serde(default, deserialize_with = "present")]
        data: Option<Box<RawValue>>,
    }
    let stored: Stored = serde_json::from_slice(body).ok()?;
    match (stored.result, stored.error) {
        (_, Some(e)) => Some(Err(ErrorObjectOwned::owned(e.code, e.message, e.data))),
        (Some(result), None) => Some(Ok(result)),
        (None, None) => None,
    }
}

/// Keeps a present `null` as `Some(null)`: absent and `null` are different bytes.
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Box<RawValue>>, D::Error> {
    Box::<RawValue>::deserialize(d).map(Some)
}
