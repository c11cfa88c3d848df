//! The extension's errors: one table of numeric codes, string codes and HTTP statuses.
//!
//! The same table is published as `idem-runtime/error-codes.json`; a test keeps the two equal.

use jsonrpsee::types::ErrorObjectOwned;
use serde_json::{json, Value};

/// The extension URI of idempotency/v1 (spec §3.1).
pub const EXTENSION_URI: &str = "https://agentic-sandbox.aiwg.io/extensions/idempotency/v1";

/// Every error the extension itself answers with.
///
/// ```
/// use idem_runtime::ErrorCode;
/// assert_eq!(ErrorCode::KeyReusedWithDifferentPayload.code(), -32422);
/// assert_eq!(ErrorCode::KeyReusedWithDifferentPayload.http_status(), 422);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorCode {
    /// Spec §4.5: the messageId is cached with another request hash (or method).
    KeyReusedWithDifferentPayload,
    /// Spec §7.1: the messageId is not a UUID-shaped 128-bit value.
    KeyMalformed,
    /// The first request with this messageId is still running past the wait bound (IETF draft: 409).
    RequestInProgress,
    /// The params cannot be hashed honestly (duplicate members, inexact numbers, not an object...).
    PayloadNotCanonicalizable,
    /// A2A's ExtensionSupportRequiredError: a governed call did not activate the required extension.
    ExtensionSupportRequired,
    /// The durable cache could not be read or written; the call is not answered as if it were cached.
    StoreUnavailable,
    /// An `#[idempotent]` method ran without the idempotency layers installed on the server.
    LayerMissing,
    /// The wrapped method body panicked; the failure is cached like any outcome (spec §7.5).
    ExecutionPanicked,
    /// A stream outgrew the recording limit and was ended with this error event.
    StreamTooLarge,
    /// A governed method called over WebSocket: the extension is defined for HTTP requests.
    HttpOnly,
    /// A database write the call staged in its unit of work failed: nothing of the call was
    /// committed, nothing is cached, and a retry executes it again.
    WriteFailed,
    /// The process serving a stream stopped before the stream ended: the stored events, then
    /// this error event, are the cached outcome.
    StreamInterrupted,
    /// The call ran past its claim's lease and another replica took the key over: nothing of
    /// the call was committed (fenced), nothing is cached; a retry gets the other's outcome.
    ClaimLost,
    /// A streaming method called inside a JSON-RPC batch: an event stream is one response of
    /// its own.
    StreamInBatch,
    /// The method's result, or one of its stream's events, does not serialize to JSON.
    ResultNotSerializable,
    /// The event stream is not there to serve (taken twice, or the stored entry of a stream
    /// is not one): an internal inconsistency, reported rather than hidden. Also what a
    /// governed method that calls `EventStream::live` gets (`data.reason` says what to return).
    StreamUnavailable,
    /// The request body is larger than `IdempotencyConfig::max_request_body_bytes` (HTTP 413;
    /// `data.limit_bytes` names the limit).
    RequestTooLarge,
    /// The method's answer is larger than `IdempotencyConfig::max_response_body_bytes`:
    /// the call ran, and this error (`data.limit_bytes`, `data.response_bytes`) is its cached
    /// outcome, answered and replayed in place of bytes jsonrpsee would not send. Also any
    /// call's answer in place of jsonrpsee's -32008 "Response is too big" (`data.limit_bytes`
    /// alone; not cached outside the extension): -32008 is A2A's ExtensionSupportRequired.
    ResponseTooLarge,
    /// A governed method answered without its `#[idempotent]` guard (the attribute is missing
    /// from its implementation): its answer is replaced by this error, nothing it staged was
    /// written, and nothing is cached.
    NotGuarded,
}

impl ErrorCode {
    /// Every code, in the order of `error-codes.json`.
    pub const ALL: [ErrorCode; 19] = [
        ErrorCode::KeyReusedWithDifferentPayload,
        ErrorCode::KeyMalformed,
        ErrorCode::RequestInProgress,
        ErrorCode::PayloadNotCanonicalizable,
        ErrorCode::ExtensionSupportRequired,
        ErrorCode::StoreUnavailable,
        ErrorCode::LayerMissing,
        ErrorCode::ExecutionPanicked,
        ErrorCode::StreamTooLarge,
        ErrorCode::HttpOnly,
        ErrorCode::WriteFailed,
        ErrorCode::StreamInterrupted,
        ErrorCode::ClaimLost,
        ErrorCode::StreamInBatch,
        ErrorCode::ResultNotSerializable,
        ErrorCode::StreamUnavailable,
        ErrorCode::RequestTooLarge,
        ErrorCode::ResponseTooLarge,
        ErrorCode::NotGuarded,
    ];

