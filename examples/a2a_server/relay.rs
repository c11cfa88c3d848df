//! The outbox relay, the other half of the outbox pattern: the `mission.*` events commit with
//! their task (and with the call's cache entry); this delivers each to the webhooks of its
//! task, at least once unless it is given up (below), and marks it `delivered_at` only after
//! every webhook answered 2xx, or once it is given up. An event goes to all of its task's
//! webhooks at once; where one fails, those that took it are recorded (`outbox_deliveries`)
//! and the retry posts to the others alone, and a webhook that failed an event gets none of
//! its task's later ones before it. Only a task's first undelivered event holds a retry time
//! (`Pass`, `settle`): the reads below rely on it.
//!
//! It reads what is undelivered from the outbox itself, so a restart resumes where the last
//! process stopped; an event it was delivering when the process died is delivered again,
//! with the same id (`X-A2A-Event-Id`, the outbox row's id), which is how a receiver
//! recognises a duplicate. A webhook that fails is retried with exponential backoff, written
//! to the event's row (`next_attempt_at`, wall-clock ms, and the `attempts` that failed, so a
//! restart or another replica's relay goes on with the same backoff): until then the outbox is
//! read past it and the later events of its task, so events that wait for a failing webhook
//! never hold back the others, however many (each read passes over them, so a backlog of
//! thousands costs each read a scan of it). The events of one task are delivered in the order
//! they happened. An event whose failed attempts have waited `--outbox-give-up` between them
//! (a day by default: 17,285 attempts; time in which no relay ran does not count, so an outage
//! of the agent itself gives nothing up) is given up: logged as an error, counted in
//! [`ABANDONED`], marked `abandoned_at` and `delivered_at` (so the reads pass it by, its task's
//! later events go, and `--outbox-retention` deletes it in time); without this, a webhook that
//! never came back kept the relay retrying its events every 5 s for as long as the database
//! lived.
//! The body is the task as A2A 0.3 shapes it, as it is when delivered; the event's type is
//! in `X-A2A-Event-Type`, a config's token in `X-A2A-Notification-Token`. An event of a task
//! without webhooks has nowhere to go: the events of all such tasks that one read finds are
//! marked delivered together, in one write, so that under load the relay keeps up with the
//! calls (marked one by one, each waiting for its commit, it fell behind by thousands of
//! events a second).
//!
//! Each task's events go out through a worker of their own, up to [`TASKS_AT_ONCE`] tasks at
//! once, while the relay goes on reading: a webhook that takes its 5 s to fail holds back its
//! own task only (delivered one by one, one dead webhook held every task's events back, by
//! 40 s with five of them). A task a worker has is passed over by the reads until the worker
//! is done, and so is an event a worker settled after a read began, so no event is ever
//! handed out twice.
//!
//! Failing tasks never take every worker:
//! - tasks whose last attempt failed (in their row: any process's) take at most
//!   [`FAILING_AT_ONCE`] workers, and the others are handed out first (with all 64 open to
//!   them, 150 dead webhooks held every other task's events back for good);
//! - a read takes the oldest [`BATCH`] first attempts and the [`BATCH`] retries due longest
//!   beside the oldest [`BATCH`] due events, so failing tasks' events never hide a new task's,
//!   and however many fail, each of them is read in turn (found among the oldest due events
//!   alone, one past the 512th waited for the older to drain);
//! - the failing tasks a read finds take the retry places in turn, the one that has waited
//!   longest first (by id, the oldest took them again and again, and a webhook that came back
//!   was not tried again).
//!
//! Replicas on one PostgreSQL database share one outbox, and one relay delivers it at a time:
//! the one whose session holds the relay's lock ([`RelayLock`]). The others try to take it
//! every [`FOLLOW`]; a replica that dies takes its session with it, so another delivers within
//! that. Before each delivery a worker checks that its relay still holds the lock, so two
//! relays overlap at most for the events the leader's workers were delivering when its session
//! ended, one per task (up to [`TASKS_AT_ONCE`]): each may arrive twice (with one id), and
//! after a later one of its task. The old leader's failure never undoes the new one's success:
//! a retry or a give-up is written only over an event still undelivered.

