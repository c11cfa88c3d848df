//! A stream's events as they are produced: kept in order, read by any number of readers (the
//! original caller, and retries that attach while it runs), each at its own pace. A live
//! stream's (one not deduplicated, which nothing replays and no retry attaches to) has one
//! reader, and keeps only what that reader has not read yet.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use bytes::Bytes;
use futures::Stream;
use tokio::sync::{watch, Notify};

/// The most bytes a recorded stream may hold. A stream that would grow past it is ended with a
/// JSON-RPC error event (-32603, `IDEMPOTENCY_STREAM_TOO_LARGE` in `data.code`) and stored so,
/// which keeps memory bounded and the replay equal to what the first caller saw. A live
/// stream holds only what its client has not read: its events wait while its client is this
/// far behind, and it is ended so only by one event larger than this alone.
pub const MAX_RECORDED_STREAM_BYTES: usize = 8 * 1024 * 1024;

/// The frames of one execution.
pub(crate) struct Recording {
    state: Mutex<State>,
    /// Bumped on every change, so readers wait without polling. Each reader holds one of its
    /// receivers: their count is the readers left.
    changed: watch::Sender<u64>,
    /// Whether a reader ever came, and the news that one did.
    read: AtomicBool,
    first_reader: Notify,
    /// A live stream's reader took a frame: room made for the next.
    drained: Notify,
    /// Whether read frames are kept (for replays and retries that attach), or dropped (a live
    /// stream's, whose one reader has them).
    keeps_read: bool,
}

#[derive(Default)]
struct State {
    frames: VecDeque<Bytes>,
    /// How many frames were dropped from the front, once read (a live stream's).
    dropped: usize,
    /// The bytes of `frames`.
    bytes: usize,
    finished: bool,
}

impl State {
    fn add(&mut self, frame: Bytes) {
        self.bytes += frame.len();
        self.frames.push_back(frame);
    }
}

impl Recording {
    pub(crate) fn new() -> Self {
        Self {
            state: Mutex::default(),
            changed: watch::Sender::new(0),
            read: AtomicBool::new(false),
            first_reader: Notify::new(),
            drained: Notify::new(),
            keeps_read: true,
        }
    }

    /// The recording of a live stream: one reader, and what it read is dropped.
    pub(crate) fn live() -> Self {
        Self {
            keeps_read: false,
            ..Self::new()
        }
    }

    /// A recording that is already complete (a replay).
    pub(crate) fn finished(frames: Vec<Bytes>) -> Self {
        let recording = Self::new();
        {
            let mut state = recording.lock();
            state.bytes = frames.iter().map(Bytes::len).sum();
            state.frames = frames.into();
            state.finished = true;
        }
        recording
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("recording lock")
    }

    /// Whether `frame` still fits under [`MAX_RECORDED_STREAM_BYTES`], after `pending` bytes
    /// of frames not pushed yet.
    pub(crate) fn fits(&self, pending: usize, frame: &[u8]) -> bool {
        self.lock().bytes + pending + frame.len() <= MAX_RECORDED_STREAM_BYTES
    }

    /// Like [`fits`](Self::fits), but a live recording, which holds only what its reader has
    /// not read, waits for its reader to make room: its client reads at its own pace, as it
    /// would from a stream outside the extension. Only a frame larger than the limit alone
    /// never fits there. Frames that a stream had ready together counted as unread, and a
    /// client reading at once was cut all the same (helper-111).
    pub(crate) async fn has_room(&self, pending: usize, frame: &[u8]) -> bool {
        if self.keeps_read || pending + frame.len() > MAX_RECORDED_STREAM_BYTES {
            return self.fits(pending, frame);
        }
        // `notify_one` keeps a permit when no one waits: a frame read between the look and
        // the wait is not missed.
        while !self.fits(pending, frame) {
            self.drained.notified().await;
        }
        true
    }

    pub(crate) fn push(&self, frame: Bytes) {
        self.lock().add(frame);
        self.changed.send_modify(|n| *n += 1);
    }

    /// Ends the recording with `frame`, unless it has ended: what a recorder that unwinds
    /// leaves, which must not panic again (a second panic would abort the process), so the
    /// lock is taken even if a panic poisoned it.
    pub(crate) fn end_with(&self, frame: Bytes) {
        {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            if state.finished {
                return;
            }
            state.add(frame);
            state.finished = true;
        }
        self.changed.send_modify(|n| *n += 1);
    }

    pub(crate) fn finish(&self) {
        self.lock().finished = true;
        self.changed.send_modify(|n| *n += 1);
    }

    /// Everything recorded, then `last`, as one body: what the stream's entry stores.
    pub(crate) fn joined(&self, last: &[u8]) -> Vec<u8> {
        joined(self.lock().frames.make_contiguous(), last)
    }

    /// Once a reader came and every reader has gone (a client that hung up): what a stream no
    /// one replays waits on, to stop producing events no one reads.
    pub(crate) async fn abandoned(&self) {
        while !self.read.load(Ordering::SeqCst) {
            self.first_reader.notified().await;
        }
        self.changed.closed().await;
    }

    /// No reader will ever come: the client hung up before its answer was sent. A stream
    /// waiting on [`abandoned`](Self::abandoned) stops, as if a reader had come and gone (it
    /// waited for a first reader for as long as the stream ran: helper-71).
    pub(crate) fn never_read(&self) {
        self.read.store(true, Ordering::SeqCst);
        self.first_reader.notify_one();
    }

