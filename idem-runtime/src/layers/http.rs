//! The HTTP layer: reads activation before jsonrpsee runs, and turns what happened to the
//! governed calls into the response: status, headers, and for a stream the SSE body.
//!
//! It also answers the commonest retry of all before jsonrpsee parses anything: a request
//! whose body is byte-for-byte one whose single call was answered with an entry's stored
//! bytes (same id, same method, same params) gets those bytes again, from the store's memory.
//! And where jsonrpsee's answer is not JSON-RPC 2.0's (to a body it read, or a plain-text
//! refusal of one it did not), it gives JSON-RPC's (`invalid_request.rs`): so every JSON POST
//! body is read here, whatever its size (up to the limit, which a chunked one is counted
//! against as it comes), and a body that is not UTF-8 (so not JSON, RFC 8259 §8.1: jsonrpsee
//! skips the members it does not read unchecked) or cannot be read is refused here.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::StreamExt;
use http::{HeaderMap, HeaderValue, StatusCode};
use http_body_util::BodyExt;
use jsonrpsee::server::http::{content_type_is_json, response};
use jsonrpsee::server::{HttpBody, HttpRequest, HttpResponse};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::caller::CallerPolicy;
use crate::claim::IdempotencyCache;
use crate::error::{ErrorCode, IdempotencyError, EXTENSION_URI};
use crate::guard::sse;
use crate::hash::Sent;
use crate::layers::activation::{is_activated, A2A_EXTENSIONS};
use crate::layers::scope::{HttpScope, Outcome, StreamSource, WebSocket};
use crate::layers::{content_type, invalid_request};
use crate::state::State;
use crate::store::Entry;

/// How many bytes of a too large body are read (and dropped) so that the client, still
/// sending, reads the 413 instead of a reset; past this the connection is closed.
const DRAINED_BODY_BYTES: u64 = 64 * 1024 * 1024;

/// The response header that marks a replay (spec §4.3). Sent only as `true`, never as `false`.
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";

/// The tower layer for `ServerBuilder::set_http_middleware` (see [`crate::Idempotency::http_layer`]).
#[derive(Clone, Debug)]
pub struct HttpLayer {
    state: Arc<State>,
}

impl HttpLayer {
    pub(crate) fn new(state: Arc<State>) -> Self {
        Self { state }
    }

    /// Names the extension on `response` where this layer would (spec §3.2: the server offers
    /// it, and `request` activated it), for a layer in front of this one that answers some
    /// requests itself.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use http::{HeaderMap, HeaderValue};
    /// use idem_runtime::layers::{A2A_EXTENSIONS, EXTENSION_URI};
    /// let dir = tempfile::tempdir()?;
    /// let idem = idem_runtime::Idempotency::open(dir.path().join("a2a.db"), Default::default())?;
    /// let mut request = HeaderMap::new();
    /// request.insert(A2A_EXTENSIONS, HeaderValue::from_static(EXTENSION_URI));
    /// let mut response = HeaderMap::new();
    /// idem.http_layer().echo(&request, &mut response);
    /// assert_eq!(response[A2A_EXTENSIONS], EXTENSION_URI);
    /// # Ok(()) }
    /// ```
    pub fn echo(&self, request: &HeaderMap, response: &mut HeaderMap) {
        if activated(&self.state, request) {
            echo_activation(response);
        }
    }

    /// Admits one request under `max_requests_in_flight`, as this layer does before it reads
    /// a body, for a layer in front of it that reads one to answer it itself: the admission
    /// to hold until that answer, or the 429 to answer with, the body unread. Read without
    /// it, such bodies were bounded by nothing (found by helper-88).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_runtime::{Idempotency, IdempotencyConfig};
    /// let dir = tempfile::tempdir()?;
    /// let config = IdempotencyConfig::default().with(|c| c.max_requests_in_flight = 1);
    /// let idem = Idempotency::open(dir.path().join("a2a.db"), config)?;
    /// let layer = idem.http_layer();
    /// let admitted = layer.admit().expect("a place is free");
    /// let too_busy = layer.admit().unwrap_err().into_response();
    /// assert_eq!(too_busy.status(), 429);
    /// drop(admitted);
    /// assert!(layer.admit().is_ok());
    /// # Ok(()) }
    /// ```
    pub fn admit(&self) -> Result<Admission, TooBusy> {
        admit(&self.state.requests)
    }
}

