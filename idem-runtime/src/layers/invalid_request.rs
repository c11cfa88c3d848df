//! JSON-RPC 2.0 §5 where jsonrpsee 0.26 answers otherwise, for the request bodies the HTTP
//! layer has read:
//!
//! - JSON that is not a valid Request object (no `method`, `jsonrpc` not `"2.0"`, a number)
//!   is -32600 Invalid Request with `id: null`, where jsonrpsee says -32700 Parse error (which
//!   is for text that is not JSON);
//! - a request whose `id` jsonrpsee cannot read is -32600 with `id: null` and a reason, where
//!   jsonrpsee answers nothing for it, as if it were a notification: it reads an id only as
//!   `null`, a string, or an integer from 0 to 2^64 - 1, so an object or an array (which
//!   JSON-RPC forbids), but also `-1` or `1.5` (which it allows), and `"\ud800"`;
//! - text that is not JSON is -32700 Parse error with HTTP 400 and a reason that says where,
//!   where jsonrpsee answers it with 200 when the text starts with `{` or `[` (400
//!   otherwise), and without a reason;
//! - a notification (no `id`), or a batch of them, is not answered: an empty body (HTTP 204),
//!   where jsonrpsee answers `null`;
//! - an entry of a batch that is not an object is -32600 with `id: null`, where jsonrpsee
//!   echoes an id it read out of an array (`[[1]]` got `id: 1`), or answers nothing when it
//!   reads the array as a notification (`[["2.0","m"]]`). One it reads as a Request
//!   (`[["2.0",1,"m"]]`: serde reads a struct out of an array too) it dispatches, and that
//!   call's answer stands: it ran.
//!
//! Which entries jsonrpsee answered is found as jsonrpsee finds it ([`Taken`]): read as a
//! Request, else as a notification, else answered as invalid. A batch's answers are listed in
//! the order of its entries, jsonrpsee's where it gave one.
//!
//! Only those two answers of jsonrpsee's, and answers to batches, are looked at (by their
//! exact size, so an ordinary answer costs nothing here), and only then is the request parsed.
//! The call of an id jsonrpsee cannot read never ran: the error says so.
//!
//! And jsonrpsee's refusals in plain text, which keep their status: of a request whose body
//! it never reads, a method other than POST (405) and a content type other than JSON (415)
//! become a -32600 whose `data` says what to send, and a 405 names the one method allowed
//! (`Allow`, which RFC 9110 §15.5.6 requires of it); its 429, to any request past
//! `max_connections` (which counts HTTP requests in flight), becomes a -32603 that says
//! nothing ran, with `Retry-After: 1`; its 200 in plain text to a WebSocket handshake it could
//! not complete becomes a 400 -32600 with its reason. The HTTP layer's own refusals of a body that is not
//! UTF-8 or cannot be read are written here too ([`not_utf8`], [`unreadable_body`]).

use std::borrow::Cow;

use bytes::Bytes;
use http::header::{ALLOW, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, StatusCode};
use http_body_util::BodyExt;
use jsonrpsee::server::{HttpBody, HttpResponse};
use jsonrpsee::types::{Notification, Request};
use serde::de::IgnoredAny;
use serde_json::value::RawValue;

use crate::layers::scope::HttpScope;

/// jsonrpsee's answer to a notification and to a request with an object or array id.
const NULL: &[u8] = b"null";
/// jsonrpsee's answer to JSON it cannot read as a request.
const PARSE_ERROR: &[u8] =
    br#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error"}}"#;
const INVALID_REQUEST: &str =
    r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Invalid request"}}"#;
/// The answer to a request whose id jsonrpsee cannot read.
const UNREADABLE_ID: &str = concat!(
    r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Invalid request","#,
    r#""data":{"reason":"the request's id must be a string, an integer from 0 to "#,
    r#"18446744073709551615, or null; the call was not run"}}}"#
);
/// The answer to a request that names its id twice, which jsonrpsee reads as a notification:
/// not [`UNREADABLE_ID`], whose reason sent the client after the id's type (helper-101).
const DUPLICATE_ID: &str = concat!(
    r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Invalid request","#,
    r#""data":{"reason":"the request names its id more than once; the call was not run"}}}"#
);

/// The end of jsonrpsee's own -32600 to a request whose id it read (the id comes before).
const INVALID_REQUEST_END: &[u8] = br#","error":{"code":-32600,"message":"Invalid request"}}"#;

/// jsonrpsee's -32600 but the id it echoes: an answer to a request longer than this plus the
/// request itself (no id is longer) is no Invalid Request, and passes unread.
const INVALID_REQUEST_AROUND_ID: usize =
    br#"{"jsonrpc":"2.0","id":"#.len() + INVALID_REQUEST_END.len();

