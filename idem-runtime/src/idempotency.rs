//! The handle an application builds once and installs on its jsonrpsee server.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use serde_json::Value;

use crate::cache::IdempotencyCache;
use crate::config::IdempotencyConfig;
use crate::http_layer::HttpLayer;
use crate::rpc_layer::RpcLayer;
use crate::sqlite_store::SqliteStore;
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

/// Shared by both layers and every guarded call.
pub(crate) struct State {
    pub(crate) cache: IdempotencyCache,
    pub(crate) config: IdempotencyConfig,
    pub(crate) governed: HashSet<String>,
}

impl Idempotency {
    /// Opens the SQLite cache at `path` and starts its periodic sweep (needs a tokio runtime).
    pub fn open(path: impl AsRef<Path>, config: IdempotencyConfig) -> Result<Self, StoreError> {
        let cache = IdempotencyCache::new(SqliteStore::open(path, &config)?);
        cache.spawn_sweeper(config.sweep_interval);
        Ok(Self::new(cache, config))
    }

    /// The extension over an existing cache (no sweeper is started).
    pub fn new(cache: IdempotencyCache, config: IdempotencyConfig) -> Self {
        let governed = DEFAULT_GOVERNED_METHODS
            .iter()
            .map(|m| m.to_string())
            .collect();
        Self {
            state: Arc::new(State {
                cache,
                config,
                governed,
            }),
        }
    }

    /// Puts one more method in scope (spec §4.1 lets other extensions extend it).
    pub fn govern(self, method: &str) -> Self {
        let State {
            cache,
            config,
            mut governed,
        } = Arc::try_unwrap(self.state).unwrap_or_else(|shared| State {
            cache: shared.cache.clone(),
            config: shared.config.clone(),
            governed: shared.governed.clone(),
        });
        governed.insert(method.to_owned());
        Self {
            state: Arc::new(State {
                cache,
                config,
                governed,
            }),
        }
    }

    /// The tower layer for `ServerBuilder::set_http_middleware`.
    pub fn http_layer(&self) -> HttpLayer {
        HttpLayer::new(self.state.clone())
    }

    /// The RPC layer for `ServerBuilder::set_rpc_middleware`.
    pub fn rpc_layer(&self) -> RpcLayer {
        RpcLayer::new(self.state.clone())
    }

    /// The AgentCard `capabilities.extensions[]` entry, from the effective config.
    pub fn agent_card_extension(&self) -> Value {
        self.state.config.agent_card_extension()
    }

    /// The effective configuration.
    pub fn config(&self) -> &IdempotencyConfig {
        &self.state.config
    }

    /// The cache.
    pub fn cache(&self) -> &IdempotencyCache {
        &self.state.cache
    }

    /// Whether `method` is governed.
    pub fn governs(&self, method: &str) -> bool {
        self.state.governed.contains(method)
    }
}
