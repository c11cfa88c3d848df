//! JSON-RPC 2.0 on the wire, in one place: a call's outcome as raw JSON, the response bytes
//! jsonrpsee would write for it, and the way back from stored bytes to the outcome.

use jsonrpsee::types::{ErrorObjectOwned, Id, Response, ResponsePayload};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

/// A JSON-RPC outcome in its wire form: the raw `result`, or the `error` object.
pub type Payload = Result<Box<RawValue>, ErrorObjectOwned>;

/// The content type of a single JSON-RPC response.
pub(crate) const JSON: &str = "application/json";

/// Bytes of a response's envelope around its `result` (`{"jsonrpc":"2.0","id":…,"result":}`),
/// with room for an id: what a body is given beyond its result up front.
const ENVELOPE_BYTES: usize = 128;

/// A JSON-RPC response as jsonrpsee writes it, in an allocation of its own size: these bytes
/// are what the store and its memory tier keep, and a `Vec` grown by doubling would hold up
/// to twice them (a 1,254-byte body took 2,048), memory the tier's budget did not see.
pub(crate) fn response_bytes(id: &Id<'_>, payload: &Payload) -> Vec<u8> {
    let mut body = Vec::with_capacity(payload_bytes(payload) + ENVELOPE_BYTES);
    let response = Response::new(response_payload(payload), id.clone());
    serde_json::to_writer(&mut body, &response).expect("JSON-RPC response serializes");
    match body.capacity() - body.len() > ENVELOPE_BYTES {
        // A shrinking realloc may keep the block: a copy is what frees it.
        true => body.as_slice().to_vec(),
        false => body,
    }
}

/// How many bytes `response_bytes(id, payload)` would be, written nowhere: what a call that
/// stores nothing measures against the size limit.
pub(crate) fn response_len(id: &Id<'_>, payload: &Payload) -> usize {
    struct Counted(usize);
    impl std::io::Write for Counted {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len();
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut counted = Counted(0);
    let response = Response::new(response_payload(payload), id.clone());
    serde_json::to_writer(&mut counted, &response).expect("JSON-RPC response serializes");
    counted.0
}

/// The `result` or `error` member of the response `payload` makes.
fn response_payload(payload: &Payload) -> ResponsePayload<'_, &RawValue> {
    match payload {
        Ok(raw) => ResponsePayload::success(raw.as_ref()),
        Err(error) => ResponsePayload::error(error.clone()),
    }
}

/// About how many bytes `payload` takes written: its result, or its error's message and data.
fn payload_bytes(payload: &Payload) -> usize {
    match payload {
        Ok(raw) => raw.get().len(),
        Err(error) => error.message().len() + error.data().map_or(0, |data| data.get().len()),
    }
}

/// The `result` or `error` of a JSON-RPC response, as raw as it was written.
pub(crate) fn decode(body: &[u8]) -> Option<Payload> {
    #[derive(Deserialize)]
    struct Stored {
        #[serde(default, deserialize_with = "present")]
        result: Option<Box<RawValue>>,
        error: Option<StoredError>,
    }
    #[derive(Deserialize)]
    struct StoredError {
        code: i32,
        message: String,
        #[serde(default, deserialize_with = "present")]
        data: Option<Box<RawValue>>,
    }
    let stored: Stored = serde_json::from_slice(body).ok()?;
    match (stored.result, stored.error) {
        (_, Some(e)) => Some(Err(ErrorObjectOwned::owned(e.code, e.message, e.data))),
        (Some(result), None) => Some(Ok(result)),
        (None, None) => None,
    }
}

/// Keeps a present `null` as `Some(null)`: absent and `null` are different bytes.
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Box<RawValue>>, D::Error> {
    Box::<RawValue>::deserialize(d).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn response_bytes_are_jsonrpsee_s_in_an_allocation_of_their_size() {
        let text = format!(r#"{{"kind":"task","note":"{}"}}"#, "x".repeat(1_200));
        let ids = [Id::Number(7), Id::Str("a \"quoted\" id".into()), Id::Null];
        for id in ids {
            let ok: Payload = Ok(RawValue::from_string(text.clone()).unwrap());
            let error: Payload = Err(ErrorObjectOwned::owned(-32603, "failed", Some(&text)));
            for payload in [ok, error] {
                let body = response_bytes(&id, &payload);
                let response = Response::new(response_payload(&payload), id.clone());
                assert_eq!(body, serde_json::to_vec(&response).unwrap());
                assert_eq!(response_len(&id, &payload), body.len(), "measured alike");
                assert!(body.capacity() <= body.len() + ENVELOPE_BYTES, "{id:?}");
                assert_eq!(decode(&body).map(|p| p.is_ok()), Some(payload.is_ok()));
            }
        }
    }
}
