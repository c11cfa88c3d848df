//! Guarding a streaming method: `RpcResult<EventStream<T>>` (`message/stream`).
//!
//! The response of a stream is its whole event sequence. Its side effects show while it runs
//! (the task exists), so they commit at its start, with a durable record that the stream runs
//! and its first event. A recorder then runs the stream to its end whatever the client does,
//! makes each event durable before it is sent, and stores the recording as the entry when the
//! stream ends (in an error event too). A replay re-emits the stored events as fast as the
//! client reads; a retry that arrives while the stream runs attaches to the recording: every
//! event so far, then the live ones. A retry after the process died mid-stream gets the
//! recorded events and an `IDEMPOTENCY_STREAM_INTERRUPTED` event, and never executes again.

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};

use futures::stream::BoxStream;
use futures::{FutureExt, Stream, StreamExt};
use jsonrpsee::types::{ErrorObjectOwned, Id};
use serde::{Serialize, Serializer};

use bytes::Bytes;

use crate::claim::{Progress, Ticket};
use crate::error::{ErrorCode, IdempotencyError};
use crate::guard::recording::{self, Recording};
use crate::guard::sse;
use crate::guard::{
    decide, key_failure, layer_missing, not_serializable, replay_json, run_catching, store_failure,
    store_json, undeduplicated_failure, CallContext, Decision, Guarded,
};
use crate::layers::scope::{CallId, GovernedCall, HttpScope, Outcome, Undeduplicated, WebSocket};
use crate::store::{Entry, OpenStream, StoreError, StoredResponse};
use crate::unit_of_work::{SqlWrite, UnitOfWork};
use crate::wire::{response_bytes, Payload};

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

    /// Serves `events` to this call as an event stream, not deduplicated: for a method
    /// outside the extension that streams, such as A2A's `tasks/resubscribe` (declare it
    /// `with_extensions`; no `#[idempotent]`). Each event is framed as a JSON-RPC response to
    /// the call, as an `#[idempotent]` stream's are.
    ///
    /// ```
    /// use idem_runtime::EventStream;
    /// use jsonrpsee::core::RpcResult;
    /// use serde_json::{json, Value};
    /// fn resubscribe(ext: &jsonrpsee::Extensions) -> RpcResult<EventStream<Value>> {
    ///     let events = futures::stream::iter([Ok(json!({"kind": "status-update"}))]);
    ///     EventStream::live(ext, events)
    /// }
    /// // Without the layers there is no HTTP request to stream to: a clear error.
    /// assert!(resubscribe(&jsonrpsee::Extensions::new()).is_err());
    /// ```
    pub fn live<S>(ext: &jsonrpsee::Extensions, events: S) -> Result<Self, ErrorObjectOwned>
    where
        T: Serialize + Send + 'static,
        S: Stream<Item = Result<T, ErrorObjectOwned>> + Send + 'static,
    {
        if ext.get::<GovernedCall>().is_some() || ext.get::<Undeduplicated>().is_some() {
            return Err(live_in_governed());
        }
        if ext.get::<WebSocket>().is_some() {
            // Events go out as an HTTP response of their own: a WebSocket has none, and the
            // layers are there (it was told they were missing: helper-91).
            return Err(IdempotencyError::new(ErrorCode::HttpOnly).into());
        }
        let (Some(scope), Some(CallId(id))) = (ext.get::<HttpScope>(), ext.get::<CallId>()) else {
            return Err(layer_missing(false));
        };
        if scope.is_batch() {
            return Err(IdempotencyError::new(ErrorCode::StreamInBatch).into());
        }
        serve_undeduplicated(scope, events.boxed(), id.clone());
        Ok(Self::handed_over())
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

impl<T: Serialize + Send + 'static> crate::guard::sealed::Sealed
    for Result<EventStream<T>, ErrorObjectOwned>
{
}

impl<T: Serialize + Send + 'static> Guarded for Result<EventStream<T>, ErrorObjectOwned> {
    async fn run<F>(ctx: CallContext, body: F) -> Self
    where
        F: Future<Output = Self> + Send,
    {
        if ctx.governed.is_none() && ctx.undeduplicated.is_none() {
            // Before the scope: over WebSocket there is none, and the method was told the
            // layers were missing where it is not governed (found by helper-88).
            return Err(layer_missing(ctx.ungoverned));
        }
        let Some(scope) = ctx.scope.clone() else {
            return Err(layer_missing(false));
        };
        if scope.is_batch() {
            let refused = IdempotencyError::new(ErrorCode::StreamInBatch);
            return Err(match &ctx.governed {
                // Counted as the governed call's outcome, as every other refusal is.
                Some(call) => crate::guard::reject(call, refused),
                None => refused.into(),
            });
        }
        match (ctx.governed, ctx.undeduplicated) {
            (Some(call), _) => run_governed(&call, body, ctx.unit).await,
            (None, Some(alone)) => {
                let events = body.await?.take().ok_or_else(consumed)?;
                serve_alone(&scope, events, alone.id, ctx.unit).await
            }
            (None, None) => Err(layer_missing(ctx.ungoverned)),
        }
    }
}

