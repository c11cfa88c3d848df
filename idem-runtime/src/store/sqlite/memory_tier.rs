//! The memory tier: stored entries kept in memory, so that a replay needs neither a disk read
//! nor another thread.
//!
//! It never answers what the store would not. It is filled after a commit (by the writer) and
//! after a read; what the store deletes (TTL sweep, the `max_cache_entries` bound) leaves it in
//! the same step, right after the delete commits; an entry past its TTL is never answered from
//! it (the store's own TTL rule is applied to it); an operator's purge, made by another
//! process, empties it (`purge_watch.rs`). A restart starts it empty and loses nothing: the
//! store stays the source of truth.
//!
//! Bounded by bytes ([`crate::IdempotencyConfig::memory_tier_bytes`]): when full, the entries
//! not used since the clock hand last passed leave first (CLOCK, an LRU approximation that
//! costs no reordering on a hit).
//!
//! It also remembers the raw params each resident was asked with (their SHA-256, a
//! [`Spelling`]): a retry that resends the very same bytes is the same key with the same
//! request hash, so it is recognised without parsing or canonicalizing anything. Each
//! spelling is filed under a [`Glimpse`] of its bytes too, so that bytes no spelling has are
//! not spelled at all (`hash/resend.rs`).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use crate::fingerprint::ByFingerprint;
use crate::hash::{Glimpse, Spelling};
use crate::message_id::MessageId;
use crate::store::Entry;

/// The spellings one resident keeps at most: retries resend one spelling, rarely more.
const SPELLINGS_PER_ENTRY: usize = 4;

/// Slots of deletion counters (see [`MemoryTier::fill`]).
const DELETION_SLOTS: usize = 256;

pub(crate) struct MemoryTier {
    budget: usize,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    residents: HashMap<MessageId, Resident, ByFingerprint>,
    spellings: HashMap<Spelling, MessageId>,
    /// The glimpses of the spellings' bytes, counted (two spellings may share one).
    glimpses: HashMap<Glimpse, u32>,
    /// Keys in the order the clock hand visits them.
    hand: VecDeque<MessageId>,
    bytes: usize,
    /// Deletions so far, per slot of keys, and the entries committed over a row (an expired
    /// one's): either makes a read of that row stale.
    deletions: Vec<u64>,
    /// Operators' purges seen so far (see [`MemoryTier::purges_seen`]).
    purges_seen: u64,
}

struct Resident {
    entry: Arc<Entry>,
    spellings: Vec<(Glimpse, Spelling)>,
    used: bool,
    bytes: usize,
}

impl MemoryTier {
    /// A tier of at most `budget` bytes (0 turns it off).
    pub(crate) fn new(budget: usize) -> Self {
        let state = State {
            deletions: vec![0; DELETION_SLOTS],
            ..State::default()
        };
        Self {
            budget,
            state: Mutex::new(state),
        }
    }

    /// Whether the tier keeps anything (a budget of 0 turns it off).
    pub(crate) fn keeps_anything(&self) -> bool {
        self.budget > 0
    }

    /// The resident entry of `key`, if any and `live` says it is live.
    pub(crate) fn get(&self, key: &MessageId, live: impl Fn(&Entry) -> bool) -> Option<Arc<Entry>> {
        self.state().get(key, live)
    }

    /// The resident entry last asked with exactly these raw bytes, if it is `live`: bytes of
    /// this `glimpse` are spelled (outside the lock), other bytes are not.
    pub(crate) fn get_spelled(
        &self,
        glimpse: Glimpse,
        spelling: impl FnOnce() -> Spelling,
        live: impl Fn(&Entry) -> bool,
    ) -> Option<Arc<Entry>> {
        if !self.state().glimpses.contains_key(&glimpse) {
            return None;
        }
        let spelling = spelling();
        let mut state = self.state();
        let key = state.spellings.get(&spelling)?.clone();
        state.get(&key, live)
    }

