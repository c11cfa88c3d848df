//! The outbox relay, the other half of the outbox pattern: the `mission.*` events commit with
//! their task (and with the call's cache entry); this delivers each to the webhooks of its
//! task, at least once, and marks it `delivered_at` only after every webhook answered 2xx.
//!
//! It reads what is undelivered from the outbox itself, so a restart resumes where the last
//! process stopped; an event it was delivering when the process died is delivered again,
//! with the same id (`X-A2A-Event-Id`, the outbox row's id), which is how a receiver
//! recognises a duplicate. A webhook that fails is retried with exponential backoff, written
//! to the event's row (`next_attempt_at`, wall-clock ms): until then the outbox is read past
//! it and the later events of its task, so events that wait for a failing webhook never hold
//! back the others, however many (each read passes over them, so a backlog of thousands costs
//! each read a scan of it). The events of one task are delivered in the order they happened.
//! The body is the task as A2A 0.3 shapes it, as it is when delivered; the event's type is
//! in `X-A2A-Event-Type`, a config's token in `X-A2A-Notification-Token`. An event of a task
//! without webhooks has nowhere to go: the events of all such tasks that one read finds are
//! marked delivered together, in one write, so that under load the relay keeps up with the
//! calls (marked one by one, each waiting for its commit, it fell behind by thousands of
//! events a second).
//!
//! Replicas on one PostgreSQL database share one outbox, and one relay delivers it at a time:
//! the one whose session holds the relay's lock ([`RelayLock`]). The others try to take it
//! every [`FOLLOW`]; a replica that dies takes its session with it, so another delivers within
//! that. Before each delivery the leader checks that it still holds the lock, so two relays
//! overlap at most for the one event a leader was delivering when its session ended: that event
//! may arrive twice (with one id), and after a later one of its task.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use crate::clock;
use crate::push::{PushConfig, PushConfigs};
use crate::shapes::Shape;
use crate::tasks::{Pending, RelayLock, TaskStore};

/// How often the outbox is read, unless the last read found a full batch.
const POLL: Duration = Duration::from_millis(100);
/// How often a relay without the lock tries to take it.
const FOLLOW: Duration = Duration::from_secs(1);
/// Events read at once.
const BATCH: i64 = 512;
/// The first retry's wait; each failure doubles it, up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// A webhook that does not answer within this fails the attempt.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(5);

/// Starts the relay; it runs as long as the process.
pub fn spawn(store: TaskStore, push: PushConfigs) {
    let client = reqwest::Client::builder()
        .timeout(DELIVERY_TIMEOUT)
        .build()
        .expect("an HTTP client");
    let relay = Relay {
        store,
        push,
        client,
        lock: None,
        retries: HashMap::new(),
    };
    tokio::spawn(relay.run());
}

struct Relay {
    store: TaskStore,
    push: PushConfigs,
    client: reqwest::Client,
    /// Held while this relay is the one that delivers.
    lock: Option<RelayLock>,
    /// Events that failed: how many times (their next attempt is in their row).
    retries: HashMap<i64, u32>,
}

impl Relay {
    async fn run(mut self) {
        loop {
            if !self.leads().await {
                tokio::time::sleep(FOLLOW).await;
                continue;
            }
            // More are waiting behind a full batch: an event read and marked delivered, or
            // held back for a retry, is not read again, so the next read finds others.
            let more = match self.store.undelivered(BATCH).await {
                Ok(pending) => {
                    let full = pending.len() as i64 == BATCH;
                    let settled = self.deliver_all(pending).await;
                    full && settled > 0
                }
                Err(error) => {
                    tracing::warn!(?error, "relay: the outbox could not be read");
                    false
                }
            };
            if !more {
                tokio::time::sleep(POLL).await;
            }
        }
    }

