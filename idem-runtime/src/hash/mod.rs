//! The request hash of spec §4.3/§5: `lowercase_hex(SHA-256(JCS(params \ {message.messageId})))`.
//!
//! The input is the raw `params` text as received, never a re-serialized struct, so unknown
//! fields, nested metadata and number spelling all count as the spec says. One pass over the
//! text (`canonical_pass.rs`) writes the canonical bytes and refuses what JCS cannot bind
//! honestly: duplicate member names (serde_json would silently keep the last), lone surrogates,
//! and numbers whose decimal value the IEEE-754 double would change (spec §7.3: two payloads
//! must never share a hash).
//!
//! ```
//! use idem_runtime::hash::request_hash;
//! // Member order, whitespace and the messageId do not count; everything else does.
//! let a = request_hash(br#"{"message":{"messageId":"m1","parts":[],"role":"user"}}"#).unwrap();
//! let b = request_hash(br#"{ "message": {"role":"user","parts":[],"messageId":"m2"} }"#).unwrap();
//! assert_eq!(a, b);
//! assert_eq!(a.as_str().len(), 64);
//! ```

pub(crate) mod canonical_pass;
/// How deep params may nest: deeper is refused as not canonicalizable.
pub use canonical_pass::MAX_DEPTH;
pub(crate) mod jcs;
mod number_exactness;
mod resend;
pub(crate) use resend::Sent;
pub use resend::{glimpse, Glimpse};

use serde_json::Value;
use sha2::{Digest, Sha256};
use std::fmt;

pub use crate::hash::canonical_pass::HashError;
use crate::hash::canonical_pass::{canonicalize, canonicalize_text, FoundId};

/// A request hash: 64 lowercase hex digits.
///
/// ```
/// use idem_runtime::hash::request_hash;
/// let a = request_hash(br#"{"message":{"messageId":"a","parts":[]},"x":1}"#).unwrap();
/// let b = request_hash(br#"{ "x" : 1, "message":{"parts":[],"messageId":"b"}}"#).unwrap();
/// assert_eq!(a, b); // key order, whitespace and the messageId itself do not count
/// assert_eq!(a.as_str().len(), 64);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RequestHash(String);

impl RequestHash {
    /// The lowercase hex digest.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Wraps a digest read back from storage; `None` unless it is 64 lowercase hex digits.
    pub fn from_hex(hex: &str) -> Option<Self> {
        let ok = hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        ok.then(|| RequestHash(hex.to_owned()))
    }
}

impl fmt::Display for RequestHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// SHA-256 of raw `params` bytes, exactly as received: equal spellings are equal params, so
/// they have one request hash, which a cache can answer without computing it.
pub type Spelling = [u8; 32];

/// The [`Spelling`] of raw `params` bytes.
///
/// ```
/// use idem_runtime::hash::spelling;
/// assert_eq!(spelling(br#"{"a":1}"#), spelling(br#"{"a":1}"#));
/// assert_ne!(spelling(br#"{"a":1}"#), spelling(br#"{ "a":1}"#)); // same hash, other spelling
/// ```
pub fn spelling(raw_params: &[u8]) -> Spelling {
    Sha256::digest(raw_params).into()
}

/// The [`Spelling`] of a whole HTTP request body: apart from any params' spelling, so that
/// params that happen to be a request's text are never taken for that request.
pub fn request_spelling(body: &[u8]) -> Spelling {
    Sha256::new()
        .chain_update(b"idempotency/v1 request body\n")
        .chain_update(body)
        .finalize()
        .into()
}

/// Hashes raw JSON-RPC `params` bytes per spec §4.3.
pub fn request_hash(raw_params: &[u8]) -> Result<RequestHash, HashError> {
    Ok(digest(&canonicalize(raw_params)?.bytes))
}

/// The request hash of raw `params`, and what their `message.messageId` holds: one pass.
pub(crate) fn hash_and_message_id(params: &str) -> Result<(RequestHash, FoundId), HashError> {
    let canonical = canonicalize_text(params)?;
    Ok((digest(&canonical.bytes), canonical.message_id))
}

/// Parses raw `params`, refusing what the hash cannot bind honestly (see [`HashError`]).
pub fn parse_params(raw_params: &[u8]) -> Result<Value, HashError> {
    let text = crate::hash::canonical_pass::check(raw_params)?;
    serde_json::from_str(text).map_err(|e| HashError::Syntax {
        offset: 0,
        detail: e.to_string(),
    })
}

/// Hashes params already parsed by [`parse_params`].
pub fn hash_params(params: Value) -> Result<RequestHash, HashError> {
    Ok(digest(&canonical_without_message_id(params)?))
}

fn digest(canonical: &[u8]) -> RequestHash {
    RequestHash(hex(&Sha256::digest(canonical)))
}

/// The bytes that are hashed: the RFC 8785 form of `params` without `params.message.messageId`.
pub fn canonical_params(raw_params: &[u8]) -> Result<Vec<u8>, HashError> {
    Ok(canonicalize(raw_params)?.bytes)
}

