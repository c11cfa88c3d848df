//! Which keys the SQLite store holds a row for, kept in memory: a fresh messageId costs no
//! read.
//!
//! One process serves a database file (`file_lock.rs`) and every row of the cache and of the
//! open streams is written by its writer thread, so the process can know every key its file
//! holds: loaded once at open, then updated by the writer after each commit. A key the index
//! has never seen has no row, and its claim executes without asking the disk. A key it has
//! seen still reads the store (the row may be expired, or another key may share its
//! fingerprint): the index may answer "maybe" for an absent key, never "no" for a present one.
//!
//! Memory: one 8-byte fingerprint and a 4-byte count per row, about 16 bytes with the
//! table's overhead; 1.6 MB at the default bound of 100,000 entries.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::Mutex;

/// The fingerprints of every key with a row, counted (two keys may share one).
pub(crate) struct KeyIndex {
    /// Seeded per process: nobody outside can aim keys at one fingerprint.
    seed: RandomState,
    counts: Mutex<HashMap<u64, u32>>,
}

impl KeyIndex {
    /// An index of `keys`, the keys of the rows already in the file.
    pub(crate) fn new<'a>(keys: impl IntoIterator<Item = &'a str>) -> Self {
        let index = Self {
            seed: RandomState::new(),
            counts: Mutex::new(HashMap::new()),
        };
        index.added(keys);
        index
    }

    /// `false` only when no row holds `key`.
    pub(crate) fn may_hold(&self, key: &str) -> bool {
        let fingerprint = self.fingerprint(key);
        self.counts().contains_key(&fingerprint)
    }

    /// What the index keeps of `key`.
    pub(crate) fn fingerprint(&self, key: &str) -> u64 {
        self.seed.hash_one(key)
    }

    /// Rows of these keys were committed.
    pub(crate) fn added<'a>(&self, keys: impl IntoIterator<Item = &'a str>) {
        let mut counts = self.counts();
        for key in keys {
            *counts.entry(self.fingerprint(key)).or_default() += 1;
        }
    }

    /// Rows of these keys were deleted, each once counted by [`added`](Self::added).
    pub(crate) fn removed<'a>(&self, keys: impl IntoIterator<Item = &'a str>) {
        let mut counts = self.counts();
        for key in keys {
            let fingerprint = self.fingerprint(key);
            if let Some(count) = counts.get_mut(&fingerprint) {
                *count -= 1;
                if *count == 0 {
                    counts.remove(&fingerprint);
                }
            }
        }
    }

    /// How many fingerprints it holds (for tests and the bound's documentation).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.counts().len()
    }

    fn counts(&self) -> std::sync::MutexGuard<'_, HashMap<u64, u32>> {
        self.counts.lock().expect("key index lock")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_rows_not_keys() {
        let index = KeyIndex::new(["a", "b"]);
        assert!(index.may_hold("a") && index.may_hold("b"));
        assert!(!index.may_hold("c"));
        // An entry and an open stream of one key are two rows.
        index.added(["a"]);
        index.removed(["a"]);
        assert!(index.may_hold("a"), "one row of a is left");
        index.removed(["a", "b"]);
        assert!(!index.may_hold("a") && !index.may_hold("b"));
        assert_eq!(index.len(), 0);
    }
}