/// `response`, or the answer JSON-RPC 2.0 gives to `request` where jsonrpsee's differs. A body
/// that is not a Request, answered with one Invalid Request error (not a batch's array), has
/// HTTP 400, as a body that is not JSON has: the request as a whole is malformed, whatever
/// jsonrpsee's status was (it said 400 to `null` and 200 to `{}`). A method's own -32600 keeps
/// its status: it is the call's answer, cached and replayed as sent.
///
/// Where the RPC layer saw a call of the request (`scope`), a single request's answer is that
/// call's and passes unread (where the RPC layer is not installed, the request is read to
/// tell). Answers added to a batch beside jsonrpsee's are counted in `scope`: none is a replay.
pub(crate) async fn corrected(
    request: &[u8],
    response: HttpResponse,
    scope: &HttpScope,
) -> HttpResponse {
    let batch = request_is_batch(request);
    if scope.dispatched() && !batch {
        return response;
    }
    let size = hyper::body::Body::size_hint(response.body()).exact();
    let looked_at = (request.len() + INVALID_REQUEST_AROUND_ID) as u64;
    if !batch && !matches!(size, Some(n) if n <= looked_at) {
        return response;
    }
    let (parts, body) = response.into_parts();
    let Ok(body) = body.collect().await.map(|b| b.to_bytes()) else {
        return HttpResponse::from_parts(parts, HttpBody::empty());
    };
    match answer_to(request, &body, batch) {
        Ok(answer) => {
            if let Some(Answer::Batch { added, .. }) = &answer {
                scope.answered_beside_jsonrpsee(*added);
            }
            respond(request, parts, body, answer, batch)
        }
        Err(not_json) => refused(StatusCode::BAD_REQUEST, PARSE, not_json.to_string()),
    }
}

/// JSON-RPC 2.0's answer to `request` where jsonrpsee's, `body`, differs from it (`None`:
/// jsonrpsee's stands); `Err` where the request is not JSON at all.
fn answer_to(
    request: &[u8],
    body: &[u8],
    batch: bool,
) -> Result<Option<Answer>, serde_json::Error> {
    // Where the body is a Request (JSON-RPC 2.0 §4), jsonrpsee dispatched it: an error in the
    // answer is its method's, cached and replayed with its status, whatever its code.
    Ok(match body {
        NULL => Some(answer_to_null(request)),
        PARSE_ERROR if !is_request(request) => {
            serde_json::from_slice::<serde::de::IgnoredAny>(request)?;
            Some(Answer::Invalid(vec![INVALID_REQUEST.to_owned()]))
        }
        answers if batch => batch_answers(request, answers),
        _ => None,
    })
}

/// The response with `answer` in place of jsonrpsee's `body` (and the status it goes with).
fn respond(
    request: &[u8],
    mut parts: http::response::Parts,
    body: Bytes,
    answer: Option<Answer>,
    batch: bool,
) -> HttpResponse {
    match answer {
        None => {
            let invalid = body.ends_with(INVALID_REQUEST_END) && !body.starts_with(b"[");
            if invalid && !is_request(request) {
                parts.status = StatusCode::BAD_REQUEST;
            }
            HttpResponse::from_parts(parts, HttpBody::new(http_body_util::Full::new(body)))
        }
        Some(Answer::Batch { text, .. }) => {
            let body = HttpBody::new(http_body_util::Full::new(Bytes::from(text)));
            HttpResponse::from_parts(parts, body)
        }
        Some(Answer::Nothing) => {
            parts.status = StatusCode::NO_CONTENT;
            parts.headers.remove(http::header::CONTENT_TYPE);
            HttpResponse::from_parts(parts, HttpBody::empty())
        }
        Some(Answer::Invalid(errors)) => {
            let text = match errors.as_slice() {
                [one] if !batch => {
                    parts.status = StatusCode::BAD_REQUEST;
                    one.clone()
                }
                many => format!("[{}]", many.join(",")),
            };
            let body = HttpBody::new(http_body_util::Full::new(Bytes::from(text)));
            HttpResponse::from_parts(parts, body)
        }
    }
}

/// `response`, or where it is jsonrpsee's plain-text refusal of a request it did not read,
/// that refusal as JSON-RPC.
pub(crate) fn refusal_as_json_rpc(response: HttpResponse) -> HttpResponse {
    let plain_text = |response: &HttpResponse| {
        let content_type = response.headers().get(CONTENT_TYPE);
        content_type.is_some_and(|value| value.as_bytes().starts_with(b"text/plain"))
    };
    match refusal(response.status()) {
        Some(refusal) if plain_text(&response) => refusal,
        _ => response,
    }
}

