//! The AgentCard, and the tower layer that serves it.
//!
//! jsonrpsee answers POST only, so `GET /.well-known/agent-card.json` is answered in front of
//! it; so is a request for an A2A version the agent does not speak (`version.rs`). One card serves both versions: the 0.3 required fields and the 1.0
//! `supportedInterfaces` side by side (each version ignores the other's members).

use std::future::{ready, Ready};
use std::net::SocketAddr;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::Either;
use http::header::CONTENT_TYPE;
use http::{HeaderValue, Method};
use jsonrpsee::server::{HttpBody, HttpResponse};
use serde_json::{json, Value};

use crate::version;

/// Where A2A clients look for the card.
pub const CARD_PATH: &str = "/.well-known/agent-card.json";

/// The card of this agent at `addr`; `extensions` goes to `capabilities.extensions`.
pub fn agent_card(addr: SocketAddr, extensions: Vec<Value>) -> Value {
    let url = format!("http://{addr}/");
    json!({
        "protocolVersion": "0.3.0",
        "name": "idem example agent",
        "description": "Assigns missions that echo their text, deduplicated by the idempotency/v1 extension.",
        "url": url,
        "preferredTransport": "JSONRPC",
        "supportedInterfaces": [
            { "url": url, "protocolBinding": "JSONRPC", "protocolVersion": "1.0" },
            { "url": url, "protocolBinding": "JSONRPC", "protocolVersion": "0.3" },
        ],
        "version": env!("CARGO_PKG_VERSION"),
        "capabilities": {
            "streaming": true,
            "pushNotifications": false,
            "extensions": extensions,
        },
        "defaultInputModes": ["text/plain"],
        "defaultOutputModes": ["text/plain"],
        "skills": [{
            "id": "mission",
            "name": "Mission",
            "description": "Works on the message for metadata.durationMs (default 2000) and completes with an artifact echoing its text parts.",
            "tags": ["mission", "echo"],
            "examples": ["Survey the north ridge"],
        }],
    })
}

/// Answers GET on [`CARD_PATH`] with the card; passes every other request through.
#[derive(Clone)]
pub struct CardLayer {
    /// Serialized once: the card does not change while the server runs.
    body: Arc<str>,
}

impl CardLayer {
    pub fn new(card: &Value) -> Self {
        Self {
            body: card.to_string().into(),
        }
    }
}

impl<S> tower::Layer<S> for CardLayer {
    type Service = CardService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        CardService {
            inner,
            body: self.body.clone(),
        }
    }
}

/// The service of [`CardLayer`].
#[derive(Clone)]
pub struct CardService<S> {
    inner: S,
    body: Arc<str>,
}

impl<S, B> tower::Service<http::Request<B>> for CardService<S>
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
        if request.method() == Method::GET && request.uri().path() == CARD_PATH {
            Either::Left(ready(Ok(json_response(self.body.to_string()))))
        } else if let Some(requested) = version::unsupported(request.headers()) {
            let body = version::not_supported_body(&requested);
            Either::Left(ready(Ok(json_response(body))))
        } else {
            Either::Right(self.inner.call(request))
        }
    }
}

fn json_response(body: String) -> HttpResponse {
    let mut response = HttpResponse::new(HttpBody::from(body));
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}
