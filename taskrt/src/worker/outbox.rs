//! Task reports on their way to the leader, with bounded memory whatever the connection does.
//!
//! While attached to a leader, reports queue in order (bounded: past the limit, acknowledgements
//! and declines are dropped, which the leader sees as a checkpoint that times out; statuses are
//! kept coalesced). While detached, only each task attempt's latest status is kept:
//! acknowledgements and declines of a previous leader's checkpoints are worthless to the next
//! leader, which aborts every checkpoint it did not start. On attach, the kept statuses are sent
//! first. Pure bookkeeping, no I/O: the job host ([`super::host`]) owns one.

use std::collections::{BTreeMap, VecDeque};

use cairn_protocol::messages::{TaskAttemptId, TaskMessage, TaskStatus};

/// What happened to a pushed report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pushed {
    Queued,
    /// Detached: kept as the task's latest status.
    KeptLatest,
    /// An acknowledgement or decline that cannot be delivered (detached, or queue full).
    Dropped,
}

#[derive(Debug)]
pub struct Outbox {
    attached: bool,
    queue: VecDeque<TaskMessage>,
    /// Latest status per task attempt, kept while detached (and on queue overflow).
    latest: BTreeMap<TaskAttemptId, TaskStatus>,
    /// Bound on `queue`, and on `latest`.
    capacity: usize,
}

impl Outbox {
    pub fn new(capacity: usize) -> Self {
        Self { attached: false, queue: VecDeque::new(), latest: BTreeMap::new(), capacity: capacity.max(1) }
    }

    pub fn is_attached(&self) -> bool {
        self.attached
    }

    pub fn push(&mut self, msg: TaskMessage) -> Pushed {
        if self.attached && self.queue.len() < self.capacity {
            self.queue.push_back(msg);
            return Pushed::Queued;
        }
        match msg {
            TaskMessage::Status { task, status } => {
                self.keep_latest(task, status);
                Pushed::KeptLatest
            }
            _ => Pushed::Dropped,
        }
    }

    fn keep_latest(&mut self, task: TaskAttemptId, status: TaskStatus) {
        if self.latest.len() >= self.capacity && !self.latest.contains_key(&task) {
            // Bounded memory: forget the status of an ended task first (its job is gone).
            let victim = self.latest.iter().find(|(_, s)| s.is_terminal()).map(|(t, _)| t.clone());
            match victim {
                Some(t) => {
                    self.latest.remove(&t);
                }
                None => {
                    tracing::warn!(task = %task, "status buffer full; status dropped");
                    return;
                }
            }
        }
        self.latest.insert(task, status);
    }

    /// The connection is gone: keep the latest status of each task, drop the rest.
    pub fn detach(&mut self) -> usize {
        self.attached = false;
        let mut dropped = 0;
        for msg in std::mem::take(&mut self.queue) {
            if self.push(msg) == Pushed::Dropped {
                dropped += 1;
            }
        }
        dropped
    }

    /// A leader accepted the worker: what was kept goes out first.
    pub fn attach(&mut self) {
        self.attached = true;
        let kept = std::mem::take(&mut self.latest);
        let mut front: VecDeque<TaskMessage> =
            kept.into_iter().map(|(task, status)| TaskMessage::Status { task, status }).collect();
        front.append(&mut self.queue);
        self.queue = front;
    }

    /// The next report to send (only while attached): the queue in order, then any status kept
    /// on overflow.
    pub fn pop(&mut self) -> Option<TaskMessage> {
        if !self.attached {
            return None;
        }
        self.queue
            .pop_front()
            .or_else(|| self.latest.pop_first().map(|(task, status)| TaskMessage::Status { task, status }))
    }

    pub fn has_pending(&self) -> bool {
        self.attached && !(self.queue.is_empty() && self.latest.is_empty())
    }

    /// Reports waiting (queued or kept).
    pub fn len(&self) -> usize {
        self.queue.len() + self.latest.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_protocol::messages::{DeclineReason, TaskId};

    fn id(subtask: u32) -> TaskAttemptId {
        TaskAttemptId { task: TaskId { job: "j".into(), vertex: "v".into(), subtask }, attempt: 1 }
    }

    fn status(subtask: u32, status: TaskStatus) -> TaskMessage {
        TaskMessage::Status { task: id(subtask), status }
    }

    fn decline(subtask: u32) -> TaskMessage {
        TaskMessage::Decline { task: id(subtask), checkpoint_id: 1, reason: DeclineReason::TaskNotReady }
    }

    #[test]
    fn detached_keeps_only_the_latest_status_per_task() {
        let mut o = Outbox::new(16);
        assert_eq!(o.push(status(0, TaskStatus::Restoring)), Pushed::KeptLatest);
        assert_eq!(o.push(status(0, TaskStatus::Running)), Pushed::KeptLatest);
        assert_eq!(o.push(decline(0)), Pushed::Dropped);
        assert_eq!(o.pop(), None);
        assert!(!o.has_pending());
        o.attach();
        o.push(decline(1));
        assert_eq!(o.pop(), Some(status(0, TaskStatus::Running)));
        assert_eq!(o.pop(), Some(decline(1)));
        assert_eq!(o.pop(), None);
    }

    #[test]
    fn detach_coalesces_the_queue() {
        let mut o = Outbox::new(16);
        o.attach();
        o.push(status(0, TaskStatus::Running));
        o.push(decline(0));
        o.push(status(0, TaskStatus::Canceled));
        assert_eq!(o.detach(), 1);
        assert_eq!(o.len(), 1);
        o.attach();
        assert_eq!(o.pop(), Some(status(0, TaskStatus::Canceled)));
    }

    #[test]
    fn memory_is_bounded() {
        let mut o = Outbox::new(2);
        o.attach();
        o.push(decline(0));
        o.push(decline(1));
        assert_eq!(o.push(decline(2)), Pushed::Dropped);
        o.detach();
        o.push(status(0, TaskStatus::Finished));
        o.push(status(1, TaskStatus::Running));
        o.push(status(2, TaskStatus::Running));
        assert_eq!(o.len(), 2);
        o.push(status(3, TaskStatus::Running));
        assert_eq!(o.len(), 2);
    }
}
