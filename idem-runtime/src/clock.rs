//! Time, injectable so that TTL tests run in milliseconds instead of hours.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of wall-clock time in milliseconds since the Unix epoch.
pub trait Clock: Send + Sync + 'static {
    /// Now, in milliseconds since the Unix epoch.
    fn now_millis(&self) -> u64;

    /// Now, in whole seconds since the Unix epoch (the unit of `inserted_at`, spec §4.4).
    fn now_seconds(&self) -> u64 {
        self.now_millis() / 1000
    }
}

/// The system clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_millis(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    }
}

/// A clock that moves only when told to.
///
/// ```
/// use idem_runtime::testing::{Clock, ManualClock};
/// use std::time::Duration;
/// let clock = ManualClock::new(1_000_000);
/// clock.advance(Duration::from_secs(86_401));
/// assert_eq!(clock.now_seconds(), 1_000 + 86_401);
/// ```
#[derive(Debug, Default)]
pub struct ManualClock(AtomicU64);

impl ManualClock {
    /// A clock reading `millis`.
    pub fn new(millis: u64) -> Self {
        Self(AtomicU64::new(millis))
    }

    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(by.as_millis() as u64, Ordering::SeqCst);
    }

    /// Moves the clock back, as a wall clock that NTP steps back does.
    pub fn step_back(&self, by: Duration) {
        self.0.fetch_sub(by.as_millis() as u64, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_millis(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}