    /// The numeric JSON-RPC `error.code`.
    pub const fn code(self) -> i32 {
        match self {
            Self::KeyReusedWithDifferentPayload => -32422,
            Self::KeyMalformed => -32400,
            Self::RequestInProgress => -32409,
            Self::PayloadNotCanonicalizable => -32602,
            Self::ExtensionSupportRequired => -32008,
            Self::StoreUnavailable => -32603,
            Self::LayerMissing => -32603,
            Self::ExecutionPanicked => -32603,
            Self::StreamTooLarge => -32603,
            Self::HttpOnly => -32600,
            Self::WriteFailed => -32603,
            Self::StreamInterrupted => -32603,
            Self::ClaimLost => -32603,
            Self::StreamInBatch => -32600,
            Self::ResultNotSerializable => -32603,
            Self::StreamUnavailable => -32603,
            Self::RequestTooLarge => -32600,
            Self::ResponseTooLarge => -32603,
            Self::NotGuarded => -32603,
        }
    }

    /// The stable string code, sent as `error.data.code`.
    ///
    /// ```
    /// use idem_runtime::ErrorCode;
    /// // Clients tell the extension's errors apart by `error.data.code` (several share -32603).
    /// let data = serde_json::json!({"code": "IDEMPOTENCY_REQUEST_IN_PROGRESS"});
    /// let code = ErrorCode::ALL.into_iter().find(|c| data["code"] == c.name());
    /// assert_eq!(code, Some(ErrorCode::RequestInProgress));
    /// assert_eq!(ErrorCode::RequestInProgress.to_json()["numeric"], -32409);
    /// let message = ErrorCode::RequestInProgress.message();
    /// assert_eq!(message, "A request with this idempotency key is still in progress");
    /// ```
    pub const fn name(self) -> &'static str {
        match self {
            Self::KeyReusedWithDifferentPayload => "IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_PAYLOAD",
            Self::KeyMalformed => "IDEMPOTENCY_KEY_MALFORMED",
            Self::RequestInProgress => "IDEMPOTENCY_REQUEST_IN_PROGRESS",
            Self::PayloadNotCanonicalizable => "IDEMPOTENCY_PAYLOAD_NOT_CANONICALIZABLE",
            Self::ExtensionSupportRequired => "EXTENSION_SUPPORT_REQUIRED",
            Self::StoreUnavailable => "IDEMPOTENCY_STORE_UNAVAILABLE",
            Self::LayerMissing => "IDEMPOTENCY_LAYER_MISSING",
            Self::ExecutionPanicked => "IDEMPOTENCY_EXECUTION_PANICKED",
            Self::StreamTooLarge => "IDEMPOTENCY_STREAM_TOO_LARGE",
            Self::HttpOnly => "IDEMPOTENCY_HTTP_ONLY",
            Self::WriteFailed => "IDEMPOTENCY_WRITE_FAILED",
            Self::StreamInterrupted => "IDEMPOTENCY_STREAM_INTERRUPTED",
            Self::ClaimLost => "IDEMPOTENCY_CLAIM_LOST",
            Self::StreamInBatch => "IDEMPOTENCY_STREAM_IN_BATCH",
            Self::ResultNotSerializable => "IDEMPOTENCY_RESULT_NOT_SERIALIZABLE",
            Self::StreamUnavailable => "IDEMPOTENCY_STREAM_UNAVAILABLE",
            Self::RequestTooLarge => "IDEMPOTENCY_REQUEST_TOO_LARGE",
            Self::ResponseTooLarge => "IDEMPOTENCY_RESPONSE_TOO_LARGE",
            Self::NotGuarded => "IDEMPOTENCY_METHOD_NOT_GUARDED",
        }
    }

    /// The HTTP status of a single (non-batch) response carrying this error.
    pub const fn http_status(self) -> u16 {
        match self {
            Self::KeyReusedWithDifferentPayload => 422,
            Self::KeyMalformed
            | Self::PayloadNotCanonicalizable
            | Self::ExtensionSupportRequired => 400,
            Self::RequestInProgress => 409,
            Self::RequestTooLarge => 413,
            // An executed call's outcome, or a server fault, keeps jsonrpsee's usual 200.
            Self::StoreUnavailable
            | Self::LayerMissing
            | Self::ExecutionPanicked
            | Self::StreamTooLarge
            | Self::HttpOnly
            | Self::WriteFailed
            | Self::StreamInterrupted
            | Self::ClaimLost
            | Self::StreamInBatch
            | Self::ResultNotSerializable
            | Self::StreamUnavailable
            | Self::ResponseTooLarge
            | Self::NotGuarded => 200,
        }
    }

    /// The human-readable `error.message`.
    pub const fn message(self) -> &'static str {
        match self {
            Self::KeyReusedWithDifferentPayload => "Idempotency key reused with different payload",
            Self::KeyMalformed => "Malformed idempotency key: params.message.messageId",
            Self::RequestInProgress => "A request with this idempotency key is still in progress",
            Self::PayloadNotCanonicalizable => "Params cannot be canonicalized for idempotency",
            Self::ExtensionSupportRequired => "Extension support required",
            Self::StoreUnavailable => "Idempotency cache unavailable",
            Self::LayerMissing => "Idempotency layers are not installed on this server",
            Self::ExecutionPanicked => "Internal error: the method panicked",
            Self::StreamTooLarge => "The event stream exceeded the recording limit",
            Self::HttpOnly => "Idempotent methods are served over HTTP only, not WebSocket",
            Self::WriteFailed => "The call's database writes failed; nothing was stored, retry",
            Self::StreamInterrupted => "The event stream was interrupted before it ended",
            Self::ClaimLost => {
                "The call's claim was taken over by another replica; nothing of it was stored, retry"
            }
            Self::StreamInBatch => "Streaming calls cannot be batched",
            Self::ResultNotSerializable => "The method's result does not serialize to JSON",
            Self::StreamUnavailable => "The event stream is not available",
            Self::RequestTooLarge => "Request body too large",
            Self::ResponseTooLarge => "The method's response exceeds the server's size limit",
            Self::NotGuarded => {
                "The method is governed by idempotency/v1 but not #[idempotent]; nothing it staged was stored"
            }
        }
    }

    /// The code as one row of `error-codes.json`.
    pub fn to_json(self) -> Value {
        json!({
            "code": self.name(),
            "numeric": self.code(),
            "http_status": self.http_status(),
            "message": self.message(),
        })
    }
}

