//! `A2A-Version`: which protocol versions this agent speaks. A2A: an empty or absent header is
//! 0.3; an unsupported one gets VersionNotSupportedError (-32009). A client may name the
//! version as a request parameter instead of the header (A2A 1.0 §3.6.1).

use http::{HeaderMap, Uri};
use serde_json::{json, Value};

/// The versions this agent serves, as Major.Minor (empty: 0.3).
const SUPPORTED: [&str; 3] = ["", "0.3", "1.0"];

/// The requested version, when it is one this agent does not serve: the header's, or else
/// the request parameter's (it was not read, and a send asking for 2.0 that way ran: found
/// by helper-87). A2A §3.6: a patch number does not affect compatibility and is not
/// considered, so `1.0.1` is 1.0 (it was refused: helper-77).
pub fn unsupported(headers: &HeaderMap, uri: &Uri) -> Option<String> {
    let requested = match headers.get("a2a-version") {
        Some(header) => String::from_utf8_lossy(header.as_bytes()).trim().to_owned(),
        None => request_parameter(uri)?,
    };
    (!SUPPORTED.contains(&major_minor(&requested))).then_some(requested)
}

/// The `A2A-Version` parameter of the request's query, if named.
fn request_parameter(uri: &Uri) -> Option<String> {
    uri.query()?.split('&').find_map(|pair| {
        let (name, value) = pair.split_once('=')?;
        name.eq_ignore_ascii_case("a2a-version")
            .then(|| value.trim().to_owned())
    })
}

/// `X.Y` of `X.Y.Z`, where `Z` is a number; anything else as it is.
fn major_minor(version: &str) -> &str {
    match version.rsplit_once('.') {
        Some((major_minor, patch))
            if major_minor.contains('.')
                && !patch.is_empty()
                && patch.bytes().all(|b| b.is_ascii_digit()) =>
        {
            major_minor
        }
        _ => version,
    }
}

/// The JSON-RPC answer to `body`, sent with `requested`: VersionNotSupportedError for each
/// call, under its id (JSON-RPC 2.0 §5: `null` only where the id cannot be read), as one
/// error or, for a batch, an array of them; none for notifications (§4.1), so `None` for a
/// body of notifications only. Nothing of the body is run.
pub fn not_supported(requested: &str, body: &[u8]) -> Option<String> {
    let error = |id: &Value| {
        let id = match id {
            Value::String(_) | Value::Number(_) => id.clone(),
            _ => Value::Null,
        };
        json!({
            "jsonrpc": "2.0",
            "id": id,
            "error": {
                "code": -32009,
                "message": "Version not supported",
                "data": { "requested": requested, "supported": ["0.3", "1.0"] }
            }
        })
    };
    // A notification is a Request without `id`: it names its method. Anything else, `{}`
    // included (not a Request: -32600 would answer it), is answered.
    let notification =
        |call: &Value| call.get("method").is_some_and(Value::is_string) && call.get("id").is_none();
    let answer = match serde_json::from_slice::<Value>(body) {
        Ok(Value::Array(calls)) if !calls.is_empty() => {
            let errors: Vec<_> = calls
                .iter()
                .filter(|call| !notification(call))
                .map(|call| error(&call["id"]))
                .collect();
            (!errors.is_empty()).then_some(Value::Array(errors))
        }
        Ok(call) if notification(&call) => None,
        Ok(call) => Some(error(&call["id"])),
        Err(_) => Some(error(&Value::Null)),
    };
    answer.map(|answer| answer.to_string())
}
