//! The A2A 0.3 and 1.0 JSON shapes: requests are read in either spelling, results are rendered
//! in the spelling of the method that was called.
//!
//! 0.3 tags objects with `kind`, spells states `working` and roles `user`; 1.0 has no `kind`,
//! spells `TASK_STATE_WORKING` and `ROLE_USER`, flattens file parts to `raw`/`url`, and wraps
//! the `SendMessage` result as `{"task": ...}`.

use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::mission::Progress;
use crate::model::{Artifact, Content, FileSource, Message, Part, Role, Task, TaskState};

/// The protocol version a result is rendered for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    V03,
    V10,
}

/// `params.configuration` of a send, in both versions. Unknown members are ignored.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SendConfiguration {
    pub history_length: Option<u32>,
    /// 0.3: answer once the task is terminal, not as soon as it is working (default false).
    pub blocking: Option<bool>,
    /// 1.0: answer as soon as the task is working; by default a 1.0 send waits for its end
    /// (1.0.1 §3.2.2).
    pub return_immediately: Option<bool>,
    /// A webhook for the task's events, set with the task (1.0 names it
    /// `taskPushNotificationConfig`).
    #[serde(alias = "taskPushNotificationConfig")]
    pub push_notification_config: Option<Value>,
}

impl SendConfiguration {
    /// Whether a send answers only once its task is terminal: 0.3's `blocking`, default
    /// false; 1.0's `returnImmediately` negated, default true (a 1.0 client's `blocking`, of
    /// an earlier draft, is read too).
    pub fn waits_for_the_end(&self, shape: Shape) -> bool {
        match shape {
            Shape::V03 => self.blocking.unwrap_or(false),
            Shape::V10 => self
                .return_immediately
                .map(|immediately| !immediately)
                .or(self.blocking)
                .unwrap_or(true),
        }
    }
}

impl Shape {
    /// The result of `message/send` (a Task) or `SendMessage` (`{"task": Task}`).
    pub fn send_result(self, task: &Task, history_length: Option<u32>) -> Value {
        let task = self.task(task, history_length);
        match self {
            Self::V03 => task,
            Self::V10 => json!({ "task": task }),
        }
    }

    /// One event of `message/stream` (0.3) or `SendStreamingMessage` (1.0).
    pub fn stream_event(self, progress: &Progress, history_length: Option<u32>) -> Value {
        match progress {
            Progress::Task(task) => self.send_result(task, history_length),
            Progress::Status { task, last } => {
                let mut update = json!({
                    "taskId": task.id,
                    "contextId": task.context_id,
                    "status": self.status(task),
                });
                match self {
                    Self::V03 => {
                        update["final"] = (*last).into();
                        self.kinded("status-update", update)
                    }
                    Self::V10 => json!({ "statusUpdate": update }),
                }
            }
            Progress::Artifact(task, artifact) => {
                let update = json!({
                    "taskId": task.id,
                    "contextId": task.context_id,
                    "artifact": self.artifact(artifact),
                    "lastChunk": true,
                });
                match self {
                    Self::V03 => self.kinded("artifact-update", update),
                    Self::V10 => json!({ "artifactUpdate": update }),
                }
            }
        }
    }

    /// A Task, with at most `history_length` of the most recent history messages.
    pub fn task(self, task: &Task, history_length: Option<u32>) -> Value {
        let history = recent(&task.history, history_length);
        self.kinded(
            "task",
            json!({
                "id": task.id,
                "contextId": task.context_id,
                "status": self.status(task),
                "history": history.iter().map(|m| self.message(m)).collect::<Vec<_>>(),
                "artifacts": task.artifacts.iter().map(|a| self.artifact(a)).collect::<Vec<_>>(),
            }),
        )
    }

    fn status(self, task: &Task) -> Value {
        let mut status = json!({ "state": self.state(task.state), "timestamp": task.timestamp });
        put(
            &mut status,
            "message",
            task.status_message.as_ref().map(|m| self.message(m)),
        );
        status
    }

    fn message(self, message: &Message) -> Value {
        let mut out = json!({
            "messageId": message.message_id,
            "role": self.role(message.role),
            "parts": self.parts(&message.parts),
        });
        put(&mut out, "contextId", message.context_id.clone());
        put(&mut out, "taskId", message.task_id.clone());
        put(&mut out, "metadata", message.metadata.clone());
        self.kinded("message", out)
    }

