//! Which keys the SQLite store holds a row for, and where, kept in memory: a fresh messageId
//! costs no read, and a stored one is found by its rowid.
//!
//! One process serves a database file (`file_lock.rs`) and every row of the cache and of the
//! open streams is written by its writer thread, so the process can know every key its file
//! holds: loaded once at open, then updated by the writer after each commit. A key the index
//! has never seen has no row, and its claim executes without asking the disk. A key it has
//! seen still reads the store (the row may be expired, or another key may share its
//! fingerprint): the index may answer "maybe" for an absent key, never "no" for a present one.
//!
//! The cache's rows are found through the index, not through an index on disk: a messageId is
//! random, so an on-disk index of them takes one random page per new key, written to the log
//! and copied back at every commit (a third of a fresh call's cost, measured). The rowids the
//! index gives are candidates: a reader or the writer takes a row only if its `message_id` is
//! the key (an operator's purge may have deleted it since, and SQLite may reuse its rowid).
//!
//! Memory: an 8-byte fingerprint and its rowids (32 bytes in the table), about 45 bytes per
//! entry with the table's overhead; 4.5 MB at the default bound of 100,000 entries. The rows an
//! operator's purge deletes stay in it until the next sweep after the purge was seen, which
//! reloads it from the file ([`KeyIndex::reload`]).

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use crate::fingerprint::{ByFingerprint, Fingerprinted};

/// The fingerprints of every key with a row: the rowids of its entries, and its open streams.
pub(crate) struct KeyIndex {
    keys: Mutex<Keys>,
}

#[derive(Default)]
struct Keys {
    /// `idempotency_cache` rows by fingerprint (two keys may share one).
    entries: HashMap<u64, Rows, ByFingerprint>,
    /// `idempotency_open_streams` rows by fingerprint, counted.
    streams: HashMap<u64, u32, ByFingerprint>,
}

/// The rowids under one fingerprint: almost always one.
enum Rows {
    One(i64),
    Many(Vec<i64>),
}

impl Rows {
    fn as_slice(&self) -> &[i64] {
        match self {
            Rows::One(rowid) => std::slice::from_ref(rowid),
            Rows::Many(rowids) => rowids,
        }
    }
}

/// The keys of the rows a file holds, read in one transaction.
pub(crate) struct StoredKeys {
    /// The entries' rowids and keys.
    pub(crate) entries: Vec<(i64, String)>,
    /// The keys of the open streams.
    pub(crate) streams: Vec<String>,
}

impl KeyIndex {
    /// An index of the rows already in the file.
    pub(crate) fn new(stored: &StoredKeys) -> Self {
        let index = Self {
            keys: Mutex::new(Keys::default()),
        };
        index.reload(stored);
        index
    }

    /// Holds exactly `stored` from now on: after rows were deleted behind the writer's back
    /// (an operator's purge), which the index would otherwise keep until a restart.
    pub(crate) fn reload(&self, stored: &StoredKeys) {
        let fresh = Self {
            keys: Mutex::new(Keys::default()),
        };
        for (rowid, key) in &stored.entries {
            fresh.entry_added(key.as_str(), *rowid);
        }
        for key in &stored.streams {
            fresh.stream_added(key.as_str());
        }
        *self.keys() = fresh.keys.into_inner().expect("a new lock");
    }

    /// `false` only when no row holds `key`, neither an entry nor an open stream.
    pub(crate) fn may_hold(&self, key: &(impl Fingerprinted + ?Sized)) -> bool {
        self.holds(key.fingerprint())
    }

    /// [`may_hold`](Self::may_hold), for a fingerprint already taken.
    pub(crate) fn holds(&self, fingerprint: u64) -> bool {
        let keys = self.keys();
        keys.entries.contains_key(&fingerprint) || keys.streams.contains_key(&fingerprint)
    }

    /// The rowids that may hold `key`'s entry (none when it has none).
    pub(crate) fn entry_rows(&self, key: &(impl Fingerprinted + ?Sized)) -> Vec<i64> {
        self.rows_of(key.fingerprint())
    }

    /// The rowids under `fingerprint` (a key's).
    pub(crate) fn rows_of(&self, fingerprint: u64) -> Vec<i64> {
        let keys = self.keys();
        keys.entries
            .get(&fingerprint)
            .map_or_else(Vec::new, |rows| rows.as_slice().to_vec())
    }

