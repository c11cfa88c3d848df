//! The executor behind the agent: a message assigns a mission (a Task in state `working`), the
//! mission completes in the background with an artifact echoing the text it was given, and
//! every assignment, completion and cancellation leaves one event in the outbox.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::stream::{self, BoxStream, StreamExt};
use jsonrpsee::core::RpcResult;
use jsonrpsee::types::ErrorObjectOwned;
use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::watch;
use tokio::time::Instant;
use uuid::Uuid;

use idem::UnitOfWork;

use crate::clock;
use crate::errors;
use crate::model::{Artifact, Content, Message, Part, Task, TaskState};
use crate::task_locks::TaskLocks;
use crate::tasks::{Event, TaskStore};

const DEFAULT_DURATION_MS: u64 = 2_000;
const MAX_DURATION_MS: u64 = 60_000;
/// The longest pause between two attempts to complete a mission.
const MAX_COMPLETION_PAUSE: Duration = Duration::from_secs(5);
/// How often a replica on a shared database looks for missions left overdue.
const OVERDUE_SWEEP: Duration = Duration::from_secs(5);
/// How often a stream that follows a task on a shared database reads it again, for another
/// replica's cancel.
const SHARED_LOOK: Duration = Duration::from_secs(1);
const MAX_DELAY_MS: u64 = 10_000;

/// `params.metadata` as a send reads it: the two members the missions obey. The others, a
/// client's own (trace ids, tenants, routing...), are skipped unread: no tree of them is built
/// only to be dropped.
#[derive(Debug, Default)]
pub struct Metadata {
    duration_ms: Option<Value>,
    delay_ms: Option<Value>,
}

impl<'de> Deserialize<'de> for Metadata {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(MetadataVisitor)
    }
}

struct MetadataVisitor;

/// A member's name, read without allocating it.
#[derive(Deserialize)]
enum Member {
    #[serde(rename = "durationMs")]
    DurationMs,
    #[serde(rename = "delayMs")]
    DelayMs,
    #[serde(other)]
    Other,
}

impl<'de> Visitor<'de> for MetadataVisitor {
    type Value = Metadata;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("params.metadata to be an object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut members: A) -> Result<Metadata, A::Error> {
        let mut metadata = Metadata::default();
        while let Some(member) = members.next_key()? {
            match member {
                Member::DurationMs => metadata.duration_ms = members.next_value()?,
                Member::DelayMs => metadata.delay_ms = members.next_value()?,
                Member::Other => drop(members.next_value::<IgnoredAny>()?),
            }
        }
        Ok(metadata)
    }
}

/// What `params.metadata` asks of a send.
#[derive(Debug, Clone, Copy)]
pub struct Orders {
    /// How long the mission works before it completes (`durationMs`).
    duration_ms: u64,
    /// How long the response itself is held back (`delayMs`), to make a call stay in flight.
    delay_ms: u64,
}

impl Orders {
    pub fn from_metadata(metadata: Option<&Metadata>) -> Result<Self, ErrorObjectOwned> {
        let (duration, delay) = metadata.map_or((None, None), |m| {
            (m.duration_ms.as_ref(), m.delay_ms.as_ref())
        });
        Ok(Self {
            duration_ms: millis(duration, "durationMs", DEFAULT_DURATION_MS, MAX_DURATION_MS)?,
            delay_ms: millis(delay, "delayMs", 0, MAX_DELAY_MS)?,
        })
    }
}

/// An optional whole number of milliseconds from 0 to `max`: member `key`'s `value`.
fn millis(value: Option<&Value>, key: &str, default: u64, max: u64) -> RpcResult<u64> {
    match value {
        None | Some(Value::Null) => Ok(default),
        // Clients built on protobuf's Struct (the official A2A SDKs) send every number as a
        // double: `200.0` is the whole number 200, as JCS also says when it hashes it.
        Some(value) => whole_number(value).filter(|ms| *ms <= max).ok_or_else(|| {
            errors::invalid_params(format!(
                "params.metadata.{key} must be a whole number from 0 to {max}"
            ))
        }),
    }
}