/// An extension error ready to be answered: a code plus the details that go into `error.data`.
///
/// ```
/// use idem_runtime::{ErrorCode, IdempotencyError};
/// let err = IdempotencyError::new(ErrorCode::KeyMalformed).with_detail("reason", "empty");
/// let obj = err.to_error_object();
/// assert_eq!(obj.code(), -32400);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct IdempotencyError {
    /// Which error this is.
    pub code: ErrorCode,
    /// Members of `error.data` besides `code`.
    pub details: serde_json::Map<String, Value>,
}

impl IdempotencyError {
    /// An error with no details.
    pub fn new(code: ErrorCode) -> Self {
        Self {
            code,
            details: serde_json::Map::new(),
        }
    }

    /// Adds one member to `error.data`.
    pub fn with_detail(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.details.insert(key.to_owned(), value.into());
        self
    }

    /// The JSON-RPC error object: `{code, message, data: {code: NAME, ...details}}`.
    pub fn to_error_object(&self) -> ErrorObjectOwned {
        let mut data = serde_json::Map::with_capacity(self.details.len() + 1);
        data.insert("code".into(), self.code.name().into());
        data.extend(self.details.clone());
        ErrorObjectOwned::owned(
            self.code.code(),
            self.code.message(),
            Some(Value::Object(data)),
        )
    }
}

impl std::fmt::Display for IdempotencyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.code.message(), self.code.name())?;
        if let Some(Value::String(reason)) = self.details.get("reason") {
            write!(f, ": {reason}")?;
        }
        Ok(())
    }
}

impl std::error::Error for IdempotencyError {}

impl From<ErrorCode> for IdempotencyError {
    fn from(code: ErrorCode) -> Self {
        Self::new(code)
    }
}

impl From<IdempotencyError> for ErrorObjectOwned {
    fn from(err: IdempotencyError) -> Self {
        err.to_error_object()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn published_table_matches_the_code() {
        let published: Value =
            serde_json::from_str(include_str!("../error-codes.json")).expect("valid JSON");
        let ours: Vec<Value> = ErrorCode::ALL.iter().map(|c| c.to_json()).collect();
        assert_eq!(published["extension"], EXTENSION_URI);
        assert_eq!(published["errors"], Value::Array(ours));
    }

    #[test]
    fn string_codes_are_unique() {
        let mut names: Vec<_> = ErrorCode::ALL.iter().map(|c| c.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ErrorCode::ALL.len());
    }

    #[test]
    fn error_object_carries_string_code_and_details() {
        let obj = IdempotencyError::new(ErrorCode::KeyReusedWithDifferentPayload)
            .with_detail("message_id", "m")
            .to_error_object();
        let data: Value = serde_json::from_str(obj.data().unwrap().get()).unwrap();
        assert_eq!(
            data["code"],
            "IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_PAYLOAD"
        );
        assert_eq!(data["message_id"], "m");
        assert_eq!(
            obj.message(),
            "Idempotency key reused with different payload"
        );
    }
}
