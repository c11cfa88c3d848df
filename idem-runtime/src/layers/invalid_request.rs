//! JSON-RPC 2.0 §5 where jsonrpsee 0.26 answers otherwise, for the request bodies the HTTP
//! layer has read:
//!
//! - JSON that is not a valid Request object (no `method`, `jsonrpc` not `"2.0"`, a number)
//!   is -32600 Invalid Request with `id: null`, where jsonrpsee says -32700 Parse error (which
//!   is for text that is not JSON);
//! - a request whose `id` is an object or an array is -32600 with `id: null`, where jsonrpsee
//!   answers the body `null`;
//! - a notification (no `id`), or a batch of them, is not answered: an empty body (HTTP 204),
//!   where jsonrpsee answers `null`.
//!
//! Only those two answers of jsonrpsee's are looked at (by their exact size, so an ordinary
//! answer costs nothing here), and only then is the request parsed.

use bytes::Bytes;
use http::StatusCode;
use http_body_util::BodyExt;
use jsonrpsee::server::{HttpBody, HttpResponse};
use serde_json::Value;

/// jsonrpsee's answer to a notification and to a request with an object or array id.
const NULL: &[u8] = b"null";
/// jsonrpsee's answer to JSON it cannot read as a request.
const PARSE_ERROR: &[u8] =
    br#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error"}}"#;
const INVALID_REQUEST: &str =
    r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Invalid request"}}"#;

/// `response`, or the answer JSON-RPC 2.0 gives to `request` where jsonrpsee's differs.
pub(crate) async fn corrected(request: &[u8], response: HttpResponse) -> HttpResponse {
    let size = hyper::body::Body::size_hint(response.body()).exact();
    if !matches!(size, Some(n) if n == NULL.len() as u64 || n == PARSE_ERROR.len() as u64) {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let Ok(body) = body.collect().await.map(|b| b.to_bytes()) else {
        return HttpResponse::from_parts(parts, HttpBody::empty());
    };
    let answer = match &body[..] {
        NULL => Some(answer_to_null(request)),
        PARSE_ERROR => serde_json::from_slice::<Value>(request)
            .ok()
            .map(|_json| Answer::Invalid(vec![INVALID_REQUEST.to_owned()])),
        _ => None,
    };
    match answer {
        None => HttpResponse::from_parts(parts, HttpBody::new(http_body_util::Full::new(body))),
        Some(Answer::Nothing) => {
            parts.status = StatusCode::NO_CONTENT;
            parts.headers.remove(http::header::CONTENT_TYPE);
            HttpResponse::from_parts(parts, HttpBody::empty())
        }
        Some(Answer::Invalid(errors)) => {
            let text = match errors.as_slice() {
                [one] if !request_is_batch(request) => one.clone(),
                many => format!("[{}]", many.join(",")),
            };
            let body = HttpBody::new(http_body_util::Full::new(Bytes::from(text)));
            HttpResponse::from_parts(parts, body)
        }
    }
}

enum Answer {
    /// Notifications only: no answer at all.
    Nothing,
    /// One Invalid Request error per request whose id is not a JSON-RPC id.
    Invalid(Vec<String>),
}

/// Why jsonrpsee answered `null`: requests whose ids it could not read, or notifications.
/// Read as leniently as jsonrpsee reads (members other than `id` are skipped unchecked); a
/// body that cannot be read even so is an Invalid Request, never `null`.
fn answer_to_null(request: &[u8]) -> Answer {
    let ids: Vec<Probe<'_>> = match request_is_batch(request) {
        true => serde_json::from_slice(request).unwrap_or_default(),
        false => serde_json::from_slice(request)
            .map(|one| vec![one])
            .unwrap_or_default(),
    };
    if ids.is_empty() {
        return Answer::Invalid(vec![INVALID_REQUEST.to_owned()]);
    }
    let invalid = ids
        .iter()
        .filter(|probe| probe.id.is_some_and(|id| id.get().starts_with(['{', '['])))
        .map(|_| INVALID_REQUEST.to_owned())
        .collect::<Vec<_>>();
    match invalid.is_empty() {
        true => Answer::Nothing,
        false => Answer::Invalid(invalid),
    }
}

/// A request's `id`, the one member the answer depends on.
#[derive(serde::Deserialize)]
struct Probe<'a> {
    #[serde(borrow)]
    id: Option<&'a serde_json::value::RawValue>,
}

fn request_is_batch(request: &[u8]) -> bool {
    request.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[')
}
