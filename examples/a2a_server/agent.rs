//! The JSON-RPC surface: the A2A methods in both spellings, each a thin adapter that reads the
//! params, asks the missions, and renders the result in the shape of the method called.

use futures::StreamExt;
use idem::{idempotent, EventStream, Replayable, UnitOfWork};
use jsonrpsee::core::{async_trait, RpcResult};
use jsonrpsee::proc_macros::rpc;
use jsonrpsee::Extensions;
use serde_json::Value;

use crate::errors;
use crate::mission::{Metadata, Missions, Orders};
use crate::push::{PushConfig, PushConfigs, Spelling};
use crate::shapes::{self, SendConfiguration, Shape};

/// The A2A methods. jsonrpsee maps the members of a named-params object to the arguments
/// (`historyLength` reaches `history_length`); members the agent does not use, such as 1.0's
/// `tenant`, are ignored.
#[rpc(server)]
pub trait A2a {
    /// A2A 0.3 `message/send`: the result is a Task.
    #[method(name = "message/send", with_extensions)]
    async fn message_send(
        &self,
        message: Value,
        configuration: Option<SendConfiguration>,
        metadata: Option<Metadata>,
    ) -> RpcResult<Replayable<Value>>;

    /// A2A 1.0 `SendMessage`: the result is `{"task": Task}`.
    #[method(name = "SendMessage", with_extensions)]
    async fn send_message(
        &self,
        message: Value,
        configuration: Option<SendConfiguration>,
        metadata: Option<Metadata>,
    ) -> RpcResult<Replayable<Value>>;

    /// A2A 0.3 `message/stream`: Server-Sent Events, each a JSON-RPC response whose result is
    /// the Task, a `status-update` or an `artifact-update`; the last has `final: true`.
    #[method(name = "message/stream", with_extensions)]
    async fn message_stream(
        &self,
        message: Value,
        configuration: Option<SendConfiguration>,
        metadata: Option<Metadata>,
    ) -> RpcResult<EventStream<Value>>;

    /// A2A 1.0 `SendStreamingMessage`: the same events as `{"task"}`, `{"statusUpdate"}`,
    /// `{"artifactUpdate"}`.
    #[method(name = "SendStreamingMessage", with_extensions)]
    async fn send_streaming_message(
        &self,
        message: Value,
        configuration: Option<SendConfiguration>,
        metadata: Option<Metadata>,
    ) -> RpcResult<EventStream<Value>>;

    /// A2A 0.3 `tasks/get`.
    #[method(name = "tasks/get")]
    async fn tasks_get(&self, id: String, history_length: Option<u32>) -> RpcResult<Value>;

    /// A2A 1.0 `GetTask`: the result is the Task itself (no wrapper, unlike `SendMessage`).
    #[method(name = "GetTask")]
    async fn get_task(&self, id: String, history_length: Option<u32>) -> RpcResult<Value>;

    /// A2A 0.3 `tasks/cancel`.
    #[method(name = "tasks/cancel")]
    async fn tasks_cancel(&self, id: String) -> RpcResult<Value>;

    /// A2A 1.0 `CancelTask`: the result is the Task itself.
    #[method(name = "CancelTask")]
    async fn cancel_task(&self, id: String) -> RpcResult<Value>;

    /// A2A 0.3 `tasks/resubscribe`: follows a task again after a broken stream (Server-Sent
    /// Events: the task now, then its events until it ends). Not deduplicated: it changes
    /// nothing.
    #[method(name = "tasks/resubscribe", with_extensions)]
    async fn tasks_resubscribe(&self, id: String) -> RpcResult<EventStream<Value>>;

    /// A2A 1.0 `SubscribeToTask`: the same, in 1.0's shapes.
    #[method(name = "SubscribeToTask", with_extensions)]
    async fn subscribe_to_task(&self, id: String) -> RpcResult<EventStream<Value>>;

    /// A2A 0.3: sets a webhook of a task (`{taskId, pushNotificationConfig}`).
    #[method(name = "tasks/pushNotificationConfig/set")]
    async fn push_set(&self, task_id: String, push_notification_config: Value) -> RpcResult<Value>;

    /// A2A 0.3: one webhook of a task (`id` is the task's).
    #[method(name = "tasks/pushNotificationConfig/get")]
    async fn push_get(
        &self,
        id: String,
        push_notification_config_id: Option<String>,
    ) -> RpcResult<Value>;

    /// A2A 0.3: the webhooks of a task.
    #[method(name = "tasks/pushNotificationConfig/list")]
    async fn push_list(&self, id: String) -> RpcResult<Value>;

