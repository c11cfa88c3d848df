//! The handle an application builds once and installs on its jsonrpsee server.

use std::path::Path;
use std::sync::Arc;

use serde_json::Value;
use tokio::sync::Semaphore;

use crate::claim::IdempotencyCache;
use crate::config::IdempotencyConfig;
use crate::layers::agent_card::AgentCardLayer;
use crate::layers::http::HttpLayer;
use crate::layers::rpc::RpcLayer;
use crate::state::State;
use crate::store::database::Database;
use crate::store::sqlite::SqliteStore;
use crate::store::{Store, StoreError};

/// The methods governed by default (spec §4.1), in both A2A spellings.
pub const DEFAULT_GOVERNED_METHODS: [&str; 4] = [
    "message/send",
    "SendMessage",
    "message/stream",
    "SendStreamingMessage",
];

/// The extension on one server: the cache, the effective config, the governed methods.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use idem_runtime::{Idempotency, IdempotencyConfig};
/// use jsonrpsee::server::middleware::rpc::RpcServiceBuilder;
/// use jsonrpsee::server::Server;
///
/// let idem = Idempotency::open("a2a.db", IdempotencyConfig::from_env()?)?;
/// let server = Server::builder()
///     .set_http_middleware(tower::ServiceBuilder::new().layer(idem.http_layer()))
///     .set_rpc_middleware(RpcServiceBuilder::new().layer(idem.rpc_layer()))
///     .build("127.0.0.1:8080")
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Idempotency {
    state: Arc<State>,
}

/// Builds an [`Idempotency`]: the config once, then the store it runs on. Every store it
/// opens gets that config (TTL, bound, lease) and a periodic sweep.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use idem_runtime::store::SqliteStore;
/// use idem_runtime::{Idempotency, IdempotencyConfig};
/// let dir = tempfile::tempdir().unwrap();
/// let path = dir.path().join("a2a.db");
/// // The shorthand of `Idempotency::builder(config).sqlite(path)`:
/// let idem = Idempotency::open(&path, IdempotencyConfig::default()).unwrap();
/// drop(idem);
/// // A custom store is built from the same config, so TTL and bound are given once.
/// let idem = Idempotency::builder(IdempotencyConfig::default())
///     .govern("tasks/pushNotificationConfig/set")
///     .store(|config| SqliteStore::open(&path, config))
///     .unwrap();
/// assert!(idem.governs("tasks/pushNotificationConfig/set"));
/// # }
/// ```
#[must_use = "a builder does nothing until a store is given"]
pub struct IdempotencyBuilder {
    config: IdempotencyConfig,
    governed: Vec<String>,
    deduplicate: bool,
}

impl IdempotencyBuilder {
    /// Puts one more method in scope (spec §4.1 lets other extensions extend it).
    pub fn govern(mut self, method: &str) -> Self {
        self.governed.push(method.to_owned());
        self
    }

    /// Deduplication off: governed methods run undeduplicated, no extension header is read or
    /// sent, and the AgentCard lists no extension; their units of work still commit through
    /// the store, so the application keeps one code path.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use idem_runtime::{Idempotency, IdempotencyConfig};
    /// let dir = tempfile::tempdir().unwrap();
    /// let idem = Idempotency::builder(IdempotencyConfig::default())
    ///     .without_deduplication()
    ///     .sqlite(dir.path().join("a2a.db"))
    ///     .unwrap();
    /// // The AgentCard lists no extension, but units of work still commit through the store.
    /// assert!(idem.agent_card_extension().is_none());
    /// assert!(idem.database().is_some());
    /// # }
    /// ```
    pub fn without_deduplication(mut self) -> Self {
        self.deduplicate = false;
        self
    }

    /// The embedded default: the SQLite file at `path` (created with mode 0600, served by this
    /// process alone). Needs a tokio runtime (the sweeper).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use idem_runtime::{Idempotency, IdempotencyConfig};
    /// let dir = tempfile::tempdir().unwrap();
    /// let config = IdempotencyConfig::default().with(|c| c.required = false);
    /// let idem = Idempotency::builder(config)
    ///     .govern("tasks/cancel")
    ///     .sqlite(dir.path().join("a2a.db"))
    ///     .unwrap();
    /// assert!(idem.governs("tasks/cancel") && idem.governs("message/send"));
    /// assert!(!idem.config().required);
    /// # }
    /// ```
    pub fn sqlite(self, path: impl AsRef<Path>) -> Result<Idempotency, StoreError> {
        self.store(|config| SqliteStore::open(path, config))
    }