fn whole_number(value: &Value) -> Option<u64> {
    value.as_u64().or_else(|| {
        let float = value.as_f64()?;
        let whole = float.fract() == 0.0 && (0.0..=u32::MAX as f64).contains(&float);
        whole.then_some(float as u64)
    })
}

/// The missions of this agent.
#[derive(Clone)]
pub struct Missions {
    store: TaskStore,
    /// Continuations of one task take turns (`task_locks.rs`).
    continuing: TaskLocks,
    /// Bumped by each cancel here: a stream following a task looks again whether it ended.
    cancels: Arc<watch::Sender<u64>>,
}

impl Missions {
    pub fn new(store: TaskStore) -> Self {
        let continuing = TaskLocks::default();
        let cancels = Arc::new(watch::Sender::new(0));
        Self {
            store,
            continuing,
            cancels,
        }
    }

    /// Assigns a mission, or continues the task the message names; the task and its event
    /// commit with the call's `unit` of work. `blocking`: a new mission is worked to its end
    /// inside the call, and the task answered and committed as it ends, with both its events
    /// (a crash before the commit leaves nothing, and the retry works it again). A message
    /// that continues a running task is answered at once either way: its mission runs already.
    pub async fn send(
        &self,
        unit: &UnitOfWork,
        message: Message,
        orders: Orders,
        blocking: bool,
    ) -> RpcResult<Task> {
        if blocking && message.task_id.is_none() {
            return self.work_to_end(unit, message, orders).await;
        }
        let (task, _) = self.begin(unit, message, orders).await?;
        tokio::time::sleep(Duration::from_millis(orders.delay_ms)).await;
        Ok(task)
    }

    /// Like [`send`](Self::send), then follows the mission to its end: the task, a status update
    /// halfway to the deadline, then the artifact and the final status update. A message that
    /// continues a task follows that task's mission the same way. The stream completes the
    /// mission itself (the background completion, racing it, is a no-op). A task canceled here
    /// meanwhile ends it at once with its final status, as a task stream closes when its task
    /// is terminal (a cancel on another replica within a second).
    pub async fn stream(
        &self,
        unit: &UnitOfWork,
        message: Message,
        orders: Orders,
    ) -> RpcResult<(String, BoxStream<'static, RpcResult<Progress>>)> {
        let (task, due_at_ms) = self.begin(unit, message, orders).await?;
        let task_id = task.id.clone();
        let until_due = Duration::from_millis(due_at_ms.saturating_sub(clock::now_ms()));
        let now = Instant::now();
        let (halfway, due) = (now + until_due / 2, now + until_due);
        let first = Progress::Task(task.clone());
        let working = Progress::Status {
            task: task.clone(),
            last: false,
        };
        let (missions, mut cancels) = (self.clone(), self.cancels.subscribe());
        let rest = async move {
            if let Some(ended) = missions.ended_before(halfway, &task.id, &mut cancels).await {
                return stream::iter(ending(Ok(ended))).boxed();
            }
            let end = async move {
                match missions.ended_before(due, &task.id, &mut cancels).await {
                    Some(ended) => Ok(ended),
                    // Tried again while the store fails, as the timer does: one failed
                    // write must not end the stream, whose outcome is cached, with an error.
                    None => missions.complete_until_done(task.id).await,
                }
            };
            stream::iter([Ok(working)])
                .chain(stream::once(end).flat_map(|ended| stream::iter(ending(ended))))
                .boxed()
        };
        let events = stream::iter([Ok(first)]).chain(stream::once(rest).flatten());
        Ok((task_id, events.boxed()))
    }

    /// A blocking send's new mission, worked here: the completed task and both its events
    /// are staged in the call's unit of work, so they commit with its cache entry.
    async fn work_to_end(
        &self,
        unit: &UnitOfWork,
        message: Message,
        orders: Orders,
    ) -> RpcResult<Task> {
        accept(&message)?;
        let mut task = Task::assign(message);
        let assigned = event(
            "mission.assigned",
            &task,
            json!({ "durationMs": orders.duration_ms }),
        );
        tokio::time::sleep(Duration::from_millis(orders.duration_ms)).await;
        let completed = finish(&mut task);
        let events = [assigned, completed];
        self.store
            .stage_insert(unit, &task, clock::now_ms(), events)?;
        tokio::time::sleep(Duration::from_millis(orders.delay_ms)).await;
        Ok(task)
    }