    /// Remembers that these spellings ask for `answered` (whose request hash they have),
    /// while it is the resident entry of its key; one lock for all of them.
    pub(crate) fn add_spellings(&self, answered: &Entry, spellings: &[(Glimpse, Spelling)]) {
        let key = &answered.message_id;
        let mut state = self.state();
        let State {
            residents,
            spellings: by_spelling,
            glimpses,
            bytes,
            ..
        } = &mut *state;
        let Some(resident) = residents.get_mut(key) else {
            return;
        };
        // An entry that replaced it since (the key swept or evicted, then stored again) may
        // answer other bytes: the spellings are of the entry that answered them, or nothing.
        if !std::ptr::eq(Arc::as_ptr(&resident.entry), answered) {
            return;
        }
        for &(glimpse, spelling) in spellings {
            if resident.spellings.len() >= SPELLINGS_PER_ENTRY
                || resident.spellings.iter().any(|(_, s)| *s == spelling)
            {
                continue;
            }
            // Room for this one alone: a `Vec` of digests left to grow takes four at once.
            resident.spellings.reserve_exact(1);
            resident.spellings.push((glimpse, spelling));
            resident.bytes += SPELLING_BYTES;
            *bytes += SPELLING_BYTES;
            by_spelling.insert(spelling, key.clone());
            *glimpses.entry(glimpse).or_default() += 1;
        }
        self.shrink(&mut state);
    }

    /// An entry was committed (a new one, or one replacing an expired row), in a transaction
    /// during which `purges_seen` was [`purges_seen`](Self::purges_seen): kept unless an
    /// operator's purge was seen since (it may have deleted the row right after the commit).
    pub(crate) fn insert(&self, entry: Arc<Entry>, purges_seen: u64) {
        if self.budget == 0 {
            return;
        }
        let mut state = self.state();
        // A read of the row this one replaced, still running, would fill the tier with it
        // (live again to a clock stepped back) were this one not resident: past the budget,
        // or evicted since.
        state.deletions[slot(&entry.message_id)] += 1;
        state.remove(&entry.message_id);
        if state.purges_seen == purges_seen {
            self.admit(&mut state, entry);
        }
    }

    /// How many operators' purges the tier has forgotten everything for: the writer takes it
    /// before its commit, when no purge can commit, and hands it to [`insert`](Self::insert).
    pub(crate) fn purges_seen(&self) -> u64 {
        self.state().purges_seen
    }

    /// The deletion count of `key`'s slot: taken before a read, handed to [`fill`](Self::fill).
    pub(crate) fn deletions(&self, key: &MessageId) -> u64 {
        self.state().deletions[slot(key)]
    }

    /// Keeps an entry just read from the store, unless a row of its slot was deleted since
    /// `deletions` was taken (the read may have seen the row before its delete committed)
    /// or a newer entry of the key is resident already.
    pub(crate) fn fill(&self, entry: Arc<Entry>, deletions: u64) {
        if self.budget == 0 {
            return;
        }
        let mut state = self.state();
        if state.deletions[slot(&entry.message_id)] != deletions
            || state.residents.contains_key(&entry.message_id)
        {
            return;
        }
        self.admit(&mut state, entry);
    }

    /// The store committed the deletion of these keys' rows.
    pub(crate) fn deleted<'a>(&self, keys: impl IntoIterator<Item = &'a MessageId>) {
        let mut state = self.state();
        for key in keys {
            state.deletions[slot(key)] += 1;
            state.remove(key);
        }
    }

    /// Another process deleted rows (an operator's purge): forgets every entry, and refuses
    /// the fills of reads that ran before (they may have seen a purged row).
    pub(crate) fn forget_all(&self) {
        let mut state = self.state();
        state.deletions.iter_mut().for_each(|count| *count += 1);
        state.purges_seen += 1;
        state.residents.clear();
        state.spellings.clear();
        state.glimpses.clear();
        state.hand.clear();
        state.bytes = 0;
    }

    /// Bytes held (for tests and the documentation of the bound).
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> usize {
        self.state().bytes
    }

    /// Keeps `entry` if it fits the budget at all: one larger would first push out every
    /// entry not used lately, then itself.
    fn admit(&self, state: &mut State, entry: Arc<Entry>) {
        if entry_bytes(&entry) > self.budget {
            return;
        }
        state.admit(entry);
        self.shrink(state);
    }

    /// Evicts until the tier fits its budget.
    fn shrink(&self, state: &mut State) {
        while state.bytes > self.budget {
            let Some(key) = state.hand.pop_front() else {
                return;
            };
            let Some(resident) = state.residents.get_mut(&key) else {
                continue; // removed already; the hand drops its stale place
            };
            if std::mem::take(&mut resident.used) {
                state.hand.push_back(key); // a second chance
            } else {
                state.remove(&key);
            }
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("memory tier lock")
    }
}

