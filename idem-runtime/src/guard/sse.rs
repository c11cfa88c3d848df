//! The wire format of `message/stream`: Server-Sent Events, one JSON-RPC response per
//! `data:` line, each event ended by a blank line.

use bytes::Bytes;
use futures::{Stream, StreamExt};
use http::{HeaderValue, Response};
use http_body_util::StreamBody;
use hyper::body::Frame;
use jsonrpsee::server::HttpBody;
use jsonrpsee::types::Id;

use crate::wire::{decode, response_bytes};

/// The content type of an SSE response.
pub const EVENT_STREAM: &str = "text/event-stream";

/// One event carrying one JSON-RPC response.
pub(crate) fn frame(json: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(json.len() + 8);
    out.extend_from_slice(b"data: ");
    // On one line: an event ends at a blank line, and a recording is split there. JSON holds
    // a line break only between tokens (a pretty-printed `RawValue` of the application's, in
    // an event or in an error's `data`), where it can go.
    match json.iter().any(|b| matches!(b, b'\n' | b'\r')) {
        false => out.extend_from_slice(json),
        true => out.extend(json.iter().filter(|b| !matches!(b, b'\n' | b'\r'))),
    }
    out.extend_from_slice(b"\n\n");
    out.into()
}

/// Splits a recorded body back into events, slices of `body`, not copies. Compact JSON holds
/// no raw newline, so the blank line that ends each event cannot occur inside one.
pub(crate) fn split(body: Bytes) -> Vec<Bytes> {
    let mut frames = Vec::new();
    let mut start = 0;
    while let Some(at) = body[start..].windows(2).position(|w| w == b"\n\n") {
        let end = start + at + 2;
        frames.push(body.slice(start..end));
        start = end;
    }
    frames
}

/// How every recorded event starts, up to its JSON-RPC id: jsonrpsee's serializer writes
/// each response so, and so does [`response_bytes`].
const UP_TO_THE_ID: &[u8] = br#"data: {"jsonrpc":"2.0","id":"#;

/// The same event under the JSON-RPC id `id` (as JSON): what a retry with a new id receives.
/// Under the recorded id, the event itself; under another, a new start up to the id, then the
/// rest of the recorded event, a slice of it. Each replay under a new id re-encoded every
/// event, and held its copy while its client read nothing: 100 such replays of a 7 MB event
/// held 773 MiB (helper-107).
pub(crate) fn reframe(event: Bytes, id: &[u8]) -> (Option<Bytes>, Bytes) {
    let Some(after_the_id) = end_of_the_id(&event) else {
        return (None, decoded_anew(&event, id));
    };
    if &event[UP_TO_THE_ID.len()..after_the_id] == id {
        return (None, event);
    }
    let start = [UP_TO_THE_ID, id].concat();
    (Some(start.into()), event.slice(after_the_id..))
}

/// Where the recorded id of `event` ends, if the event starts as recorded events do.
fn end_of_the_id(event: &[u8]) -> Option<usize> {
    let rest = event.strip_prefix(UP_TO_THE_ID)?;
    let mut values =
        serde_json::Deserializer::from_slice(rest).into_iter::<serde::de::IgnoredAny>();
    values.next()?.ok()?;
    Some(UP_TO_THE_ID.len() + values.byte_offset())
}

/// An event of another shape, decoded and written again under `id` (the event as it is, if
/// it cannot be decoded).
fn decoded_anew(event: &Bytes, id: &[u8]) -> Bytes {
    let json = event
        .strip_prefix(b"data: ")
        .and_then(|j| j.strip_suffix(b"\n\n"));
    let id = serde_json::from_slice::<Id<'_>>(id).ok();
    match (json.and_then(decode), id) {
        (Some(payload), Some(id)) => frame(&response_bytes(&id, &payload)),
        _ => event.clone(),
    }
}

/// A `200 text/event-stream` response that sends `events` as the client reads them.
pub(crate) fn response<S>(events: S) -> Response<HttpBody>
where
    S: Stream<Item = Bytes> + Send + 'static,
{
    let body =
        StreamBody::new(events.map(|bytes| Ok::<_, std::convert::Infallible>(Frame::data(bytes))));
    let mut response = Response::new(HttpBody::new(body));
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static(EVENT_STREAM),
    );
    headers.insert(
        http::header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_split_back_and_reframe_under_a_new_id() {
        let a = frame(br#"{"jsonrpc":"2.0","id":1,"result":{"n":1}}"#);
        let b = frame(br#"{"jsonrpc":"2.0","id":1,"error":{"code":-1,"message":"m"}}"#);
        let body = [a.clone(), b.clone()].concat();
        let body = Bytes::from(body);
        let frames = split(body.clone());
        assert_eq!(frames, vec![a.clone(), b.clone()]);
        // Slices of the recording, not copies: each replay of a stream shares it.
        assert_eq!(frames[0].as_ptr(), body.as_ptr());
        assert_eq!(frames[1].as_ptr(), body[a.len()..].as_ptr());
        // Under the recorded id, the event itself; under another, a new start and the rest
        // of the event, a slice of it (helper-107).
        let same = reframe(a.clone(), b"1");
        assert_eq!(same, (None, a.clone()));
        assert_eq!(same.1.as_ptr(), a.as_ptr(), "not a copy");
        let (start, rest) = reframe(a.clone(), br#""x""#);
        let start = start.expect("a new start");
        assert_eq!(
            [start, rest.clone()].concat(),
            frame(br#"{"jsonrpc":"2.0","id":"x","result":{"n":1}}"#)
        );
        assert_eq!(
            rest.as_ptr(),
            a[r#"data: {"jsonrpc":"2.0","id":1"#.len()..].as_ptr()
        );
        assert_eq!(reframe(b.clone(), b"1"), (None, b.clone()));
        let (_, rest) = reframe(b.clone(), b"null");
        assert!(rest.starts_with(br#","error""#), "{rest:?}");
        // An event of another shape is decoded and written again.
        let other = frame(br#"{"id":1,"jsonrpc":"2.0","result":2}"#);
        let (start, anew) = reframe(other, b"7");
        assert_eq!(start, None);
        assert_eq!(anew, frame(br#"{"jsonrpc":"2.0","id":7,"result":2}"#));
    }
}
