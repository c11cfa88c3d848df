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

/// The same event under another JSON-RPC id: what a retry with a new id receives. Under the
/// original id the bytes come out identical, since jsonrpsee's serializer writes both.
pub(crate) fn reframe(event: &Bytes, id: &Id<'_>) -> Bytes {
    let json = event
        .strip_prefix(b"data: ")
        .and_then(|j| j.strip_suffix(b"\n\n"));
    match json.and_then(decode) {
        Some(payload) => frame(&response_bytes(id, &payload)),
        None => event.clone(),
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
        assert_eq!(reframe(&a, &Id::Number(1)), a, "same id: same bytes");
        assert_eq!(
            reframe(&a, &Id::Str("x".into())),
            frame(br#"{"jsonrpc":"2.0","id":"x","result":{"n":1}}"#)
        );
        assert_eq!(reframe(&b, &Id::Number(1)), b);
    }
}
