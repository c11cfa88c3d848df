//! The SQL of the `tasks` and `outbox` tables, each statement written once, in PostgreSQL's
//! dialect; SQLite runs the same text with `?N` for `$N` ([`sqlite`]). Only the tables'
//! definitions differ (the outbox's generated id), and only here.

pub const SQLITE_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS tasks (
    id          TEXT NOT NULL PRIMARY KEY,
    context_id  TEXT NOT NULL,
    state       TEXT NOT NULL,     -- working | completed | canceled
    due_at      INTEGER NOT NULL,  -- epoch ms at which the mission completes
    created_at  INTEGER NOT NULL,  -- epoch ms
    updated_at  INTEGER NOT NULL,  -- epoch ms
    task_json   TEXT NOT NULL      -- the whole task (history, artifacts) as this example models it
);
CREATE INDEX IF NOT EXISTS idx_tasks_state ON tasks(state);
CREATE TABLE IF NOT EXISTS outbox (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id      TEXT NOT NULL REFERENCES tasks(id),
    event_type   TEXT NOT NULL,    -- mission.assigned | mission.completed | mission.canceled
    payload      TEXT NOT NULL,    -- JSON
    created_at   INTEGER NOT NULL, -- epoch ms
    delivered_at INTEGER,          -- set once every webhook took it or once it was given up
    next_attempt_at INTEGER,       -- epoch ms: a failed delivery is not tried again before
    attempts     INTEGER NOT NULL DEFAULT 0, -- failed deliveries so far: the next backoff
    abandoned_at INTEGER           -- epoch ms: given up (its delivery failed too long)
);
CREATE INDEX IF NOT EXISTS idx_outbox_task ON outbox(task_id);
CREATE INDEX IF NOT EXISTS idx_outbox_undelivered ON outbox(id) WHERE delivered_at IS NULL;
CREATE TABLE IF NOT EXISTS push_configs (
    task_id     TEXT NOT NULL REFERENCES tasks(id),
    config_id   TEXT NOT NULL,
    config_json TEXT NOT NULL,     -- {id, url, token?, authentication?}
    created_at  INTEGER NOT NULL,  -- epoch ms
    PRIMARY KEY (task_id, config_id)
);
-- The webhooks that took an event while another of its task's failed: not posted it again.
CREATE TABLE IF NOT EXISTS outbox_deliveries (
    event_id     INTEGER NOT NULL,
    config_id    TEXT NOT NULL,
    delivered_at INTEGER NOT NULL, -- epoch ms
    PRIMARY KEY (event_id, config_id)
) WITHOUT ROWID;
";

