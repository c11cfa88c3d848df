//! What is answered in front of jsonrpsee, which answers POST only: `GET` (and `HEAD`) of the
//! AgentCard and of `/metrics`, and the 405 of any other method there, which names them as
//! well as jsonrpsee's `POST`; a request for an A2A version the agent does not speak
//! (`version.rs`), and a body in a content coding (jsonrpsee reads bodies as sent, so a gzip body was a -32700
//! Parse error; RFC 9110 §15.5.16 makes it a 415). Everything else passes through. Its
//! answers echo the activation as the idempotency layer's own do, by that layer's rule.

use std::future::ready;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::future::{BoxFuture, Either};
use futures::FutureExt;
use http::header::{ACCEPT_ENCODING, ALLOW, CONTENT_ENCODING, CONTENT_TYPE};
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use idem::layers::HttpLayer;
use idem::{ErrorCode, IdempotencyError};
use jsonrpsee::server::{HttpBody, HttpResponse};
use jsonrpsee::types::ErrorObjectOwned;
use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::{json, Value};

use crate::card::CARD_PATH;
use crate::version;

/// Where Prometheus scrapes the metrics.
pub const METRICS_PATH: &str = "/metrics";

/// The layer: the card, the metrics recorder's handle, and the idempotency layer behind it.
#[derive(Clone)]
pub struct FrontLayer {
    /// Serialized once: the card does not change while the server runs.
    card: Arc<str>,
    metrics: PrometheusHandle,
    idempotency: HttpLayer,
    /// The most of a refused request's body read for its calls' ids: the server's limit.
    max_body_bytes: usize,
}

impl FrontLayer {
    pub fn new(
        card: &Value,
        metrics: PrometheusHandle,
        idempotency: HttpLayer,
        max_body_bytes: usize,
    ) -> Self {
        Self {
            card: card.to_string().into(),
            metrics,
            idempotency,
            max_body_bytes,
        }
    }
}

impl<S> tower::Layer<S> for FrontLayer {
    type Service = FrontService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        FrontService {
            inner,
            front: self.clone(),
        }
    }
}

/// The service of [`FrontLayer`].
#[derive(Clone)]
pub struct FrontService<S> {
    inner: S,
    front: FrontLayer,
}

impl<S, B> tower::Service<http::Request<B>> for FrontService<S>
where
    S: tower::Service<http::Request<B>, Response = HttpResponse>,
    S::Error: Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Response = HttpResponse;
    type Error = S::Error;
    type Future = Either<BoxFuture<'static, Result<HttpResponse, S::Error>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        match self.front.answer(&request) {
            Answer::Pass => Either::Right(self.inner.call(request)),
            Answer::Now(mut answer) => {
                self.front
                    .idempotency
                    .echo(request.headers(), answer.headers_mut());
                Either::Left(ready(Ok(answer)).boxed())
            }
            Answer::VersionNotSupported(requested) => {
                // Its body is read here, for the calls' ids: under the bound on requests in
                // flight that the idempotency layer holds bodies to (found by helper-88).
                let admitted = match self.front.idempotency.admit() {
                    Ok(admitted) => admitted,
                    Err(too_busy) => {
                        let mut too_busy = too_busy.into_response();
                        let idempotency = &self.front.idempotency;
                        idempotency.echo(request.headers(), too_busy.headers_mut());
                        return Either::Left(ready(Ok(too_busy)).boxed());
                    }
                };
                let (parts, body) = request.into_parts();
                let idempotency = self.front.idempotency.clone();
                let limit = self.front.max_body_bytes;
                let answered = async move {
                    let _admitted = admitted;
                    let mut answer = version_not_supported(requested, body, limit).await;
                    idempotency.echo(&parts.headers, answer.headers_mut());
                    Ok(answer)
                };
                Either::Left(answered.boxed())
            }
        }
    }
}

/// What is done here with a request.
enum Answer {
    /// Answered here, as is.
    Now(HttpResponse),
    /// Refused for its `A2A-Version`, once its body is read for the calls' ids.
    VersionNotSupported(String),
    /// jsonrpsee's.
    Pass,
}

impl FrontLayer {
    /// What is done here with `request`.
    fn answer<B>(&self, request: &http::Request<B>) -> Answer {
        let (method, path) = (request.method(), request.uri().path());
        if path != CARD_PATH && path != METRICS_PATH || method == Method::POST {
            // POST is JSON-RPC on every path, these two included.
            return self.refusal(request);
        }
        // HEAD is GET without the body (RFC 9110 §9.3.2), which hyper leaves out.
        if method != Method::GET && method != Method::HEAD {
            return Answer::Now(not_allowed(method));
        }
        Answer::Now(match path {
            CARD_PATH => response(self.card.to_string(), JSON),
            _ => response(self.metrics.render(), PROMETHEUS_TEXT),
        })
    }