    fn artifact(self, artifact: &Artifact) -> Value {
        json!({
            "artifactId": artifact.artifact_id,
            "name": artifact.name,
            "parts": self.parts(&artifact.parts),
        })
    }

    fn parts(self, parts: &[Part]) -> Vec<Value> {
        parts.iter().map(|part| self.part(part)).collect()
    }

    fn part(self, part: &Part) -> Value {
        let mut out = match &part.content {
            Content::Text(text) => self.kinded("text", json!({ "text": text })),
            Content::Data(data) => self.kinded("data", json!({ "data": data })),
            Content::File {
                source,
                name,
                media_type,
            } => self.file(source, name, media_type),
        };
        put(&mut out, "metadata", part.metadata.clone());
        out
    }

    fn file(
        self,
        source: &FileSource,
        name: &Option<String>,
        media_type: &Option<String>,
    ) -> Value {
        let (bytes_key, uri_key, name_key, type_key) = match self {
            Self::V03 => ("bytes", "uri", "name", "mimeType"),
            Self::V10 => ("raw", "url", "filename", "mediaType"),
        };
        let mut file = match source {
            FileSource::Bytes(bytes) => json!({ bytes_key: bytes }),
            FileSource::Uri(uri) => json!({ uri_key: uri }),
        };
        put(&mut file, name_key, name.clone());
        put(&mut file, type_key, media_type.clone());
        match self {
            Self::V03 => json!({ "kind": "file", "file": file }),
            Self::V10 => file,
        }
    }

    /// 0.3 discriminates objects with `kind`; 1.0 dropped it.
    fn kinded(self, kind: &str, mut object: Value) -> Value {
        if self == Self::V03 {
            object["kind"] = kind.into();
        }
        object
    }

    fn state(self, state: TaskState) -> &'static str {
        match (self, state) {
            (Self::V03, _) => state.name(),
            (Self::V10, TaskState::Working) => "TASK_STATE_WORKING",
            (Self::V10, TaskState::Completed) => "TASK_STATE_COMPLETED",
            (Self::V10, TaskState::Canceled) => "TASK_STATE_CANCELED",
        }
    }

    fn role(self, role: Role) -> &'static str {
        match (self, role) {
            (Self::V03, Role::User) => "user",
            (Self::V03, Role::Agent) => "agent",
            (Self::V10, Role::User) => "ROLE_USER",
            (Self::V10, Role::Agent) => "ROLE_AGENT",
        }
    }
}