    /// The checks and effects shared by both sends: the `fail` order, then assign or continue.
    /// Returns the task and when its mission completes (epoch ms).
    async fn begin(
        &self,
        unit: &UnitOfWork,
        message: Message,
        orders: Orders,
    ) -> RpcResult<(Task, u64)> {
        accept(&message)?;
        match message.task_id.clone() {
            Some(task_id) => self.continue_task(unit, task_id, message).await,
            None => self.assign(unit, message, orders.duration_ms),
        }
    }

    /// Follows a task to its end, for a client whose stream broke: the task as it is now,
    /// then, once its mission ends (or a cancel ends it), its artifacts and the final status.
    /// A task that ended already gets its task and final status at once, or unless
    /// `ended_allowed`, -32004.
    pub async fn follow(
        &self,
        task_id: String,
        ended_allowed: bool,
    ) -> RpcResult<BoxStream<'static, RpcResult<Progress>>> {
        let loaded = self.store.load(task_id).await?;
        let task = loaded.task;
        let now = stream::iter([Ok(Progress::Task(task.clone()))]);
        if task.state.is_terminal() {
            if !ended_allowed {
                return Err(errors::subscription_to_ended_task(
                    &task.id,
                    task.state.name(),
                ));
            }
            return Ok(now.chain(stream::iter(ending(Ok(task)))).boxed());
        }
        let (missions, mut cancels) = (self.clone(), self.cancels.subscribe());
        let end = async move {
            let due = Duration::from_millis(loaded.due_at_ms.saturating_sub(clock::now_ms()));
            // A cancel meanwhile ends it at once, as it ends the task's own stream.
            match missions
                .ended_before(Instant::now() + due, &task.id, &mut cancels)
                .await
            {
                Some(ended) => Ok(ended),
                None => missions.ended(task.id).await,
            }
        };
        Ok(now
            .chain(stream::once(end).flat_map(|ended| stream::iter(ending(ended))))
            .boxed())
    }

    /// The task once it is terminal: its mission completes on the timer scheduled for it (here
    /// or, after a restart, by the resume), which may run a moment after the deadline. One
    /// still working a minute later is an error: a stream's last status must be terminal.
    async fn ended(&self, task_id: String) -> RpcResult<Task> {
        let deadline = tokio::time::Instant::now() + Duration::from_millis(MAX_DURATION_MS);
        loop {
            let task = self.store.get(task_id.clone()).await?;
            if task.state.is_terminal() {
                return Ok(task);
            }
            if tokio::time::Instant::now() > deadline {
                return Err(errors::task_not_ended(&task.id));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn get(&self, task_id: String) -> RpcResult<Task> {
        self.store.get(task_id).await
    }

    /// Cancels a working task; a terminal one is -32002.
    pub async fn cancel(&self, task_id: String) -> RpcResult<Task> {
        let canceled = self
            .store
            .update(task_id, |task| {
                if task.state.is_terminal() {
                    return Err(errors::task_not_cancelable(&task.id, task.state.name()));
                }
                task.cancel();
                Ok(Some(event("mission.canceled", task, json!({}))))
            })
            .await?;
        self.cancels.send_modify(|count| *count += 1);
        Ok(canceled)
    }

    /// The task, if it is terminal before `deadline`: looked at again after each cancel here,
    /// and on a database replicas share, every [`SHARED_LOOK`] as well: another replica's
    /// cancel reaches no watch of this one (a follower learned of it at the deadline, up to a
    /// minute late: helper-95).
    async fn ended_before(
        &self,
        deadline: Instant,
        task_id: &str,
        cancels: &mut watch::Receiver<u64>,
    ) -> Option<Task> {
        let shared = self.store.shared();
        loop {
            tokio::select! {
                // A cancel first: one that came with the deadline still ends the stream.
                biased;
                _ = cancels.changed() => {}
                _ = tokio::time::sleep(SHARED_LOOK), if shared => {}
                _ = tokio::time::sleep_until(deadline) => return None,
            }
            // A read that fails leaves the stream to its deadline, as before a cancel.
            if let Ok(task) = self.store.get(task_id.to_owned()).await {
                if task.state.is_terminal() {
                    return Some(task);
                }
            }
        }
    }

    /// Reschedules the missions a previous run left working; overdue ones complete at once.
    pub async fn resume(&self) -> RpcResult<usize> {
        let working = self.store.working().await?;
        for (task_id, due_at_ms) in &working {
            self.schedule(task_id.clone(), *due_at_ms);
        }
        Ok(working.len())
    }

    /// Stages a new working task and its `mission.assigned` event; the mission's timer starts
    /// once they are committed.
    fn assign(
        &self,
        unit: &UnitOfWork,
        message: Message,
        duration_ms: u64,
    ) -> RpcResult<(Task, u64)> {
        let task = Task::assign(message);
        let due_at_ms = clock::now_ms() + duration_ms;
        let assigned = event(
            "mission.assigned",
            &task,
            json!({ "durationMs": duration_ms }),
        );
        self.store
            .stage_insert(unit, &task, due_at_ms, [assigned])?;
        let (missions, task_id) = (self.clone(), task.id.clone());
        unit.after_commit(move || {
            tracing::info!(%task_id, duration_ms, "mission assigned");
            missions.schedule(task_id, due_at_ms);
        })?;
        Ok((task, due_at_ms))
    }

    /// Adds the message to a working task's history; its mission keeps its deadline. The
    /// task's turn is held from the read until the call's unit has committed or was dropped.
    async fn continue_task(
        &self,
        unit: &UnitOfWork,
        task_id: String,
        message: Message,
    ) -> RpcResult<(Task, u64)> {
        let turn = self.continuing.turn(&task_id).await;
        unit.after_commit(move || drop(turn))?;
        let loaded = self.store.load(task_id).await?;
        let mut task = loaded.task.clone();
        if task.state.is_terminal() {
            return Err(errors::task_terminal(&task.id, task.state.name()));
        }
        if message
            .context_id
            .as_ref()
            .is_some_and(|c| *c != task.context_id)
        {
            return Err(errors::invalid_params(
                "message.contextId differs from the contextId of message.taskId",
            ));
        }
        task.append(message);
        let due_at_ms = loaded.due_at_ms;
        self.store.stage_update(unit, loaded, &task)?;
        Ok((task, due_at_ms))
    }

    fn schedule(&self, task_id: String, due_at_ms: u64) {
        let missions = self.clone();
        tokio::spawn(async move {
            let wait = due_at_ms.saturating_sub(clock::now_ms());
            tokio::time::sleep(Duration::from_millis(wait)).await;
            let _ = missions.complete_until_done(task_id).await;
        });
    }

    /// Completes a mission, trying again while the store fails (a database outage, say):
    /// a mission is never left working past its time by one failed write. The task as it
    /// ended (completed here, or canceled before), or -32001 if it is gone.
    async fn complete_until_done(&self, task_id: String) -> RpcResult<Task> {
        let mut pause = Duration::from_millis(250);
        let mut failures = 0u32;
        loop {
            match self.complete(task_id.clone()).await {
                // Logged once: the stream and the timer of a streamed task both complete it.
                Ok((task, true)) => {
                    let state = task.state.name();
                    tracing::info!(%task_id, state, failures, "mission ended");
                    return Ok(task);
                }
                Ok((task, false)) => return Ok(task),
                Err(error) if error.code() == errors::TASK_NOT_FOUND => {
                    tracing::warn!(%task_id, "a mission's task is gone");
                    return Err(error);
                }
                // Said once, not at every attempt (a full disk: two lines a mission each time,
                // helper-63); the store's own error is logged where it failed.
                Err(error) => {
                    failures += 1;
                    if failures == 1 {
                        let message = error.message();
                        tracing::warn!(%task_id, message, "mission could not complete; trying again until it does");
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(MAX_COMPLETION_PAUSE);
                }
            }
        }
    }

    /// On a database that several replicas share: completes, every [`OVERDUE_SWEEP`], the
    /// missions overdue by more than that, whichever replica assigned them (one that was
    /// killed no longer will). Completing is conditional on the row, so two replicas never
    /// complete a task twice. Due times are stamped by the assigning replica's clock: one
    /// more than [`OVERDUE_SWEEP`] behind the others has its missions completed early
    /// (README: keep the replicas' clocks in step).
    pub fn sweep_overdue(&self) {
        let missions = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(OVERDUE_SWEEP).await;
                let Ok(working) = missions.store.working().await else {
                    continue;
                };
                let late = clock::now_ms().saturating_sub(OVERDUE_SWEEP.as_millis() as u64);
                for (task_id, due_at_ms) in working {
                    if due_at_ms < late {
                        let _ = missions.complete_until_done(task_id).await;
                    }
                }
            }
        });
    }

    /// Completes a mission that is still working (one canceled meanwhile stays canceled).
    /// The task as it ended, and whether it ended here (else it had ended before).
    async fn complete(&self, task_id: String) -> RpcResult<(Task, bool)> {
        let ended_here = Arc::new(AtomicBool::new(false));
        let ending = ended_here.clone();
        let task = self
            .store
            .update(task_id, move |task| {
                if task.state != TaskState::Working {
                    return Ok(None);
                }
                ending.store(true, Ordering::Relaxed);
                Ok(Some(finish(task)))
            })
            .await?;
        Ok((task, ended_here.load(Ordering::Relaxed)))
    }
}

