//! Who calls, for the extension's key scoping (`--principal-header`): the value of one request
//! header names the caller, as the proxy in front of this agent authenticated it. The agent
//! authenticates nobody itself; without a proxy that sets the header, any client could name
//! any caller. Without the flag, no caller is named and keys are the spec's, global.

use http::{HeaderName, HeaderValue};
use idem::Caller;
use jsonrpsee::server::HttpRequest;
use tower::util::MapRequestLayer;

/// What leads the name of a caller whose header value is not UTF-8.
const NOT_TEXT: char = '\u{7f}';

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

/// The caller a header's value names: none (the global keys) where it is absent or empty.
/// Any other value is a caller of its own, whatever its bytes: a name in UTF-8 (`josé`) is
/// that text, and one that is not UTF-8 (a proxy's Latin-1) is its bytes in hex after a DEL,
/// which no header value holds, so it is apart from every text name. Both used to fall into
/// the global keys, where every such caller, and every anonymous one, replayed the others'
/// entries (a review). A DEL, not a NUL: `idem-admin --principal` can be given it, and a NUL
/// no command line can carry (helper-94).
fn caller(value: Option<&HeaderValue>) -> Caller {
    let Some(bytes) = value.map(|value| value.as_bytes().trim_ascii()) else {
        return Caller::Unauthenticated;
    };
    if bytes.is_empty() {
        return Caller::Unauthenticated;
    }
    match std::str::from_utf8(bytes) {
        Ok(name) => Caller::authenticated(name),
        Err(_) => {
            let hex: String = bytes.iter().map(|byte| format!("{byte:02x}")).collect();
            Caller::authenticated(format!("{NOT_TEXT}{hex}"))
        }
    }
}