/// The same tables on PostgreSQL: BIGINT epoch milliseconds, an identity column.
pub const POSTGRES_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS tasks (
    id          TEXT NOT NULL PRIMARY KEY,
    context_id  TEXT NOT NULL,
    state       TEXT NOT NULL,
    due_at      BIGINT NOT NULL,
    created_at  BIGINT NOT NULL,
    updated_at  BIGINT NOT NULL,
    task_json   TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS outbox (
    id           BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id      TEXT NOT NULL REFERENCES tasks(id),
    event_type   TEXT NOT NULL,
    payload      TEXT NOT NULL,
    created_at   BIGINT NOT NULL,
    delivered_at BIGINT,
    next_attempt_at BIGINT,
    attempts     INTEGER NOT NULL DEFAULT 0,
    abandoned_at BIGINT
);
-- An outbox of an earlier version gains the columns; each looked for first, since an ALTER
-- TABLE locks the table out for everyone even when it has nothing to do.
DO $$ DECLARE
    added TEXT[][] := ARRAY[['next_attempt_at', 'BIGINT'], ['attempts', 'INTEGER NOT NULL DEFAULT 0'],
                            ['abandoned_at', 'BIGINT']];
BEGIN
    FOR i IN 1 .. array_length(added, 1) LOOP
        IF NOT EXISTS (SELECT 1 FROM information_schema.columns
                       WHERE table_schema = current_schema() AND table_name = 'outbox'
                         AND column_name = added[i][1]) THEN
            EXECUTE format('ALTER TABLE outbox ADD COLUMN %I %s', added[i][1], added[i][2]);
        END IF;
    END LOOP;
END $$;
CREATE TABLE IF NOT EXISTS push_configs (
    task_id     TEXT NOT NULL REFERENCES tasks(id),
    config_id   TEXT NOT NULL,
    config_json TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    PRIMARY KEY (task_id, config_id)
);
CREATE TABLE IF NOT EXISTS outbox_deliveries (
    event_id     BIGINT NOT NULL,
    config_id    TEXT NOT NULL,
    delivered_at BIGINT NOT NULL,
    PRIMARY KEY (event_id, config_id)
);
-- Indexes are made only where missing: CREATE INDEX IF NOT EXISTS takes its table's SHARE lock
-- before it looks, which holds every replica's writes to the table back at each start.
DO $$ BEGIN
    IF to_regclass('idx_tasks_state') IS NULL THEN
        CREATE INDEX IF NOT EXISTS idx_tasks_state ON tasks(state);
    END IF;
    IF to_regclass('idx_outbox_task') IS NULL THEN
        CREATE INDEX IF NOT EXISTS idx_outbox_task ON outbox(task_id);
    END IF;
    IF to_regclass('idx_outbox_undelivered') IS NULL THEN
        CREATE INDEX IF NOT EXISTS idx_outbox_undelivered ON outbox(id) WHERE delivered_at IS NULL;
    END IF;
END $$;
";

/// The events held back for a retry, by task: few, and what every read of the outbox asks
/// about ([`UNDELIVERED`]). Created once the outbox has `next_attempt_at` (an outbox of an
/// earlier version gains it first, [`OUTBOX_ADDED_COLUMNS`]).
pub const HELD_INDEX: &str = "CREATE INDEX IF NOT EXISTS idx_outbox_held ON outbox(task_id, id)
    WHERE delivered_at IS NULL AND next_attempt_at IS NOT NULL";

/// [`HELD_INDEX`] on PostgreSQL, made only where it is missing (see [`POSTGRES_SCHEMA`]'s
/// indexes).
pub fn postgres_held_index() -> String {
    format!(
        "DO $$ BEGIN IF to_regclass('idx_outbox_held') IS NULL THEN {HELD_INDEX}; END IF; END $$"
    )
}

/// `$1` id, `$2` context id, `$3` state, `$4` due at, `$5` now, `$6` task JSON.
pub const INSERT_TASK: &str = "INSERT INTO tasks
    (id, context_id, state, due_at, created_at, updated_at, task_json)
    VALUES ($1, $2, $3, $4, $5, $5, $6)";

/// `$1` id, `$2` state, `$3` now, `$4` task JSON.
pub const UPDATE_TASK: &str =
    "UPDATE tasks SET state = $2, updated_at = $3, task_json = $4 WHERE id = $1";

/// [`UPDATE_TASK`], applied only if the row still holds `$5`, the task JSON as read.
pub const UPDATE_TASK_IF_UNCHANGED: &str =
    "UPDATE tasks SET state = $2, updated_at = $3, task_json = $4 WHERE id = $1 AND task_json = $5";

/// `$1` id.
pub const LOAD_TASK: &str = "SELECT task_json, due_at FROM tasks WHERE id = $1";

/// `$1` state.
pub const TASKS_IN_STATE: &str = "SELECT id, due_at FROM tasks WHERE state = $1";

/// `$1` task id, `$2` event type, `$3` payload, `$4` now.
pub const RECORD_EVENT: &str =
    "INSERT INTO outbox (task_id, event_type, payload, created_at) VALUES ($1, $2, $3, $4)";

/// `$1` task id, `$2` config id, `$3` config JSON, `$4` now: a config set again is replaced.
pub const UPSERT_PUSH_CONFIG: &str = "INSERT INTO push_configs
    (task_id, config_id, config_json, created_at) VALUES ($1, $2, $3, $4)
    ON CONFLICT (task_id, config_id) DO UPDATE SET config_json = excluded.config_json";

/// `$1` task id: its configs, oldest first.
pub const PUSH_CONFIGS: &str =
    "SELECT config_json FROM push_configs WHERE task_id = $1 ORDER BY created_at, config_id";

/// `$1` task id, `$2` config id.
pub const DELETE_PUSH_CONFIG: &str =
    "DELETE FROM push_configs WHERE task_id = $1 AND config_id = $2";

/// `$1` task id, `$2` config id: what the webhook of that id took of the task's events, run
/// where the id is deleted (where it is set, [`FORGET_DELIVERIES_IF_MOVED`]).
pub const FORGET_DELIVERIES: &str = "DELETE FROM outbox_deliveries WHERE config_id = $2
    AND event_id IN (SELECT id FROM outbox WHERE task_id = $1)";

/// `$1` how many, `$2` now: the oldest events to deliver now, whether their task has
/// webhooks, when they were due again if an attempt of theirs failed (in any process), how
/// many attempts failed, and whether some of its webhooks took it already.
/// An event whose last attempt failed waits out its backoff, and so do the later events of
/// its task (they are delivered in order), while every other event is read past it.
/// The held events are looked for in [`HELD_INDEX`] (implied by `next_attempt_at > $2`), so
/// an event costs one lookup in a nearly empty index, not a visit to each event of its task.
///
/// Three reads in one: the oldest first attempts (events never tried, of tasks with no failed
/// event before them); the retries due longest (`next_attempt_at`, in the held index: the
/// failed events alone); and the oldest due events of any kind, which bring a failing task's
/// later events with its retry. Due events of failing tasks alone would fill the third (a
/// review: 600 of them, and no healthy task's event was read for a minute): the first always
/// reaches the tasks whose webhooks answer, the second every failing task in turn, with the
/// later events of its task (the task's other webhooks get them at that retry: read by the
/// third alone, they waited behind 512 older due events, until the retry was given up:
/// helper-69). A due retry needs no check for a held event before it: only a task's first
/// undelivered event ever holds a retry (`relay.rs`, `settle`; later events of its task are
/// tried with it, after it).
pub const UNDELIVERED: &str = "SELECT id, task_id, event_type,
    EXISTS (SELECT 1 FROM push_configs p WHERE p.task_id = due.task_id), next_attempt_at,
    attempts, EXISTS (SELECT 1 FROM outbox_deliveries d WHERE d.event_id = due.id)
    FROM (
      SELECT * FROM (SELECT id, task_id, event_type, next_attempt_at, attempts
        FROM outbox
        WHERE delivered_at IS NULL AND next_attempt_at IS NULL
          AND NOT EXISTS (SELECT 1 FROM outbox failed
            WHERE failed.task_id = outbox.task_id AND failed.id < outbox.id
              AND failed.delivered_at IS NULL AND failed.next_attempt_at IS NOT NULL)
        ORDER BY id LIMIT $1) first_attempts
      UNION
      SELECT later.id, later.task_id, later.event_type, later.next_attempt_at, later.attempts
        FROM (SELECT id, task_id FROM outbox
          WHERE delivered_at IS NULL AND next_attempt_at IS NOT NULL AND next_attempt_at <= $2
          ORDER BY next_attempt_at LIMIT $1) retries
        JOIN outbox later ON later.task_id = retries.task_id AND later.id >= retries.id
          AND later.delivered_at IS NULL
      UNION
      SELECT * FROM (SELECT id, task_id, event_type, next_attempt_at, attempts
        FROM outbox WHERE delivered_at IS NULL
        AND NOT EXISTS (SELECT 1 FROM outbox waiting
          WHERE waiting.task_id = outbox.task_id AND waiting.id <= outbox.id
            AND waiting.delivered_at IS NULL AND waiting.next_attempt_at > $2)
        ORDER BY id LIMIT $1) oldest
    ) AS due
    ORDER BY id";

/// `$1` event id, `$2` now.
pub const MARK_DELIVERED: &str = "UPDATE outbox SET delivered_at = $2 WHERE id = $1";

/// Deletes at most `$2` events delivered before `$1` (epoch ms), the oldest first. Each one a
/// join may pick again is past `$1` as well: at most more of them go, never another.
pub const PRUNE_DELIVERED: &str = "DELETE FROM outbox WHERE id IN (
    SELECT id FROM outbox WHERE delivered_at < $1 ORDER BY id LIMIT $2)";

