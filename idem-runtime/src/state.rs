//! What the HTTP layer, the RPC layer and every guarded call share: the cache, the effective
//! config, the governed methods. Its own module, so that the layers depend on it and not on the
//! handle that builds them.

use std::collections::HashSet;
use std::sync::Arc;

use tokio::sync::Semaphore;

use crate::claim::IdempotencyCache;
use crate::config::IdempotencyConfig;

/// Shared by both layers and every guarded call.
#[derive(Clone)]
pub(crate) struct State {
    /// `None` when the extension is off.
    pub(crate) cache: Option<IdempotencyCache>,
    /// `false` when the store serves units of work only and deduplicates nothing.
    pub(crate) deduplicate: bool,
    pub(crate) config: IdempotencyConfig,
    pub(crate) governed: HashSet<String>,
    /// The HTTP requests the HTTP layer may read and serve at once
    /// (`max_requests_in_flight`), shared by every clone of the layer.
    pub(crate) requests: Arc<Semaphore>,
}

impl State {
    /// The cache, when calls are deduplicated.
    pub(crate) fn deduplicating(&self) -> Option<&IdempotencyCache> {
        self.cache.as_ref().filter(|_| self.deduplicate)
    }
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut governed: Vec<&String> = self.governed.iter().collect();
        governed.sort();
        f.debug_struct("Idempotency")
            .field("deduplicating", &self.deduplicating().is_some())
            .field("database", &self.cache.is_some())
            .field("governed", &governed)
            .field("config", &self.config)
            .finish()
    }
}