impl State {
    fn get(&mut self, key: &MessageId, live: impl Fn(&Entry) -> bool) -> Option<Arc<Entry>> {
        let resident = self.residents.get_mut(key)?;
        if !live(&resident.entry) {
            self.remove(key);
            return None;
        }
        resident.used = true;
        Some(resident.entry.clone())
    }

    fn admit(&mut self, entry: Arc<Entry>) {
        let bytes = entry_bytes(&entry);
        let key = entry.message_id.clone();
        self.bytes += bytes;
        self.hand.push_back(key.clone());
        let resident = Resident {
            entry,
            spellings: Vec::new(),
            used: false,
            bytes,
        };
        self.residents.insert(key, resident);
    }

    fn remove(&mut self, key: &MessageId) {
        if let Some(resident) = self.residents.remove(key) {
            self.bytes -= resident.bytes;
            for (glimpse, spelling) in &resident.spellings {
                self.spellings.remove(spelling);
                if let std::collections::hash_map::Entry::Occupied(mut count) =
                    self.glimpses.entry(*glimpse)
                {
                    *count.get_mut() -= 1;
                    if *count.get() == 0 {
                        count.remove();
                    }
                }
            }
        }
        // Its place in the hand goes when the hand reaches it; a key that comes back before
        // then has two places, which only gives it one more second chance.
        if self.hand.len() > 2 * self.residents.len() + 64 {
            let residents = &self.residents;
            self.hand.retain(|key| residents.contains_key(key));
        }
    }
}

/// What one spelling costs: its digest and glimpse in the resident, and in the two maps (the
/// spelling map's slot holds a 24-byte `MessageId`).
const SPELLING_BYTES: usize = 2 * (32 + 8) + 56 + 32;

/// What a resident costs: the entry's bytes, plus the maps' and the hand's share.
fn entry_bytes(entry: &Entry) -> usize {
    let headers: usize = entry
        .response
        .headers
        .iter()
        .map(|(name, value)| name.len() + value.len() + 48)
        .sum();
    // The key is one shared allocation (the entry, the map, the hand and the spellings each
    // hold a pointer to it): its bytes and the Arc's counts once.
    let key = entry.message_id.as_str().len() + 16;
    // What is allocated, not what is used: a body with spare capacity costs all of it.
    let owned = entry.method.capacity() + entry.response.body.capacity();
    // Entry and Resident structs, the request hash, the map slot and the hand's pointer, with
    // the three `MessageId`s among them (the entry's, the map's key, the hand's: 24 bytes each).
    key + owned + 64 + headers + 280
}

