//! Purges by another process: `idem-admin purge` deletes a key's row over its own connection,
//! and the serving process, which keeps entries in memory, must stop answering it.
//!
//! The admin's delete bumps a generation number in `idempotency_purges`, in the same
//! transaction ([`bump`]). The checkpointer's thread reads it every time it wakes (every 250
//! ms, `checkpointer::INTERVAL`) and on a change empties the memory tier: entries are read
//! from the file again, which no longer holds the purged one. The key index needs nothing: it
//! already checks every row it names (an operator's purge is why).

use std::sync::Arc;
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension};

use crate::store::sqlite::checkpointer::INTERVAL;
use crate::store::sqlite::memory_tier::MemoryTier;

/// The table, for the store's schema and for files that predate it.
pub(crate) const TABLE: &str = "CREATE TABLE IF NOT EXISTS idempotency_purges (
    id         INTEGER PRIMARY KEY CHECK (id = 1),
    generation INTEGER NOT NULL
);";

/// How long after a purge a serving process has looked: twice the checkpointer's interval.
pub(crate) const NOTICED_WITHIN: Duration = Duration::from_millis(2 * INTERVAL.as_millis() as u64);

/// Records a purge, in the transaction of its delete.
pub(crate) fn bump(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(TABLE)?;
    conn.execute(
        "INSERT INTO idempotency_purges (id, generation) VALUES (1, 1)
         ON CONFLICT (id) DO UPDATE SET generation = generation + 1",
        [],
    )?;
    Ok(())
}

/// The serving process's side: the generation last seen, and the tier to empty.
pub(crate) struct PurgeWatch {
    seen: Option<i64>,
    tier: Arc<MemoryTier>,
}

impl PurgeWatch {
    pub(crate) fn new(conn: &Connection, tier: Arc<MemoryTier>) -> rusqlite::Result<Self> {
        Ok(Self {
            seen: generation(conn)?,
            tier,
        })
    }

    /// Empties the tier if a purge committed since the last look.
    pub(crate) fn look(&mut self, conn: &Connection) {
        match generation(conn) {
            Ok(now) if now != self.seen => {
                tracing::info!("an operator purged entries: the memory tier starts over");
                self.tier.forget_all();
                self.seen = now;
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "cannot read idempotency_purges"),
        }
    }
}

fn generation(conn: &Connection) -> rusqlite::Result<Option<i64>> {
    conn.prepare_cached("SELECT generation FROM idempotency_purges WHERE id = 1")?
        .query_row([], |row| row.get(0))
        .optional()
}
