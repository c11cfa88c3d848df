//! The messageId parser on any text: never a panic; what it accepts is one canonical,
//! lowercase UUID that parses to itself again, whatever the case it was sent in.
#![no_main]

use idem::message_id::MessageId;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(id) = MessageId::parse_str(text) else {
        return;
    };
    let key = id.as_str();
    assert_eq!(key.len(), 36);
    assert_eq!(key, text.to_ascii_lowercase());
    assert_eq!(MessageId::parse_str(key).expect("a key parses again"), id);
    let upper = MessageId::parse_str(&key.to_ascii_uppercase()).expect("either case");
    assert_eq!(upper, id);
});