/// jsonrpsee's answer to a WebSocket handshake, its refusals as JSON-RPC. One it could not
/// complete (no `Sec-WebSocket-Key`, a version other than 13) it answers 200 in plain text,
/// with its reason: that is a 400 -32600 with the reason (helper-103).
pub(crate) async fn handshake_refusal(response: HttpResponse) -> HttpResponse {
    if response.status() != StatusCode::OK {
        return refusal_as_json_rpc(response);
    }
    let reason = match response.into_body().collect().await {
        Ok(body) => String::from_utf8_lossy(&body.to_bytes()).into_owned(),
        Err(error) => error.to_string(),
    };
    refused(StatusCode::BAD_REQUEST, INVALID, reason)
}

/// jsonrpsee's refusal with `status` of a request it did not read, as JSON-RPC; `None` for
/// another status.
fn refusal(status: StatusCode) -> Option<HttpResponse> {
    let (error, reason, header) = match status {
        StatusCode::METHOD_NOT_ALLOWED => (
            INVALID,
            "JSON-RPC requests are sent with POST",
            Some((ALLOW, "POST")),
        ),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => (
            INVALID,
            "JSON-RPC requests are sent with Content-Type: application/json",
            None,
        ),
        StatusCode::TOO_MANY_REQUESTS => (
            INTERNAL,
            "the server is serving as many requests as it may at once; nothing of this one \
             ran: send it again later",
            Some((RETRY_AFTER, "1")),
        ),
        _ => return None,
    };
    let mut refusal = refused(status, error, reason.to_owned());
    if let Some((name, value)) = header {
        refusal
            .headers_mut()
            .insert(name, HeaderValue::from_static(value));
    }
    Some(refusal)
}

/// The answer to a request past the requests in flight the HTTP layer takes, as jsonrpsee's
/// own past its limit, as JSON-RPC: HTTP 429 with `Retry-After: 1`; its body is never read.
pub(crate) fn too_busy() -> HttpResponse {
    refusal(StatusCode::TOO_MANY_REQUESTS).expect("jsonrpsee's 429 is among its refusals")
}

/// The answer to a body that is not UTF-8, so not JSON: -32700, HTTP 400.
pub(crate) fn not_utf8(error: &std::str::Utf8Error) -> HttpResponse {
    let at = error.valid_up_to();
    let reason = format!("the body is not UTF-8 (at byte {at}), so not JSON (RFC 8259 §8.1)");
    refused(StatusCode::BAD_REQUEST, PARSE, reason)
}

/// The answer to a body led by a form feed, which jsonrpsee would skip: not JSON.
pub(crate) fn form_feed_first() -> HttpResponse {
    let reason = "the body starts with a form feed, which is not whitespace in JSON (RFC 8259 §2)";
    refused(StatusCode::BAD_REQUEST, PARSE, reason.to_owned())
}

/// The answer to a body whose framing broke as it was read (a bad chunk, fewer bytes than its
/// `Content-Length`): the client's error, -32600, HTTP 400.
pub(crate) fn unreadable_body(error: &dyn std::fmt::Display) -> HttpResponse {
    let reason = format!("the request body could not be read: {error}");
    refused(StatusCode::BAD_REQUEST, INVALID, reason)
}

const INVALID: (i32, &str) = (-32600, "Invalid Request");
const PARSE: (i32, &str) = (-32700, "Parse error");
const INTERNAL: (i32, &str) = (-32603, "Internal error");

/// A request refused before jsonrpsee read it: `status`, and the JSON-RPC error `code` with
/// `id: null` (the call is unknown) and a `reason`.
fn refused(status: StatusCode, (code, message): (i32, &str), reason: String) -> HttpResponse {
    let error = serde_json::json!({"jsonrpc": "2.0", "id": null, "error": {
        "code": code,
        "message": message,
        "data": {"reason": reason},
    }});
    let mut response = HttpResponse::new(HttpBody::from(error.to_string()));
    *response.status_mut() = status;
    let json = HeaderValue::from_static("application/json");
    response.headers_mut().insert(CONTENT_TYPE, json);
    response
}

enum Answer {
    /// Notifications only: no answer at all.
    Nothing,
    /// One Invalid Request error per request jsonrpsee left unanswered ([`Taken::Unanswered`]).
    Invalid(Vec<String>),
    /// jsonrpsee's answers to a batch, corrected, with an error for each call it left
    /// unanswered (`added` of them).
    Batch { text: String, added: usize },
}

/// Why jsonrpsee answered `null`: requests whose ids it could not read, or notifications.
/// A body that cannot be read even so is an Invalid Request, never `null`.
fn answer_to_null(request: &[u8]) -> Answer {
    let entries = entries(request).unwrap_or_default();
    if entries.is_empty() {
        return Answer::Invalid(vec![INVALID_REQUEST.to_owned()]);
    }
    let unanswered: Vec<String> = entries
        .iter()
        .filter_map(|entry| match taken(entry.get()) {
            Taken::Unanswered(error) => Some(error.to_owned()),
            _ => None,
        })
        .collect();
    match unanswered.is_empty() {
        true => Answer::Nothing,
        false => Answer::Invalid(unanswered),
    }
}

