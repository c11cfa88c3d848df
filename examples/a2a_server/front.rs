//! What is answered in front of jsonrpsee, which answers POST only: `GET` of the AgentCard
//! and of `/metrics`, and a request for an A2A version the agent does not speak
//! (`version.rs`). Everything else passes through.

use std::future::{ready, Ready};
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::Either;
use http::header::CONTENT_TYPE;
use http::{HeaderValue, Method};
use jsonrpsee::server::{HttpBody, HttpResponse};
use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::Value;

use crate::card::CARD_PATH;
use crate::version;

/// Where Prometheus scrapes the metrics.
pub const METRICS_PATH: &str = "/metrics";

/// The layer: the card, and the metrics recorder's handle.
#[derive(Clone)]
pub struct FrontLayer {
    /// Serialized once: the card does not change while the server runs.
    card: Arc<str>,
    metrics: PrometheusHandle,
}

impl FrontLayer {
    pub fn new(card: &Value, metrics: PrometheusHandle) -> Self {
        Self {
            card: card.to_string().into(),
            metrics,
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
{
    type Response = HttpResponse;
    type Error = S::Error;
    type Future = Either<Ready<Result<HttpResponse, S::Error>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let get = request.method() == Method::GET;
        let answer = |body, content_type| Either::Left(ready(Ok(response(body, content_type))));
        if get && request.uri().path() == CARD_PATH {
            answer(self.front.card.to_string(), JSON)
        } else if get && request.uri().path() == METRICS_PATH {
            answer(self.front.metrics.render(), PROMETHEUS_TEXT)
        } else if let Some(requested) = version::unsupported(request.headers()) {
            answer(version::not_supported_body(&requested), JSON)
        } else {
            Either::Right(self.inner.call(request))
        }
    }
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