/// Records `events` in a task of its own and hands them to the HTTP layer, framed for `id`.
fn serve_undeduplicated<T: Serialize + Send + 'static>(
    scope: &HttpScope,
    events: Events<T>,
    id: Id<'static>,
) {
    let recording = Arc::new(Recording::live());
    tokio::spawn(record(events, recording.clone(), id, None));
    scope.set_stream(recording, None);
}

/// A governed stream that is not deduplicated: its staged writes still commit, on their own,
/// once its first event is known, and are discarded if its first item ends it, as a
/// deduplicated stream's are (one code path for the application).
async fn serve_alone<T: Serialize + Send + 'static>(
    scope: &HttpScope,
    mut events: Events<T>,
    id: Id<'static>,
    unit: Option<UnitOfWork>,
) -> Result<EventStream<T>, ErrorObjectOwned> {
    // Sealed before the first event, as a deduplicated stream's unit is: what the stream
    // stages once it runs is refused the same way in both.
    let sealed = unit.as_ref().map(UnitOfWork::seal);
    let recording = Arc::new(Recording::live());
    let first = next_frame(&mut events, &id, &recording, 0).await;
    if let (Some(unit), Some(sealed)) = (unit, sealed) {
        match first {
            Next::Last(_) => drop(sealed), // discarded: nothing of it is ever written
            _ => unit
                .commit_sealed(sealed)
                .await
                .map_err(undeduplicated_failure)?,
        }
    }
    match first {
        Next::Event(frame) => {
            recording.push(frame);
            tokio::spawn(record(events, recording.clone(), id, None));
        }
        Next::Last(frame) => {
            drop_caught(events);
            recording.push(frame);
            recording.finish();
        }
        Next::End => {
            drop_caught(events);
            recording.finish();
        }
    }
    scope.set_stream(recording, None);
    Ok(EventStream::handed_over())
}

async fn run_governed<T, F>(
    call: &GovernedCall,
    body: F,
    unit: Option<UnitOfWork>,
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
            attach(call, recording, Outcome::Attached);
            Ok(EventStream::handed_over())
        }
        Decision::Execute(ticket) => execute(call, ticket, body, unit).await,
    }
}

/// Runs the body; commits its staged writes with the durable record of the stream and its
/// first event before anything is sent, then records the rest in a task of its own.
async fn execute<T, F>(
    call: &GovernedCall,
    mut ticket: Ticket,
    body: F,
    unit: Option<UnitOfWork>,
) -> Result<EventStream<T>, ErrorObjectOwned>
where
    T: Serialize + Send + 'static,
    F: Future<Output = Result<EventStream<T>, ErrorObjectOwned>> + Send,
{
    let started = run_catching(&call.method, body)
        .await
        .and_then(|output| output?.take().ok_or_else(consumed));
    let mut events = match started {
        Ok(events) => events,
        // Failed before streaming: an ordinary JSON-RPC error, stored like any outcome; the
        // duplicates waiting meanwhile replay it as stored.
        Err(error) => {
            let stored = store_json(call, ticket, Err(error), unit.as_ref()).await;
            return Err(stored.err().unwrap_or_else(consumed));
        }
    };
    let sealed = unit.as_ref().map(UnitOfWork::seal);
    let recording = Arc::new(Recording::new());
    let first = next_frame(&mut events, &call.id, &recording, 0).await;
    // The first item already ended it (an error, a panic, or past the recording limit): the
    // outcome is that error alone, and as with a unary call's error the staged writes are
    // discarded (dropped with `sealed`): no event would name what they made.
    let sealed = sealed.filter(|_| !matches!(first, Next::Last(_)));
    let writes = sealed
        .map(|sealed| ticket.commits(sealed))
        .unwrap_or_default();
    let stored = match first {
        Next::Event(first) => open(call, ticket, events, first, writes, &recording).await,
        Next::Last(last) => {
            drop_caught(events);
            store_whole(call, ticket, Some(last), Vec::new(), &recording).await
        }
        Next::End => {
            drop_caught(events);
            store_whole(call, ticket, None, writes, &recording).await
        }
    };
    stored.map_err(|e| store_failure(call, e))?;
    call.scope.set_stream(recording, None);
    call.record(Outcome::Executed);
    Ok(EventStream::handed_over())
}

