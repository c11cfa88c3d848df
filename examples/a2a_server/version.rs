//! `A2A-Version`: which protocol versions this agent speaks. A2A: an empty or absent header is
//! 0.3; an unsupported one gets VersionNotSupportedError (-32009).

use http::HeaderMap;
use serde_json::json;

/// The values of `A2A-Version` this agent serves: each version as Major.Minor, and with its
/// patch number 0, which a client may name as its SDK's full version.
const SUPPORTED: [&str; 5] = ["", "0.3", "0.3.0", "1.0", "1.0.0"];

/// The requested version, when it is one this agent does not serve.
pub fn unsupported(headers: &HeaderMap) -> Option<String> {
    let requested = headers.get("a2a-version")?;
    let requested = String::from_utf8_lossy(requested.as_bytes())
        .trim()
        .to_owned();
    (!SUPPORTED.contains(&requested.as_str())).then_some(requested)
}

/// The JSON-RPC error for it. Answered before the body is read, so the call's id is unknown
/// and `null`, as JSON-RPC 2.0 allows for errors detected before the id.
pub fn not_supported_body(requested: &str) -> String {
    json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": {
            "code": -32009,
            "message": "Version not supported",
            "data": { "requested": requested, "supported": ["0.3", "1.0"] }
        }
    })
    .to_string()
}
