//! JSON-RPC 2.0 on the wire, in one place: a call's outcome as raw JSON, the response bytes
//! jsonrpsee would write for it, and the way back from stored bytes to the outcome.

use jsonrpsee::types::{ErrorObjectOwned, Id, Response, ResponsePayload};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

/// A JSON-RPC outcome in its wire form: the raw `result`, or the `error` object.
pub type Payload = Result<Box<RawValue>, ErrorObjectOwned>;

/// The content type of a single JSON-RPC response.
pub(crate) const JSON: &str = "application/json";

/// A JSON-RPC response as jsonrpsee writes it.
pub(crate) fn response_bytes(id: &Id<'_>, payload: &Payload) -> Vec<u8> {
    let payload = match payload {
        Ok(raw) => ResponsePayload::<&RawValue>::success(raw.as_ref()),
        Err(error) => ResponsePayload::<&RawValue>::error(error.clone()),
    };
    serde_json::to_vec(&Response::new(payload, id.clone())).expect("JSON-RPC response serializes")
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
