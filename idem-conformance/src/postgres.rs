//! A PostgreSQL server for tests: the variable that names it, a database of a test's own,
//! and queries beside the server under test. Without the variable a test says loudly that it
//! does not run; with `IDEM_REQUIRE_POSTGRES=1` (as `.ci/run` sets) it fails instead.

use std::sync::atomic::{AtomicUsize, Ordering};

/// The variable that names the server the tests may create databases on.
pub const URL_ENV: &str = "IDEM_TEST_POSTGRES_URL";

/// `1`: a missing PostgreSQL variable fails the test instead of skipping it.
pub const REQUIRE_ENV: &str = "IDEM_REQUIRE_POSTGRES";

/// The value of `variable`, or `None` after saying that `what` does not run: on stderr
/// itself, past the test harness's capture, so a skip is never silent.
pub fn variable(variable: &str, what: &str) -> Option<String> {
    match std::env::var(variable) {
        Ok(value) if !value.is_empty() => Some(value),
        _ if std::env::var(REQUIRE_ENV).as_deref() == Ok("1") => {
            panic!("{REQUIRE_ENV}=1 but {variable} is not set")
        }
        _ => {
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "*** SKIPPED: {what}, for want of {variable} \
                 (`source .ci/postgres.sh && start_postgres` sets it) ***"
            );
            None
        }
    }
}

/// A database of the test's own on the server of [`URL_ENV`], dropped with it.
pub struct TestDatabase {
    admin: String,
    name: String,
    /// Its URL.
    pub url: String,
}

static DATABASES: AtomicUsize = AtomicUsize::new(0);

impl TestDatabase {
    /// A new database named `PREFIX_PID_N`; `None` (said loudly) without a server.
    pub async fn create(prefix: &str, what: &str) -> Option<Self> {
        let admin = variable(URL_ENV, what)?;
        let n = DATABASES.fetch_add(1, Ordering::SeqCst);
        let name = format!("{prefix}_{}_{n}", std::process::id());
        let client = connect(&admin).await;
        let sql = format!("CREATE DATABASE {name}");
        client.batch_execute(&sql).await.unwrap();
        let (base, _) = admin.rsplit_once('/').expect("a URL that names a database");
        let url = format!("{base}/{name}");
        Some(Self { admin, name, url })
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let sql = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
        let admin = self.admin.clone();
        let _ = on_own_runtime(async move {
            let (client, connection) = tokio_postgres::connect(&admin, tokio_postgres::NoTls)
                .await
                .map_err(|e| e.to_string())?;
            tokio::spawn(connection);
            client.batch_execute(&sql).await.map_err(|e| e.to_string())
        });
    }
}

/// A direct connection, driven on the current runtime; panics if there is no server.
pub async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {url}: {e}"));
    tokio::spawn(connection);
    client
}

/// The one integer `sql` (at most one text parameter `$1`) returns from the database at
/// `url`, on a connection, thread and runtime of its own: callable from synchronous code
/// inside an async test.
pub fn count(url: &str, sql: &str, param: Option<&str>) -> Result<i64, String> {
    match rows(url, sql, param)?.as_slice() {
        [row] => Ok(row.get::<_, i64>(0)),
        rows => Err(format!("{sql}: {} rows, not one", rows.len())),
    }
}

/// The (text, integer) rows `sql` returns, as [`count`] reads them.
pub fn pairs(url: &str, sql: &str) -> Result<Vec<(String, i64)>, String> {
    let rows = rows(url, sql, None)?;
    Ok(rows.iter().map(|row| (row.get(0), row.get(1))).collect())
}

fn rows(url: &str, sql: &str, param: Option<&str>) -> Result<Vec<tokio_postgres::Row>, String> {
    let (url, sql, param) = (url.to_owned(), sql.to_owned(), param.map(str::to_owned));
    on_own_runtime(async move {
        let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .map_err(|e| format!("connecting to {url}: {e}"))?;
        tokio::spawn(connection);
        let params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = match &param {
            Some(param) => vec![param],
            None => vec![],
        };
        let rows = client.query(&sql, &params).await;
        rows.map_err(|e| format!("reading {url}: {e}"))
    })
}

/// Runs `work` on a thread and runtime of its own (a drop or a synchronous check may happen
/// inside a runtime, even one that is stopping).
fn on_own_runtime<T: Send + 'static>(
    work: impl std::future::Future<Output = Result<T, String>> + Send + 'static,
) -> Result<T, String> {
    let thread = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        runtime.block_on(work)
    });
    thread
        .join()
        .map_err(|_| "the thread panicked".to_owned())?
}
