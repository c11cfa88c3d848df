//! Guarding a method that answers once: `RpcResult<Replayable<T>>`.
//!
//! Execute runs the body, stores the JSON-RPC response durably, and answers with the stored
//! bytes; a replay answers with the same bytes; a duplicate of a running call waits for it.

use std::future::Future;

use jsonrpsee::types::ErrorObjectOwned;
use serde::Serialize;

use crate::guard::replayable::Replayable;
use crate::guard::{
    decide, layer_missing, not_serializable, over_limit, replay_json, run_catching, store_json,
    undeduplicated_failure, CallContext, Decision, Guarded,
};
use crate::layers::scope::Undeduplicated;
use crate::unit_of_work::UnitOfWork;
use crate::wire::{response_len, Payload};

impl<T: Serialize + Send + 'static> crate::guard::sealed::Sealed
    for Result<Replayable<T>, ErrorObjectOwned>
{
}

impl<T: Serialize + Send + 'static> Guarded for Result<Replayable<T>, ErrorObjectOwned> {
    async fn run<F>(ctx: CallContext, body: F) -> Self
    where
        F: Future<Output = Self> + Send,
    {
        let Some(call) = ctx.governed else {
            return match (ctx.undeduplicated, ctx.unit) {
                (None, _) => Err(layer_missing(ctx.ungoverned)),
                (Some(_), None) => body.await,
                (Some(alone), Some(unit)) => run_alone(&alone, body, unit).await,
            };
        };
        let payload = match decide(&call, false).await {
            Decision::Refuse(error) => Err(error),
            Decision::Replay(entry) => replay_json(&call, &entry),
            Decision::Attach(_) => unreachable!("unary calls wait instead of attaching"),
            Decision::Execute(ticket) => {
                // Serialized inside the catch: a result whose `Serialize` panics is a panic
                // of the call, cached as one, not an unwinding guard that caches nothing.
                let payload = run_catching(&call.method, async { into_payload(body.await) })
                    .await
                    .and_then(|payload| payload);
                store_json(&call, ticket, payload, ctx.unit.as_ref()).await
            }
        };
        payload.map(Replayable::stored)
    }
}

/// Not deduplicated: the staged writes still commit, on their own, with an answer the client
/// gets. Serialized and measured first, as a deduplicated call's: a result jsonrpsee would
/// cut, or that does not serialize, was answered with an error after its writes committed,
/// and a client's retry wrote them again (found by helper-80); a panic is answered too.
async fn run_alone<T, F>(
    alone: &Undeduplicated,
    body: F,
    unit: UnitOfWork,
) -> Result<Replayable<T>, ErrorObjectOwned>
where
    T: Serialize + Send + 'static,
    F: Future<Output = Result<Replayable<T>, ErrorObjectOwned>> + Send,
{
    let payload = run_catching(&alone.method, async { into_payload(body.await) })
        .await
        .and_then(|payload| payload);
    // Measured, not written: nothing is stored, and jsonrpsee writes the answer.
    let size = response_len(&alone.id, &payload);
    let payload = match over_limit(&alone.method, alone.max_response_bytes, size) {
        Some(too_large) => Err(too_large),
        None => payload,
    };
    match &payload {
        Ok(_) => unit.commit_alone().await.map_err(undeduplicated_failure)?,
        Err(_) => unit.discard(),
    }
    payload.map(Replayable::stored)
}

/// Serializes the outcome once: these bytes are stored and answered.
fn into_payload<T: Serialize>(output: Result<Replayable<T>, ErrorObjectOwned>) -> Payload {
    serde_json::value::to_raw_value(&output?).map_err(|e| not_serializable(&e))
}