/// What the agent works on: text. A `fail` text asks the mission to fail (a cached failure);
/// a file or data part is refused before anything happens (-32005).
fn accept(message: &Message) -> RpcResult<()> {
    if message.texts().eq(["fail"]) {
        return Err(errors::mission_failed(
            "the message asked the mission to fail",
        ));
    }
    let unsupported = message
        .parts
        .iter()
        .enumerate()
        .find_map(|(i, part)| match part.content {
            Content::Text(_) => None,
            Content::File { .. } => Some((i, "file")),
            Content::Data(_) => Some((i, "data")),
        });
    match unsupported {
        Some((index, kind)) => Err(errors::content_type_not_supported(index, kind)),
        None => Ok(()),
    }
}

/// Completes a working task with its artifact; the `mission.completed` event it causes.
fn finish(task: &mut Task) -> Event {
    let artifact = echo(task);
    let artifact_id = artifact.artifact_id.clone();
    task.complete(artifact, Message::agent("Mission complete."));
    event(
        "mission.completed",
        task,
        json!({ "artifactId": artifact_id }),
    )
}

/// A step of a streamed mission, rendered per version by `shapes`.
pub enum Progress {
    /// The task as assigned (or as continued).
    Task(Task),
    /// The task's status; `last` marks the final event of the stream.
    Status { task: Task, last: bool },
    /// An artifact the mission produced.
    Artifact(Task, Artifact),
}

/// The last events of a streamed mission: its artifacts (none if it was canceled), then the
/// final status; a failure to complete ends the stream with an error event.
fn ending(ended: RpcResult<Task>) -> Vec<RpcResult<Progress>> {
    let task = match ended {
        Ok(task) => task,
        Err(error) => return vec![Err(error)],
    };
    let artifacts = task
        .artifacts
        .iter()
        .map(|a| Ok(Progress::Artifact(task.clone(), a.clone())));
    let mut events: Vec<_> = artifacts.collect();
    events.push(Ok(Progress::Status { task, last: true }));
    events
}

/// The mission's result: every text part the task was given, in order.
fn echo(task: &Task) -> Artifact {
    Artifact {
        artifact_id: Uuid::new_v4().to_string(),
        name: "echo".into(),
        parts: task
            .history
            .iter()
            .flat_map(Message::texts)
            .map(Part::text)
            .collect(),
    }
}

/// An outbox event about `task`; `details` adds to the ids every event carries.
fn event(event_type: &'static str, task: &Task, mut details: Value) -> Event {
    details["taskId"] = task.id.clone().into();
    details["contextId"] = task.context_id.clone().into();
    Event {
        event_type,
        payload: details,
    }
}
