//! One store test, either backend: a SQLite file in a temporary directory, or a fresh
//! database on the PostgreSQL server that `IDEM_TEST_POSTGRES_URL` names (`.ci/run` starts
//! one). Without that variable the PostgreSQL variants say so loudly and do not run, unless
//! `IDEM_REQUIRE_POSTGRES=1` (as in CI), where they fail.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::claim::IdempotencyCache;
use crate::store::{PostgresOptions, PostgresStore, SqlWrite, SqliteStore, Store};
use crate::testing::ManualClock;
use crate::IdempotencyConfig;
use tokio_postgres;

pub const T0_MS: u64 = 1_800_000_000_000;

/// The variable that names the PostgreSQL server the tests may use.
pub const POSTGRES_URL_ENV: &str = "IDEM_TEST_POSTGRES_URL";

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
    database: Option<(String, String)>,
    pub clock: Arc<ManualClock>,
}

static DATABASES: AtomicUsize = AtomicUsize::new(0);

impl Fixture {
    pub fn sqlite() -> Self {
        let dir = tempfile::tempdir().unwrap();
        Self {
            backend: Backend::Sqlite,
            path: dir.path().join("cache.db"),
            _dir: dir,
            url: None,
            database: None,
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
        let admin = postgres_url()?;
        let name = format!(
            "idem_test_{}_{}",
            std::process::id(),
            DATABASES.fetch_add(1, Ordering::SeqCst)
        );
        let client = connect(&admin).await;
        client
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .unwrap();
        let url = database_url(&admin, &name);
        let mut fx = Self::sqlite();
        fx.backend = Backend::Postgres;
        fx.url = Some(url);
        fx.database = Some((admin, name));
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

impl Drop for Fixture {
    fn drop(&mut self) {
        let Some((admin, name)) = self.database.take() else {
            return;
        };
        // Its own thread and runtime: a drop may happen inside a runtime that is stopping.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                let client = connect(&admin).await;
                let sql = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
                let _ = client.batch_execute(&sql).await;
            });
        });
        let _ = dropped.join();
    }
}

/// The PostgreSQL server's URL, or `None` after saying loudly that the test does not run.
pub fn postgres_url() -> Option<String> {
    match std::env::var(POSTGRES_URL_ENV) {
        Ok(url) if !url.is_empty() => Some(url),
        _ if std::env::var("IDEM_REQUIRE_POSTGRES").as_deref() == Ok("1") => {
            panic!("IDEM_REQUIRE_POSTGRES=1 but {POSTGRES_URL_ENV} is not set")
        }
        _ => {
            // Straight to stderr, past the test harness's capture: a skip is never silent.
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "*** SKIPPED: a PostgreSQL store test, for want of a server; set \
                 {POSTGRES_URL_ENV} (`source .ci/postgres.sh && start_postgres` starts one) ***"
            );
            None
        }
    }
}

/// A direct connection, driven on the current runtime.
pub async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {url}: {e}"));
    tokio::spawn(connection);
    client
}

/// `admin` with its database name replaced by `name`.
fn database_url(admin: &str, name: &str) -> String {
    let (base, _) = admin.rsplit_once('/').expect("a URL that names a database");
    format!("{base}/{name}")
}
