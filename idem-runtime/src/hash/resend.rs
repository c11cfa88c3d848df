//! Recognising a resend of the very same bytes, cheaply enough for every request.
//!
//! A resend is recognised by its bytes' SHA-256 ([`Spelling`]), which the memory tier
//! remembers with the entry that answered them. Most requests are no resend, and a SHA-256
//! of a request's 2 KB costs about 2 µs: too much to pay twice (the body, the params) on every
//! first execution. So the tier files each spelling under a [`Glimpse`] of the same bytes, a
//! keyed 64-bit hash that costs a tenth of that, and bytes are spelled only when their glimpse
//! is one it holds. A glimpse is no proof (two byte strings may share one): the spelling is.
//!
//! Spellings are remembered when an entry answers a call by its key (the guard's replay),
//! not when the call first runs: a first execution spells nothing, and the first retry of it
//! teaches the tier its bytes for the next.

use std::hash::BuildHasher;
use std::sync::LazyLock;

use bytes::Bytes;

use crate::hash::{request_spelling, spelling, Spelling};

/// A keyed 64-bit hash of raw bytes (see the module's text).
pub type Glimpse = u64;

/// Seeded per process. Bytes aimed at a remembered spelling's glimpse cost one SHA-256, as
/// any resend does: a glimpse filters, the spelling decides.
static SEED: LazyLock<foldhash::quality::RandomState> = LazyLock::new(Default::default);

/// The [`Glimpse`] of `bytes`.
///
/// ```
/// use idem_runtime::hash::glimpse;
/// assert_eq!(glimpse(b"{}"), glimpse(b"{}"));
/// ```
pub fn glimpse(bytes: &[u8]) -> Glimpse {
    SEED.hash_one(bytes)
}

/// Bytes a call came with, as a resend of them would be recognised: glimpsed at once,
/// spelled only when asked.
#[derive(Clone)]
pub(crate) struct Sent {
    pub(crate) glimpse: Glimpse,
    bytes: Bytes,
    whole_request: bool,
}

impl Sent {
    /// A call's raw params.
    pub(crate) fn params(raw: &[u8]) -> Self {
        Self {
            glimpse: glimpse(raw),
            bytes: Bytes::copy_from_slice(raw),
            whole_request: false,
        }
    }

    /// A whole HTTP request body (shared, not copied).
    pub(crate) fn request(body: Bytes) -> Self {
        Self {
            glimpse: glimpse(&body),
            bytes: body,
            whole_request: true,
        }
    }

    /// The bytes' [`Spelling`]: a request body's apart from any params' (`request_spelling`).
    pub(crate) fn spelling(&self) -> Spelling {
        match self.whole_request {
            true => request_spelling(&self.bytes),
            false => spelling(&self.bytes),
        }
    }
}