fn slot(key: &MessageId) -> usize {
    key.slot(DELETION_SLOTS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::request_hash;
    use crate::store::StoredResponse;

    /// Spelling `n`, whose bytes' glimpse is `n` too.
    fn spelled(n: u8) -> (Glimpse, Spelling) {
        (Glimpse::from(n), [n; 32])
    }

    fn entry(n: u32, body_bytes: usize) -> Arc<Entry> {
        Arc::new(Entry {
            message_id: MessageId::parse_str(&format!("9b2e7c1a-3f4d-4e5a-8b6c-{n:012x}")).unwrap(),
            method: "message/send".into(),
            request_hash: request_hash(b"{}").unwrap(),
            response: StoredResponse {
                status: 200,
                headers: vec![],
                body: vec![b'x'; body_bytes],
            },
            inserted_at: 0,
        })
    }

    #[test]
    fn stays_within_its_byte_budget_and_keeps_what_is_used() {
        let tier = MemoryTier::new(10_000);
        let first = entry(0, 1_000);
        tier.insert(first.clone(), tier.purges_seen());
        for n in 1..100 {
            // The first entry is used between inserts: the clock hand spares it.
            assert!(tier.get(&first.message_id, |_| true).is_some(), "at {n}");
            tier.insert(entry(n, 1_000), tier.purges_seen());
            assert!(tier.bytes() <= 10_000, "{} bytes", tier.bytes());
        }
        assert!(
            tier.get(&entry(1, 0).message_id, |_| true).is_none(),
            "unused: evicted"
        );
        assert!(
            tier.get(&entry(99, 0).message_id, |_| true).is_some(),
            "newest: kept"
        );
    }

    #[test]
    fn a_body_is_charged_what_it_holds_allocated_not_only_what_it_uses() {
        let tier = MemoryTier::new(1 << 20);
        let exact = entry(1, 1_000);
        tier.insert(exact.clone(), tier.purges_seen());
        let charged = tier.bytes();
        tier.deleted([&exact.message_id]);
        let mut spare = Arc::unwrap_or_clone(entry(1, 1_000));
        spare.response.body.reserve_exact(1_000);
        let spare_bytes = spare.response.body.capacity() - spare.response.body.len();
        tier.insert(Arc::new(spare), tier.purges_seen());
        assert_eq!(tier.bytes(), charged + spare_bytes);
    }

    #[test]
    fn an_entry_larger_than_the_budget_is_not_kept() {
        let tier = MemoryTier::new(500);
        tier.insert(entry(1, 1_000), tier.purges_seen());
        assert!(tier.get(&entry(1, 0).message_id, |_| true).is_none());
        assert_eq!(tier.bytes(), 0);
    }

    #[test]
    fn an_entry_larger_than_the_budget_pushes_nothing_out() {
        let tier = MemoryTier::new(4_000);
        let small = entry(1, 100);
        tier.insert(small.clone(), tier.purges_seen());
        tier.insert(entry(2, 5_000), tier.purges_seen());
        assert!(tier.get(&small.message_id, |_| true).is_some());
        assert!(tier.get(&entry(2, 0).message_id, |_| true).is_none());
        let read = entry(3, 5_000);
        tier.fill(read.clone(), tier.deletions(&read.message_id));
        assert!(tier.get(&small.message_id, |_| true).is_some());
        assert_eq!(tier.bytes(), entry_bytes(&small));
    }

    #[test]
    fn a_commit_that_a_purge_may_have_followed_is_not_kept() {
        let tier = MemoryTier::new(1 << 20);
        let e = entry(1, 10);
        let at_commit = tier.purges_seen(); // the writer, before its commit
        tier.forget_all(); // a purge committed right after it, and was seen
        tier.insert(e.clone(), at_commit);
        assert!(tier.get(&e.message_id, |_| true).is_none());
        tier.insert(e.clone(), tier.purges_seen());
        assert!(tier.get(&e.message_id, |_| true).is_some());
    }

    #[test]
    fn a_read_that_raced_a_delete_is_not_kept() {
        let tier = MemoryTier::new(1 << 20);
        let e = entry(1, 10);
        let before = tier.deletions(&e.message_id);
        tier.deleted([&e.message_id]); // committed while the read ran
        tier.fill(e.clone(), before);
        assert!(tier.get(&e.message_id, |_| true).is_none());
        tier.fill(e.clone(), tier.deletions(&e.message_id));
        assert!(tier.get(&e.message_id, |_| true).is_some());
    }

    #[test]
    fn a_read_that_raced_a_replacement_is_not_kept() {
        let tier = MemoryTier::new(1 << 20);
        let (old, new) = (entry(1, 10), entry(1, 2 << 20)); // `new`: past the budget
        let before = tier.deletions(&old.message_id);
        tier.insert(new, tier.purges_seen()); // committed while the read ran
        tier.fill(old.clone(), before);
        assert!(tier.get(&old.message_id, |_| true).is_none());
    }

    #[test]
    fn spellings_are_charged_once_each_and_kept_up_to_the_bound() {
        let tier = MemoryTier::new(1 << 20);
        let e = entry(1, 10);
        tier.insert(e.clone(), tier.purges_seen());
        let alone = tier.bytes();
        // What the resident holds allocated for its spellings, in digests.
        let room = || tier.state().residents[&e.message_id].spellings.capacity();
        tier.add_spellings(&e, &[spelled(1), spelled(1)]);
        assert_eq!(
            tier.bytes(),
            alone + SPELLING_BYTES,
            "a repeated spelling once"
        );
        assert_eq!(room(), 1, "and allocated once");
        // One glimpse for all of them: the spelling map decides.
        let more: Vec<_> = (2..=6).map(|n| (2, [n; 32])).collect();
        tier.add_spellings(&e, &more);
        let kept = SPELLINGS_PER_ENTRY;
        assert_eq!(tier.bytes(), alone + kept * SPELLING_BYTES);
        assert_eq!(room(), kept, "none allocated past the bound");
        assert!(tier.get_spelled(2, || [4; 32], |_| true).is_some());
        assert!(
            tier.get_spelled(2, || [5; 32], |_| true).is_none(),
            "past the bound"
        );
        tier.deleted([&e.message_id]);
        assert_eq!(tier.bytes(), 0, "the entry and its spellings are gone");
        assert!(tier.state().glimpses.is_empty(), "and their glimpses");
        assert!(tier.get_spelled(1, || [1; 32], |_| true).is_none());
    }

    /// Between an answer and the noting of its spellings the key may be swept and stored
    /// again with other params: those spellings must not reach the new entry.
    #[test]
    fn spellings_attach_only_to_the_entry_that_answered_them() {
        let tier = MemoryTier::new(1 << 20);
        let answered = entry(1, 10);
        tier.insert(answered.clone(), tier.purges_seen());
        let replacement = entry(1, 20);
        tier.insert(replacement.clone(), tier.purges_seen());
        tier.add_spellings(&answered, &[spelled(8)]);
        assert!(tier.get_spelled(8, || [8; 32], |_| true).is_none());
        tier.add_spellings(&replacement, &[spelled(8)]);
        let found = tier.get_spelled(8, || [8; 32], |_| true).unwrap();
        assert!(Arc::ptr_eq(&found, &replacement));
    }

    #[test]
    fn forgetting_all_empties_the_tier_and_refuses_fills_of_earlier_reads() {
        let tier = MemoryTier::new(1 << 20);
        let e = entry(1, 10);
        tier.insert(e.clone(), tier.purges_seen());
        tier.add_spellings(&e, &[spelled(3)]);
        let read = entry(2, 10);
        let before = tier.deletions(&read.message_id);
        tier.forget_all();
        assert!(tier.get(&e.message_id, |_| true).is_none());
        let never = || -> Spelling { panic!("a glimpse left behind") };
        assert!(tier.get_spelled(3, never, |_| true).is_none());
        assert_eq!(tier.bytes(), 0);
        tier.fill(read.clone(), before); // read before the purge was seen
        assert!(tier.get(&read.message_id, |_| true).is_none());
    }

    /// Bytes whose glimpse no remembered spelling has are not spelled: a first execution
    /// costs no SHA-256 here. Nor once the spellings of that glimpse are gone.
    #[test]
    fn bytes_of_a_glimpse_no_spelling_has_are_not_spelled() {
        let tier = MemoryTier::new(1 << 20);
        let never = || -> Spelling { panic!("spelled bytes of an unknown glimpse") };
        assert!(tier.get_spelled(9, never, |_| true).is_none());
        let e = entry(1, 10);
        tier.insert(e.clone(), tier.purges_seen());
        tier.add_spellings(&e, &[spelled(9), (9, [10; 32])]); // two spellings, one glimpse
        assert!(tier.get_spelled(9, || [10; 32], |_| true).is_some());
        assert!(
            tier.get_spelled(9, || [11; 32], |_| true).is_none(),
            "the spelling decides"
        );
        tier.deleted([&e.message_id]);
        assert!(tier.get_spelled(9, never, |_| true).is_none());
    }

    #[test]
    fn spellings_leave_with_their_entry() {
        let tier = MemoryTier::new(1 << 20);
        let e = entry(1, 10);
        tier.insert(e.clone(), tier.purges_seen());
        tier.add_spellings(&e, &[spelled(7)]);
        assert!(tier.get_spelled(7, || [7; 32], |_| true).is_some());
        assert!(
            tier.get_spelled(7, || [7; 32], |_| false).is_none(),
            "not live: not answered"
        );
        assert!(tier.get(&e.message_id, |_| true).is_none(), "and gone");
        tier.insert(e.clone(), tier.purges_seen());
        tier.add_spellings(&e, &[spelled(7)]);
        tier.deleted([&e.message_id]);
        assert!(tier.get_spelled(7, || [7; 32], |_| true).is_none());
    }
}
