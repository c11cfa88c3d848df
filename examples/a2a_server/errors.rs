//! The JSON-RPC errors this agent answers with (A2A error codes, see the A2A specification).

use jsonrpsee::types::ErrorObjectOwned;
use serde_json::json;

/// -32602: the params are well-formed JSON-RPC but not a request this agent can act on.
pub fn invalid_params(reason: impl Into<String>) -> ErrorObjectOwned {
    ErrorObjectOwned::owned(
        -32602,
        "Invalid params",
        Some(json!({ "reason": reason.into() })),
    )
}

/// The code of [`task_not_found`].
pub const TASK_NOT_FOUND: i32 = -32001;

/// -32001 TaskNotFoundError.
pub fn task_not_found(task_id: &str) -> ErrorObjectOwned {
    ErrorObjectOwned::owned(
        TASK_NOT_FOUND,
        "Task not found",
        Some(json!({ "taskId": task_id })),
    )
}

/// -32002 TaskNotCancelableError: the task already reached a terminal state.
pub fn task_not_cancelable(task_id: &str, state: &str) -> ErrorObjectOwned {
    ErrorObjectOwned::owned(
        -32002,
        "Task cannot be canceled",
        Some(json!({ "taskId": task_id, "state": state })),
    )
}

/// -32004 UnsupportedOperationError: A2A tasks never restart once terminal.
pub fn task_terminal(task_id: &str, state: &str) -> ErrorObjectOwned {
    ErrorObjectOwned::owned(
        -32004,
        "Task is in a terminal state and accepts no more messages",
        Some(json!({ "taskId": task_id, "state": state })),
    )
}

/// -32004 UnsupportedOperationError: A2A 1.0 (§3.1.6) has no subscription to a task that ended.
pub fn subscription_to_ended_task(task_id: &str, state: &str) -> ErrorObjectOwned {
    ErrorObjectOwned::owned(
        -32004,
        "Task is in a terminal state: there is nothing to subscribe to (GetTask reads it)",
        Some(json!({ "taskId": task_id, "state": state })),
    )
}

/// -32005 ContentTypeNotSupportedError: a part this agent cannot work on (it reads text).
pub fn content_type_not_supported(index: usize, kind: &str) -> ErrorObjectOwned {
    ErrorObjectOwned::owned(
        -32005,
        "Incompatible content types",
        Some(json!({
            "reason": format!("message.parts[{index}] is a {kind} part; this agent reads text parts only"),
            "part": index,
            "kind": kind,
            "acceptedInputModes": ["text/plain"],
        })),
    )
}

/// -32007 ExtendedAgentCardNotConfiguredError (0.3: AuthenticatedExtendedCardNotConfigured):
/// the one card this agent has is the public one.
pub fn extended_card_not_configured() -> ErrorObjectOwned {
    ErrorObjectOwned::owned(
        -32007,
        "Extended agent card not configured",
        Some(
            json!({ "reason": "this agent serves its public card only, at /.well-known/agent-card.json" }),
        ),
    )
}

/// -32000: an application-level failure of the mission itself. It is cached like a success,
/// so a retry with the same messageId gets the same failure (idempotency/v1 §7.5).
pub fn mission_failed(reason: &str) -> ErrorObjectOwned {
    ErrorObjectOwned::owned(-32000, "Mission failed", Some(json!({ "reason": reason })))
}

/// -32603: a task still working a minute past its due time (its completion could not be
/// written: the store fails): a stream that waited for its end ends with this, not with a
/// last status that is not terminal.
pub fn task_not_ended(task_id: &str) -> ErrorObjectOwned {
    ErrorObjectOwned::owned(
        -32603,
        "Internal error: the task has not ended a minute past its due time; subscribe again",
        Some(json!({ "taskId": task_id })),
    )
}

/// -32603: the task store failed; details go to the log, not to the client.
pub fn internal() -> ErrorObjectOwned {
    ErrorObjectOwned::owned(-32603, "Internal error", None::<()>)
}