/// Commits the writes with the open stream and its first event, then hands the rest of the
/// stream to a recorder of its own.
async fn open<T: Serialize + Send + 'static>(
    call: &GovernedCall,
    mut ticket: Ticket,
    events: Events<T>,
    first: Bytes,
    writes: Vec<SqlWrite>,
    recording: &Arc<Recording>,
) -> Result<(), StoreError> {
    let id = serde_json::to_string(&call.id).expect("a JSON-RPC id serializes");
    let opened = ticket.open_stream(id, first.clone(), writes);
    let opened = crate::telemetry::committed(&call.method, opened).await;
    if let Err(error) = opened {
        drop_caught(events);
        return Err(error);
    }
    recording.push(first);
    // Shared once the first event is durable, which wakes the retries waiting to attach.
    ticket.set_progress(recording.clone());
    let recorder = record(events, recording.clone(), call.id.clone(), Some(ticket));
    tokio::spawn(recorder);
    Ok(())
}

/// Stores a stream that ended with its first item (`last`, if it sent one) with `writes`.
async fn store_whole(
    call: &GovernedCall,
    ticket: Ticket,
    last: Option<Bytes>,
    writes: Vec<SqlWrite>,
    recording: &Recording,
) -> Result<(), StoreError> {
    let body = last.as_deref().map(<[u8]>::to_vec).unwrap_or_default();
    let completed = ticket.complete_with(event_stream(body), writes);
    crate::telemetry::committed(&call.method, completed).await?;
    if let Some(last) = last {
        recording.push(last);
    }
    recording.finish();
    Ok(())
}

/// Drops the application's stream: a panic in its `Drop` (after its last event) is logged,
/// and the events it gave stand; unwinding through the recorder, it left the readers
/// waiting, and the finished stream was stored as interrupted.
fn drop_caught<T>(events: Events<T>) {
    crate::unit_of_work::drop_caught(events, "an #[idempotent] method's event stream");
}

/// Ends a recording whose recorder unwinds: the error that says it panicked, then the end.
struct EndsOnPanic {
    recording: Arc<Recording>,
    id: Id<'static>,
}

impl Drop for EndsOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let panicked = IdempotencyError::new(ErrorCode::ExecutionPanicked).into();
            self.recording.end_with(error_frame(&self.id, panicked));
        }
    }
}

/// The next item of a stream, framed as an SSE event.
enum Next {
    /// An event; more may follow.
    Event(Bytes),
    /// The event that ends the stream (an error, or the recording limit reached).
    Last(Bytes),
    /// The stream ended after its last event.
    End,
}

/// `pending`: the bytes of the frames taken before this one and not recorded yet.
async fn next_frame<T: Serialize>(
    events: &mut Events<T>,
    id: &Id<'static>,
    recording: &Recording,
    pending: usize,
) -> Next {
    // The event is serialized inside the catch too: a `Serialize` that panics is the stream's
    // panic, which ends it, not the recorder's, which would leave its readers waiting.
    let next = async {
        let item = events.next().await?;
        Some(item.and_then(|event| {
            serde_json::value::to_raw_value(&event).map_err(|e| not_serializable(&e))
        }))
    };
    let payload: Payload = match AssertUnwindSafe(next).catch_unwind().await {
        Ok(None) => return Next::End,
        Ok(Some(payload)) => payload,
        Err(_panic) => Err(IdempotencyError::new(ErrorCode::ExecutionPanicked).into()),
    };
    let frame = sse::frame(&response_bytes(id, &payload));
    if !recording.has_room(pending, &frame).await {
        return Next::Last(error_frame(id, too_large()));
    }
    match payload {
        Ok(_) => Next::Event(frame),
        Err(_) => Next::Last(frame),
    }
}

/// Most events, and bytes of events, that one commit of a stream records.
const BATCH_EVENTS: usize = 256;
const BATCH_BYTES: usize = 1024 * 1024;

