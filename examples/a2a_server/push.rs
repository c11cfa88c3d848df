//! A2A push notifications: the webhooks a client configures for a task (stored in the task
//! store's database, beside the outbox), in the shapes of both versions. `relay.rs` delivers
//! the outbox's events to them.

use jsonrpsee::core::RpcResult;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::errors;
use crate::tasks::TaskStore;

/// One webhook of a task, as stored and as both versions spell its members.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PushConfig {
    /// The config's id; a task's first config without one takes the task's id.
    #[serde(default)]
    pub id: Option<String>,
    pub url: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authentication: Option<Value>,
}

impl PushConfig {
    /// Reads a config from a request (`pushNotificationConfig`, or 1.0's flat params).
    pub fn parse(value: &Value) -> RpcResult<Self> {
        let config: Self = serde_json::from_value(value.clone())
            .map_err(|e| errors::invalid_params(format!("push notification config: {e}")))?;
        // Refused now, not retried for ever: a URL the relay cannot post to held the task's
        // later events back behind it.
        let refused =
            |why: String| errors::invalid_params(format!("push notification config: {why}"));
        let url = reqwest::Url::parse(&config.url).map_err(|e| refused(format!("url: {e}")))?;
        // A token the relay cannot send as a header failed every post before it left, for a
        // day of retries (helper-101).
        if let Some(token) = &config.token {
            http::HeaderValue::from_str(token)
                .map_err(|_| refused("token: not a valid HTTP header value".into()))?;
        }
        match (url.scheme(), url.host()) {
            ("http", Some(_)) => Ok(config),
            ("https", _) => Err(refused(
                "this agent posts to http:// webhooks only (it is built without TLS)".into(),
            )),
            _ => Err(refused("url must be an http:// URL with a host".into())),
        }
    }

    /// The config's id, given the task it belongs to.
    pub fn id_for(&self, task_id: &str) -> String {
        self.id.clone().unwrap_or_else(|| task_id.to_owned())
    }

    /// The config as it is stored, given the task it belongs to.
    pub fn stored(&self, task_id: &str) -> StoredConfig {
        let mut config = self.clone();
        let id = config.id_for(task_id);
        config.id = Some(id.clone());
        StoredConfig {
            id,
            json: serde_json::to_string(&config).expect("a config serializes"),
            url: config.url,
        }
    }
}

/// A config as its task's row holds it.
pub struct StoredConfig {
    pub id: String,
    pub json: String,
    pub url: String,
}

/// The A2A version a push method was called in.
#[derive(Debug, Clone, Copy)]
pub enum Spelling {
    /// 0.3: `{taskId, pushNotificationConfig: {id, url, ...}}`.
    V03,
    /// 1.0: `{id, taskId, url, ...}`.
    V10,
}

impl Spelling {
    fn render(self, task_id: &str, config: &PushConfig) -> Value {
        match self {
            Self::V03 => json!({ "taskId": task_id, "pushNotificationConfig": config }),
            Self::V10 => {
                let mut flat = serde_json::to_value(config).expect("a config serializes");
                flat["taskId"] = task_id.into();
                flat
            }
        }
    }
}

/// The push configs of the tasks.
#[derive(Clone)]
pub struct PushConfigs {
    store: TaskStore,
}

impl PushConfigs {
    pub fn new(store: TaskStore) -> Self {
        Self { store }
    }

    pub async fn set(
        &self,
        spelling: Spelling,
        task_id: String,
        config: Value,
    ) -> RpcResult<Value> {
        let config = PushConfig::parse(&config)?;
        let stored = config.stored(&task_id);
        self.store.set_push_config(&task_id, &stored).await?;
        Ok(spelling.render(
            &task_id,
            &PushConfig {
                id: Some(stored.id),
                ..config
            },
        ))
    }

    /// The config `config_id` of the task (its only one, or the one with the task's id, when
    /// no id is given).
    pub async fn get(
        &self,
        spelling: Spelling,
        task_id: String,
        config_id: Option<String>,
    ) -> RpcResult<Value> {
        let configs = self.of(&task_id).await?;
        let wanted = config_id.clone().unwrap_or_else(|| task_id.clone());
        let found = match (config_id, configs.as_slice()) {
            (None, [only]) => Some(only),
            _ => configs.iter().find(|c| c.id.as_deref() == Some(&wanted)),
        };
        match found {
            Some(config) => Ok(spelling.render(&task_id, config)),
            None => Err(errors::invalid_params(format!(
                "task {task_id} has no push notification config {wanted}"
            ))),
        }
    }

    pub async fn list(&self, spelling: Spelling, task_id: String) -> RpcResult<Value> {
        let configs = self.of(&task_id).await?;
        let rendered: Vec<Value> = configs
            .iter()
            .map(|c| spelling.render(&task_id, c))
            .collect();
        Ok(match spelling {
            Spelling::V03 => rendered.into(),
            Spelling::V10 => json!({ "configs": rendered }),
        })
    }

    pub async fn delete(
        &self,
        spelling: Spelling,
        task_id: String,
        config_id: String,
    ) -> RpcResult<Value> {
        self.store.get(task_id.clone()).await?;
        if !self
            .store
            .delete_push_config(task_id.clone(), config_id.clone())
            .await?
        {
            return Err(errors::invalid_params(format!(
                "task {task_id} has no push notification config {config_id}"
            )));
        }
        Ok(match spelling {
            Spelling::V03 => Value::Null,
            Spelling::V10 => json!({}),
        })
    }

    /// Stages the webhook a send's `configuration.pushNotificationConfig` names, in the call's
    /// unit of work (after its task: it commits with it).
    pub fn stage(
        &self,
        unit: &idem::UnitOfWork,
        task_id: &str,
        config: &PushConfig,
    ) -> RpcResult<()> {
        self.store
            .stage_push_config(unit, task_id, &config.stored(task_id))
    }

    /// The configs of an existing task (-32001 otherwise).
    pub async fn of(&self, task_id: &str) -> RpcResult<Vec<PushConfig>> {
        self.store.get(task_id.to_owned()).await?;
        self.stored(task_id).await
    }

    /// The configs stored for `task_id`, with no check that the task exists.
    pub async fn stored(&self, task_id: &str) -> RpcResult<Vec<PushConfig>> {
        let stored = self.store.push_configs(task_id.to_owned()).await?;
        stored
            .iter()
            .map(|json| serde_json::from_str(json).map_err(|_| errors::internal()))
            .collect()
    }
}
