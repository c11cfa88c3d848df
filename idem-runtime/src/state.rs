//! What the HTTP layer, the RPC layer and every guarded call share: the cache, the effective
//! config, the governed methods. Its own module, so that the layers depend on it and not on the
//! handle that builds them.

use std::collections::HashSet;

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
}

impl State {
    /// The cache, when calls are deduplicated.
    pub(crate) fn deduplicating(&self) -> Option<&IdempotencyCache> {
        self.cache.as_ref().filter(|_| self.deduplicate)
    }
}
