//! Waiting on the disk in bounded time: a write the disk does not answer fails its call within
//! the bound, and what was waiting on it learns later whether it landed.

use std::time::Duration;

use crate::store::Settling;

/// `operation`'s output, or `None` once `bound` has passed by the wall clock. Not by tokio's
/// alone: a runtime whose time is paused (a test's `start_paused`) jumps its clock to the next
/// timer whenever it idles, which here is whenever it waits on a database, and every operation
/// would time out at once. There, a thread keeps the bound instead, so that waiting on the
/// database neither spins nor moves the test's clock.
pub(crate) async fn at_most<F: std::future::Future>(
    bound: Duration,
    operation: F,
) -> Option<F::Output> {
    let started = std::time::Instant::now();
    let mut operation = std::pin::pin!(operation);
    if !clock_paused() {
        match tokio::time::timeout(bound, &mut operation).await {
            Ok(output) => return Some(output),
            Err(_) if started.elapsed() >= bound => return None,
            // Paused meanwhile: the clock jumped to the timer.
            Err(_) => {}
        }
    }
    let expired = WallTimer::start(bound.saturating_sub(started.elapsed()));
    let expired = std::pin::pin!(expired.fired());
    match futures::future::select(operation, expired).await {
        futures::future::Either::Left((output, _)) => Some(output),
        futures::future::Either::Right(_) => None,
    }
}

/// Whether tokio's clock is paused: it then stands still (a running clock reads the wall
/// clock's time, to the nanosecond, at every call), or stands apart from the wall clock once
/// advanced. A running clock taken for paused costs one thread, never a wrong bound.
fn clock_paused() -> bool {
    let before = tokio::time::Instant::now();
    let wall = std::time::Instant::now();
    let after = tokio::time::Instant::now();
    let apart = wall
        .saturating_duration_since(after.into_std())
        .max(after.into_std().saturating_duration_since(wall));
    before == after || apart > Duration::from_millis(1)
}

/// A wall-clock timer on a thread of its own; dropped, it stops the thread at once.
struct WallTimer {
    _stop: std::sync::mpsc::Sender<()>,
    fired: tokio::sync::oneshot::Receiver<()>,
}

impl WallTimer {
    fn start(after: Duration) -> Self {
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let (fire, fired) = tokio::sync::oneshot::channel();
        std::thread::spawn(move || {
            if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(after) {
                let _ = fire.send(());
            }
        });
        Self { _stop: stop, fired }
    }

    async fn fired(self) {
        let Self { _stop, fired } = self;
        let _ = fired.await;
    }
}

/// Runs `then` with the outcome of `settling`: on the current runtime, or else on `runtime`
/// (a ticket dropped outside any, at shutdown, names the one that claimed it; a runtime
/// already shut down drops the wait, and `then` with it). With neither, on a thread of its
/// own, which keeps the store open until the disk answers; what `then` runs there has no
/// runtime to spawn on.
pub(crate) fn after(
    settling: Settling,
    runtime: Option<&tokio::runtime::Handle>,
    then: impl FnOnce(bool) + Send + 'static,
) {
    let wait = async move { then(settling.await) };
    match tokio::runtime::Handle::try_current()
        .ok()
        .or_else(|| runtime.cloned())
    {
        Some(runtime) => drop(runtime.spawn(wait)),
        None => drop(std::thread::spawn(move || {
            futures::executor::block_on(wait)
        })),
    }
}
