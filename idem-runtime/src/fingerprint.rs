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

/// Takes a fingerprint as the hash: the `u64` that is the first and only thing written. What
/// else is written is hashed under the seed with what came before, so that a key type these
/// maps were not meant for (a tuple, a string) is still spread and out of an attacker's aim.
/// A lone integer that is not a fingerprint would be taken as it is: none is ever a key.
#[derive(Default)]
pub(crate) struct Passthrough {
    hash: u64,
    written: bool,
}

impl Hasher for Passthrough {
    fn finish(&self) -> u64 {
        self.hash
    }

    fn write_u64(&mut self, value: u64) {
        self.hash = match self.written {
            false => value,
            true => SEED.hash_one((self.hash, value)),
        };
        self.written = true;
    }

    fn write(&mut self, bytes: &[u8]) {
        self.hash = SEED.hash_one((self.hash, self.written, bytes));
        self.written = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::hash::Hash;

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
    fn what_is_not_a_lone_fingerprint_is_still_hashed() {
        let hash = |key: &dyn Fn(&mut Passthrough)| {
            let mut hasher = ByFingerprint::default().build_hasher();
            key(&mut hasher);
            hasher.finish()
        };
        let text = |t: &'static str| move |h: &mut Passthrough| t.hash(h);
        assert_eq!(hash(&text("a")), hash(&text("a")));
        assert_ne!(hash(&text("a")), hash(&text("b")));
        // A u64 after something else is mixed with it, not taken alone.
        let pair = |a: &'static str, n: u64| move |h: &mut Passthrough| (a, n).hash(h);
        assert_ne!(hash(&pair("a", 7)), hash(&pair("b", 7)));
        let two = |a: u64, b: u64| move |h: &mut Passthrough| (a, b).hash(h);
        assert_ne!(hash(&two(1, 2)), hash(&two(9, 2)));
        assert_ne!(hash(&two(1, 2)), 2);
    }
}