/// Reads a client's `params.message` in either version's spelling.
///
/// Lenient about the version because a client's spelling says nothing about the task: only the
/// result is rendered per method.
pub fn parse_message(value: &Value) -> Result<Message, String> {
    let Some(message) = value.as_object() else {
        return Err("params.message must be an object".into());
    };
    if present(message, "kind").is_some_and(|kind| kind != "message") {
        return Err(r#"message.kind must be "message" (A2A 0.3), or absent (1.0)"#.into());
    }
    let message_id = string(message.get("messageId"), "message.messageId")?
        .ok_or("message.messageId is required")?;
    let role = match message.get("role").and_then(Value::as_str) {
        Some("user" | "ROLE_USER") => Role::User,
        _ => {
            return Err(r#"message.role must be "user" (A2A 0.3) or "ROLE_USER" (A2A 1.0)"#.into())
        }
    };
    let parts = match message.get("parts").and_then(Value::as_array) {
        Some(parts) if !parts.is_empty() => parts
            .iter()
            .enumerate()
            .map(|(i, part)| parse_part(i, part))
            .collect::<Result<_, _>>()?,
        _ => return Err("message.parts must be a non-empty array".into()),
    };
    Ok(Message {
        message_id,
        role,
        parts,
        context_id: string(message.get("contextId"), "message.contextId")?,
        task_id: string(message.get("taskId"), "message.taskId")?,
        metadata: metadata(message, "message.metadata")?,
    })
}

/// A part by its `kind` where it has one (0.3), or by its one member of a 1.0 part's. Read by
/// the first member found, a 0.3 file or data part that also held a `text` was run as text,
/// the client's file dropped without a word (found by helper-117).
fn parse_part(index: usize, value: &Value) -> Result<Part, String> {
    let Some(part) = value.as_object() else {
        return Err(format!("message.parts[{index}] must be an object"));
    };
    let at = format!("message.parts[{index}]");
    let content = match present(part, "kind") {
        Some(kind) => part_of_kind(part, kind, &at)?,
        None => part_by_member(part, &at)?,
    };
    Ok(Part {
        content,
        metadata: metadata(part, &format!("{at}.metadata"))?,
    })
}

/// 0.3: `{kind: "text", text}`, `{kind: "file", file: {bytes | uri, name?, mimeType?}}` or
/// `{kind: "data", data}`; the kind's member is required.
fn part_of_kind(part: &Map<String, Value>, kind: &Value, at: &str) -> Result<Content, String> {
    let required = |key: &str| {
        present(part, key)
            .ok_or_else(|| format!(r#"{at}.{key} is required in a part of kind "{key}""#))
    };
    match kind.as_str() {
        Some("text") => text(required("text")?, at),
        Some("file") => file_v03(required("file")?, at),
        Some("data") => Ok(Content::Data(required("data")?.clone())),
        _ => Err(format!(r#"{at}.kind must be "text", "file" or "data""#)),
    }
}

/// 1.0: exactly one of `text`, `raw` or `url` (with `filename?`, `mediaType?`), or `data`; a
/// 0.3 `file` without its kind is read too.
fn part_by_member(part: &Map<String, Value>, at: &str) -> Result<Content, String> {
    let members = ["text", "file", "raw", "url", "data"];
    // A 1.0 `data` is any JSON value, `null` too (helper-118): there, not absent.
    let has = |key: &str| match key {
        "data" => part.contains_key("data"),
        _ => present(part, key).is_some(),
    };
    let found: Vec<&str> = members.into_iter().filter(|key| has(key)).collect();
    match found[..] {
        ["text"] => text(&part["text"], at),
        ["file"] => file_v03(&part["file"], at),
        ["raw"] | ["url"] | ["raw", "url"] => {
            parse_file(part, ("raw", "url", "filename", "mediaType"), at)
        }
        ["data"] => Ok(Content::Data(part["data"].clone())),
        [] => Err(format!(
            "{at} has none of text, file (0.3), raw or url (1.0), data"
        )),
        _ => Err(format!(
            "{at} has {}: a part is one of them",
            found.join(" and ")
        )),
    }
}

/// 0.3's `file` member of the part at `at`: `{bytes | uri, name?, mimeType?}`.
fn file_v03(file: &Value, at: &str) -> Result<Content, String> {
    match file {
        Value::Object(file) => parse_file(
            file,
            ("bytes", "uri", "name", "mimeType"),
            &format!("{at}.file"),
        ),
        _ => Err(format!("{at}.file must be an object")),
    }
}

fn text(value: &Value, at: &str) -> Result<Content, String> {
    Ok(Content::Text(
        string(Some(value), &format!("{at}.text"))?.unwrap_or_default(),
    ))
}

/// A `metadata` member: an object, or absent.
fn metadata(object: &Map<String, Value>, what: &str) -> Result<Option<Value>, String> {
    match present(object, "metadata") {
        None => Ok(None),
        Some(value @ Value::Object(_)) => Ok(Some(value.clone())),
        Some(_) => Err(format!("{what} must be an object")),
    }
}

fn parse_file(
    file: &Map<String, Value>,
    (bytes_key, uri_key, name_key, type_key): (&str, &str, &str, &str),
    what: &str,
) -> Result<Content, String> {
    let field = |key: &str| string(file.get(key), &format!("{what}.{key}"));
    let bytes = field(bytes_key)?;
    let uri = field(uri_key)?;
    let source = match (bytes, uri) {
        (Some(bytes), None) => FileSource::Bytes(bytes),
        (None, Some(uri)) => FileSource::Uri(uri),
        _ => {
            return Err(format!(
                "{what} needs exactly one of {bytes_key} or {uri_key}"
            ))
        }
    };
    Ok(Content::File {
        source,
        name: field(name_key)?,
        media_type: field(type_key)?,
    })
}

/// A member that is there and not `null` (clients send `null` for "absent").
fn present<'a>(object: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    object.get(key).filter(|value| !value.is_null())
}

/// An optional string member: absent or `null` is `None`, anything but a string is an error.
fn string(value: Option<&Value>, what: &str) -> Result<Option<String>, String> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(format!("{what} must be a string")),
    }
}

/// Sets `key` only when there is a value: absent members stay absent on the wire.
fn put(object: &mut Value, key: &str, value: Option<impl Into<Value>>) {
    if let Some(value) = value {
        object[key] = value.into();
    }
}

fn recent(history: &[Message], limit: Option<u32>) -> &[Message] {
    let keep = limit.map_or(history.len(), |n| n as usize);
    &history[history.len().saturating_sub(keep)..]
}
