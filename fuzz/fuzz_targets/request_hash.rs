//! `request_hash` against the reference: wherever it accepts params, its hash is SHA-256 of
//! serde_jcs's canonical form of those params without `message.messageId` (spec §4.3), and
//! what it refuses is something the spec lets it refuse. Never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use sha2::{Digest, Sha256};

fuzz_target!(|data: &[u8]| {
    let ours = idem::hash::request_hash(data);
    let Ok(ours) = ours else {
        // Refused: I-JSON violations, inexact numbers, nesting past the limit, not JSON.
        return;
    };
    let mut params: Value =
        serde_json::from_slice(data).expect("params our hash accepts are JSON to serde_json");
    if let Some(message) = params.get_mut("message").and_then(Value::as_object_mut) {
        message.remove("messageId");
    }
    let canonical = serde_jcs::to_vec(&params).expect("serde_jcs writes any parsed value");
    let reference: String = Sha256::digest(&canonical)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(
        ours.as_str(),
        reference,
        "canonical form: {}",
        String::from_utf8_lossy(&canonical)
    );
});
