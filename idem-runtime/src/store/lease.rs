//! A won claim, as the call that won it holds it until its outcome is stored.

use std::sync::Arc;

/// A won claim. Where one process serves the store (SQLite) it is exclusive and never
/// expires; where several share it (PostgreSQL) it is a lease that the store renews while the
/// execution runs, and its fence is what every write of the call is checked against: a call
/// whose lease was taken over commits nothing.
#[derive(Debug)]
pub struct Lease {
    fence: i64,
    renewal: Option<Renewal>,
}

/// What keeps a shared store's lease alive: the flag that tells its renewal the call is ending
/// its own claim (a claim it then finds gone is not a takeover), and what stops the renewal.
struct Renewal {
    ending: Arc<std::sync::atomic::AtomicBool>,
    stop: Option<Box<dyn FnOnce() + Send + Sync>>,
}

impl std::fmt::Debug for Renewal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Renewal")
            .field("ending", &self.ending)
            .finish_non_exhaustive()
    }
}

impl Lease {
    /// The claim of a store that one process serves: nothing to renew, nothing to fence.
    pub fn exclusive() -> Self {
        Self {
            fence: 0,
            renewal: None,
        }
    }

    /// A lease with `fence`, renewed until the lease is dropped, which runs `stop`; `ending`,
    /// shared with the renewal, is set by [`end`](Self::end).
    pub fn renewed(
        fence: i64,
        ending: Arc<std::sync::atomic::AtomicBool>,
        stop: impl FnOnce() + Send + Sync + 'static,
    ) -> Self {
        Self {
            fence,
            renewal: Some(Renewal {
                ending,
                stop: Some(Box::new(stop)),
            }),
        }
    }

    /// The fencing number: larger for every later claim of any key.
    pub fn fence(&self) -> i64 {
        self.fence
    }

    /// The call is about to end its claim by storing its outcome: a renewal that finds the
    /// claim gone from then on is not told of a takeover.
    pub fn end(&self) {
        if let Some(renewal) = &self.renewal {
            renewal
                .ending
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(stop) = self.renewal.as_mut().and_then(|r| r.stop.take()) {
            stop();
        }
    }
}
