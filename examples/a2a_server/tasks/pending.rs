//! An outbox event as the relay reads it.

/// An outbox event the relay has not delivered yet.
pub struct Pending {
    pub id: i64,
    pub task_id: String,
    pub event_type: String,
    /// Whether the task had a webhook when the event was read.
    pub has_webhooks: bool,
    /// When it is due again, if an attempt to deliver it failed (in this process or another).
    pub next_attempt_at: Option<i64>,
    /// How many attempts to deliver it failed.
    pub attempts: u32,
    /// Whether some of its task's webhooks took it already (while another failed).
    pub reached_some: bool,
}

impl Pending {
    /// Whether an attempt to deliver it failed before.
    pub fn failed(&self) -> bool {
        self.next_attempt_at.is_some()
    }
}