    /// A2A 0.3: deletes a webhook of a task.
    #[method(name = "tasks/pushNotificationConfig/delete")]
    async fn push_delete(
        &self,
        id: String,
        push_notification_config_id: String,
    ) -> RpcResult<Value>;

    /// A2A 1.0: sets a webhook of a task (`{taskId, id?, url, token?, authentication?}`).
    #[method(name = "CreateTaskPushNotificationConfig")]
    async fn create_push_config(
        &self,
        task_id: String,
        id: Option<String>,
        url: String,
        token: Option<String>,
        authentication: Option<Value>,
    ) -> RpcResult<Value>;

    /// A2A 1.0: one webhook of a task.
    #[method(name = "GetTaskPushNotificationConfig")]
    async fn get_push_config(&self, task_id: String, id: String) -> RpcResult<Value>;

    /// A2A 1.0: the webhooks of a task, as `{configs}`.
    #[method(name = "ListTaskPushNotificationConfigs")]
    async fn list_push_configs(&self, task_id: String) -> RpcResult<Value>;

    /// A2A 1.0: deletes a webhook of a task.
    #[method(name = "DeleteTaskPushNotificationConfig")]
    async fn delete_push_config(&self, task_id: String, id: String) -> RpcResult<Value>;

    /// A2A 0.3 `agent/getAuthenticatedExtendedCard`: this agent has no extended card (its card
    /// says `supportsAuthenticatedExtendedCard: false`), so the answer is -32007, not -32601.
    #[method(name = "agent/getAuthenticatedExtendedCard")]
    async fn get_authenticated_extended_card(&self) -> RpcResult<Value>;

    /// A2A 1.0 `GetExtendedAgentCard`: the same, for 1.0's `capabilities.extendedAgentCard`.
    #[method(name = "GetExtendedAgentCard")]
    async fn get_extended_agent_card(&self) -> RpcResult<Value>;
}

/// The agent: the RPC methods over the missions and the tasks' webhooks.
pub struct Agent {
    missions: Missions,
    push: PushConfigs,
}

impl Agent {
    pub fn new(missions: Missions, push: PushConfigs) -> Self {
        Self { missions, push }
    }

    /// The webhook a send configures, read before anything happens.
    fn push_config(configuration: &SendConfiguration) -> RpcResult<Option<PushConfig>> {
        let config = configuration.push_notification_config.as_ref();
        config.map(PushConfig::parse).transpose()
    }

    /// Both send methods; runs inside the idempotency guard, so everything it does (task,
    /// outbox event, error) happens once per messageId: its writes commit in the unit of work
    /// of the call, with its cache entry.
    async fn send(
        &self,
        ext: &Extensions,
        shape: Shape,
        message: Value,
        configuration: Option<SendConfiguration>,
        metadata: Option<Metadata>,
    ) -> RpcResult<Replayable<Value>> {
        let orders = Orders::from_metadata(metadata.as_ref())?;
        let message = shapes::parse_message(&message).map_err(errors::invalid_params)?;
        let unit = UnitOfWork::of(ext)?;
        let configuration = configuration.unwrap_or_default();
        let push = Self::push_config(&configuration)?;
        let blocking = configuration.waits_for_the_end(shape);
        let task = self.missions.send(&unit, message, orders, blocking).await?;
        if let Some(push) = &push {
            self.push.stage(&unit, &task.id, push)?;
        }
        let history_length = configuration.history_length;
        Ok(shape.send_result(&task, history_length).into())
    }

    /// Both streaming methods; the guard records the events and replays them per messageId.
    async fn stream(
        &self,
        ext: &Extensions,
        shape: Shape,
        message: Value,
        configuration: Option<SendConfiguration>,
        metadata: Option<Metadata>,
    ) -> RpcResult<EventStream<Value>> {
        let orders = Orders::from_metadata(metadata.as_ref())?;
        let message = shapes::parse_message(&message).map_err(errors::invalid_params)?;
        let unit = UnitOfWork::of(ext)?;
        let configuration = configuration.unwrap_or_default();
        let push = Self::push_config(&configuration)?;
        let history_length = configuration.history_length;
        let (task_id, progress) = self.missions.stream(&unit, message, orders).await?;
        if let Some(push) = &push {
            self.push.stage(&unit, &task_id, push)?;
        }
        let events =
            progress.map(move |step| step.map(|step| shape.stream_event(&step, history_length)));
        Ok(EventStream::new(events))
    }

    /// Both resubscribe methods.
    async fn follow(
        &self,
        ext: &Extensions,
        shape: Shape,
        id: String,
    ) -> RpcResult<EventStream<Value>> {
        // 0.3 streams a task that ended; 1.0 (§3.1.6) refuses it with -32004.
        let progress = self.missions.follow(id, shape == Shape::V03).await?;
        let events = progress.map(move |step| step.map(|step| shape.stream_event(&step, None)));
        EventStream::live(ext, events)
    }

