//! A failure that a thread meets again at every tick: the checkpointer's, four times a second
//! on a full disk. Logged at every tick, one full disk wrote 345,600 lines a day, to that disk
//! (helper-63). It is logged when it starts, at most once every [`SAID_AGAIN_AFTER`] while it
//! lasts, and once when it ends.

use std::fmt::Display;
use std::time::{Duration, Instant};

/// How long a failure that goes on is not logged again.
const SAID_AGAIN_AFTER: Duration = Duration::from_secs(60);

/// One kind of attempt that a thread repeats, and how its failures have been logged.
pub(crate) struct RepeatedFailure {
    /// What is attempted, as the log names it.
    what: &'static str,
    /// Failures in a row.
    failures: u64,
    /// When the failure was last logged.
    said_at: Option<Instant>,
}

impl RepeatedFailure {
    pub(crate) const fn new(what: &'static str) -> Self {
        Self {
            what,
            failures: 0,
            said_at: None,
        }
    }

    /// Notes one attempt's outcome, and logs it if it is due: its value, or `None`.
    pub(crate) fn note<T, E: Display>(&mut self, outcome: Result<T, E>) -> Option<T> {
        match outcome {
            Ok(value) => {
                if self.failures > 0 {
                    let failures = self.failures;
                    tracing::info!(failures, "{} works again", self.what);
                }
                self.failures = 0;
                self.said_at = None;
                Some(value)
            }
            Err(error) => {
                self.failures += 1;
                if self
                    .said_at
                    .is_none_or(|at| at.elapsed() >= SAID_AGAIN_AFTER)
                {
                    let failures = self.failures;
                    tracing::warn!(
                        %error,
                        failures,
                        "{} failed; tried again at every tick, and said again once a minute \
                         while it fails",
                        self.what
                    );
                    self.said_at = Some(Instant::now());
                }
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// What a test's subscriber logged.
    #[derive(Clone, Default)]
    struct Log(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Log {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Log {
        fn lines(&self) -> Vec<String> {
            let text = String::from_utf8(self.0.lock().unwrap().clone()).unwrap();
            text.lines().map(str::to_owned).collect()
        }
    }

    #[test]
    fn a_failure_is_logged_when_it_starts_once_a_minute_and_when_it_ends() {
        let log = Log::default();
        let writer = log.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let mut checkpoint = RepeatedFailure::new("SQLite checkpoint");
            assert_eq!(checkpoint.note::<_, String>(Ok(3)), Some(3));
            for _ in 0..100 {
                assert_eq!(checkpoint.note::<i64, _>(Err("disk full")), None);
            }
            assert_eq!(log.lines().len(), 1, "{:?}", log.lines());
            // A minute on:
            checkpoint.said_at = Some(Instant::now() - SAID_AGAIN_AFTER);
            checkpoint.note::<i64, _>(Err("disk full"));
            checkpoint.note::<i64, _>(Err("disk full"));
            assert_eq!(checkpoint.note::<_, String>(Ok(0)), Some(0));
            checkpoint.note::<_, String>(Ok(0));
        });
        let lines = log.lines();
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert!(
            lines[0].contains("WARN") && lines[0].contains("failures=1"),
            "{lines:?}"
        );
        assert!(lines[0].contains("SQLite checkpoint failed") && lines[0].contains("disk full"));
        assert!(
            lines[1].contains("WARN") && lines[1].contains("failures=101"),
            "{lines:?}"
        );
        assert!(
            lines[2].contains("INFO") && lines[2].contains("works again"),
            "{lines:?}"
        );
        assert!(lines[2].contains("failures=102"), "{lines:?}");
    }
}
