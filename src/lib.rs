//! Idempotency for jsonrpsee-based A2A servers: the A2A extension `idempotency/v1`.
//!
//! Put `#[idempotent]` on the send methods of your `#[rpc(server)]` impl and install the two
//! layers of an [`Idempotency`] on the server; a retried `message/send` or `message/stream`
//! then never causes duplicate work. See the README for the whole picture.
//!
//! What an application names is here at the root: the attribute, [`Idempotency`] (the handle
//! that opens the store and hands out the layers), [`IdempotencyConfig`], the two return types
//! an `#[idempotent]` method may have ([`Replayable`] for one answer, [`EventStream`] for a
//! stream), [`UnitOfWork`] (the writes that commit with the cache entry), and the errors
//! ([`IdempotencyError`], [`ErrorCode`]), and [`Caller`] (who calls, for key scoping). The
//! rest has a module of its own: [`store`] (the SQLite and PostgreSQL stores, the
//! application's [`store::Database`]), [`layers`], [`hash`], [`message_id`], [`config`],
//! [`telemetry`] (the metrics), [`admin`] (the operator's view), [`testing`] (the manual clock).
//!
//! ```
//! use idem::{idempotent, Replayable};
//! use jsonrpsee::core::{async_trait, RpcResult};
//! use jsonrpsee::proc_macros::rpc;
//! use jsonrpsee::Extensions;
//! use serde_json::{json, Value};
//!
//! #[rpc(server)]
//! trait A2a {
//!     #[method(name = "message/send", with_extensions)]
//!     async fn send(&self, message: Value) -> RpcResult<Replayable<Value>>;
//! }
//!
//! struct Agent;
//!
//! #[async_trait]
//! impl A2aServer for Agent {
//!     #[idempotent]
//!     async fn send(&self, ext: &Extensions, message: Value) -> RpcResult<Replayable<Value>> {
//!         Ok(json!({"kind": "task", "id": "t1", "history": [message]}).into())
//!     }
//! }
//!
//! let _methods = Agent.into_rpc();
//! ```

pub use idem_macros::idempotent;
pub use idem_runtime::*;