    /// The PostgreSQL database at `url`, which every replica of the server shares.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), idem_runtime::store::StoreError> {
    /// use idem_runtime::store::PostgresOptions;
    /// use idem_runtime::{Idempotency, IdempotencyConfig};
    /// let _idem = Idempotency::builder(IdempotencyConfig::default())
    ///     .postgres("postgres://app@127.0.0.1:5432/a2a")
    ///     .await?;
    /// // Behind PgBouncer: `url` through a session-mode pool (the sessions' bounds are
    /// // session settings), and LISTEN, which a transaction-mode pool does not carry, direct:
    /// let mut options = PostgresOptions::new("postgres://app@pgbouncer:6432/a2a");
    /// options.listen_url = Some("postgres://app@db:5432/a2a".into());
    /// options.pool_size = 32;
    /// let _idem = Idempotency::builder(IdempotencyConfig::default())
    ///     .postgres_with(options)
    ///     .await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "postgres")]
    pub async fn postgres(self, url: &str) -> Result<Idempotency, StoreError> {
        self.postgres_with(crate::store::PostgresOptions::new(url))
            .await
    }

    /// Like [`postgres`](Self::postgres), with every connection option.
    #[cfg(feature = "postgres")]
    pub async fn postgres_with(
        self,
        options: crate::store::PostgresOptions,
    ) -> Result<Idempotency, StoreError> {
        // The store checks the config before it connects.
        let clock = Arc::new(crate::clock::SystemClock);
        let store = crate::store::PostgresStore::connect_with(options, &self.config, clock);
        let store = store.await?;
        Ok(self.build(Arc::new(store)))
    }

    /// A store of the application's making, built from the config. Every way to build
    /// refuses a config whose [`checked`](IdempotencyConfig::checked) refuses.
    pub fn store<S: Store>(
        self,
        open: impl FnOnce(&IdempotencyConfig) -> Result<S, StoreError>,
    ) -> Result<Idempotency, StoreError> {
        let store = open(self.config.checked()?)?;
        Ok(self.build(Arc::new(store)))
    }

    fn build(self, store: Arc<dyn Store>) -> Idempotency {
        let cache = IdempotencyCache::from_arc(store);
        cache.spawn_sweeper(self.config.sweep_interval);
        let mut idem = Idempotency::with_cache(Some(cache), self.config);
        let state = Arc::make_mut(&mut idem.state);
        state.deduplicate = self.deduplicate;
        state.governed.extend(self.governed);
        idem
    }
}

impl Idempotency {
    /// A builder with `config`: then the store (SQLite, PostgreSQL or a custom one).
    pub fn builder(config: IdempotencyConfig) -> IdempotencyBuilder {
        IdempotencyBuilder {
            config,
            governed: Vec::new(),
            deduplicate: true,
        }
    }

    /// Opens the SQLite cache at `path` and starts its sweep: `builder(config).sqlite(path)`.
    pub fn open(path: impl AsRef<Path>, config: IdempotencyConfig) -> Result<Self, StoreError> {
        Self::builder(config).sqlite(path)
    }

    /// Connects to the PostgreSQL database at `url` (shared by every replica of the server)
    /// and starts its sweep: `builder(config).postgres(url)`.
    #[cfg(feature = "postgres")]
    pub async fn connect(url: &str, config: IdempotencyConfig) -> Result<Self, StoreError> {
        Self::builder(config).postgres(url).await
    }

    /// The same layers with the extension off: governed methods run undeduplicated (streams
    /// are still served as SSE), no extension header is read or sent, and the AgentCard
    /// lists no extension. For serving the same agent without the extension.
    pub fn off() -> Self {
        Self::with_cache(None, IdempotencyConfig::default())
    }

    fn with_cache(cache: Option<IdempotencyCache>, config: IdempotencyConfig) -> Self {
        let governed = DEFAULT_GOVERNED_METHODS
            .iter()
            .map(|m| m.to_string())
            .collect();
        let requests = Arc::new(Semaphore::new(config.max_requests_in_flight as usize));
        let state = State {
            deduplicate: cache.is_some(),
            cache,
            config,
            governed,
            requests,
        };
        Self {
            state: Arc::new(state),
        }
    }

    /// The application's handle on the store's database: `None` with [`off`](Self::off).
    pub fn database(&self) -> Option<Database> {
        let cache = self.state.cache.as_ref()?;
        Some(Database::new(cache.store().clone()))
    }

    /// The tower layer for `ServerBuilder::set_http_middleware`.
    pub fn http_layer(&self) -> HttpLayer {
        HttpLayer::new(self.state.clone())
    }

    /// The RPC layer for `ServerBuilder::set_rpc_middleware`.
    pub fn rpc_layer(&self) -> RpcLayer {
        RpcLayer::new(self.state.clone())
    }