/// jsonrpsee's `answers` to a batch as JSON-RPC 2.0 has them, in the order of the entries: an
/// error for each entry it left unanswered ([`Taken::Unanswered`]), and `id: null` in its
/// error to an entry that is not an object (it read an id out of an array: `[1]` was id 1).
/// `None` where they need nothing, or do not line up with the entries (then they stand).
fn batch_answers(request: &[u8], answers: &[u8]) -> Option<Answer> {
    let entries = entries(request)?;
    let mut given = serde_json::from_slice::<Vec<&RawValue>>(answers)
        .ok()?
        .into_iter();
    let (mut listed, mut added, mut replaced) = (Vec::new(), 0, false);
    for entry in &entries {
        match taken(entry.get()) {
            Taken::Call | Taken::Invalid { object: true } => listed.push(given.next()?.get()),
            Taken::Invalid { object: false } => {
                given.next()?;
                listed.push(INVALID_REQUEST);
                replaced = true;
            }
            Taken::Unanswered(error) => {
                listed.push(error);
                added += 1;
            }
            Taken::Notification => {}
        }
    }
    if given.next().is_some() || (added == 0 && !replaced) {
        return None;
    }
    let text = format!("[{}]", listed.join(","));
    Some(Answer::Batch { text, added })
}

/// The requests of a body, one or a batch; `None` when it is not JSON.
fn entries(request: &[u8]) -> Option<Vec<&RawValue>> {
    match request_is_batch(request) {
        true => serde_json::from_slice(request).ok(),
        false => serde_json::from_slice(request).ok().map(|one| vec![one]),
    }
}

/// How jsonrpsee 0.26 takes one request (`handle_rpc_call` in its `server.rs`), read as it
/// reads them: as a Request, else as a notification, else as an invalid request.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Taken {
    /// A Request: dispatched and answered.
    Call,
    /// A notification (no `id`): not answered, as JSON-RPC says.
    Notification,
    /// Read as a notification, and not answered, where JSON-RPC answers it with this -32600
    /// (`id: null`): a call whose `id` jsonrpsee cannot read ([`UNREADABLE_ID`]), or an
    /// array ([`INVALID_REQUEST`]).
    Unanswered(&'static str),
    /// Answered -32600 with the id jsonrpsee read of it; `object`: whether it is an object
    /// (the id read out of anything else is no request's).
    Invalid { object: bool },
}

fn taken(entry: &str) -> Taken {
    type Notif<'a> = Notification<'a, Option<Cow<'a, RawValue>>>;
    if serde_json::from_str::<Request<'_>>(entry).is_ok() {
        return Taken::Call;
    }
    let object = entry.trim_start().starts_with('{');
    if serde_json::from_str::<Notif<'_>>(entry).is_ok() {
        return match (object, id_members(entry)) {
            (false, _) => Taken::Unanswered(INVALID_REQUEST),
            (true, 0) => Taken::Notification,
            (true, 1) => Taken::Unanswered(UNREADABLE_ID),
            (true, _) => Taken::Unanswered(DUPLICATE_ID),
        };
    }
    Taken::Invalid { object }
}

/// How many `id` members an object has, whatever they hold (0 where it is no object).
fn id_members(object: &str) -> usize {
    struct Ids;
    impl<'de> serde::de::Visitor<'de> for Ids {
        type Value = usize;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an object")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<usize, A::Error> {
            let mut ids = 0;
            while let Some(name) = map.next_key::<Cow<'de, str>>()? {
                map.next_value::<IgnoredAny>()?;
                ids += usize::from(name == "id");
            }
            Ok(ids)
        }
    }
    let mut reader = serde_json::Deserializer::from_str(object);
    serde::Deserializer::deserialize_map(&mut reader, Ids).unwrap_or(0)
}

/// Whether `request` is one Request object (JSON-RPC 2.0 §4: `jsonrpc` "2.0" and a `method`),
/// which jsonrpsee dispatches unless it cannot read its id (then it answers `null`).
fn is_request(request: &[u8]) -> bool {
    // Each member named, so that a member given twice (which jsonrpsee refuses) is no Request.
    #[derive(serde::Deserialize)]
    #[allow(dead_code)]
    struct Request {
        jsonrpc: String,
        method: String,
        id: Option<serde::de::IgnoredAny>,
        params: Option<serde::de::IgnoredAny>,
    }
    serde_json::from_slice::<Request>(request).is_ok_and(|r| r.jsonrpc == "2.0")
}

fn request_is_batch(request: &[u8]) -> bool {
    request.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[')
}
