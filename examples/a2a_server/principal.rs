//! Who calls, for the extension's key scoping (`--principal-header`): the value of one request
//! header names the caller, as the proxy in front of this agent authenticated it. The agent
//! authenticates nobody itself; without a proxy that sets the header, any client could name
//! any caller. Without the flag, no caller is named and keys are the spec's, global.

use http::{HeaderName, HeaderValue};
use idem::Caller;
use jsonrpsee::server::HttpRequest;
use tower::util::MapRequestLayer;

/// The layer, in front of the idempotency layer, which reads the [`Caller`] it inserts.
pub fn layer(
    header: Option<HeaderName>,
) -> MapRequestLayer<impl Fn(HttpRequest) -> HttpRequest + Clone> {
    MapRequestLayer::new(move |mut request: HttpRequest| {
        if let Some(header) = &header {
            // The last of several: a proxy that appends its header to the client's (instead of
            // replacing it) puts its own after, and the client's must not name the caller.
            let caller = caller(request.headers().get_all(header).iter().next_back());
            request.extensions_mut().insert(caller);
        }
        request
    })
}

/// The caller a header's value names: none (the global keys) where it is absent, empty or not
/// text.
fn caller(value: Option<&HeaderValue>) -> Caller {
    let principal = value.and_then(|v| v.to_str().ok()).map(str::trim);
    match principal {
        Some(name) if !name.is_empty() => Caller::authenticated(name),
        _ => Caller::Unauthenticated,
    }
}
