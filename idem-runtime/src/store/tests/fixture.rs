//! One store test, either backend: a SQLite file in a temporary directory, or a fresh
//! database on the PostgreSQL server that `IDEM_TEST_POSTGRES_URL` names (`.ci/run` starts
//! one; `idem_conformance::postgres` makes the database, and skips loudly without a server).

use std::sync::Arc;

pub use idem_conformance::postgres::connect;
use idem_conformance::postgres::TestDatabase;

use crate::claim::IdempotencyCache;
use crate::store::{PostgresOptions, PostgresStore, SqlWrite, SqliteStore, Store};
use crate::testing::ManualClock;
use crate::IdempotencyConfig;

pub const T0_MS: u64 = 1_800_000_000_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

pub struct Fixture {
    pub backend: Backend,
    _dir: tempfile::TempDir,
    /// The SQLite file.
    pub path: std::path::PathBuf,
    /// The PostgreSQL database of this test.
    pub url: Option<String>,
    _database: Option<TestDatabase>,
    pub clock: Arc<ManualClock>,
}

impl Fixture {
    pub fn sqlite() -> Self {
        let dir = tempfile::tempdir().unwrap();
        Self {
            backend: Backend::Sqlite,
            path: dir.path().join("cache.db"),
            _dir: dir,
            url: None,
            _database: None,
            clock: Arc::new(ManualClock::new(T0_MS)),
        }
    }

    /// A fixture on `backend`; `None` when PostgreSQL is not available (and not required).
    pub async fn new(backend: Backend) -> Option<Self> {
        match backend {
            Backend::Sqlite => Some(Self::sqlite()),
            Backend::Postgres => Self::postgres().await,
        }
    }

    async fn postgres() -> Option<Self> {
        let database = TestDatabase::create("idem_test", "a PostgreSQL store test").await?;
        let mut fx = Self::sqlite();
        fx.backend = Backend::Postgres;
        fx.url = Some(database.url.clone());
        fx._database = Some(database);
        Some(fx)
    }

    /// A store on the fixture's database: on PostgreSQL, each call is another replica.
    pub async fn store(&self, config: &IdempotencyConfig) -> Arc<dyn Store> {
        match self.backend {
            Backend::Sqlite => Arc::new(
                SqliteStore::open_with_clock(&self.path, config, self.clock.clone()).unwrap(),
            ),
            Backend::Postgres => {
                let options = PostgresOptions::new(self.url.clone().unwrap());
                let store = PostgresStore::connect_with(options, config, self.clock.clone());
                Arc::new(store.await.unwrap())
            }
        }
    }

    pub async fn cache(&self, config: &IdempotencyConfig) -> IdempotencyCache {
        IdempotencyCache::from_arc(self.store(config).await)
    }

    /// `n` processes serving the store: on SQLite, where one process serves a file, the same
    /// cache `n` times; on PostgreSQL, `n` replicas.
    pub async fn replicas(&self, config: &IdempotencyConfig, n: usize) -> Vec<IdempotencyCache> {
        match self.backend {
            Backend::Sqlite => vec![self.cache(config).await; n],
            Backend::Postgres => {
                let mut caches = Vec::new();
                for _ in 0..n {
                    caches.push(self.cache(config).await);
                }
                caches
            }
        }
    }

    /// The integer the query `sql` returns, read beside the store (another connection).
    pub async fn count(&self, sql: &str) -> i64 {
        match self.backend {
            Backend::Sqlite => {
                let conn = rusqlite::Connection::open(&self.path).unwrap();
                conn.query_row(sql, [], |r| r.get(0)).unwrap()
            }
            Backend::Postgres => {
                let client = connect(self.url.as_ref().unwrap()).await;
                client.query_one(sql, &[]).await.unwrap().get(0)
            }
        }
    }

    /// Waits until the sessions of the PostgreSQL stores dropped so far have ended (moments
    /// after the drop), so that one of another TTL opens instead of being refused, and their
    /// index builds too, so that a test's own schema change does not meet one.
    pub async fn stores_gone(&self) {
        if !matches!(self.backend, Backend::Postgres) {
            return;
        }
        let sessions = "SELECT COUNT(*) FROM pg_stat_activity
                        WHERE datname = current_database()
                          AND (application_name LIKE 'idem ttl=%'
                               OR application_name = 'idem index build')";
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while self.count(sessions).await > 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "sessions left after 10 s"
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    /// Runs `sql` beside the store: PostgreSQL only (fault injection, say).
    pub async fn execute(&self, sql: &str) {
        let client = connect(self.url.as_ref().expect("a PostgreSQL fixture")).await;
        client.batch_execute(sql).await.unwrap();
    }

    /// Creates the table `effects (name)` that [`effect`](Self::effect) writes to.
    pub async fn create_effects(&self, store: &Arc<dyn Store>) {
        let ddl = "CREATE TABLE effects (name TEXT PRIMARY KEY)";
        let write = match self.backend {
            Backend::Sqlite => SqlWrite::rerunnable(move |db| Ok(db.execute_batch(ddl)?)),
            Backend::Postgres => SqlWrite::postgres(move |tx| {
                Box::pin(async move {
                    tx.batch_execute(ddl).await?;
                    Ok(())
                })
            }),
        };
        store.apply(vec![write]).await.unwrap();
    }

    /// A staged write that inserts `name` into `effects` (names are unique).
    pub fn effect(&self, name: &str) -> SqlWrite {
        let name = name.to_owned();
        match self.backend {
            Backend::Sqlite => SqlWrite::rerunnable(move |db| {
                db.execute("INSERT INTO effects (name) VALUES (?1)", [&name])?;
                Ok(())
            }),
            Backend::Postgres => SqlWrite::postgres(move |tx| {
                Box::pin(async move {
                    tx.execute("INSERT INTO effects (name) VALUES ($1)", &[&name])
                        .await?;
                    Ok(())
                })
            }),
        }
    }

    /// A staged write that panics, as a bug in an application's write would.
    pub fn panicking(&self) -> SqlWrite {
        fn bug() -> Result<(), crate::store::WriteError> {
            panic!("a bug in the write")
        }
        match self.backend {
            Backend::Sqlite => SqlWrite::rerunnable(|_| bug()),
            Backend::Postgres => SqlWrite::postgres(|_| Box::pin(async { bug() })),
        }
    }

    /// The names in `effects`, sorted.
    pub async fn effects(&self) -> Vec<String> {
        let sql = "SELECT name FROM effects ORDER BY name";
        match self.backend {
            Backend::Sqlite => {
                let conn = rusqlite::Connection::open(&self.path).unwrap();
                let mut names = conn.prepare(sql).unwrap();
                let names = names.query_map([], |r| r.get(0)).unwrap();
                names.collect::<Result<_, _>>().unwrap()
            }
            Backend::Postgres => {
                let client = connect(self.url.as_ref().unwrap()).await;
                let rows = client.query(sql, &[]).await.unwrap();
                rows.iter().map(|row| row.get(0)).collect()
            }
        }
    }
}