/// `first`, then the events that `events` has ready now, which go durable in the same commit:
/// a stream that produces faster than the disk commits is recorded at the disk's pace in
/// batches, not one commit an event. Also returns the item that ended the gathering early
/// (the stream's end or last event), if one did.
fn ready_batch<T: Serialize>(
    events: &mut Events<T>,
    id: &Id<'static>,
    recording: &Recording,
    first: Bytes,
) -> (Vec<Bytes>, Option<Next>) {
    let mut bytes = first.len();
    let mut batch = vec![first];
    while batch.len() < BATCH_EVENTS && bytes < BATCH_BYTES {
        match next_frame(events, id, recording, bytes).now_or_never() {
            Some(Next::Event(frame)) => {
                bytes += frame.len();
                batch.push(frame);
            }
            Some(end) => return (batch, Some(end)),
            None => break,
        }
    }
    (batch, None)
}

/// Runs the stream to its end, recording every event; with a ticket, each event is durable
/// before it is sent, and the finished recording is stored before the HTTP stream ends.
async fn record<T: Serialize>(
    mut events: Events<T>,
    recording: Arc<Recording>,
    id: Id<'static>,
    ticket: Option<Ticket>,
) {
    // A panic below that nothing else catches (a store's) must still end the readers' stream,
    // with the error that says so: they would wait for ever.
    let _ends = EndsOnPanic {
        recording: recording.clone(),
        id: id.clone(),
    };
    let mut seq = 1;
    // An item taken while gathering a batch that ended it: the stream's end, or its last event.
    let mut ahead = None;
    let last = loop {
        let next = match (ahead.take(), &ticket) {
            (Some(next), _) => next,
            (None, Some(_)) => next_frame(&mut events, &id, &recording, 0).await,
            // Not deduplicated, so replayed to no one: once its client hangs up, the events
            // are read by no one, and the stream stops.
            (None, None) => tokio::select! {
                next = next_frame(&mut events, &id, &recording, 0) => next,
                () = recording.abandoned() => {
                    drop_caught(events);
                    recording.finish();
                    return;
                }
            },
        };
        let frame = match next {
            Next::Event(frame) => frame,
            Next::Last(frame) => break Some(frame),
            Next::End => break None,
        };
        let Some(ticket) = &ticket else {
            recording.push(frame);
            continue;
        };
        let batch;
        (batch, ahead) = ready_batch(&mut events, &id, &recording, frame);
        let count = batch.len() as u32;
        if let Err(e) = ticket.append_events(seq, batch.clone()).await {
            // The key is released with what was recorded (once events the disk did not
            // answer have settled): the next claim closes it as interrupted, and nothing
            // executes again.
            tracing::error!("a stream's events could not be recorded; the stream ends");
            // Retries from now on wait for the key, and get the interrupted outcome, not this
            // recording's uncached failure.
            ticket.withdraw_progress();
            let failure = key_failure(ticket.key(), &e);
            recording.push(error_frame(&id, failure));
            recording.finish();
            drop_caught(events);
            return;
        }
        seq += count;
        for frame in batch {
            recording.push(frame);
        }
    };
    drop_caught(events);
    if let Some(ticket) = ticket {
        let body = recording.joined(last.as_deref().unwrap_or_default());
        let key = ticket.key().clone();
        if let Err(e) = ticket.close_stream(event_stream(body)).await {
            tracing::error!(
                "a finished stream could not be stored; a retry gets it as interrupted"
            );
            // Tell the client, which would otherwise take the stream for stored.
            recording.push(error_frame(&id, key_failure(&key, &e)));
            recording.finish();
            return;
        }
    }
    if let Some(last) = last {
        recording.push(last);
    }
    recording.finish();
}

/// The cached outcome of a stream that stopped before its end: the events recorded durably,
/// then an `IDEMPOTENCY_STREAM_INTERRUPTED` error event under the call's id.
pub(crate) fn interrupted(stream: &OpenStream, events: Vec<Bytes>) -> StoredResponse {
    let id = serde_json::from_str::<Id<'_>>(&stream.jsonrpc_id)
        .map(Id::into_owned)
        .unwrap_or(Id::Null);
    let error = IdempotencyError::new(ErrorCode::StreamInterrupted)
        .with_detail("message_id", stream.message_id.message_id())
        .into();
    event_stream(recording::joined(&events, &error_frame(&id, error)))
}

/// A recorded stream as a stored response.
fn event_stream(body: Vec<u8>) -> StoredResponse {
    StoredResponse {
        status: 200,
        headers: vec![("content-type".into(), sse::EVENT_STREAM.into())],
        body,
    }
}