mod backoff;
mod hand_out;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::clock;
use crate::push::{PushConfig, PushConfigs};
use crate::shapes::Shape;
use crate::tasks::{Pending, RelayLock, TaskStore, Took};
use backoff::{backoff, waited};
use hand_out::HandedOut;

/// How often the outbox is read, unless the last read found a full batch.
const POLL: Duration = Duration::from_millis(100);
/// How often a relay without the lock tries to take it.
const FOLLOW: Duration = Duration::from_secs(1);
/// Events read at once.
const BATCH: i64 = 512;
/// Tasks whose events are being delivered at once, each by a worker of its own.
const TASKS_AT_ONCE: usize = 64;
/// Of those, tasks whose last attempt failed: the others always find a worker free.
const FAILING_AT_ONCE: usize = TASKS_AT_ONCE / 2;
/// A webhook that does not answer within this fails the attempt.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(5);
/// The counter of events given up (`GET /metrics`).
pub const ABANDONED: &str = "a2a_outbox_abandoned_total";

/// Starts the relay; it runs as long as the process. An event whose failed attempts have
/// waited `give_up` between them is given up.
pub fn spawn(store: TaskStore, push: PushConfigs, give_up: Duration) {
    // No redirects: a webhook's host is the one the client named, not one it bounces to.
    let client = reqwest::Client::builder()
        .timeout(DELIVERY_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("an HTTP client");
    metrics::describe_counter!(
        ABANDONED,
        "Outbox events given up: their failed deliveries waited --outbox-give-up between them"
    );
    metrics::counter!(ABANDONED).absolute(0); // shown from the start, at zero
    let relay = Relay {
        delivery: Arc::new(Delivery {
            store,
            push,
            client,
            give_up,
            handed_out: Mutex::default(),
            store_failed: AtomicBool::new(false),
        }),
        lock: None,
        workers: Arc::new(Semaphore::new(TASKS_AT_ONCE)),
        failing: Arc::new(Semaphore::new(FAILING_AT_ONCE)),
        store_failures: 0,
    };
    tokio::spawn(relay.run());
}

struct Relay {
    delivery: Arc<Delivery>,
    /// Held while this relay is the one that delivers; its workers check it before each event.
    lock: Option<Arc<RelayLock>>,
    workers: Arc<Semaphore>,
    failing: Arc<Semaphore>,
    /// Passes in a row in which the task store failed: each waits longer before the next, as a
    /// failed delivery does (a store that fails for good, its file deleted say, is not asked
    /// ten times a second, each failure logged).
    store_failures: u32,
}

/// What a pass over one task's events knows of those before the one it is at.
#[derive(Default)]
struct Pass {
    /// The webhooks (config ids) that failed an earlier event, or were set after the pass's
    /// first event was posted: posted none of the later ones.
    behind: HashSet<String>,
    /// The webhooks the pass's first event went to.
    webhooks: Option<HashSet<String>>,
    /// An earlier event is still undelivered: a later one holds no retry of its own.
    undelivered_before: bool,
}

impl Pass {
    /// The task's webhooks as an event of the pass reads them. One set since its first event
    /// is behind: it has not been posted that event yet (it got a later event first: helper-68).
    fn note_webhooks(&mut self, ids: impl Iterator<Item = String>) {
        match &self.webhooks {
            None => self.webhooks = Some(ids.collect()),
            Some(known) => self.behind.extend(ids.filter(|id| !known.contains(id))),
        }
    }
}

/// What one attempt to deliver an event did.
struct Attempt {
    /// The webhooks (config ids) that took it in this attempt, with the URLs they took it at.
    took: Vec<(String, String)>,
    /// A webhook of its task was behind, and not posted it.
    held_back: bool,
    /// Why a post failed, if one did.
    failure: Option<String>,
}

impl Attempt {
    /// Every webhook of its task has it now.
    fn complete(&self) -> bool {
        !self.held_back && self.failure.is_none()
    }

    /// What to record of this attempt at `event`.
    fn took(&mut self, event: &Pending) -> Took {
        Took {
            event: event.id,
            task: event.task_id.clone(),
            configs: std::mem::take(&mut self.took),
            complete: self.complete(),
        }
    }
}

/// What a worker holds while it delivers: its place, and, for a task whose last attempt
/// failed, one of the places such tasks may take.
struct Places {
    _worker: OwnedSemaphorePermit,
    _failing: Option<OwnedSemaphorePermit>,
}

/// What the relay's workers share.
struct Delivery {
    store: TaskStore,
    push: PushConfigs,
    client: reqwest::Client,
    /// How long an event's failed attempts may wait between them before it is given up.
    give_up: Duration,
    handed_out: Mutex<HandedOut>,
    /// The task store failed since the relay last looked: its own read or mark, or a worker's
    /// write (a delivered event's mark, whose event then goes again at the next pass; a
    /// retry's schedule; a give-up). The relay backs off while passes see it.
    store_failed: AtomicBool,
}

impl Relay {
    async fn run(mut self) {
        loop {
            if !self.leads().await {
                tokio::time::sleep(FOLLOW).await;
                continue;
            }
            // Settled before this read began: the read sees it.
            self.delivery.handed_out().settled.clear();
            // More are waiting behind a full batch: an event read and marked delivered, or
            // handed to a worker, is not handed out again, so the next read finds others.
            let more = match self.delivery.store.undelivered(BATCH).await {
                Ok(pending) => {
                    let full = pending.len() as i64 >= BATCH;
                    let settled = self.hand_out(pending).await;
                    full && settled > 0
                }
                Err(error) => {
                    tracing::warn!(?error, "relay: the outbox could not be read");
                    self.delivery.note_store_failure();
                    false
                }
            };
            self.store_failures = match self.delivery.store_failed.swap(false, Ordering::Relaxed) {
                true => self.store_failures.saturating_add(1),
                false => 0,
            };
            match self.store_failures {
                0 if more => {}
                0 => tokio::time::sleep(POLL).await,
                failures => tokio::time::sleep(backoff(failures).max(POLL)).await,
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
        match self.delivery.store.take_relay_lock().await {
            Ok(Some(lock)) => {
                if matches!(lock, RelayLock::Session(_)) {
                    tracing::info!("relay: this replica delivers the outbox");
                }
                self.lock = Some(Arc::new(lock));
                true
            }
            Ok(None) => false,
            Err(error) => {
                tracing::warn!(?error, "relay: the outbox's lock could not be taken");
                false
            }
        }
    }

    /// Marks what was read for tasks without webhooks, and hands each other task's events to
    /// a worker; returns how many events it marked or handed out.
    async fn hand_out(&mut self, pending: Vec<Pending>) -> usize {
        let (pending, nowhere): (Vec<_>, Vec<_>) =
            pending.into_iter().partition(|event| event.has_webhooks);
        let mut handed = self.mark_nowhere(nowhere).await;
        let Some(lock) = self.lock.clone() else {
            return handed;
        };
        // Tasks that have not failed first: webhooks that keep timing out (5 s each) never
        // take every worker, however many they are.
        let (mut failing, fresh): (Vec<_>, Vec<_>) = self
            .delivery
            .new_work(pending)
            .into_iter()
            .partition(|events| events[0].failed());
        // The retry that has waited longest first: the failing tasks a read finds take turns.
        failing.sort_by_key(|events| events[0].next_attempt_at);
        for events in fresh.into_iter().chain(failing) {
            let Some(places) = self.places(events[0].failed()) else {
                self.delivery.give_back(&events[0].task_id);
                continue; // no place free: a later read hands it out
            };
            handed += events.len();
            let delivery = self.delivery.clone();
            tokio::spawn(delivery.deliver_task(lock.clone(), events, places));
        }
        handed
    }

    /// Events of tasks without webhooks go nowhere: marked delivered together, in one write.
    async fn mark_nowhere(&self, nowhere: Vec<Pending>) -> usize {
        let ids: Vec<i64> = nowhere.into_iter().map(|event| event.id).collect();
        let count = ids.len();
        if count == 0 {
            return 0;
        }
        match self.delivery.store.mark_delivered(ids).await {
            Ok(()) => count,
            Err(error) => {
                tracing::warn!(?error, "relay: events without webhooks not marked");
                self.delivery.note_store_failure();
                0
            }
        }
    }

    fn places(&self, failed: bool) -> Option<Places> {
        let failing = match failed {
            true => Some(self.failing.clone().try_acquire_owned().ok()?),
            false => None,
        };
        let worker = self.workers.clone().try_acquire_owned().ok()?;
        Some(Places {
            _worker: worker,
            _failing: failing,
        })
    }
}

impl Delivery {
    fn handed_out(&self) -> std::sync::MutexGuard<'_, HandedOut> {
        self.handed_out.lock().expect("relay lock")
    }

    /// The events of each task no worker has, in order, grouped by task (in the order of each
    /// task's first event); those tasks are now handed out.
    fn new_work(&self, pending: Vec<Pending>) -> Vec<Vec<Pending>> {
        self.handed_out().take(pending)
    }

    /// Notes that the task store failed, for the relay's next pass to back off.
    fn note_store_failure(&self) {
        self.store_failed.store(true, Ordering::Relaxed);
    }

    /// `task_id` was not handed to a worker after all.
    fn give_back(&self, task_id: &str) {
        self.handed_out().tasks.remove(task_id);
    }

    /// Delivers a task's events in order, while this relay holds the lock. A webhook that
    /// fails an event is posted none of the task's later events in this pass, so each webhook
    /// gets them in order; the task's other webhooks go on (one dead webhook held them all
    /// back, and had the event given up for them too: helper-65).
    async fn deliver_task(
        self: Arc<Self>,
        lock: Arc<RelayLock>,
        events: Vec<Pending>,
        _places: Places,
    ) {
        let task_id = events[0].task_id.clone();
        let mut pass = Pass::default();
        for event in events {
            if !lock.held().await || !self.settle(&event, &mut pass).await {
                break;
            }
        }
        self.give_back(&task_id);
    }

    /// Posts `event` to the webhooks of its task that have not taken it, except those behind
    /// on the task's events; marks it delivered once all have taken it, records who took it
    /// otherwise, and holds it back for a retry if a post failed. `false` if the task store
    /// failed.
    ///
    /// Only a task's first undelivered event holds a retry (its backoff, its give-up): a later
    /// one that failed is tried again with it, after it. With a retry time of its own, a later
    /// event was read alone once its backoff ran out, and posted to the webhook that still
    /// failed the earlier one (helper-67).
    async fn settle(&self, event: &Pending, pass: &mut Pass) -> bool {
        let first = !pass.undelivered_before;
        let (stored, go_on) = match self.attempt(event, pass).await {
            // Marked delivered where every webhook its task has now took it. One re-pointed
            // while it was posted is owed it still (helper-95): the pass ends, and the next
            // read posts it there before the task's next event (helper-96).
            Ok(mut attempt) if attempt.complete() => {
                match self.store.record_deliveries(attempt.took(event)).await {
                    Ok(marked) => (Ok(()), marked),
                    Err(error) => (Err(error), true),
                }
            }
            Ok(mut attempt) => {
                pass.undelivered_before = true;
                let took = attempt.took(event);
                let recorded = match took.configs.is_empty() {
                    true => Ok(()),
                    false => self.store.record_deliveries(took).await.map(drop),
                };
                if let (Ok(()), Some(why), true) = (&recorded, attempt.failure, first) {
                    self.failed(event, &why).await;
                }
                (recorded, true)
            }
            // Nobody was posted it, and whom it would have gone to is not known: the pass
            // ends here, or the task's next event would reach them first (helper-68).
            Err(why) => {
                if first {
                    self.failed(event, &why).await;
                }
                (Ok(()), false)
            }
        };
        self.handed_out().settled.insert(event.id);
        // Not marked, or not recorded: the event goes again, to those webhooks too, before
        // the task's next one, which must not overtake it (in order, at least once).
        if let Err(error) = stored {
            tracing::warn!(id = event.id, ?error, "relay: delivered, not marked");
            self.note_store_failure();
            return false;
        }
        go_on
    }

    /// An attempt to deliver `event` failed: it waits out its backoff, which its row keeps
    /// (a restart, or another replica's relay, goes on from there), or is given up once its
    /// failed attempts have waited `give_up` between them.
    async fn failed(&self, event: &Pending, why: &str) {
        let failures = event.attempts.saturating_add(1);
        let waited = waited(event.attempts);
        if waited >= self.give_up {
            match self.store.abandon(event.id).await {
                Ok(true) => {
                    tracing::error!(id = event.id, task_id = event.task_id,
                        event_type = event.event_type, failures, ?waited, %why,
                        "relay: delivery still failing, event given up");
                    metrics::counter!(ABANDONED).increment(1);
                }
                Ok(false) => {} // another relay delivered it meanwhile
                Err(error) => {
                    tracing::warn!(id = event.id, ?error, "relay: not given up");
                    self.note_store_failure();
                }
            }
            return;
        }
        let wait = backoff(failures);
        tracing::warn!(id = event.id, failures, ?wait, %why, "relay: delivery failed");
        let at = clock::now_ms() + wait.as_millis() as u64;
        if let Err(error) = self.store.retry_at(event.id, at).await {
            tracing::warn!(id = event.id, ?error, "relay: retry not scheduled");
            self.note_store_failure();
        }
    }

    /// Posts the event, at once, to every webhook of its task that has not taken it and is
    /// not `behind`; a webhook that fails is `behind` from then on. `Err` if the task store
    /// could not say where to post it.
    async fn attempt(&self, event: &Pending, pass: &mut Pass) -> Result<Attempt, String> {
        // The outbox row names an existing task: its configs, then the task itself, once.
        let configs = self
            .push
            .stored(&event.task_id)
            .await
            .map_err(|e| e.to_string())?;
        let webhooks: Vec<(String, &PushConfig)> = configs
            .iter()
            .map(|config| (config.id_for(&event.task_id), config))
            .collect();
        pass.note_webhooks(webhooks.iter().map(|(id, _)| id.clone()));
        let took_before = match event.reached_some {
            true => self
                .store
                .delivered_to(event.id)
                .await
                .map_err(|e| e.to_string())?,
            false => Vec::new(),
        };
        let (behind, due): (Vec<_>, Vec<_>) = webhooks
            .into_iter()
            .filter(|(id, _)| !took_before.contains(id))
            .partition(|(id, _)| pass.behind.contains(id));
        let mut attempt = Attempt {
            took: Vec::new(),
            held_back: !behind.is_empty(),
            failure: None,
        };
        if due.is_empty() {
            return Ok(attempt);
        }
        let task = self
            .store
            .get(event.task_id.clone())
            .await
            .map_err(|e| e.to_string())?;
        let body = Shape::V03.task(&task, None).to_string();
        // At once: a webhook that takes its 5 s to fail holds back none of the others.
        let posts = due
            .iter()
            .map(|(_, config)| self.post(config, event, body.clone()));
        let posted = futures::future::join_all(posts).await;
        for ((id, config), posted) in due.into_iter().zip(posted) {
            match posted {
                Ok(()) => attempt.took.push((id, config.url.clone())),
                Err(why) => {
                    pass.behind.insert(id);
                    attempt.failure.get_or_insert(why);
                }
            }
        }
        Ok(attempt)
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
