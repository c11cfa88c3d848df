//! When the relay tries a failed event again, and how long an event has been failing.

use std::time::Duration;

/// The first retry's wait; each failure doubles it, up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// The wait after the `failures`-th failed attempt: 100 ms, doubling, at most 5 s.
pub fn backoff(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    FIRST_BACKOFF
        .saturating_mul(1 << doublings)
        .min(MAX_BACKOFF)
}

/// The waits between `failures` failed attempts, summed: how long an event has been failing,
/// not counting the attempts' own time, nor any time no relay ran. A day of them is 17,285
/// attempts (5 s apart past the sixth).
pub fn waited(failures: u32) -> Duration {
    let doubling = (1..=failures.min(6)).map(backoff).sum::<Duration>();
    doubling + MAX_BACKOFF * failures.saturating_sub(6)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_to_5_s_and_a_day_of_it_is_17_285_attempts() {
        let waits: Vec<u128> = (1..=8).map(|n| backoff(n).as_millis()).collect();
        assert_eq!(waits, [100, 200, 400, 800, 1600, 3200, 5000, 5000]);
        assert_eq!(waited(0), Duration::ZERO);
        assert_eq!(waited(4), Duration::from_millis(1500));
        assert_eq!(waited(8), Duration::from_millis(16_300));
        let day = Duration::from_secs(86_400);
        let attempts = (0..).find(|&n| waited(n) >= day).unwrap();
        assert_eq!(attempts, 17_285);
    }
}
