//! The handle an application builds once and installs on its jsonrpsee server.

use std::path::Path;
use std::sync::Arc;

use serde_json::Value;

use crate::claim::IdempotencyCache;
use crate::config::IdempotencyConfig;
use crate::layers::http::HttpLayer;
use crate::layers::rpc::RpcLayer;
use crate::state::State;
use crate::store::database::Database;
use crate::store::sqlite::SqliteStore;
use crate::store::StoreError;

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
#[derive(Clone)]
pub struct Idempotency {
    state: Arc<State>,
}

impl Idempotency {
    /// Opens the SQLite cache at `path` and starts its periodic sweep (needs a tokio runtime).
    pub fn open(path: impl AsRef<Path>, config: IdempotencyConfig) -> Result<Self, StoreError> {
        let cache = IdempotencyCache::new(SqliteStore::open(path, &config)?);
        cache.spawn_sweeper(config.sweep_interval);
        Ok(Self::new(cache, config))
    }

    /// Connects to the PostgreSQL database at `url` (shared by every replica of the server)
    /// and starts its periodic sweep.
    #[cfg(feature = "postgres")]
    pub async fn connect(url: &str, config: IdempotencyConfig) -> Result<Self, StoreError> {
        let store = crate::store::postgres::PostgresStore::connect(url, &config).await?;
        let cache = IdempotencyCache::new(store);
        cache.spawn_sweeper(config.sweep_interval);
        Ok(Self::new(cache, config))
    }

    /// The extension over an existing cache (no sweeper is started).
    pub fn new(cache: IdempotencyCache, config: IdempotencyConfig) -> Self {
        Self::with_cache(Some(cache), config)
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
        let state = State {
            deduplicate: cache.is_some(),
            cache,
            config,
            governed,
        };
        Self {
            state: Arc::new(state),
        }
    }

    /// The same store with deduplication off: governed methods run undeduplicated, no
    /// extension header is read or sent, and the AgentCard lists no extension; their units of
    /// work still commit through the store's writer, so the application keeps one code path.
    pub fn without_deduplication(mut self) -> Self {
        Arc::make_mut(&mut self.state).deduplicate = false;
        self
    }

    /// The application's handle on the store's database: `None` with [`off`](Self::off).
    pub fn database(&self) -> Option<Database> {
        let cache = self.state.cache.as_ref()?;
        Some(Database::new(cache.store().clone()))
    }

    /// Puts one more method in scope (spec §4.1 lets other extensions extend it).
    pub fn govern(mut self, method: &str) -> Self {
        Arc::make_mut(&mut self.state)
            .governed
            .insert(method.to_owned());
        self
    }

    /// The tower layer for `ServerBuilder::set_http_middleware`.
    pub fn http_layer(&self) -> HttpLayer {
        HttpLayer::new(self.state.clone())
    }

    /// The RPC layer for `ServerBuilder::set_rpc_middleware`.
    pub fn rpc_layer(&self) -> RpcLayer {
        RpcLayer::new(self.state.clone())
    }

    /// The AgentCard `capabilities.extensions[]` entry, from the effective config; `None`
    /// when the extension is off.
    pub fn agent_card_extension(&self) -> Option<Value> {
        self.state.deduplicating()?;
        Some(self.state.config.agent_card_extension())
    }

    /// The effective configuration.
    pub fn config(&self) -> &IdempotencyConfig {
        &self.state.config
    }

    /// The cache; `None` when the extension is off.
    pub fn cache(&self) -> Option<&IdempotencyCache> {
        self.state.deduplicating()
    }

    /// Waits, at most `bound`, until no execution is in flight, e.g. a stream whose client
    /// left: call it after the server stopped, before dropping the last handle. `true` if none
    /// is left (always, with the extension off).
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