/// A request admitted under `max_requests_in_flight` ([`HttpLayer::admit`]): dropped, its
/// place is free.
#[derive(Debug)]
pub struct Admission(#[allow(dead_code)] OwnedSemaphorePermit);

/// No place left under `max_requests_in_flight` ([`HttpLayer::admit`]).
#[derive(Debug)]
pub struct TooBusy;

impl TooBusy {
    /// The answer: HTTP 429 with `Retry-After: 1`, and a JSON-RPC error saying nothing ran.
    pub fn into_response(self) -> HttpResponse<HttpBody> {
        invalid_request::too_busy()
    }
}

fn admit(requests: &Arc<Semaphore>) -> Result<Admission, TooBusy> {
    match requests.clone().try_acquire_owned() {
        Ok(permit) => Ok(Admission(permit)),
        Err(_) => Err(TooBusy),
    }
}

/// Whether the request activated the extension on a server that offers it. A server with the
/// extension off neither reads nor echoes the activation header.
fn activated(state: &State, request: &HeaderMap) -> bool {
    state.deduplicating().is_some() && is_activated(request, EXTENSION_URI)
}

impl<S> tower::Layer<S> for HttpLayer {
    type Service = HttpService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        HttpService {
            inner,
            state: self.state.clone(),
        }
    }
}

/// The HTTP service of [`HttpLayer`].
#[derive(Clone, Debug)]
pub struct HttpService<S> {
    inner: S,
    state: Arc<State>,
}

type BoxFuture<T> = Pin<Box<dyn std::future::Future<Output = T> + Send + 'static>>;

impl<S> tower::Service<HttpRequest<HttpBody>> for HttpService<S>
where
    S: tower::Service<HttpRequest<HttpBody>, Response = HttpResponse<HttpBody>>,
    S: Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: From<tokio::task::JoinError> + Send + 'static,
{
    type Response = HttpResponse<HttpBody>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: HttpRequest<HttpBody>) -> Self::Future {
        if jsonrpsee::server::ws::is_upgrade_request(&request) {
            if request.method() == http::Method::GET {
                return self.handshake(request);
            }
            // RFC 6455 §4.1: only a GET opens a WebSocket. Another request that asks for one
            // is served as the HTTP request it is (RFC 9110 §7.8 lets a server ignore
            // Upgrade): jsonrpsee took a POST for a handshake, read none of its body and
            // answered 200 in plain text (helper-103).
            request.headers_mut().remove(http::header::UPGRADE);
        }
        content_type::spelled_for_jsonrpsee(request.headers_mut());
        let activated = activated(&self.state, request.headers());
        let cache = self.state.deduplicating().cloned().filter(|_| activated);
        let limit = self.state.config.max_request_body_bytes;
        let caller = CallerPolicy::of(request.extensions(), &self.state.config);
        let requests = self.state.requests.clone();
        let inner = self.inner.clone();
        Box::pin(async move {
            let mut response =
                answer(inner, request, cache, activated, caller, limit, requests).await?;
            // Spec §3.2: every answer to a request that activated the extension names it.
            if activated {
                echo_activation(response.headers_mut());
            }
            Ok(response)
        })
    }
}

impl<S> HttpService<S>
where
    S: tower::Service<HttpRequest<HttpBody>, Response = HttpResponse<HttpBody>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    /// A WebSocket handshake, for jsonrpsee to complete. One scope would serve every call of
    /// the connection: the RPC layer refuses governed calls over WebSocket instead.
    fn handshake(
        &mut self,
        mut request: HttpRequest<HttpBody>,
    ) -> BoxFuture<Result<HttpResponse<HttpBody>, S::Error>> {
        request.extensions_mut().insert(WebSocket);
        let upgraded = self.inner.call(request);
        Box::pin(async move { Ok(invalid_request::handshake_refusal(upgraded.await?).await) })
    }
}