    /// The frames from the first, then live ones as they come, until the recording finishes.
    pub(crate) fn reader(self: std::sync::Arc<Self>) -> impl Stream<Item = Bytes> + Send + 'static {
        let changes = self.changed.subscribe();
        self.read.store(true, Ordering::SeqCst);
        // One permit at most: the recorder's wait takes it whenever it starts.
        self.first_reader.notify_one();
        futures::stream::unfold(
            (self, 0usize, changes),
            |(rec, next, mut changes)| async move {
                loop {
                    changes.borrow_and_update();
                    {
                        let mut state = rec.lock();
                        // A live recording has one reader, and what it dropped is behind it (a
                        // second reader, which none makes, would find the frames gone).
                        let at = next.checked_sub(state.dropped)?;
                        if let Some(frame) = state.frames.get(at).cloned() {
                            if !rec.keeps_read {
                                state.frames.pop_front();
                                state.dropped += 1;
                                state.bytes -= frame.len();
                                rec.drained.notify_one();
                            }
                            drop(state);
                            return Some((frame, (rec, next + 1, changes)));
                        }
                        if state.finished {
                            return None;
                        }
                    }
                    if changes.changed().await.is_err() {
                        return None;
                    }
                }
            },
        )
    }
}

/// `frames`, then `last`, in one allocation of their size: the store and its memory tier keep
/// it (`concat` then a push would double it, memory the tier's budget does not see).
pub(crate) fn joined(frames: &[Bytes], last: &[u8]) -> Vec<u8> {
    let mut body = Vec::with_capacity(frames.iter().map(Bytes::len).sum::<usize>() + last.len());
    frames
        .iter()
        .for_each(|frame| body.extend_from_slice(frame));
    body.extend_from_slice(last);
    body
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use std::sync::Arc;

    #[tokio::test]
    async fn readers_get_past_and_live_frames_in_order() {
        let rec = Arc::new(Recording::new());
        rec.push(Bytes::from_static(b"a"));
        let early = tokio::spawn(rec.clone().reader().collect::<Vec<_>>());
        rec.push(Bytes::from_static(b"b"));
        tokio::task::yield_now().await;
        let late = tokio::spawn(rec.clone().reader().collect::<Vec<_>>());
        rec.push(Bytes::from_static(b"c"));
        rec.finish();
        let expected: Vec<Bytes> = ["a", "b", "c"].iter().map(|s| Bytes::from(*s)).collect();
        assert_eq!(early.await.unwrap(), expected);
        assert_eq!(late.await.unwrap(), expected);
        let body = rec.joined(b"d");
        assert_eq!(body, b"abcd");
        assert_eq!(
            body.capacity(),
            body.len(),
            "what is stored holds no spare room"
        );
    }

    #[test]
    fn the_size_limit_is_checked_before_a_push() {
        let rec = Recording::new();
        assert!(rec.fits(0, &vec![0; MAX_RECORDED_STREAM_BYTES]));
        rec.push(Bytes::from(vec![0; MAX_RECORDED_STREAM_BYTES - 1]));
        assert!(rec.fits(0, b"x"));
        assert!(!rec.fits(0, b"xy"));
    }

    #[tokio::test]
    async fn a_live_recording_holds_only_what_its_reader_has_not_read() {
        let rec = Arc::new(Recording::live());
        let mut reader = Box::pin(rec.clone().reader());
        let frame = Bytes::from(vec![0; MAX_RECORDED_STREAM_BYTES / 2]);
        for _ in 0..5 {
            assert!(rec.has_room(0, &frame).await, "what was read is not held");
            rec.push(frame.clone());
            assert_eq!(reader.next().await.unwrap(), frame);
        }
        rec.push(frame.clone());
        rec.push(frame.clone());
        let mut waiting = Box::pin(rec.has_room(0, b"x"));
        assert!(
            futures::poll!(waiting.as_mut()).is_pending(),
            "a reader the limit behind holds the next frame back"
        );
        assert_eq!(reader.next().await.unwrap(), frame);
        assert!(waiting.await, "room once the reader took a frame");
        let larger = vec![0; MAX_RECORDED_STREAM_BYTES + 1];
        assert!(!rec.has_room(0, &larger).await, "one frame over the limit");
        rec.finish();
        assert_eq!(reader.collect::<Vec<_>>().await.len(), 1);
    }

    #[tokio::test]
    async fn a_recording_is_abandoned_once_its_readers_came_and_went() {
        let rec = Arc::new(Recording::new());
        let abandoned = tokio::spawn({
            let rec = rec.clone();
            async move { rec.abandoned().await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert!(!abandoned.is_finished(), "no reader came yet");
        let reader = rec.clone().reader();
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert!(!abandoned.is_finished(), "a reader reads");
        drop(reader);
        tokio::time::timeout(std::time::Duration::from_secs(5), abandoned)
            .await
            .expect("abandoned once the reader went")
            .unwrap();
    }

    #[tokio::test]
    async fn a_recording_no_reader_will_read_is_abandoned() {
        let rec = Arc::new(Recording::live());
        let abandoned = tokio::spawn({
            let rec = rec.clone();
            async move { rec.abandoned().await }
        });
        rec.never_read();
        tokio::time::timeout(std::time::Duration::from_secs(5), abandoned)
            .await
            .expect("abandoned once no reader will come")
            .unwrap();
    }
}
