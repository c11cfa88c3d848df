//! The SQLite store's readers: a fixed number of threads, each with its own connection.
//!
//! A fixed pool keeps the thread count flat under any load (tokio's blocking pool grows with
//! the number of reads waiting), and WAL lets every reader run while the writer commits.

use std::path::Path;
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use rusqlite::Connection;
use tokio::sync::{oneshot, Semaphore};

use crate::store::sqlite::connection::restored;
use crate::store::sqlite::no_answer;
use crate::store::{at_most, ReadJob, StoreError};

/// Reader threads (the machine's cores are few; reads are short).
pub(crate) const READER_THREADS: usize = 4;

/// How many of them the application's reads may take at once (see `Readers::application`).
pub(crate) const APPLICATION_READS: usize = READER_THREADS - 1;

pub(crate) struct Readers {
    jobs: Mutex<Option<mpsc::Sender<ReadJob>>>,
    /// Places for the application's reads (`Database::read`), one fewer than the threads: a
    /// thread is always left for the store's own lookups. Four slow reports took them all,
    /// and every replay and claim behind them failed as a disk that did not answer
    /// (helper-93).
    application: Arc<Semaphore>,
    /// How long a read waits for the disk: a read changes nothing, so one the disk does not
    /// answer is simply failed (it stays queued, and its answer is dropped).
    disk_timeout: Duration,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Readers {
    /// Opens the connections first, so that a file that cannot be read fails here.
    pub(crate) fn start(
        path: &Path,
        connect: fn(&Path) -> Result<Connection, StoreError>,
        disk_timeout: Duration,
    ) -> Result<Self, StoreError> {
        let (tx, rx) = mpsc::channel::<ReadJob>();
        let rx = Arc::new(Mutex::new(rx));
        let mut threads = Vec::with_capacity(READER_THREADS);
        for n in 0..READER_THREADS {
            let conn = connect(path)?;
            let rx = rx.clone();
            let thread = std::thread::Builder::new()
                .name(format!("idem-sqlite-reader-{n}"))
                .spawn(move || serve(&conn, &rx))?;
            threads.push(thread);
        }
        Ok(Self {
            jobs: Mutex::new(Some(tx)),
            application: Arc::new(Semaphore::new(APPLICATION_READS)),
            disk_timeout,
            threads: Mutex::new(threads),
        })
    }

    /// Runs `read` on a reader thread and returns what it returned.
    pub(crate) async fn run<T: Send + 'static>(
        &self,
        read: impl FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let (reply, done) = oneshot::channel();
        let job: ReadJob = Box::new(move |conn| drop(reply.send(read(conn))));
        self.jobs
            .lock()
            .expect("readers lock")
            .as_ref()
            .ok_or(StoreError::Closed)?
            .send(job)
            .map_err(|_| StoreError::Closed)?;
        match at_most(self.disk_timeout, done).await {
            Some(answer) => answer.map_err(|_| StoreError::Closed)?,
            None => Err(no_answer(self.disk_timeout)),
        }
    }

    /// [`run`](Self::run) for an application's read: it takes one of the application's places
    /// first, within `disk_timeout` as well, and holds it until it has run.
    pub(crate) async fn run_for_application(
        &self,
        read: impl FnOnce(&Connection) + Send + 'static,
    ) -> Result<(), StoreError> {
        let place = at_most(self.disk_timeout, self.application.clone().acquire_owned());
        let place = match place.await {
            Some(place) => place.map_err(|_| StoreError::Closed)?,
            None => return Err(no_place(self.disk_timeout)),
        };
        self.run(move |conn| {
            read(conn);
            drop(place);
            Ok(())
        })
        .await
    }

    /// Lets the threads finish the queued reads, then joins them.
    pub(crate) fn close(&self) {
        drop(self.jobs.lock().expect("readers lock").take());
        for thread in self.threads.lock().expect("readers lock").drain(..) {
            let _ = thread.join();
        }
    }
}

/// The error of an application's read that found every place taken by its earlier reads.
fn no_place(bound: Duration) -> StoreError {
    let cause = format!(
        "no reader free for the application's read in {} ms: its earlier reads hold all {} \
         places (slow, or waiting for the disk)",
        bound.as_millis(),
        APPLICATION_READS
    );
    StoreError::Backend {
        backend: "sqlite",
        cause: cause.into(),
    }
}

fn serve(conn: &Connection, jobs: &Mutex<mpsc::Receiver<ReadJob>>) {
    loop {
        let next = jobs.lock().expect("reader queue lock").recv();
        match next {
            // A panicking job must not take the reader (and its queue) down with it.
            Ok(job) => {
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(conn)));
                end_transaction_left_open(conn);
                restored(conn);
            }
            Err(_closed) => return,
        }
    }
}

/// Ends a transaction a read left open (an application's `BEGIN`, then an error or a panic
/// before its end): kept, it pinned this connection to its snapshot, so every later read here
/// missed newer entries and every claim failed to begin its own (found by helper-75), and the
/// checkpointer could not copy the log back past it.
fn end_transaction_left_open(conn: &Connection) {
    if !conn.is_autocommit() {
        tracing::warn!("a read left its transaction open: rolled back");
        if let Err(error) = conn.execute_batch("ROLLBACK") {
            tracing::error!(%error, "a read's transaction left open could not be rolled back");
        }
    }
}
