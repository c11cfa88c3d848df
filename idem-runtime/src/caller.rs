//! Who calls, as the application's own authentication established it: what key scoping and
//! the §7.4 option need to know.
//!
//! The application's auth layer (a tower layer in front of [`crate::Idempotency::http_layer`])
//! inserts a [`Caller`] into the HTTP request's extensions. Nothing else reads it: without
//! [`IdempotencyConfig::scope_keys_by_principal`] and
//! [`IdempotencyConfig::mark_replays_to_unauthenticated`] set away from their defaults, a
//! `Caller` changes nothing.

use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::config::IdempotencyConfig;
use crate::hash::Spelling;

/// Who makes a request: the application's auth layer, in front of
/// [`Idempotency::http_layer`](crate::Idempotency::http_layer), inserts it into the HTTP
/// request's extensions. It changes nothing unless
/// [`IdempotencyConfig::scope_keys_by_principal`] or
/// [`IdempotencyConfig::mark_replays_to_unauthenticated`] is set away from its default.
///
/// ```
/// use idem_runtime::Caller;
/// let mut request = http::Request::new(());
/// request.extensions_mut().insert(Caller::authenticated("client-42"));
/// let caller = request.extensions().get::<Caller>();
/// assert_eq!(caller, Some(&Caller::authenticated("client-42")));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// Authenticated as this principal: a stable identity (a token's subject, a client id),
    /// the same on every request of that caller.
    Authenticated(Arc<str>),
    /// Not authenticated (spec §7.4).
    Unauthenticated,
}

impl Caller {
    /// A caller authenticated as `principal`.
    pub fn authenticated(principal: impl Into<Arc<str>>) -> Self {
        Self::Authenticated(principal.into())
    }
}

/// One principal's keys, apart from every other caller's: a digest of the principal, so that
/// the store never holds the principal itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KeyScope([u8; 16]);

impl KeyScope {
    pub(crate) fn of(principal: &str) -> Self {
        let digest = Sha256::new()
            .chain_update(b"idempotency/v1 principal\n")
            .chain_update(principal.as_bytes())
            .finalize();
        Self(digest[..16].try_into().expect("16 of 32 bytes"))
    }

    /// The scope's part of a stored key: 32 hex digits.
    pub(crate) fn suffix(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The spelling of bytes sent by this principal: the same bytes from another caller
    /// are another spelling, so a resend is recognised only for the caller that sent them.
    pub(crate) fn spelling(&self, unscoped: Spelling) -> Spelling {
        Sha256::new()
            .chain_update(self.0)
            .chain_update(unscoped)
            .finalize()
            .into()
    }
}

/// What one HTTP request's caller changes, under the server's configuration.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CallerPolicy {
    /// Its keys' scope, where keys are scoped by principal and the caller has one.
    pub(crate) key_scope: Option<KeyScope>,
    /// Whether a replay carries `Idempotent-Replayed: true`.
    pub(crate) mark_replays: bool,
    /// Keys are scoped by principal and no `Caller` came with the request: its keys cannot
    /// be scoped, and governed calls are refused (see [`unidentified`]).
    pub(crate) unidentified: bool,
}

impl CallerPolicy {
    /// The policy for the caller in `extensions` (none inserted: an unscoped, marked one).
    pub(crate) fn of(extensions: &http::Extensions, config: &IdempotencyConfig) -> Self {
        let caller = extensions.get::<Caller>();
        let unidentified = caller.is_none() && config.scope_keys_by_principal;
        let key_scope = match caller {
            Some(Caller::Authenticated(principal)) if config.scope_keys_by_principal => {
                Some(KeyScope::of(principal))
            }
            _ => None,
        };
        let unauthenticated = matches!(caller, Some(Caller::Unauthenticated));
        Self {
            key_scope,
            mark_replays: !unauthenticated || config.mark_replays_to_unauthenticated,
            unidentified,
        }
    }

    /// `spelling`, scoped to the caller's keys.
    pub(crate) fn spelling(&self, spelling: Spelling) -> Spelling {
        match &self.key_scope {
            Some(scope) => scope.spelling(spelling),
            None => spelling,
        }
    }
}

/// The refusal of a governed call that came without a `Caller` while keys are scoped by
/// principal. Most often the auth layer is installed after the HTTP layer; served in the
/// global keys, every such caller would replay, or learn the request hash of, any other's
/// entry: what scoping is there to prevent.
pub(crate) fn unidentified() -> crate::error::IdempotencyError {
    let reason = "keys are scoped by principal, but the request reached the idempotency HTTP \
                  layer without a Caller: install the layer that inserts Caller in front of \
                  Idempotency::http_layer, and have it insert Caller::Unauthenticated for \
                  anonymous callers";
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| tracing::warn!(reason, "governed calls refused (said once)"));
    crate::error::IdempotencyError::new(crate::error::ErrorCode::LayerMissing)
        .with_detail("reason", reason)
}

impl Default for CallerPolicy {
    fn default() -> Self {
        Self {
            key_scope: None,
            mark_replays: true,
            unidentified: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(caller: Option<Caller>, config: &IdempotencyConfig) -> CallerPolicy {
        let mut extensions = http::Extensions::new();
        if let Some(caller) = caller {
            extensions.insert(caller);
        }
        CallerPolicy::of(&extensions, config)
    }

    #[test]
    fn by_default_a_caller_changes_nothing() {
        let config = IdempotencyConfig::default();
        for caller in [
            None,
            Some(Caller::Unauthenticated),
            Some(Caller::authenticated("a")),
        ] {
            let policy = policy(caller, &config);
            assert_eq!(policy.key_scope, None);
            assert!(policy.mark_replays);
        }
    }

    #[test]
    fn scoping_separates_principals_and_never_stores_one() {
        let config = IdempotencyConfig::default().with(|c| c.scope_keys_by_principal = true);
        let a = policy(Some(Caller::authenticated("alice")), &config)
            .key_scope
            .unwrap();
        let b = policy(Some(Caller::authenticated("bob")), &config)
            .key_scope
            .unwrap();
        assert_ne!(a, b);
        assert_eq!(
            a,
            policy(Some(Caller::authenticated("alice")), &config)
                .key_scope
                .unwrap()
        );
        assert_ne!(a.spelling([7; 32]), b.spelling([7; 32]));
        assert_eq!(a.suffix().len(), 32);
        assert!(!a.suffix().contains("alice"));
        assert_eq!(
            policy(Some(Caller::Unauthenticated), &config).key_scope,
            None
        );
        assert!(policy(None, &config).unidentified, "no Caller at all");
        assert!(!policy(Some(Caller::Unauthenticated), &config).unidentified);
        assert!(!policy(None, &IdempotencyConfig::default()).unidentified);
    }

    #[test]
    fn replays_to_the_unauthenticated_can_go_unmarked() {
        let config =
            IdempotencyConfig::default().with(|c| c.mark_replays_to_unauthenticated = false);
        assert!(!policy(Some(Caller::Unauthenticated), &config).mark_replays);
        assert!(policy(Some(Caller::authenticated("a")), &config).mark_replays);
        assert!(
            policy(None, &config).mark_replays,
            "only a caller marked so"
        );
    }
}
