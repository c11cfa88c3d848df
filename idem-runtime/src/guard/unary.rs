//! Guarding a method that answers once: `RpcResult<Replayable<T>>`.
//!
//! Execute runs the body, stores the JSON-RPC response durably, and answers with the stored
//! bytes; a replay answers with the same bytes; a duplicate of a running call waits for it.

use std::future::Future;

use jsonrpsee::types::ErrorObjectOwned;
use serde::Serialize;

use crate::guard::replayable::Replayable;
use crate::guard::{
    decide, layer_missing, not_serializable, replay_json, run_catching, store_json,
    undeduplicated_failure, CallContext, Decision, Guarded,
};
use crate::wire::Payload;

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
            return match (ctx.undeduplicated_id, ctx.unit) {
                (None, _) => Err(layer_missing(ctx.ungoverned)),
                (Some(_), None) => body.await,
                // Not deduplicated: the staged writes still commit, on their own.
                (Some(_), Some(unit)) => {
                    let output = body.await;
                    match &output {
                        Ok(_) => unit.commit_alone().await.map_err(undeduplicated_failure)?,
                        Err(_) => unit.discard(),
                    }
                    output
                }
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

/// Serializes the outcome once: these bytes are stored and answered.
fn into_payload<T: Serialize>(output: Result<Replayable<T>, ErrorObjectOwned>) -> Payload {
    serde_json::value::to_raw_value(&output?).map_err(|e| not_serializable(&e))
}
