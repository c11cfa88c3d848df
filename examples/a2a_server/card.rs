//! The AgentCard (served by `front.rs`). One card serves both versions: the 0.3 required
//! fields and the 1.0 `supportedInterfaces` side by side (each version ignores the other's
//! members).

use serde_json::{json, Value};

/// Where A2A clients look for the card (the front serves it itself: it answers the card's
/// requests by the activation and version rules of its other answers).
pub const CARD_PATH: &str = idem::layers::AGENT_CARD_PATH;

/// The card of this agent, reached at `url`; `extensions` goes to `capabilities.extensions`.
pub fn agent_card(url: &str, extensions: Vec<Value>) -> Value {
    json!({
        "protocolVersion": "0.3.0",
        "name": "idem example agent",
        "description": "Assigns missions that echo their text, deduplicated by the idempotency/v1 extension.",
        "url": url,
        "preferredTransport": "JSONRPC",
        "supportsAuthenticatedExtendedCard": false,
        "supportedInterfaces": [
            { "url": url, "protocolBinding": "JSONRPC", "protocolVersion": "1.0" },
            { "url": url, "protocolBinding": "JSONRPC", "protocolVersion": "0.3" },
        ],
        "version": env!("CARGO_PKG_VERSION"),
        "capabilities": {
            "streaming": true,
            "pushNotifications": true,
            "extendedAgentCard": false,
            "extensions": extensions,
        },
        "defaultInputModes": ["text/plain"],
        "defaultOutputModes": ["text/plain"],
        "skills": [{
            "id": "mission",
            "name": "Mission",
            "description": "Works on the message for metadata.durationMs (default 2000) and completes with an artifact echoing its text parts.",
            "tags": ["mission", "echo"],
            "examples": ["Survey the north ridge"],
        }],
    })
}