    /// What is refused here of a request that jsonrpsee would otherwise read. Of a method
    /// other than POST, its 405 comes first, whatever version it asks for, and so does the
    /// idempotency layer's 413 of a body announced over the limit (which it answers without
    /// asking a client that waits for `100 Continue` to send it).
    fn refusal<B>(&self, request: &http::Request<B>) -> Answer {
        let announced = request.headers().get(http::header::CONTENT_LENGTH);
        let announced = announced.and_then(|n| n.to_str().ok()?.parse::<usize>().ok());
        let read = request.method() == Method::POST
            && announced.is_none_or(|bytes| bytes <= self.max_body_bytes);
        if let Some(requested) =
            version::unsupported(request.headers(), request.uri()).filter(|_| read)
        {
            Answer::VersionNotSupported(requested)
        } else if let Some(coding) = content_coding(request.headers()) {
            Answer::Now(unsupported_coding(&coding))
        } else {
            Answer::Pass
        }
    }
}

/// -32009 to each call of `body` (read up to `limit` bytes; past it, the idempotency layer's
/// 413; unreadable, the calls are unknown and the error's id is `null`).
async fn version_not_supported<B>(requested: String, body: B, limit: usize) -> HttpResponse
where
    B: Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let body = match Limited::new(body, limit).collect().await {
        Ok(read) => read.to_bytes(),
        Err(error) if error.is::<LengthLimitError>() => return too_large(limit),
        Err(_) => Bytes::new(),
    };
    match version::not_supported(&requested, &body) {
        Some(errors) => response(errors, JSON),
        None => {
            // Notifications only: JSON-RPC answers nothing, as jsonrpsee does (HTTP 204).
            let mut nothing = HttpResponse::new(HttpBody::empty());
            *nothing.status_mut() = StatusCode::NO_CONTENT;
            nothing
        }
    }
}

/// A body over the limit: 413, with the error the idempotency layer answers it with.
fn too_large(limit: usize) -> HttpResponse {
    let error = IdempotencyError::new(ErrorCode::RequestTooLarge).with_detail("limit_bytes", limit);
    let error = ErrorObjectOwned::from(error);
    let answer = json!({"jsonrpc": "2.0", "id": null, "error": error});
    let mut response = response(answer.to_string(), JSON);
    *response.status_mut() = StatusCode::PAYLOAD_TOO_LARGE;
    response
}

const JSON: &str = "application/json";
/// The Prometheus text exposition format.
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4";

fn response(body: String, content_type: &'static str) -> HttpResponse {
    let mut response = HttpResponse::new(HttpBody::from(body));
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// The body's content coding, unless it is none (`identity`).
fn content_coding(headers: &HeaderMap) -> Option<String> {
    let codings = headers.get_all(CONTENT_ENCODING).iter();
    let named = codings.flat_map(|value| value.as_bytes().split(|&b| b == b','));
    named
        .map(|coding| String::from_utf8_lossy(coding.trim_ascii()).to_ascii_lowercase())
        .find(|coding| !coding.is_empty() && coding != "identity")
}

/// 415, with the codings the server reads (RFC 9110 §12.5.3: none but `identity`).
fn unsupported_coding(coding: &str) -> HttpResponse {
    let reason = "request bodies are read as sent: send this one without a content coding";
    let data = json!({"reason": reason, "content_encoding": coding});
    let mut response = invalid_request(StatusCode::UNSUPPORTED_MEDIA_TYPE, data);
    let identity = HeaderValue::from_static("identity");
    response.headers_mut().insert(ACCEPT_ENCODING, identity);
    response
}

/// 405 of `method` on a path served here, naming the methods it has (RFC 9110 §15.5.6).
fn not_allowed(method: &Method) -> HttpResponse {
    let data = json!({"reason": "this path answers GET (and HEAD), and JSON-RPC over POST", "method": method.as_str()});
    let mut response = invalid_request(StatusCode::METHOD_NOT_ALLOWED, data);
    let allowed = HeaderValue::from_static("GET, HEAD, POST");
    response.headers_mut().insert(ALLOW, allowed);
    response
}

/// A request refused before jsonrpsee read it: `status`, and a JSON-RPC -32600 with `id: null`
/// (the call is unknown) whose `data` says why.
pub fn invalid_request(status: StatusCode, data: Value) -> HttpResponse {
    let error = json!({"jsonrpc": "2.0", "id": null, "error": {
        "code": -32600,
        "message": "Invalid Request",
        "data": data,
    }});
    let mut response = response(error.to_string(), JSON);
    *response.status_mut() = status;
    response
}
