//! Guarding a streaming method: `RpcResult<EventStream<T>>` (`message/stream`).
//!
//! The response of a stream is its whole event sequence. Executing spawns a recorder that
//! runs the stream to its end whatever the client does, sends events live, records them, and
//! stores the recording when the stream ends (in an error event too). A replay re-emits the
//! stored events as fast as the client reads; a retry that arrives while the stream runs
//! attaches to the recording: every event so far, then the live ones.

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};

use futures::stream::BoxStream;
use futures::{FutureExt, Stream, StreamExt};
use jsonrpsee::types::{ErrorObjectOwned, Id};
use serde::{Serialize, Serializer};

use crate::cache::Ticket;
use crate::error::{ErrorCode, IdempotencyError};
use crate::guard::{
    decide, layer_missing, replay_json, response_bytes, run_catching, store_json, CallContext,
    Decision, Guarded, Payload,
};
use crate::recording::Recording;
use crate::scope::{GovernedCall, Outcome};
use crate::sse;
use crate::store::{Entry, StoredResponse};

/// What a streaming `#[idempotent]` method returns: its events, each a result or an error.
///
/// ```
/// use idem_runtime::EventStream;
/// let events = futures::stream::iter([Ok(serde_json::json!({"kind": "task"}))]);
/// let stream: EventStream<serde_json::Value> = EventStream::new(events);
/// ```
pub struct EventStream<T> {
    /// Taken once, by the guard; jsonrpsee then holds a clone whose slot is empty.
    events: Arc<Mutex<Option<Events<T>>>>,
}

type Events<T> = BoxStream<'static, Result<T, ErrorObjectOwned>>;

impl<T> EventStream<T> {
    /// Wraps the stream of events; an `Err` item is sent as an error event and ends the stream.
    pub fn new<S>(events: S) -> Self
    where
        S: Stream<Item = Result<T, ErrorObjectOwned>> + Send + 'static,
    {
        Self {
            events: Arc::new(Mutex::new(Some(events.boxed()))),
        }
    }

    /// What jsonrpsee carries back once the events are handed to the HTTP layer.
    fn handed_over() -> Self {
        Self {
            events: Arc::new(Mutex::new(None)),
        }
    }

    fn take(&self) -> Option<Events<T>> {
        self.events.lock().expect("events lock").take()
    }
}

impl<T> Clone for EventStream<T> {
    fn clone(&self) -> Self {
        Self {
            events: self.events.clone(),
        }
    }
}

/// jsonrpsee's response is replaced by the event stream; `null` never reaches a client.
impl<T> Serialize for EventStream<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_unit()
    }
}

impl<T: Serialize + Send + 'static> Guarded for Result<EventStream<T>, ErrorObjectOwned> {
    async fn run<F>(ctx: CallContext, body: F) -> Self
    where
        F: Future<Output = Self> + Send,
    {
        let Some(scope) = ctx.scope.clone() else {
            return Err(layer_missing());
        };
        if scope.is_batch() {
            return Err(ErrorObjectOwned::owned(
                -32600,
                "streaming calls cannot be batched",
                None::<()>,
            ));
        }
        match (ctx.governed, ctx.undeduplicated_id) {
            (Some(call), _) => run_governed(&call, body).await,
            (None, Some(id)) => {
                let events = body.await?.take().ok_or_else(consumed)?;
                let recording = Arc::new(Recording::new());
                tokio::spawn(record(events, recording.clone(), id, None));
                scope.set_stream(recording, None);
                Ok(EventStream::handed_over())
            }
            (None, None) => Err(layer_missing()),
        }
    }
}

async fn run_governed<T, F>(
    call: &GovernedCall,
    body: F,
) -> Result<EventStream<T>, ErrorObjectOwned>
where
    T: Serialize + Send + 'static,
    F: Future<Output = Result<EventStream<T>, ErrorObjectOwned>> + Send,
{
    match decide(call, true).await {
        Decision::Refuse(error) => Err(error),
        Decision::Replay(entry) => replay(call, &entry),
        Decision::Attach(progress) => {
            let recording = as_recording(progress).ok_or_else(consumed)?;
            attach(call, recording);
            Ok(EventStream::handed_over())
        }
        Decision::Execute(ticket) => execute(call, ticket, body).await,
    }
}

