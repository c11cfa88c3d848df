//! The HTTP layer: reads activation before jsonrpsee runs, and turns what happened to the
//! governed calls into the response: status, headers, and for a stream the SSE body.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::StreamExt;
use http::{HeaderValue, StatusCode};
use jsonrpsee::server::{HttpBody, HttpResponse};

use crate::activation::is_activated;
use crate::error::EXTENSION_URI;
use crate::idempotency::State;
use crate::scope::{HttpScope, Outcome, StreamSource, WebSocket};
use crate::sse;

/// The response header that marks a replay (spec §4.3). Sent only as `true`, never as `false`.
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";

/// The tower layer for `ServerBuilder::set_http_middleware` (see [`crate::Idempotency::http_layer`]).
#[derive(Clone)]
pub struct HttpLayer {
    state: Arc<State>,
}

impl HttpLayer {
    pub(crate) fn new(state: Arc<State>) -> Self {
        Self { state }
    }
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
#[derive(Clone)]
pub struct HttpService<S> {
    inner: S,
    state: Arc<State>,
}

type BoxFuture<T> = Pin<Box<dyn std::future::Future<Output = T> + Send + 'static>>;

impl<S, ReqBody> tower::Service<http::Request<ReqBody>> for HttpService<S>
where
    S: tower::Service<http::Request<ReqBody>, Response = HttpResponse<HttpBody>>,
    S::Future: Send + 'static,
    S::Error: From<tokio::task::JoinError> + Send + 'static,
{
    type Response = HttpResponse<HttpBody>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<ReqBody>) -> Self::Future {
        if jsonrpsee::server::ws::is_upgrade_request(&request) {
            // One scope would serve every call of the connection: the RPC layer refuses
            // governed calls over WebSocket instead.
            request.extensions_mut().insert(WebSocket);
            return Box::pin(self.inner.call(request));
        }
        // A server with the extension off neither reads nor echoes the activation header.
        let activated =
            self.state.deduplicating().is_some() && is_activated(request.headers(), EXTENSION_URI);
        let scope = HttpScope::new(activated);
        request.extensions_mut().insert(scope.clone());
        // In a task of its own: a client that hangs up must not cut a governed call off
        // mid-execution (its retry would run it again); the call runs to its end, stored.
        let response = tokio::spawn(self.inner.call(request));
        Box::pin(async move {
            let mut response = response.await??;
            if let Some(stream) = scope.take_stream() {
                response = sse_response(stream);
            }
            apply_outcome(&scope, &mut response);
            Ok(response)
        })
    }
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
        Some(id) => sse::response(events.map(move |event| sse::reframe(&event, &id))),
    }
}

/// Sets status and headers from what happened to the request's governed calls.
fn apply_outcome<B>(scope: &HttpScope, response: &mut http::Response<B>) {
    if scope.activated() {
        // Appended: other extensions the request activated may be listed already.
        response
            .headers_mut()
            .append("a2a-extensions", HeaderValue::from_static(EXTENSION_URI));
    }
    match scope.single_outcome() {
        Some(Outcome::Replayed) => {
            response
                .headers_mut()
                .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
        }
        Some(Outcome::Rejected(code)) => {
            *response.status_mut() =
                StatusCode::from_u16(code.http_status()).unwrap_or(StatusCode::BAD_REQUEST);
        }
        Some(Outcome::Executed) | None => {}
    }
}
