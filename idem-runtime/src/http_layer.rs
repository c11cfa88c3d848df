//! The HTTP layer: reads activation before jsonrpsee runs, and turns the outcomes of the
//! governed calls into the status and headers the spec requires.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{HeaderValue, StatusCode};

use crate::activation::is_activated;
use crate::error::EXTENSION_URI;
use crate::idempotency::State;
use crate::scope::{HttpScope, Outcome};

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
    #[allow(dead_code)] // the streaming front service reads the config from here
    state: Arc<State>,
}

type BoxFuture<T> = Pin<Box<dyn std::future::Future<Output = T> + Send + 'static>>;

impl<S, ReqBody, ResBody> tower::Service<http::Request<ReqBody>> for HttpService<S>
where
    S: tower::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<ReqBody>) -> Self::Future {
        let scope = HttpScope::new(is_activated(request.headers(), EXTENSION_URI));
        request.extensions_mut().insert(scope.clone());
        let response = self.inner.call(request);
        Box::pin(async move {
            let mut response = response.await?;
            apply_outcome(&scope, &mut response);
            Ok(response)
        })
    }
}

/// Sets status and headers from what happened to the request's governed calls.
pub(crate) fn apply_outcome<B>(scope: &HttpScope, response: &mut http::Response<B>) {
    if scope.activated() {
        response
            .headers_mut()
            .insert("a2a-extensions", HeaderValue::from_static(EXTENSION_URI));
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