/// The answer to an HTTP request of a server with the extension on: `cache` where the
/// request activated it.
async fn answer<S>(
    mut inner: S,
    request: HttpRequest<HttpBody>,
    cache: Option<IdempotencyCache>,
    activated: bool,
    caller: CallerPolicy,
    limit: u64,
    requests: Arc<Semaphore>,
) -> Result<HttpResponse<HttpBody>, S::Error>
where
    S: tower::Service<HttpRequest<HttpBody>, Response = HttpResponse<HttpBody>>,
    S: Send + 'static,
    S::Future: Send + 'static,
    S::Error: From<tokio::task::JoinError> + Send + 'static,
{
    if content_length(&request).is_some_and(|n| n > limit) {
        // A client that waits for `100 Continue` sends nothing until the body is read: it is
        // answered at once, and its body never asked for (hyper closes the connection).
        let body = match expects_continue(&request) {
            true => HttpBody::empty(),
            false => request.into_body(),
        };
        return Ok(too_large(body, 0, limit).await);
    }
    let (mut request, mut body, mut sent, mut admitted) = (request, None, None, None);
    if recognisable(&request) {
        // Taken before the body is read, held until the call has answered: jsonrpsee counts
        // a request only once this layer has read its body, and bodies past its limit filled
        // memory (helper-85).
        match admit(&requests) {
            Ok(admission) => admitted = Some(admission),
            Err(too_busy) => return Ok(too_busy.into_response()),
        }
        let (parts, bytes) = match read_body(request, limit).await {
            Ok(read) => read,
            Err(response) => return Ok(response),
        };
        match first_look(&bytes, cache.as_ref(), activated, caller) {
            FirstLook::Passed(read) => sent = read,
            FirstLook::Answered(answer) => return Ok(answer),
        }
        let bytes = without_leading_whitespace(bytes);
        if bytes.first() == Some(&FORM_FEED) {
            return Ok(invalid_request::form_feed_first());
        }
        let read_again = HttpBody::new(http_body_util::Full::new(bytes.clone()));
        request = HttpRequest::from_parts(parts, read_again);
        body = Some(bytes);
    }
    let scope = HttpScope::new(activated, caller, sent);
    let _answering = Answering(scope.clone());
    request.extensions_mut().insert(scope.clone());
    // In a task of its own: a client that hangs up must not cut a governed call off
    // mid-execution (its retry would run it again); the call runs to its end, stored, and
    // holds its place under the bound as long (it holds its body as long: helper-88).
    let call = inner.call(request);
    let call = async move {
        let _admitted = admitted;
        call.await
    };
    let mut response = tokio::spawn(call).await??;
    if let Some(body) = body {
        response = invalid_request::corrected(&body, response, &scope).await;
    }
    response = invalid_request::refusal_as_json_rpc(response);
    Ok(answered(&scope, response))
}

/// Held while a request is being answered. Dropped, by then its response took the call's
/// stream, or its client hung up first (hyper dropped the answer's future), and a stream the
/// call leaves is read by no one: a live one then stops, where it waited for a reader for as
/// long as it ran (helper-71).
struct Answering(HttpScope);

impl Drop for Answering {
    fn drop(&mut self) {
        self.0.hang_up();
    }
}

/// The body from its first non-whitespace byte: jsonrpsee looks for the `{` or `[` that starts
/// a request within the first 128 bytes only, and answers a Parse error past them, where JSON
/// allows any whitespace before (found by helper-56). The same bytes, not copied.
fn without_leading_whitespace(bytes: Bytes) -> Bytes {
    let start = bytes
        .iter()
        .position(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'));
    bytes.slice(start.unwrap_or(bytes.len())..)
}

/// Skipped before a request by jsonrpsee (`u8::is_ascii_whitespace`), but not whitespace in
/// JSON: a body led by one is not JSON, and ran the method (found by helper-76).
const FORM_FEED: u8 = 0x0c;

/// What the layer makes of a body it read, before jsonrpsee sees it.
enum FirstLook {
    /// Answered here: a resend of an answered request's very bytes, with the stored answer,
    /// or a body that is not UTF-8, refused.
    Answered(HttpResponse<HttpBody>),
    /// For jsonrpsee, with the body as a resend of it would be recognised, where the request
    /// activated the cache.
    Passed(Option<Sent>),
}

fn first_look(
    bytes: &Bytes,
    cache: Option<&IdempotencyCache>,
    activated: bool,
    caller: CallerPolicy,
) -> FirstLook {
    let mut sent = None;
    // A caller the scoped keys cannot place has no resend to be recognised (its call is
    // refused, by the RPC layer, as governed calls only are).
    if let Some(cache) = cache.filter(|_| !caller.unidentified) {
        let request = Sent::request(bytes.clone());
        if let Some(entry) = resent(cache, &request, caller) {
            let scope = HttpScope::new(activated, caller, None);
            scope.record(&entry.method, Outcome::Replayed);
            let stored = HttpBody::new(http_body_util::Full::new(Entry::shared_body(&entry)));
            let response = response::ok_response(stored);
            return FirstLook::Answered(answered(&scope, response));
        }
        sent = Some(request);
    }
    // A resend of bytes that were answered was UTF-8 then: checked after the lookup.
    match std::str::from_utf8(bytes) {
        Ok(_) => FirstLook::Passed(sent),
        Err(error) => FirstLook::Answered(invalid_request::not_utf8(&error)),
    }
}

/// A JSON POST: its body is read here.
fn recognisable(request: &HttpRequest<HttpBody>) -> bool {
    request.method() == http::Method::POST && content_type_is_json(request)
}

fn expects_continue(request: &HttpRequest<HttpBody>) -> bool {
    let expect = request.headers().get(http::header::EXPECT);
    expect.is_some_and(|value| value.as_bytes().eq_ignore_ascii_case(b"100-continue"))
}

fn content_length(request: &HttpRequest<HttpBody>) -> Option<u64> {
    let length = request.headers().get(http::header::CONTENT_LENGTH)?;
    length.to_str().ok()?.parse().ok()
}

/// Reads and drops the rest of the body (up to `DRAINED_BODY_BYTES` in all, `read` of them
/// read already), then answers 413 with the error that names the limit.
async fn too_large(mut body: HttpBody, mut read: u64, limit: u64) -> HttpResponse<HttpBody> {
    while read <= DRAINED_BODY_BYTES {
        let Some(Ok(frame)) = body.frame().await else {
            break;
        };
        read += frame.data_ref().map_or(0, |data| data.len() as u64);
    }
    tracing::warn!(limit, "request body over the limit: 413");
    let error = IdempotencyError::new(ErrorCode::RequestTooLarge).with_detail("limit_bytes", limit);
    let bytes = crate::wire::response_bytes(&jsonrpsee::types::Id::Null, &Err(error.into()));
    let mut response = response::ok_response(bytes);
    *response.status_mut() = StatusCode::PAYLOAD_TOO_LARGE;
    response
}

/// Reads the whole body: one of announced length (at most `limit`, checked before) at once,
/// a chunked one up to `limit`. A body whose framing breaks (a bad chunk, fewer bytes than
/// announced) is the client's error, answered 400.
async fn read_body(
    request: HttpRequest<HttpBody>,
    limit: u64,
) -> Result<(http::request::Parts, Bytes), HttpResponse<HttpBody>> {
    let chunked = content_length(&request).is_none();
    let (parts, body) = request.into_parts();
    let read = match chunked {
        true => read_chunked(body, limit).await,
        false => body
            .collect()
            .await
            .map(|collected| collected.to_bytes())
            .map_err(|e| invalid_request::unreadable_body(&e)),
    };
    read.map(|bytes| (parts, bytes))
}

/// A body of no announced length, counted as it comes: one past `limit` is the 413.
async fn read_chunked(mut body: HttpBody, limit: u64) -> Result<Bytes, HttpResponse<HttpBody>> {
    let mut bytes = bytes::BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| invalid_request::unreadable_body(&e))?;
        if let Some(data) = frame.data_ref() {
            bytes.extend_from_slice(data);
        }
        if bytes.len() as u64 > limit {
            return Err(too_large(body, bytes.len() as u64, limit).await);
        }
    }
    Ok(bytes.freeze())
}

