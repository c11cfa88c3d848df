//! What one read of the outbox hands out to the relay's workers: never an event twice.

use std::collections::{HashMap, HashSet};

use super::Pending;

/// What a read of the outbox must not hand out again.
#[derive(Default)]
pub struct HandedOut {
    /// Tasks a worker is delivering.
    pub tasks: HashSet<String>,
    /// Events settled (marked delivered or held back) since the last read began: that read
    /// may still have found them undelivered.
    pub settled: HashSet<i64>,
}

impl HandedOut {
    /// The events of `pending` (one read of the outbox) of each task no worker has, in order,
    /// grouped by task (in the order of each task's first event); those tasks are now handed
    /// out. A task with an event settled while the read ran is left to the next read: the read
    /// saw that event as it was before (a failure's backoff not yet written, so its task's next
    /// event looked free to go), and would let that next event overtake it.
    pub fn take(&mut self, pending: Vec<Pending>) -> Vec<Vec<Pending>> {
        let mut groups: Vec<Vec<Pending>> = Vec::new();
        let mut group_of: HashMap<String, usize> = HashMap::new();
        let mut stale: HashSet<String> = HashSet::new();
        for event in pending {
            if self.settled.contains(&event.id) {
                stale.insert(event.task_id.clone());
            } else if let Some(&group) = group_of.get(&event.task_id) {
                groups[group].push(event);
            } else if self.tasks.insert(event.task_id.clone()) {
                group_of.insert(event.task_id.clone(), groups.len());
                groups.push(vec![event]);
            }
        }
        groups.retain(|events| {
            let keep = !stale.contains(&events[0].task_id);
            if !keep {
                self.tasks.remove(&events[0].task_id);
            }
            keep
        });
        groups
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(id: i64, task_id: &str) -> Pending {
        Pending {
            id,
            task_id: task_id.into(),
            event_type: "mission.assigned".into(),
            has_webhooks: true,
            next_attempt_at: None,
            attempts: 0,
            reached_some: false,
        }
    }

    #[test]
    fn a_task_whose_event_was_settled_during_the_read_waits_for_the_next_read() {
        // e1 of t1 failed and was held back while the read ran: the read still shows it
        // undelivered and not held, and e2 after it as free to go.
        let mut handed_out = HandedOut::default();
        handed_out.settled.insert(1);
        let pending = vec![
            event(1, "t1"),
            event(2, "t2"),
            event(3, "t1"),
            event(4, "t2"),
        ];
        let groups = handed_out.take(pending);
        let ids: Vec<Vec<i64>> = groups
            .iter()
            .map(|events| events.iter().map(|e| e.id).collect())
            .collect();
        assert_eq!(ids, [[2, 4]], "t1's e3 must not overtake e1");
        assert!(
            !handed_out.tasks.contains("t1"),
            "t1 is free for the next read"
        );
        assert!(handed_out.tasks.contains("t2"));
    }

    #[test]
    fn a_task_a_worker_has_is_not_handed_out_again() {
        let mut handed_out = HandedOut::default();
        handed_out.tasks.insert("t1".into());
        let groups = handed_out.take(vec![event(1, "t1"), event(2, "t2")]);
        assert_eq!(groups.len(), 1);
        assert_eq!(groups[0][0].task_id, "t2");
    }
}