    /// A tower layer that serves `card` as the AgentCard (`GET` and `HEAD` of
    /// `/.well-known/agent-card.json`), with this extension's entry
    /// ([`agent_card_extension`](Self::agent_card_extension)) in its
    /// `capabilities.extensions`, in place of any it had. Put it in `set_http_middleware`
    /// before the HTTP layer.
    ///
    /// ```
    /// use idem_runtime::Idempotency;
    /// let idem = Idempotency::off();
    /// let card = serde_json::json!({"name": "Echo agent", "capabilities": {"streaming": true}});
    /// let http = tower::ServiceBuilder::new()
    ///     .layer(idem.agent_card_layer(card))
    ///     .layer(idem.http_layer());
    /// ```
    pub fn agent_card_layer(&self, card: Value) -> AgentCardLayer {
        AgentCardLayer::new(card, self.agent_card_extension())
    }

    /// The AgentCard `capabilities.extensions[]` entry, from the effective config; `None`
    /// when the extension is off.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use idem_runtime::{Idempotency, IdempotencyConfig};
    /// use serde_json::json;
    /// let dir = tempfile::tempdir().unwrap();
    /// let path = dir.path().join("a2a.db");
    /// let idem = Idempotency::open(path, IdempotencyConfig::default()).unwrap();
    /// // An application that serves its own card lists the entry itself.
    /// let extensions: Vec<_> = idem.agent_card_extension().into_iter().collect();
    /// let card = json!({"name": "Echo agent", "capabilities": {"extensions": extensions}});
    /// assert_eq!(card["capabilities"]["extensions"][0]["params"]["ttl_seconds"], 86_400);
    /// assert!(Idempotency::off().agent_card_extension().is_none());
    /// # }
    /// ```
    pub fn agent_card_extension(&self) -> Option<Value> {
        self.state.deduplicating()?;
        Some(self.state.config.agent_card_extension())
    }

    /// The effective configuration.
    ///
    /// ```
    /// use idem_runtime::Idempotency;
    /// let idem = Idempotency::off();
    /// assert_eq!(idem.config().max_response_body_bytes, 10 * 1024 * 1024);
    /// ```
    pub fn config(&self) -> &IdempotencyConfig {
        &self.state.config
    }

    /// jsonrpsee's server configuration, begun with the limits of this configuration:
    /// jsonrpsee must cut requests and responses at the sizes the extension does, or a response
    /// it refuses as too big would differ from the one stored and replayed; and its
    /// `max_connections`, which counts HTTP requests in flight, is `max_requests_in_flight`,
    /// which the HTTP layer holds first (it reads bodies before jsonrpsee counts them). Set a
    /// higher bound there, not on this builder: a durable call stays in flight until its
    /// commit, so the default (100) answers 429 under load.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use idem_runtime::{Idempotency, IdempotencyConfig};
    /// let dir = tempfile::tempdir().unwrap();
    /// let config = IdempotencyConfig::default().with(|c| c.max_requests_in_flight = 4096);
    /// let idem = Idempotency::open(dir.path().join("a2a.db"), config).unwrap();
    /// let config = idem.server_config().build();
    /// let _builder = jsonrpsee::server::Server::builder().set_config(config);
    /// # }
    /// ```
    pub fn server_config(&self) -> jsonrpsee::server::ServerConfigBuilder {
        let limits = &self.state.config;
        jsonrpsee::server::ServerConfig::builder()
            .max_request_body_size(u32::try_from(limits.max_request_body_bytes).unwrap_or(u32::MAX))
            .max_response_body_size(limits.max_response_body_bytes)
            .max_connections(limits.max_requests_in_flight)
    }

    /// Waits, at most `bound`, until no execution is in flight, e.g. a stream whose client
    /// left: call it after the server stopped, before dropping the last handle. `true` if none
    /// is left (always, with the extension off).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use idem_runtime::{Idempotency, IdempotencyConfig};
    /// use std::time::Duration;
    /// let dir = tempfile::tempdir().unwrap();
    /// let path = dir.path().join("a2a.db");
    /// let idem = Idempotency::open(path, IdempotencyConfig::default()).unwrap();
    /// // ... serve; at shutdown, stop the server first (`ServerHandle::stop`, `stopped()`).
    /// // Streams whose clients left still run: give them the rest of the grace period.
    /// if !idem.quiesce(Duration::from_secs(5)).await {
    ///     eprintln!("executions still running at shutdown were not stored");
    /// }
    /// drop(idem); // the last handle: commits what is queued and joins the writer
    /// # }
    /// ```
    pub async fn quiesce(&self, bound: std::time::Duration) -> bool {
        match &self.state.cache {
            Some(cache) => cache.quiesce(bound).await,
            None => true,
        }
    }

    /// Whether `method` is governed.
    pub fn governs(&self, method: &str) -> bool {
        self.state.governed.contains(method)
    }
}