/// `$1` event id: the webhooks (config ids) that took it already.
pub const DELIVERED_TO: &str = "SELECT config_id FROM outbox_deliveries WHERE event_id = $1";

// A webhook is its config's id and URL: set again with another token or authentication, it
// is the same webhook, which keeps what it took. One whose receiver rotated its token on
// every delivery was posted the same event again and again, for good (helper-103).

/// The URL of a stored config, on SQLite, which reads JSON text as it is.
macro_rules! url_on_sqlite {
    () => {
        "(config_json ->> 'url')"
    };
}

/// The URL of a stored config, on PostgreSQL, which reads JSON once cast.
macro_rules! url_on_postgres {
    () => {
        "(config_json::json ->> 'url')"
    };
}

/// `$1` event id, `$2` config id, `$3` now, `$4` task id, `$5` the URL it was posted to: that
/// webhook took it, unless its config was re-pointed or deleted meanwhile. Re-pointed, it is
/// another webhook, owed the event; recorded all the same, the new URL was never posted it
/// (helper-95).
macro_rules! record_delivery {
    ($url:expr, $lock:literal) => {
        concat!(
            "INSERT INTO outbox_deliveries (event_id, config_id, delivered_at)
             SELECT $1, $2, $3 WHERE EXISTS (SELECT 1 FROM push_configs
               WHERE task_id = $4 AND config_id = $2 AND ",
            $url,
            " = $5",
            $lock,
            ") ON CONFLICT (event_id, config_id) DO NOTHING"
        )
    };
}

/// [`record_delivery!`] on SQLite, whose one writer runs a config's set apart from it.
pub const RECORD_DELIVERY: &str = record_delivery!(url_on_sqlite!(), "");

/// [`record_delivery!`] on PostgreSQL: the config's row is locked until the record commits, so
/// a set of it meanwhile ([`LOCK_PUSH_CONFIG`]) forgets the record after, not before.
pub const RECORD_DELIVERY_LOCKING: &str = record_delivery!(url_on_postgres!(), " FOR SHARE");

/// `$1` task id, `$2` config id, `$3` the URL it is set to: what the webhook of that id took of
/// the task's events, forgotten before its config is set, unless it keeps its URL. A config
/// re-pointed under its id is another webhook: kept, its records had the new URL skip the
/// events the old one took (helper-69).
macro_rules! forget_deliveries_if_moved {
    ($url:expr) => {
        concat!(
            "DELETE FROM outbox_deliveries WHERE config_id = $2
               AND event_id IN (SELECT id FROM outbox WHERE task_id = $1)
               AND NOT EXISTS (SELECT 1 FROM push_configs
                 WHERE task_id = $1 AND config_id = $2 AND ",
            $url,
            " = $3)"
        )
    };
}

/// [`forget_deliveries_if_moved!`] on SQLite.
pub const FORGET_DELIVERIES_IF_MOVED: &str = forget_deliveries_if_moved!(url_on_sqlite!());

/// [`forget_deliveries_if_moved!`] on PostgreSQL, run once [`LOCK_PUSH_CONFIG`] holds the row.
pub const FORGET_DELIVERIES_IF_MOVED_LOCKED: &str = forget_deliveries_if_moved!(url_on_postgres!());

/// `$1` task id, `$2` config id: its row locked until the set commits, so that a record of a
/// delivery to its old URL (which shares the lock) is committed before the set's forget
/// reads the records, or reads the set's URL.
pub const LOCK_PUSH_CONFIG: &str =
    "SELECT 1 FROM push_configs WHERE task_id = $1 AND config_id = $2 FOR UPDATE";

/// `$1` event id, `$2` now: delivered, once every webhook of its task took it.
pub const MARK_DELIVERED_TO_ALL: &str = "UPDATE outbox SET delivered_at = $2 WHERE id = $1
    AND NOT EXISTS (SELECT 1 FROM push_configs p WHERE p.task_id = outbox.task_id
      AND NOT EXISTS (SELECT 1 FROM outbox_deliveries d
        WHERE d.event_id = outbox.id AND d.config_id = p.config_id))";

/// Deletes at most `$2` webhooks' deliveries of events delivered (or given up) before `$1`,
/// or deleted: as [`PRUNE_DELIVERED`] does their events.
pub const PRUNE_DELIVERIES: &str = "DELETE FROM outbox_deliveries WHERE event_id IN (
    SELECT d.event_id FROM outbox_deliveries d LEFT JOIN outbox o ON o.id = d.event_id
    WHERE o.id IS NULL OR o.delivered_at < $1 LIMIT $2)";

/// `$1` event id, `$2` when to try again (epoch ms): one more attempt failed. Not over an
/// event another relay delivered meanwhile (two may overlap, see `relay.rs`).
pub const RETRY_AT: &str = "UPDATE outbox SET next_attempt_at = $2, attempts = attempts + 1
    WHERE id = $1 AND delivered_at IS NULL";

/// `$1` event id, `$2` now: its last attempt failed too, and the relay gives it up. Marked
/// delivered as well, so that every read passes it by and its task's later events go; not
/// over an event another relay delivered meanwhile.
pub const ABANDON: &str = "UPDATE outbox
    SET delivered_at = $2, abandoned_at = $2, attempts = attempts + 1
    WHERE id = $1 AND delivered_at IS NULL";

/// The columns an outbox of an earlier version may lack, with their SQLite definitions
/// (SQLite has no `ADD COLUMN IF NOT EXISTS`; PostgreSQL's are in [`POSTGRES_SCHEMA`]).
pub const OUTBOX_ADDED_COLUMNS: [(&str, &str); 3] = [
    ("next_attempt_at", "INTEGER"),
    ("attempts", "INTEGER NOT NULL DEFAULT 0"),
    ("abandoned_at", "INTEGER"),
];

/// `$1` a column name: whether the outbox has it (1) or not (0).
pub const SQLITE_OUTBOX_HAS: &str =
    "SELECT COUNT(*) FROM pragma_table_info('outbox') WHERE name = $1";

/// `sql` as SQLite spells its numbered parameters.
pub fn sqlite(sql: &str) -> String {
    sql.replace('$', "?")
}
