//! The request hash of spec §4.3.1, computed independently of the server under test:
//! lowercase hex SHA-256 of the RFC 8785 (serde_jcs) form of `params` minus `message.messageId`.

use serde_json::Value;
use sha2::{Digest, Sha256};

/// The hash the server must report for this JSON-RPC request body (AC-2's 422 data).
pub fn request_hash(body: &str) -> Result<String, String> {
    let mut request: Value =
        serde_json::from_str(body).map_err(|e| format!("request body is not JSON: {e}"))?;
    let params = request
        .get_mut("params")
        .ok_or("the request has no params")?;
    if let Some(message) = params.get_mut("message").and_then(Value::as_object_mut) {
        message.remove("messageId");
    }
    let canonical = serde_jcs::to_vec(params).map_err(|e| format!("JCS: {e}"))?;
    Ok(Sha256::digest(&canonical)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_id_and_envelope_do_not_count_key_order_does_not_matter() {
        let a = r#"{"jsonrpc":"2.0","id":1,"method":"message/send","params":{"message":{"messageId":"a","parts":[]},"metadata":{"x":1,"y":2}}}"#;
        let b = r#"{"id":9,"params":{"metadata":{"y":2,"x":1},"message":{"parts":[],"messageId":"b"}}}"#;
        assert_eq!(request_hash(a).unwrap(), request_hash(b).unwrap());
        // `printf '%s' '{"message":{"parts":[]},"metadata":{"x":1,"y":2}}' | sha256sum`
        assert_eq!(
            request_hash(a).unwrap(),
            "eed695a51f617381496d3dcaf5071e244b862abf312c1406b7336e294ba69af6"
        );
    }
}