async fn execute<T, F>(
    call: &GovernedCall,
    ticket: Ticket,
    body: F,
) -> Result<EventStream<T>, ErrorObjectOwned>
where
    T: Serialize + Send + 'static,
    F: Future<Output = Result<EventStream<T>, ErrorObjectOwned>> + Send,
{
    let started = run_catching(&call.method, body)
        .await
        .and_then(|output| output?.take().ok_or_else(consumed));
    match started {
        Ok(events) => {
            // Shared once there is a stream, which wakes the retries waiting to attach.
            let recording = Arc::new(Recording::new());
            ticket.set_progress(recording.clone());
            tokio::spawn(record(
                events,
                recording.clone(),
                call.id.clone(),
                Some(ticket),
            ));
            call.scope.set_stream(recording, None);
            call.scope.record(Outcome::Executed);
            Ok(EventStream::handed_over())
        }
        // Failed before streaming: an ordinary JSON-RPC error, stored like any outcome; the
        // duplicates waiting meanwhile replay it as stored.
        Err(error) => Err(store_json(call, ticket, Err(error))
            .await
            .err()
            .unwrap_or_else(consumed)),
    }
}

/// Runs the stream to its end, recording every event; stores the recording, then finishes it,
/// so the HTTP stream ends only after the entry is durable.
async fn record<T: Serialize>(
    mut events: Events<T>,
    recording: Arc<Recording>,
    id: Id<'static>,
    ticket: Option<Ticket>,
) {
    loop {
        let next = AssertUnwindSafe(events.next()).catch_unwind().await;
        let payload: Payload = match next {
            Ok(None) => break,
            Ok(Some(item)) => item.and_then(|event| {
                serde_json::value::to_raw_value(&event).map_err(|e| {
                    ErrorObjectOwned::owned(
                        -32603,
                        format!("event does not serialize: {e}"),
                        None::<()>,
                    )
                })
            }),
            Err(_panic) => Err(IdempotencyError::new(ErrorCode::ExecutionPanicked).into()),
        };
        let ends = payload.is_err();
        let event = sse::frame(&response_bytes(&id, &payload));
        if !recording.fits(&event) {
            recording.push(sse::frame(&response_bytes(&id, &Err(too_large()))));
            break;
        }
        recording.push(event);
        if ends {
            break;
        }
    }
    drop(events);
    if let Some(ticket) = ticket {
        let response = StoredResponse {
            status: 200,
            headers: vec![("content-type".into(), sse::EVENT_STREAM.into())],
            body: recording.concat(),
        };
        if let Err(e) = ticket.complete(response).await {
            tracing::error!(error = %e, "a finished stream could not be stored; a retry will execute again");
            // Tell the client, which would otherwise take the stream for stored.
            let unavailable = IdempotencyError::new(ErrorCode::StoreUnavailable).into();
            recording.push(sse::frame(&response_bytes(&id, &Err(unavailable))));
        }
    }
    recording.finish();
}

fn replay<T>(call: &GovernedCall, entry: &Entry) -> Result<EventStream<T>, ErrorObjectOwned> {
    let is_stream = entry
        .response
        .headers
        .iter()
        .any(|(name, value)| name == "content-type" && value == sse::EVENT_STREAM);
    if !is_stream {
        // A stored failure from before the stream started.
        return Err(replay_json(call, entry).err().unwrap_or_else(consumed));
    }
    let frames = sse::split(&entry.response.body);
    attach(call, Arc::new(Recording::finished(frames)));
    Ok(EventStream::handed_over())
}

fn attach(call: &GovernedCall, recording: Arc<Recording>) {
    call.scope.set_stream(recording, Some(call.id.clone()));
    call.scope.record(Outcome::Replayed);
}

fn as_recording(progress: Arc<dyn Any + Send + Sync>) -> Option<Arc<Recording>> {
    progress.downcast::<Recording>().ok()
}

fn too_large() -> ErrorObjectOwned {
    IdempotencyError::new(ErrorCode::StreamTooLarge)
        .with_detail("limit_bytes", crate::recording::MAX_RECORDED_STREAM_BYTES)
        .into()
}

/// An internal inconsistency (a stream taken twice, a JSON entry where a stream was expected).
fn consumed() -> ErrorObjectOwned {
    ErrorObjectOwned::owned(-32603, "the event stream is not available", None::<()>)
}
