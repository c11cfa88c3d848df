//! A key's fingerprint: the 64-bit SipHash of its text under the process's own seed, taken
//! once, when the key is made ([`MessageId`] carries it).
//!
//! Each call looks its key up in several maps (the claims, the key index, the memory tier, the
//! writer's batch), and hashing the text anew at each took about twenty SipHash runs a call.
//! Those maps hash with [`ByFingerprint`], which takes the fingerprint as the hash: the seed
//! still keeps anyone outside from aiming keys at one bucket.

use std::hash::{BuildHasher, BuildHasherDefault, Hasher, RandomState};
use std::sync::LazyLock;

use crate::message_id::MessageId;

/// Seeded per process: nobody outside can aim keys at one fingerprint.
static SEED: LazyLock<RandomState> = LazyLock::new(RandomState::new);

/// The fingerprint of the key whose stored form is `key`.
pub(crate) fn of(key: &str) -> u64 {
    SEED.hash_one(key)
}

/// What a key is filed under: the fingerprint a [`MessageId`] carries, or one taken of a
/// key's stored text.
pub(crate) trait Fingerprinted {
    fn fingerprint(&self) -> u64;
}

impl Fingerprinted for MessageId {
    fn fingerprint(&self) -> u64 {
        MessageId::fingerprint(self)
    }
}

impl Fingerprinted for str {
    fn fingerprint(&self) -> u64 {
        of(self)
    }
}

/// The hasher of maps keyed by [`MessageId`]s or by fingerprints.
pub(crate) type ByFingerprint = BuildHasherDefault<Passthrough>;

/// Takes a fingerprint (a `u64` written once) as the hash.
#[derive(Default)]
pub(crate) struct Passthrough(u64);

impl Hasher for Passthrough {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write_u64(&mut self, fingerprint: u64) {
        self.0 = fingerprint;
    }

    /// Not a fingerprint: hashed under the seed, so that a key type this map was not meant
    /// for is still spread, and still out of an attacker's aim.
    fn write(&mut self, bytes: &[u8]) {
        self.0 = SEED.hash_one((self.0, bytes));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn a_key_hashes_to_its_fingerprint_whether_parsed_or_read_back() {
        let id = MessageId::parse_str("0190B5A4-7C3E-7D2A-9F11-2B3C4D5E6F70").unwrap();
        let stored = MessageId::from_stored(id.as_str().to_owned());
        assert_eq!(id.fingerprint(), of(id.as_str()));
        assert_eq!(stored.fingerprint(), id.fingerprint());
        assert_eq!(ByFingerprint::default().hash_one(&id), id.fingerprint());

        let mut map: HashMap<MessageId, u32, ByFingerprint> = HashMap::default();
        map.insert(id.clone(), 1);
        assert_eq!(map.get(&stored), Some(&1));
        let other = MessageId::parse_str("0190b5a4-7c3e-7d2a-9f11-2b3c4d5e6f71").unwrap();
        assert_ne!(other.fingerprint(), id.fingerprint());
        assert_eq!(map.get(&other), None);
    }

    #[test]
    fn bytes_that_are_not_a_fingerprint_are_still_hashed() {
        let hash = |text: &str| ByFingerprint::default().hash_one(text);
        assert_eq!(hash("a"), hash("a"));
        assert_ne!(hash("a"), hash("b"));
    }
}
