//! The AgentCard, served where A2A clients look for it, with the extension's entry in it
//! (spec §3.1): what an application would otherwise write as a tower service of its own.
//!
//! ```
//! use idem_runtime::Idempotency;
//! use serde_json::json;
//! let idem = Idempotency::off();
//! let card = json!({"name": "Echo agent", "url": "http://127.0.0.1:8080/"});
//! let _layer = idem.agent_card_layer(card); // in front of the HTTP layer
//! ```

use std::future::{ready, Ready};
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::future::Either;
use http::header::{ALLOW, CONTENT_LENGTH, CONTENT_TYPE};
use http::{HeaderValue, Method, StatusCode};
use http_body_util::Full;
use jsonrpsee::server::{HttpBody, HttpResponse};
use serde_json::Value;

use crate::error::EXTENSION_URI;

/// Where A2A clients fetch the AgentCard.
pub const AGENT_CARD_PATH: &str = "/.well-known/agent-card.json";

/// Answers `GET` and `HEAD` of [`AGENT_CARD_PATH`] with the card (see
/// [`crate::Idempotency::agent_card_layer`]); JSON-RPC over `POST` and every other path pass
/// through.
#[derive(Clone, Debug)]
pub struct AgentCardLayer {
    /// Serialized once: the card does not change while the server runs.
    card: Bytes,
}

impl AgentCardLayer {
    /// `card` with `extension` as its entry of this extension (none: the extension is off).
    /// A card that is not an object is served as given: it names no capabilities to add to.
    pub(crate) fn new(mut card: Value, extension: Option<Value>) -> Self {
        if let Some(card) = card.as_object_mut() {
            let capabilities = object_member(card, "capabilities");
            let extensions = capabilities.entry("extensions").or_insert(Value::Null);
            if !extensions.is_array() {
                *extensions = Value::Array(Vec::new());
            }
            let entries = extensions.as_array_mut().expect("made an array above");
            entries.retain(|entry| entry["uri"] != EXTENSION_URI);
            entries.extend(extension);
        }
        Self {
            card: card.to_string().into(),
        }
    }
}

/// `object[name]` as an object, made one if it was missing or something else.
fn object_member<'a>(
    object: &'a mut serde_json::Map<String, Value>,
    name: &str,
) -> &'a mut serde_json::Map<String, Value> {
    let member = object.entry(name).or_insert(Value::Null);
    if !member.is_object() {
        *member = Value::Object(serde_json::Map::new());
    }
    member.as_object_mut().expect("made an object above")
}

impl<S> tower::Layer<S> for AgentCardLayer {
    type Service = AgentCardService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        AgentCardService {
            inner,
            card: self.card.clone(),
        }
    }
}

/// The service of [`AgentCardLayer`].
#[derive(Clone, Debug)]
pub struct AgentCardService<S> {
    inner: S,
    card: Bytes,
}

impl<S, B> tower::Service<http::Request<B>> for AgentCardService<S>
where
    S: tower::Service<http::Request<B>, Response = HttpResponse<HttpBody>>,
{
    type Response = HttpResponse<HttpBody>;
    type Error = S::Error;
    type Future = Either<Ready<Result<Self::Response, S::Error>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        // jsonrpsee serves JSON-RPC over POST on every path, this one included.
        if request.uri().path() != AGENT_CARD_PATH || request.method() == Method::POST {
            return Either::Right(self.inner.call(request));
        }
        Either::Left(ready(Ok(self.answer(request.method()))))
    }
}

impl<S> AgentCardService<S> {
    /// The card to `GET` (its headers alone to `HEAD`); 405 to any other method but `POST`,
    /// naming all three, where jsonrpsee's own `Allow: POST` would leave out the card's.
    fn answer(&self, method: &Method) -> HttpResponse<HttpBody> {
        let (status, body) = match *method {
            Method::GET => (StatusCode::OK, self.card.clone()),
            Method::HEAD => (StatusCode::OK, Bytes::new()),
            _ => (StatusCode::METHOD_NOT_ALLOWED, Bytes::new()),
        };
        let mut response = HttpResponse::new(HttpBody::new(Full::new(body)));
        *response.status_mut() = status;
        let headers = response.headers_mut();
        if status == StatusCode::OK {
            let json = HeaderValue::from_static("application/json");
            headers.insert(CONTENT_TYPE, json);
            headers.insert(CONTENT_LENGTH, HeaderValue::from(self.card.len()));
        } else {
            headers.insert(ALLOW, HeaderValue::from_static("GET, HEAD, POST"));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn served(card: Value, extension: Option<Value>) -> Value {
        serde_json::from_slice(&AgentCardLayer::new(card, extension).card).unwrap()
    }

    #[test]
    fn the_entry_replaces_a_stale_one_and_keeps_the_others() {
        let ours = json!({"uri": EXTENSION_URI, "params": {"ttl_seconds": 60}});
        let card = json!({"name": "a", "capabilities": {"streaming": true, "extensions": [
            {"uri": EXTENSION_URI, "params": {"ttl_seconds": 1}}, {"uri": "other"}]}});
        let served = served(card, Some(ours.clone()));
        assert_eq!(served["capabilities"]["streaming"], true);
        assert_eq!(
            served["capabilities"]["extensions"],
            json!([{"uri": "other"}, ours])
        );
    }

    #[test]
    fn a_card_without_capabilities_or_of_odd_shapes_never_panics() {
        let ours = json!({"uri": EXTENSION_URI});
        for card in [
            json!({}),
            json!({"capabilities": 7}),
            json!({"capabilities": {"extensions": "x"}}),
        ] {
            let served = served(card, Some(ours.clone()));
            assert_eq!(served["capabilities"]["extensions"], json!([ours]));
        }
        assert_eq!(
            served(json!([1]), Some(ours)),
            json!([1]),
            "not an object: as given"
        );
        // The extension off: a stale entry of it goes, and none is added.
        let stale = json!({"capabilities": {"extensions": [{"uri": EXTENSION_URI}]}});
        assert_eq!(served(stale, None)["capabilities"]["extensions"], json!([]));
    }
}
