//! A batch: what every write of one group-committed transaction shares, and the changes to
//! the store's rows it made, which the memory tier and the key index learn once it commits.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use rusqlite::Connection;

use crate::fingerprint::{self, ByFingerprint};
use crate::message_id::MessageId;
use crate::store::sqlite::commit_gate::CommitGate;
use crate::store::sqlite::key_index::{KeyIndex, StoredKeys};
use crate::store::Entry;

/// What every write of one batch shares.
pub(crate) struct Batch {
    /// The batch's clock reading, in epoch milliseconds.
    pub(crate) now_ms: u64,
    /// Rows in `idempotency_cache`, as the writes so far left it.
    pub(crate) rows: u64,
    /// What the writes so far changed, in order: the memory tier and the key index learn it
    /// once the batch has committed.
    pub(crate) changes: Vec<Change>,
    /// The key index as the batch began, and the keys this batch wrote a row of since (their
    /// fingerprints, and the entries' rowids): together they know which keys cannot have a
    /// row, and where the others may have one.
    index: Arc<KeyIndex>,
    written: HashSet<u64, ByFingerprint>,
    entries_written: Vec<(u64, i64)>,
    /// Set when the batch's transaction was rolled back ([`CommitGate`]).
    rolled_back: Arc<AtomicBool>,
}

/// How far a batch had got: what a write that failed alone is rewound to.
pub(crate) struct Mark {
    rows: u64,
    changes: usize,
    entries_written: usize,
}

impl Batch {
    /// A batch that begins now, on `rows` rows, with the key index as it stands.
    pub(super) fn new(now_ms: u64, rows: u64, index: Arc<KeyIndex>, gate: &CommitGate) -> Self {
        Self {
            now_ms,
            rows,
            changes: Vec::new(),
            index,
            written: HashSet::default(),
            entries_written: Vec::new(),
            rolled_back: gate.rolled_back(),
        }
    }

    /// Whether the batch's transaction has ended under the writes: rolled back (by SQLite, for
    /// the write, or by a `ROLLBACK` of its own), even if a `BEGIN` or `SAVEPOINT` of the write
    /// has opened another transaction since, which `conn` alone cannot tell from the batch's.
    pub(crate) fn ended(&self, conn: &Connection) -> bool {
        conn.is_autocommit() || self.rolled_back.load(Ordering::SeqCst)
    }

    /// `false` only when no row of `key` exists, neither an entry nor an open stream: a fresh
    /// key's insert then needs no read first.
    pub(crate) fn may_hold(&self, key: &MessageId) -> bool {
        let fingerprint = key.fingerprint();
        self.index.holds(fingerprint) || self.written.contains(&fingerprint)
    }

    /// The rowids that may hold `key`'s entry: the key index's, then this batch's.
    pub(crate) fn entry_rows(&self, key: &MessageId) -> Vec<i64> {
        let fingerprint = key.fingerprint();
        let mut rows = self.index.rows_of(fingerprint);
        let written = self
            .entries_written
            .iter()
            .filter(|(f, _)| *f == fingerprint);
        rows.extend(written.map(|(_, rowid)| *rowid));
        rows
    }

    /// Whether two keys share a fingerprint (and so the key index's candidates).
    pub(crate) fn same_fingerprint(&self, a: &str, b: &MessageId) -> bool {
        fingerprint::of(a) == b.fingerprint()
    }

    /// `entry` was stored at `rowid`; `new` when no row of its key was there.
    pub(crate) fn stored(&mut self, entry: Arc<Entry>, rowid: i64, new: bool) {
        let fingerprint = self.wrote(&entry.message_id);
        if new {
            self.entries_written.push((fingerprint, rowid));
        }
        self.changes.push(Change::Stored { entry, rowid, new });
    }

    /// An open-stream row of `key` was written by this batch; `new` when none was there.
    pub(crate) fn opened(&mut self, key: &MessageId, new: bool) {
        self.wrote(key);
        if new {
            self.changes.push(Change::Opened(key.clone()));
        }
    }

    fn wrote(&mut self, key: &MessageId) -> u64 {
        let fingerprint = key.fingerprint();
        self.written.insert(fingerprint);
        fingerprint
    }

    pub(super) fn mark(&self) -> Mark {
        Mark {
            rows: self.rows,
            changes: self.changes.len(),
            entries_written: self.entries_written.len(),
        }
    }

    /// Forgets what the writes since `mark` did (they were rolled back). `written` may keep
    /// their keys: it only ever makes a key be looked for.
    pub(super) fn rewind(&mut self, mark: Mark) {
        self.rows = mark.rows;
        self.changes.truncate(mark.changes);
        self.entries_written.truncate(mark.entries_written);
    }
}

/// One change to the rows of the store's own tables.
pub(crate) enum Change {
    /// An entry was stored at `rowid`; `new` when no row of its key was there before.
    Stored {
        entry: Arc<Entry>,
        rowid: i64,
        new: bool,
    },
    /// The entry of `key` at `rowid` was deleted (swept, evicted), or found gone.
    Deleted { key: MessageId, rowid: i64 },
    /// An open-stream row was added.
    Opened(MessageId),
    /// An open-stream row was deleted (the stream closed, or was swept).
    Closed(MessageId),
    /// The keys of every row, read after the changes before this one: the key index is
    /// reloaded from them (rows deleted behind the writer's back leave it).
    Reloaded(StoredKeys),
}