    /// An entry of `key` was committed at `rowid`.
    pub(crate) fn entry_added(&self, key: &(impl Fingerprinted + ?Sized), rowid: i64) {
        let fingerprint = key.fingerprint();
        match self.keys().entries.entry(fingerprint) {
            // The common case, a fingerprint's first row, allocates nothing.
            Entry::Vacant(slot) => {
                slot.insert(Rows::One(rowid));
            }
            Entry::Occupied(mut slot) => {
                let rows = slot.get_mut();
                *rows = Rows::Many([rows.as_slice(), &[rowid]].concat());
            }
        }
    }

    /// The entry of `key` at `rowid` was deleted (or was found not to be there).
    pub(crate) fn entry_removed(&self, key: &(impl Fingerprinted + ?Sized), rowid: i64) {
        let fingerprint = key.fingerprint();
        let mut keys = self.keys();
        let Entry::Occupied(mut slot) = keys.entries.entry(fingerprint) else {
            return;
        };
        let left = match slot.get_mut() {
            Rows::One(one) if *one != rowid => return,
            Rows::One(_) => None,
            Rows::Many(rowids) => {
                rowids.retain(|r| *r != rowid);
                match rowids.as_slice() {
                    [] => None,
                    [one] => Some(Rows::One(*one)),
                    _ => return,
                }
            }
        };
        match left {
            Some(rows) => *slot.get_mut() = rows,
            None => {
                slot.remove();
            }
        }
    }

    /// An open-stream row of `key` was committed.
    pub(crate) fn stream_added(&self, key: &(impl Fingerprinted + ?Sized)) {
        let fingerprint = key.fingerprint();
        *self.keys().streams.entry(fingerprint).or_default() += 1;
    }

    /// An open-stream row of `key` was deleted.
    pub(crate) fn stream_removed(&self, key: &(impl Fingerprinted + ?Sized)) {
        let fingerprint = key.fingerprint();
        let mut keys = self.keys();
        if let Some(count) = keys.streams.get_mut(&fingerprint) {
            *count -= 1;
            if *count == 0 {
                keys.streams.remove(&fingerprint);
            }
        }
    }

    /// How many fingerprints it holds (for tests and the bound's documentation).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        let keys = self.keys();
        keys.entries.len() + keys.streams.len()
    }

    fn keys(&self) -> MutexGuard<'_, Keys> {
        self.keys.lock().expect("key index lock")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn knows_every_row_and_where_the_entries_are() {
        let index = KeyIndex::new(&stored(&[(1, "a"), (2, "b")], &["c"]));
        assert!(index.may_hold("a") && index.may_hold("b") && index.may_hold("c"));
        assert!(!index.may_hold("d"));
        assert_eq!(index.entry_rows("a"), vec![1]);
        assert_eq!(
            index.entry_rows("c"),
            Vec::<i64>::new(),
            "an open stream has no rowid"
        );
        // A stale rowid of a key and its new one are both candidates until one is removed.
        index.entry_added("a", 7);
        assert_eq!(index.entry_rows("a"), vec![1, 7]);
        index.entry_removed("a", 1);
        assert_eq!(index.entry_rows("a"), vec![7]);
        index.entry_removed("a", 7);
        index.entry_removed("b", 99);
        assert_eq!(
            index.entry_rows("b"),
            vec![2],
            "another rowid's removal leaves it"
        );
        index.stream_removed("c");
        assert!(!index.may_hold("a") && !index.may_hold("c"));
        assert_eq!(index.len(), 1, "b is left");
    }

    #[test]
    fn a_reload_holds_what_the_file_holds_and_nothing_else() {
        let index = KeyIndex::new(&stored(&[(1, "a"), (2, "b")], &["c"]));
        index.reload(&stored(&[(2, "b"), (3, "d")], &["e"]));
        assert!(!index.may_hold("a") && !index.may_hold("c"));
        assert!(index.may_hold("b") && index.may_hold("d") && index.may_hold("e"));
        assert_eq!(index.entry_rows("d"), vec![3]);
        assert_eq!(index.len(), 3);
    }

    fn stored(entries: &[(i64, &str)], streams: &[&str]) -> StoredKeys {
        StoredKeys {
            entries: entries.iter().map(|(r, k)| (*r, k.to_string())).collect(),
            streams: streams.iter().map(|k| k.to_string()).collect(),
        }
    }
}