pub(crate) fn canonical_without_message_id(mut params: Value) -> Result<Vec<u8>, HashError> {
    if let Some(Value::Object(message)) = params.get_mut("message") {
        message.remove("messageId");
    }
    canonical_json(&params)
}

/// RFC 8785 canonical bytes of a JSON value (see `jcs.rs`; byte-identical to `serde_jcs`).
pub fn canonical_json(value: &Value) -> Result<Vec<u8>, HashError> {
    let mut out = Vec::with_capacity(256);
    crate::hash::jcs::write(value, &mut out).ok_or_else(|| HashError::Syntax {
        offset: 0,
        detail: "a number JCS cannot print".into(),
    })?;
    Ok(out)
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[(b >> 4) as usize] as char);
        out.push(DIGITS[(b & 0xf) as usize] as char);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn testdata(rel: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/jcs")
            .join(rel)
    }

    #[test]
    fn official_vectors_byte_for_byte() {
        for name in [
            "arrays",
            "french",
            "structures",
            "unicode",
            "values",
            "weird",
        ] {
            let input = std::fs::read(testdata(&format!("input/{name}.json"))).unwrap();
            let expected = std::fs::read(testdata(&format!("output/{name}.json"))).unwrap();
            // The vectors test the canonicalizer alone: values.json holds numbers such as
            // 333333333.33333329 that JCS rounds, which request_hash refuses on purpose.
            let value: Value = serde_json::from_slice(&input).unwrap();
            let got = canonical_json(&value).unwrap();
            assert_eq!(
                String::from_utf8(got).unwrap(),
                String::from_utf8(expected).unwrap(),
                "{name}"
            );
        }
    }

    #[test]
    fn es6_number_file_every_line() {
        let text = std::fs::read_to_string(testdata("es6testfile10k.txt")).unwrap();
        // The checksum published with the file (tests/data/jcs/README.md): our copy is whole.
        assert_eq!(
            hex(&Sha256::digest(text.as_bytes())),
            "b9f7a8e75ef22a835685a52ccba7f7d6bdc99e34b010992cbc5864cd12be6892"
        );
        let mut lines = 0;
        for line in text.lines() {
            let (bits, expected) = line.split_once(',').unwrap();
            let f = f64::from_bits(u64::from_str_radix(bits, 16).unwrap());
            let got = canonical_json(&Value::from(f)).unwrap();
            assert_eq!(std::str::from_utf8(&got).unwrap(), expected, "bits {bits}");
            // The canonical text is exact by construction, so the refusal check must accept it,
            // and canonicalizing it again must be a fixed point.
            let raw = format!("[{expected}]");
            assert_eq!(
                canonical_params(raw.as_bytes()).unwrap(),
                raw.as_bytes(),
                "bits {bits}"
            );
            lines += 1;
        }
        assert_eq!(lines, 10_000);
    }

    #[test]
    fn removes_message_id_only_at_params_message() {
        let base = request_hash(
            br#"{"message":{"messageId":"X","metadata":{"messageId":"keep"}},"metadata":{"messageId":"1"}}"#,
        )
        .unwrap();
        let other_top_id = request_hash(
            br#"{"message":{"messageId":"Y","metadata":{"messageId":"keep"}},"metadata":{"messageId":"1"}}"#,
        )
        .unwrap();
        assert_eq!(base, other_top_id, "params.message.messageId is excluded");
        let nested_changed = request_hash(
            br#"{"message":{"messageId":"X","metadata":{"messageId":"changed"}},"metadata":{"messageId":"1"}}"#,
        )
        .unwrap();
        assert_ne!(
            base, nested_changed,
            "a messageId inside message.metadata counts"
        );
        let top_changed = request_hash(
            br#"{"message":{"messageId":"X","metadata":{"messageId":"keep"}},"metadata":{"messageId":"2"}}"#,
        )
        .unwrap();
        assert_ne!(
            base, top_changed,
            "a messageId inside params.metadata counts"
        );
        let canonical =
            canonical_params(br#"{"messageId":"top","message":{"messageId":"X"}}"#).unwrap();
        assert_eq!(canonical, br#"{"message":{},"messageId":"top"}"#);
    }

    #[test]
    fn known_digest() {
        // sha256 of `{"message":{"parts":[]}}`, computed independently with `sha256sum`.
        let h = request_hash(br#"{"message":{"messageId":"m","parts":[]}}"#).unwrap();
        assert_eq!(
            h.as_str(),
            "8fc33f40f8a2438f6d1b27bbecb300a5dfd1ef3a22689a505c91da819fcaf0da"
        );
    }

    #[test]
    fn equal_numbers_spelled_differently_hash_equal() {
        let a = request_hash(br#"{"n":4.50,"m":1e2,"z":-0}"#).unwrap();
        let b = request_hash(br#"{"n":4.5,"m":100,"z":0}"#).unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn from_hex_accepts_only_digests() {
        let h = request_hash(b"{}").unwrap();
        assert_eq!(RequestHash::from_hex(h.as_str()), Some(h.clone()));
        assert_eq!(RequestHash::from_hex(&h.as_str().to_uppercase()), None);
        assert_eq!(RequestHash::from_hex("abc"), None);
    }
}