/// The entry whose stored bytes answer a resend of `request`'s very bytes by `caller`, if
/// the store's memory holds one (a stream is replayed by the guard, not here).
fn resent(cache: &IdempotencyCache, request: &Sent, caller: CallerPolicy) -> Option<Arc<Entry>> {
    let spelling = || caller.spelling(request.spelling());
    let entry = cache.store().spelled(request.glimpse, &spelling)?;
    (!crate::guard::stream::is_event_stream(&entry)).then_some(entry)
}

/// The response, with what happened to the request's governed calls applied.
fn answered(scope: &HttpScope, mut response: HttpResponse<HttpBody>) -> HttpResponse<HttpBody> {
    if let Some(stream) = scope.take_stream() {
        response = sse_response(stream);
    }
    apply_outcome(scope, &mut response);
    response
}

/// Replaces jsonrpsee's placeholder answer with the call's events.
fn sse_response(source: StreamSource) -> HttpResponse<HttpBody> {
    let StreamSource {
        recording,
        reframe_for,
    } = source;
    let events = recording.reader();
    match reframe_for {
        None => sse::response(events),
        Some(id) => {
            let id = serde_json::to_vec(&id).expect("an id serializes");
            let reframed = events.flat_map(move |event| {
                let (start, rest) = sse::reframe(event, &id);
                futures::stream::iter(start.into_iter().chain([rest]))
            });
            sse::response(reframed)
        }
    }
}

/// Sets status and headers from what happened to the request's governed calls.
fn apply_outcome<B>(scope: &HttpScope, response: &mut http::Response<B>) {
    if scope.replayed_whole_batch() && scope.caller().mark_replays {
        let replayed = HeaderValue::from_static("true");
        response.headers_mut().insert(IDEMPOTENT_REPLAYED, replayed);
        return;
    }
    match scope.single_outcome() {
        Some(Outcome::Replayed | Outcome::Attached) if scope.caller().mark_replays => {
            response
                .headers_mut()
                .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
        }
        Some(Outcome::Rejected(code)) => {
            *response.status_mut() =
                StatusCode::from_u16(code.http_status()).unwrap_or(StatusCode::BAD_REQUEST);
        }
        Some(
            Outcome::Executed | Outcome::Replayed | Outcome::Attached | Outcome::Undeduplicated,
        )
        | None => {}
    }
}

/// Spec §3.2: a response to a request that activated the extension names it.
fn echo_activation(response: &mut HeaderMap) {
    // Appended: other extensions the request activated may be listed already.
    response.append(A2A_EXTENSIONS, HeaderValue::from_static(EXTENSION_URI));
}