    /// Whether this relay delivers now: it keeps the lock it holds, or takes it if it is free.
    async fn leads(&mut self) -> bool {
        if let Some(lock) = &self.lock {
            if lock.held().await {
                return true;
            }
            tracing::warn!("relay: lost the outbox's lock; another replica may deliver it now");
            self.lock = None;
        }
        match self.store.take_relay_lock().await {
            Ok(Some(lock)) => {
                if matches!(lock, RelayLock::Session(_)) {
                    tracing::info!("relay: this replica delivers the outbox");
                }
                self.lock = Some(lock);
                true
            }
            Ok(None) => false,
            Err(error) => {
                tracing::warn!(?error, "relay: the outbox's lock could not be taken");
                false
            }
        }
    }

    /// Delivers what was read; returns how many events it marked delivered or held back.
    async fn deliver_all(&mut self, pending: Vec<Pending>) -> usize {
        let (pending, nowhere): (Vec<_>, Vec<_>) =
            pending.into_iter().partition(|event| event.has_webhooks);
        let nowhere: Vec<i64> = nowhere.into_iter().map(|event| event.id).collect();
        let mut marked = 0;
        if !nowhere.is_empty() {
            let count = nowhere.len();
            match self.store.mark_delivered(nowhere).await {
                Ok(()) => marked += count,
                Err(error) => tracing::warn!(?error, "relay: events without webhooks not marked"),
            }
        }
        // A task whose earlier event failed just now gets none of its later ones first.
        let mut waiting: HashSet<String> = HashSet::new();
        for event in pending {
            if waiting.contains(&event.task_id) {
                continue;
            }
            if !self.leads().await {
                break;
            }
            match self.deliver(&event).await {
                Ok(()) => {
                    self.retries.remove(&event.id);
                    match self.store.mark_delivered(vec![event.id]).await {
                        Ok(()) => marked += 1,
                        Err(error) => {
                            tracing::warn!(id = event.id, ?error, "relay: delivered, not marked")
                        }
                    }
                }
                Err(why) => {
                    let failures = self.retries.get(&event.id).copied().unwrap_or(0);
                    let wait = FIRST_BACKOFF
                        .saturating_mul(1 << failures.min(16))
                        .min(MAX_BACKOFF);
                    tracing::warn!(id = event.id, failures = failures + 1, ?wait, %why, "relay: delivery failed");
                    self.retries.insert(event.id, failures + 1);
                    let at = clock::now_ms() + wait.as_millis() as u64;
                    match self.store.retry_at(event.id, at).await {
                        Ok(()) => marked += 1,
                        Err(error) => {
                            tracing::warn!(id = event.id, ?error, "relay: retry not scheduled")
                        }
                    }
                    waiting.insert(event.task_id);
                }
            }
        }
        marked
    }

    /// Posts the event to every webhook of its task; `Err` unless each answered 2xx.
    async fn deliver(&self, event: &Pending) -> Result<(), String> {
        // The outbox row names an existing task: its configs, then the task itself, once.
        let configs = self
            .push
            .stored(&event.task_id)
            .await
            .map_err(|e| e.to_string())?;
        if configs.is_empty() {
            return Ok(());
        }
        let task = self
            .store
            .get(event.task_id.clone())
            .await
            .map_err(|e| e.to_string())?;
        let body = Shape::V03.task(&task, None).to_string();
        for config in &configs {
            self.post(config, event, body.clone()).await?;
        }
        Ok(())
    }

    async fn post(&self, config: &PushConfig, event: &Pending, body: String) -> Result<(), String> {
        let mut request = self
            .client
            .post(&config.url)
            .header("content-type", "application/json")
            .header("x-a2a-event-id", event.id.to_string())
            .header("x-a2a-event-type", &event.event_type)
            .body(body);
        if let Some(token) = &config.token {
            request = request.header("x-a2a-notification-token", token);
        }
        let response = request
            .send()
            .await
            .map_err(|e| format!("{}: {e}", config.url))?;
        match response.status().is_success() {
            true => Ok(()),
            false => Err(format!("{}: HTTP {}", config.url, response.status())),
        }
    }
}
