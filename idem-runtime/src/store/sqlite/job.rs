//! A write queued to the writer: applied in a batch's transaction, then told whether the
//! batch committed.

use rusqlite::Connection;
use tokio::sync::oneshot;

use crate::store::sqlite::batch::Batch;
use crate::store::StoreError;

/// A write: applied inside the batch's transaction, then told whether the batch committed.
pub(crate) trait Job: Send {
    fn apply(&mut self, conn: &Connection, batch: &mut Batch) -> Result<(), StoreError>;
    /// Whether `apply` may run again after its transaction was rolled back.
    fn rerunnable(&self) -> bool;
    /// The bytes of responses and events it writes (the application's own rows uncounted).
    fn bytes(&self) -> usize;
    fn finish(self: Box<Self>, outcome: Result<(), StoreError>);
}

/// A write whose caller awaits its value, delivered only once the batch has committed.
pub(crate) struct Call<F, T> {
    work: F,
    rerunnable: bool,
    bytes: usize,
    value: Option<T>,
    reply: oneshot::Sender<Result<T, StoreError>>,
}

impl<F, T> Call<F, T>
where
    F: FnMut(&Connection, &mut Batch) -> Result<T, StoreError> + Send,
    T: Send,
{
    pub(crate) fn new(
        rerunnable: bool,
        bytes: usize,
        work: F,
    ) -> (Self, oneshot::Receiver<Result<T, StoreError>>) {
        let (reply, done) = oneshot::channel();
        let call = Self {
            work,
            rerunnable,
            bytes,
            value: None,
            reply,
        };
        (call, done)
    }
}

impl<F, T> Job for Call<F, T>
where
    F: FnMut(&Connection, &mut Batch) -> Result<T, StoreError> + Send,
    T: Send,
{
    fn apply(&mut self, conn: &Connection, batch: &mut Batch) -> Result<(), StoreError> {
        self.value = Some((self.work)(conn, batch)?);
        Ok(())
    }

    fn rerunnable(&self) -> bool {
        self.rerunnable
    }

    fn bytes(&self) -> usize {
        self.bytes
    }

    fn finish(self: Box<Self>, outcome: Result<(), StoreError>) {
        let Self { value, reply, .. } = *self;
        let answer = outcome.map(|()| value.expect("an applied job has its value"));
        let _ = reply.send(answer);
    }
}