    async fn get(&self, shape: Shape, id: String, history_length: Option<u32>) -> RpcResult<Value> {
        let task = self.missions.get(id).await?;
        Ok(shape.task(&task, history_length))
    }

    async fn cancel(&self, shape: Shape, id: String) -> RpcResult<Value> {
        let task = self.missions.cancel(id).await?;
        Ok(shape.task(&task, None))
    }
}

#[async_trait]
impl A2aServer for Agent {
    #[idempotent]
    async fn message_send(
        &self,
        ext: &Extensions,
        message: Value,
        configuration: Option<SendConfiguration>,
        metadata: Option<Metadata>,
    ) -> RpcResult<Replayable<Value>> {
        self.send(ext, Shape::V03, message, configuration, metadata)
            .await
    }

    #[idempotent]
    async fn send_message(
        &self,
        ext: &Extensions,
        message: Value,
        configuration: Option<SendConfiguration>,
        metadata: Option<Metadata>,
    ) -> RpcResult<Replayable<Value>> {
        self.send(ext, Shape::V10, message, configuration, metadata)
            .await
    }

    #[idempotent]
    async fn message_stream(
        &self,
        ext: &Extensions,
        message: Value,
        configuration: Option<SendConfiguration>,
        metadata: Option<Metadata>,
    ) -> RpcResult<EventStream<Value>> {
        self.stream(ext, Shape::V03, message, configuration, metadata)
            .await
    }

    #[idempotent]
    async fn send_streaming_message(
        &self,
        ext: &Extensions,
        message: Value,
        configuration: Option<SendConfiguration>,
        metadata: Option<Metadata>,
    ) -> RpcResult<EventStream<Value>> {
        self.stream(ext, Shape::V10, message, configuration, metadata)
            .await
    }

    async fn tasks_get(&self, id: String, history_length: Option<u32>) -> RpcResult<Value> {
        self.get(Shape::V03, id, history_length).await
    }

    async fn get_task(&self, id: String, history_length: Option<u32>) -> RpcResult<Value> {
        self.get(Shape::V10, id, history_length).await
    }

    async fn tasks_cancel(&self, id: String) -> RpcResult<Value> {
        self.cancel(Shape::V03, id).await
    }

    async fn cancel_task(&self, id: String) -> RpcResult<Value> {
        self.cancel(Shape::V10, id).await
    }

    async fn tasks_resubscribe(
        &self,
        ext: &Extensions,
        id: String,
    ) -> RpcResult<EventStream<Value>> {
        self.follow(ext, Shape::V03, id).await
    }

    async fn subscribe_to_task(
        &self,
        ext: &Extensions,
        id: String,
    ) -> RpcResult<EventStream<Value>> {
        self.follow(ext, Shape::V10, id).await
    }

    async fn push_set(&self, task_id: String, config: Value) -> RpcResult<Value> {
        self.push.set(Spelling::V03, task_id, config).await
    }

    async fn push_get(&self, id: String, config_id: Option<String>) -> RpcResult<Value> {
        self.push.get(Spelling::V03, id, config_id).await
    }

    async fn push_list(&self, id: String) -> RpcResult<Value> {
        self.push.list(Spelling::V03, id).await
    }

    async fn push_delete(&self, id: String, config_id: String) -> RpcResult<Value> {
        self.push.delete(Spelling::V03, id, config_id).await
    }

    async fn create_push_config(
        &self,
        task_id: String,
        id: Option<String>,
        url: String,
        token: Option<String>,
        authentication: Option<Value>,
    ) -> RpcResult<Value> {
        let config = serde_json::json!({"id": id, "url": url, "token": token, "authentication": authentication});
        self.push.set(Spelling::V10, task_id, config).await
    }

    async fn get_push_config(&self, task_id: String, id: String) -> RpcResult<Value> {
        self.push.get(Spelling::V10, task_id, Some(id)).await
    }

    async fn list_push_configs(&self, task_id: String) -> RpcResult<Value> {
        self.push.list(Spelling::V10, task_id).await
    }

    async fn delete_push_config(&self, task_id: String, id: String) -> RpcResult<Value> {
        self.push.delete(Spelling::V10, task_id, id).await
    }

    async fn get_authenticated_extended_card(&self) -> RpcResult<Value> {
        Err(errors::extended_card_not_configured())
    }

    async fn get_extended_agent_card(&self) -> RpcResult<Value> {
        Err(errors::extended_card_not_configured())
    }
}
