//! The PostgreSQL store's wake-ups: one direct connection that `LISTEN`s for the keys whose
//! claims end (an entry stored, a claim released), so a duplicate waiting on another
//! replica's execution wakes when it ends instead of polling.
//!
//! A notification can be lost (the connection drops, PostgreSQL restarts): every reconnect
//! wakes every waiter, which then re-reads the store, and no waiter sleeps past the lease of
//! the claim it waits on, so a lost notification delays a waiter at most that long and never
//! strands it. The connection is its own, outside the pool, and may go to another address
//! than the pool's (a pooler in transaction mode does not carry `LISTEN`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::watch;
use tokio_postgres::AsyncMessage;

/// The channel a claim's end is announced on; the payload is the message id.
pub(crate) const CHANNEL: &str = "idempotency_claim_ended";

/// Waiters by key: each key's sender counts the ends announced for it.
type Waiters = Arc<Mutex<HashMap<String, watch::Sender<u64>>>>;

/// The listening connection, kept up by a task of its own until the store is dropped.
pub(crate) struct Listener {
    waiters: Waiters,
    /// Counts (re)connections: a waiter re-reads the store after each.
    connected: watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

/// One waiter's view of the announcements that concern it.
pub(crate) struct Subscription {
    key: String,
    ended: Option<watch::Receiver<u64>>,
    connected: watch::Receiver<u64>,
    waiters: Waiters,
}

impl Listener {
    /// Starts listening through `config` (connects in the background, retrying).
    pub(crate) fn start(config: tokio_postgres::Config) -> Self {
        let waiters = Waiters::default();
        let connected = watch::Sender::new(0);
        let task = tokio::spawn(listen(config, waiters.clone(), connected.clone()));
        Self {
            waiters,
            connected,
            task,
        }
    }

    /// Announcements for `key` from now on; subscribe before reading the store.
    pub(crate) fn subscribe(&self, key: &str) -> Subscription {
        let ended = self
            .waiters
            .lock()
            .expect("waiters lock")
            .entry(key.to_owned())
            .or_insert_with(|| watch::Sender::new(0))
            .subscribe();
        Subscription {
            key: key.to_owned(),
            ended: Some(ended),
            connected: self.connected.subscribe(),
            waiters: self.waiters.clone(),
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Subscription {
    /// Resolves when the key's claim ended or the listener reconnected, at most after `bound`.
    pub(crate) async fn next(&mut self, bound: Duration) {
        let ended = self.ended.as_mut().expect("subscribed");
        tokio::select! {
            _ = ended.changed() => {}
            _ = self.connected.changed() => {}
            _ = tokio::time::sleep(bound) => {}
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        drop(self.ended.take());
        let mut waiters = self.waiters.lock().expect("waiters lock");
        if let Some(sender) = waiters.get(&self.key) {
            if sender.receiver_count() == 0 {
                waiters.remove(&self.key);
            }
        }
    }
}

/// Connects, listens and forwards notifications, forever; after a failure it reconnects with
/// a backoff of at most two seconds.
async fn listen(config: tokio_postgres::Config, waiters: Waiters, connected: watch::Sender<u64>) {
    let mut backoff = Duration::from_millis(50);
    loop {
        match listen_once(&config, &waiters, &connected).await {
            Ok(()) => backoff = Duration::from_millis(50),
            Err(error) => tracing::warn!(%error, "idempotency listener: connection failed"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

/// One connection's life: `Ok` when it ended after it had listened.
async fn listen_once(
    config: &tokio_postgres::Config,
    waiters: &Waiters,
    connected: &watch::Sender<u64>,
) -> Result<(), tokio_postgres::Error> {
    let (client, mut connection) = config.connect(tokio_postgres::NoTls).await?;
    // The connection is driven by a task of its own, which wakes the waiters as notifications
    // arrive; this one only has to send `LISTEN` through the client.
    let waiters = waiters.clone();
    let driver = tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = messages.next().await {
            match message {
                Ok(AsyncMessage::Notification(note)) => {
                    if let Some(sender) = waiters.lock().expect("waiters lock").get(note.payload())
                    {
                        sender.send_modify(|n| *n += 1);
                    }
                }
                Ok(_) => {}
                Err(error) => {
                    tracing::warn!(%error, "idempotency listener: connection lost");
                    return;
                }
            }
        }
    });
    let listening = client.batch_execute(&format!("LISTEN {CHANNEL}")).await;
    if let Err(error) = listening {
        driver.abort();
        return Err(error);
    }
    // Whatever ended while no connection listened: let every waiter read the store again.
    connected.send_modify(|n| *n += 1);
    let _ = driver.await;
    drop(client);
    Ok(())
}
