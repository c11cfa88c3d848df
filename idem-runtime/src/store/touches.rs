//! Uses of stored entries, noted by reads for the LRU bound (`max_cache_entries`): a replay
//! writes nothing itself; its use is written later, with other writes, a bounded number at a
//! time.
//!
//! Taken whole, the uses of a stretch of replays of many keys were all written by the next
//! call's commit: after replays of 50,000 keys a fresh call on SQLite waited 0.7 s for them
//! (7.5 s after 300,000), and every call queued behind it as long (helper-122). A call's
//! write now takes at most [`PER_WRITE`] of them and leaves the rest to the next (PostgreSQL's
//! sweep, which no call waits for, takes them all, in chunks). Until a use is written the LRU
//! order does not know of it: under that much traffic at the bound, an entry may be evicted a
//! little before its turn.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// Most uses a call's write takes: on SQLite each moves its row's cell in the LRU index, about
/// 25 µs on a table of 100,000 rows, so a batch carries at most about 6 ms of them.
pub(crate) const PER_WRITE: usize = 256;

/// The uses noted and not yet written: the latest use of each key, in epoch milliseconds.
#[derive(Default)]
pub(crate) struct Touches {
    uses: Mutex<HashMap<String, u64>>,
    /// Set when [`note`](Self::note) has asked for a write, until the next [`take`](Self::take).
    write_asked: AtomicBool,
}

impl Touches {
    /// Notes a use of `key` at `at_ms`. True when a write's worth of uses waits and none was
    /// asked for since the last take: a store that writes only when calls do (SQLite's
    /// writer) then asks for one, so that a stretch of replays alone never piles them up.
    pub(crate) fn note(&self, key: &str, at_ms: u64) -> bool {
        let mut uses = self.uses.lock().expect("touches lock");
        match uses.get_mut(key) {
            Some(at) => *at = (*at).max(at_ms),
            None => {
                uses.insert(key.to_owned(), at_ms);
            }
        }
        uses.len() >= PER_WRITE && !self.write_asked.swap(true, Ordering::Relaxed)
    }

    /// How many uses wait.
    #[cfg(any(test, feature = "postgres"))]
    pub(crate) fn waiting(&self) -> usize {
        self.uses.lock().expect("touches lock").len()
    }

    /// At most `most` of the uses waiting, taken out.
    pub(crate) fn take(&self, most: usize) -> Vec<(String, u64)> {
        let mut uses = self.uses.lock().expect("touches lock");
        self.write_asked.store(false, Ordering::Relaxed);
        if uses.len() <= most {
            return uses.drain().collect();
        }
        let keys: Vec<String> = uses.keys().take(most).cloned().collect();
        keys.into_iter()
            .map(|key| {
                let at = uses.remove(&key).expect("a key just listed");
                (key, at)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_take_holds_at_most_a_writes_worth_and_leaves_the_rest() {
        let touches = Touches::default();
        for n in 0..PER_WRITE * 2 + 10 {
            touches.note(&format!("key-{n}"), n as u64);
        }
        assert_eq!(touches.take(PER_WRITE).len(), PER_WRITE);
        assert_eq!(touches.take(PER_WRITE).len(), PER_WRITE);
        assert_eq!(touches.waiting(), 10);
        assert_eq!(touches.take(PER_WRITE).len(), 10);
        assert!(touches.take(PER_WRITE).is_empty());
    }

    #[test]
    fn a_key_keeps_its_latest_use() {
        let touches = Touches::default();
        touches.note("k", 20);
        touches.note("k", 10);
        assert_eq!(touches.take(PER_WRITE), vec![("k".to_owned(), 20)]);
    }

    #[test]
    fn a_write_is_asked_for_once_per_writes_worth_until_one_is_taken() {
        let touches = Touches::default();
        let asked: Vec<bool> = (0..PER_WRITE * 2)
            .map(|n| touches.note(&format!("key-{n}"), 1))
            .collect();
        assert_eq!(asked.iter().filter(|&&a| a).count(), 1);
        assert!(asked[PER_WRITE - 1]);
        touches.take(PER_WRITE);
        // PER_WRITE still wait: the next use asks again.
        assert!(touches.note("another", 1));
    }
}
