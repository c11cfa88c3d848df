//! Purges by another process: `idem-admin purge` deletes a key's row over its own connection,
//! and the serving process, which keeps entries in memory, must stop answering it.
//!
//! The admin's delete bumps a generation number in `idempotency_purges`, in the same
//! transaction ([`bump`]). The checkpointer's thread reads it every time it wakes (every 250
//! ms at the latest, `checkpointer::IDLE_INTERVAL`) and on a change empties the memory tier: entries are read
//! from the file again, which no longer holds the purged one. The key index needs nothing: it
//! already checks every row it names (an operator's purge is why).
//!
//! The server then writes the generation it has forgotten for into `seen`, and the admin waits
//! for that ([`forgotten`]) instead of for a time: a checkpoint of a long log can hold the
//! thread for longer than any wait chosen in advance. A server that opens the file has nothing
//! in memory yet, so it acknowledges every purge before it ([`prepare`]).

use std::sync::Arc;

use rusqlite::{Connection, OptionalExtension};

use crate::store::sqlite::memory_tier::MemoryTier;
use crate::store::sqlite::repeated_failure::RepeatedFailure;

const TABLE: &str = "CREATE TABLE IF NOT EXISTS idempotency_purges (
    id         INTEGER PRIMARY KEY CHECK (id = 1),
    generation INTEGER NOT NULL,
    -- The generation the serving process has emptied its memory for.
    seen       INTEGER NOT NULL DEFAULT 0
);";

/// The table, with `seen` added to a file whose table predates it.
fn ensure_table(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(TABLE)?;
    let has_seen = conn
        .prepare("SELECT 1 FROM pragma_table_info('idempotency_purges') WHERE name = 'seen'")?
        .exists([])?;
    if !has_seen {
        conn.execute_batch(
            "ALTER TABLE idempotency_purges ADD COLUMN seen INTEGER NOT NULL DEFAULT 0",
        )?;
    }
    Ok(())
}

/// At a server's open, before it serves: the table, and every purge so far acknowledged.
pub(crate) fn prepare(conn: &Connection) -> rusqlite::Result<()> {
    ensure_table(conn)?;
    conn.execute("UPDATE idempotency_purges SET seen = generation", [])?;
    Ok(())
}

/// Records a purge, in the transaction of its delete; returns its generation.
pub(crate) fn bump(conn: &Connection) -> rusqlite::Result<i64> {
    ensure_table(conn)?;
    conn.query_row(
        "INSERT INTO idempotency_purges (id, generation) VALUES (1, 1)
         ON CONFLICT (id) DO UPDATE SET generation = generation + 1
         RETURNING generation",
        [],
        |row| row.get(0),
    )
}

/// Whether a serving process has forgotten what it held in memory at `generation`'s purge.
pub(crate) fn forgotten(conn: &Connection, generation: i64) -> rusqlite::Result<bool> {
    let seen: Option<i64> = conn
        .query_row(
            "SELECT seen FROM idempotency_purges WHERE id = 1",
            [],
            |row| row.get(0),
        )
        .optional()?;
    Ok(seen.is_some_and(|seen| seen >= generation))
}

/// The serving process's side: the generation last forgotten for, and the last acknowledged.
pub(crate) struct PurgeWatch {
    forgotten: Option<i64>,
    acknowledged: Option<i64>,
    tier: Arc<MemoryTier>,
    /// Each look reads, and may write: on a failing disk, at every tick.
    reading: RepeatedFailure,
    acknowledging: RepeatedFailure,
}

impl PurgeWatch {
    /// For a file that [`prepare`] has acknowledged. A purge that commits between the two
    /// found nothing in memory either: the first look acknowledges it.
    pub(crate) fn new(conn: &Connection, tier: Arc<MemoryTier>) -> rusqlite::Result<Self> {
        Ok(Self {
            forgotten: generation(conn)?,
            acknowledged: None,
            tier,
            reading: RepeatedFailure::new("reading idempotency_purges"),
            acknowledging: RepeatedFailure::new("acknowledging an operator's purge"),
        })
    }

    /// Empties the tier if a purge committed since the last look, then says so to the admin.
    pub(crate) fn look(&mut self, conn: &Connection) {
        match self.reading.note(generation(conn)) {
            Some(now) if now != self.forgotten => {
                tracing::info!("an operator purged entries: the memory tier starts over");
                self.tier.forget_all();
                self.forgotten = now;
            }
            _ => {}
        }
        if self.acknowledged != self.forgotten {
            self.acknowledge(conn);
        }
    }

    /// One short write, once per purge, on this thread's connection: it waits for the
    /// writer's batch like the admin's own purge did. Tried again at the next look if it fails.
    fn acknowledge(&mut self, conn: &Connection) {
        let Some(generation) = self.forgotten else {
            return;
        };
        let acknowledged = conn.execute(
            "UPDATE idempotency_purges SET seen = max(seen, ?1) WHERE id = 1",
            [generation],
        );
        if self.acknowledging.note(acknowledged).is_some() {
            self.acknowledged = self.forgotten;
        }
    }
}

/// The file's purge generation (none before its first purge).
pub(crate) fn generation(conn: &Connection) -> rusqlite::Result<Option<i64>> {
    conn.prepare_cached("SELECT generation FROM idempotency_purges WHERE id = 1")?
        .query_row([], |row| row.get(0))
        .optional()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_without_seen_gets_it_and_a_purge_is_acknowledged_once_forgotten() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(
            "CREATE TABLE idempotency_purges (
                 id INTEGER PRIMARY KEY CHECK (id = 1), generation INTEGER NOT NULL);
             INSERT INTO idempotency_purges VALUES (1, 4);",
        )
        .unwrap();
        prepare(&conn).unwrap();
        assert!(
            forgotten(&conn, 4).unwrap(),
            "a server at open holds nothing"
        );
        let mut watch = PurgeWatch::new(&conn, Arc::new(MemoryTier::new(1 << 20))).unwrap();
        let purge = bump(&conn).unwrap();
        assert_eq!(purge, 5);
        assert!(
            !forgotten(&conn, purge).unwrap(),
            "not before the server looks"
        );
        watch.look(&conn);
        assert!(forgotten(&conn, purge).unwrap());
    }

    #[test]
    fn a_purge_between_prepare_and_the_watch_is_acknowledged_at_the_first_look() {
        let conn = Connection::open_in_memory().unwrap();
        prepare(&conn).unwrap();
        let purge = bump(&conn).unwrap(); // committed while the server opened
        let mut watch = PurgeWatch::new(&conn, Arc::new(MemoryTier::new(1 << 20))).unwrap();
        watch.look(&conn);
        assert!(forgotten(&conn, purge).unwrap());
    }
}
