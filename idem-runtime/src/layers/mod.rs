//! The two jsonrpsee layers an application installs, in the order a request meets them: the
//! HTTP layer (`http.rs`: activation, the whole-body resend fast path, the status and headers
//! of the answer) and the RPC layer (`rpc.rs`: which calls are governed, the params' hash and
//! key, the call's unit of work); `scope.rs` is what the first hands the second, `activation.rs`
//! how a request activates the extension, `content_type.rs` which `Content-Type`s are JSON,
//! `invalid_request.rs` the JSON-RPC 2.0 answers the HTTP layer gives where jsonrpsee's
//! differ; `agent_card.rs` serves the AgentCard, in front.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use idem_runtime::{Idempotency, IdempotencyConfig};
//! use jsonrpsee::server::{middleware::rpc::RpcServiceBuilder, Server};
//! let idem = Idempotency::open("a2a.db", IdempotencyConfig::default())?;
//! let (http, rpc) = (idem.http_layer(), idem.rpc_layer());
//! let server = Server::builder()
//!     .set_http_middleware(tower::ServiceBuilder::new().layer(http))
//!     .set_rpc_middleware(RpcServiceBuilder::new().layer(rpc))
//!     .build("127.0.0.1:8080")
//!     .await?;
//! # Ok(()) }
//! ```

pub(crate) mod activation;
pub(crate) mod agent_card;
pub(crate) mod content_type;
pub(crate) mod http;
pub(crate) mod invalid_request;
pub(crate) mod rpc;
pub(crate) mod scope;

pub use crate::error::EXTENSION_URI;
pub use crate::guard::sse::EVENT_STREAM;
pub use crate::idempotency::DEFAULT_GOVERNED_METHODS;
pub use activation::{is_activated, A2A_EXTENSIONS, X_A2A_EXTENSIONS};
pub use agent_card::{AgentCardLayer, AgentCardService, AGENT_CARD_PATH};
pub use http::{Admission, HttpLayer, HttpService, TooBusy, IDEMPOTENT_REPLAYED};
pub use rpc::{RpcLayer, RpcService};
