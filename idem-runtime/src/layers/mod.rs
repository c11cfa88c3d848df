//! The two jsonrpsee layers an application installs, in the order a request meets them: the
//! HTTP layer (`http.rs`: activation, the whole-body resend fast path, the status and headers
//! of the answer) and the RPC layer (`rpc.rs`: which calls are governed, the params' hash and
//! key, the call's unit of work); `scope.rs` is what the first hands the second, `activation.rs`
//! how a request activates the extension.

pub(crate) mod activation;
pub(crate) mod http;
pub(crate) mod rpc;
pub(crate) mod scope;
