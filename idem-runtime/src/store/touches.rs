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

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// Most uses a call's write takes: on SQLite each moves its row's cell in the LRU index, about
/// 25 µs on a table of 100,000 rows, so a batch carries at most about 6 ms of them.
pub(crate) const PER_WRITE: usize = 256;

/// The uses noted and not yet written: the latest use of each key, in epoch milliseconds,
/// taken in the order the keys were first noted. Taken in the map's own order, a key whose
/// bucket came late waited for ever under a steady flow of other uses, its entry the bound's
/// next victim however often it was replayed (helper-125).
#[derive(Default)]
pub(crate) struct Touches {
    uses: Mutex<Waiting>,
    /// Set when [`note`](Self::note) has asked for a write, until the next [`take`](Self::take).
    write_asked: AtomicBool,
}

#[derive(Default)]
struct Waiting {
    latest: HashMap<String, u64>,
    /// The keys of `latest`, oldest first.
    order: VecDeque<String>,
}

impl Touches {
    /// Notes a use of `key` at `at_ms`. True when a write's worth of uses waits and none was
    /// asked for since the last take: a store that writes only when calls do (SQLite's
    /// writer) then asks for one, so that a stretch of replays alone never piles them up
    /// (the writer goes on while a write's worth waits).
    pub(crate) fn note(&self, key: &str, at_ms: u64) -> bool {
        let mut uses = self.uses.lock().expect("touches lock");
        match uses.latest.get_mut(key) {
            Some(at) => *at = (*at).max(at_ms),
            None => {
                uses.latest.insert(key.to_owned(), at_ms);
                uses.order.push_back(key.to_owned());
            }
        }
        uses.latest.len() >= PER_WRITE && !self.write_asked.swap(true, Ordering::Relaxed)
    }

    /// How many uses wait.
    pub(crate) fn waiting(&self) -> usize {
        self.uses.lock().expect("touches lock").latest.len()
    }

    /// At most `most` of the uses waiting, the longest waiting first, taken out.
    pub(crate) fn take(&self, most: usize) -> Vec<(String, u64)> {
        let mut uses = self.uses.lock().expect("touches lock");
        self.write_asked.store(false, Ordering::Relaxed);
        let Waiting { latest, order } = &mut *uses;
        let taken = order.len().min(most);
        order
            .drain(..taken)
            .map(|key| {
                let at = latest.remove(&key).expect("every key in the order waits");
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

    /// Keys noted before every take, among more new keys than a take holds, are taken once
    /// the uses ahead of them are: each keeps its place from its first use. Taken in the
    /// map's order, 8 of 64 such keys were never taken in 2,000 writes (helper-125).
    #[test]
    fn the_longest_waiting_uses_are_taken_first() {
        let touches = Touches::default();
        let hot: Vec<String> = (0..64).map(|n| format!("hot-{n}")).collect();
        let mut others = 0..;
        let mut waited = vec![0; hot.len()];
        for round in 0..2_000 {
            for key in &hot {
                touches.note(key, round);
            }
            let ahead = touches.waiting();
            for n in others.by_ref().take(200) {
                touches.note(&format!("other-{n}"), round);
            }
            let taken = touches.take(PER_WRITE);
            for (key, waited) in hot.iter().zip(&mut waited) {
                match taken.iter().any(|(k, _)| k == key) {
                    true => *waited = 0,
                    false => *waited += 1,
                }
                let most = ahead.div_ceil(PER_WRITE);
                assert!(
                    *waited <= most,
                    "{key} waited {waited} takes, {ahead} uses ahead"
                );
            }
        }
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