fn error_frame(id: &Id<'_>, error: ErrorObjectOwned) -> Bytes {
    sse::frame(&response_bytes(id, &Err(error)))
}

/// Whether `entry` is a recorded event stream (not a stored JSON-RPC response).
pub(crate) fn is_event_stream(entry: &Entry) -> bool {
    entry
        .response
        .headers
        .iter()
        .any(|(name, value)| name == "content-type" && value == sse::EVENT_STREAM)
}

fn replay<T>(call: &GovernedCall, entry: &Arc<Entry>) -> Result<EventStream<T>, ErrorObjectOwned> {
    if !is_event_stream(entry) {
        // A stored failure from before the stream started.
        return Err(replay_json(call, entry).err().unwrap_or_else(consumed));
    }
    let frames = sse::split(Entry::shared_body(entry));
    attach(
        call,
        Arc::new(Recording::finished(frames)),
        Outcome::Replayed,
    );
    Ok(EventStream::handed_over())
}

/// `entry`'s recorded events, to a call whose method's guard never took it
/// ([`store_refusal`](crate::guard::store_refusal)): what goes back to jsonrpsee is a
/// placeholder, which the HTTP layer replaces with the events. In a batch, the batch's error.
pub(crate) fn replayed_unguarded(call: &GovernedCall, entry: &Arc<Entry>) -> Payload {
    let frames = sse::split(Entry::shared_body(entry));
    unguarded(
        call,
        Arc::new(Recording::finished(frames)),
        Outcome::Replayed,
    )
}

/// The running stream's events, as [`replayed_unguarded`] gives a stored one's.
pub(crate) fn attached_unguarded(call: &GovernedCall, progress: Progress) -> Payload {
    let recording = as_recording(progress).ok_or_else(consumed)?;
    unguarded(call, recording, Outcome::Attached)
}

fn unguarded(call: &GovernedCall, recording: Arc<Recording>, outcome: Outcome) -> Payload {
    if call.scope.is_batch() {
        let refused = IdempotencyError::new(ErrorCode::StreamInBatch);
        return Err(crate::guard::reject(call, refused));
    }
    attach(call, recording, outcome);
    Ok(serde_json::value::RawValue::NULL.to_owned())
}

/// Answers the call with `recording`'s events, re-identified for it.
fn attach(call: &GovernedCall, recording: Arc<Recording>, outcome: Outcome) {
    call.scope.set_stream(recording, Some(call.id.clone()));
    call.record(outcome);
}

fn as_recording(progress: Arc<dyn Any + Send + Sync>) -> Option<Arc<Recording>> {
    progress.downcast::<Recording>().ok()
}

fn too_large() -> ErrorObjectOwned {
    IdempotencyError::new(ErrorCode::StreamTooLarge)
        .with_detail(
            "limit_bytes",
            crate::guard::recording::MAX_RECORDED_STREAM_BYTES,
        )
        .into()
}

/// `EventStream::live` called by a governed method: its events would bypass the guard, so
/// the method is told what to return instead (it read as if the layers were missing).
fn live_in_governed() -> ErrorObjectOwned {
    let reason = "EventStream::live serves a method outside the extension: a governed method \
                  returns EventStream::new(events) from its #[idempotent] implementation";
    tracing::error!(reason, "EventStream::live refused");
    IdempotencyError::new(ErrorCode::StreamUnavailable)
        .with_detail("reason", reason)
        .into()
}

/// An internal inconsistency (a stream taken twice, a JSON entry where a stream was expected).
fn consumed() -> ErrorObjectOwned {
    IdempotencyError::new(ErrorCode::StreamUnavailable).into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::value::RawValue;

    #[test]
    fn an_event_or_error_written_over_several_lines_is_sent_on_one() {
        let pretty = "{\n  \"a\": [1,\r\n 2],\n  \"b\": \"x y\"\n}";
        let event = RawValue::from_string(pretty.into()).unwrap();
        let data = Some(RawValue::from_string(pretty.into()).unwrap());
        let error = ErrorObjectOwned::owned(-32000, "failed", data);
        for payload in [Ok(event), Err(error)] {
            let frame = sse::frame(&response_bytes(&Id::Number(1), &payload));
            let text = String::from_utf8(frame.to_vec()).unwrap();
            assert_eq!(text.matches('\n').count(), 2, "one event: {text:?}");
            assert!(text.contains(r#"{  "a": [1, 2],  "b": "x y"}"#), "{text:?}");
            assert_eq!(sse::split(frame).len(), 1);
        }
    }
}
