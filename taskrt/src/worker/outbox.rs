//! Task reports on their way to the leader: none is lost to a broken stream, and memory stays
//! bounded whatever the connection does.
//!
//! Every report gets a sequence number when it is pushed (increasing for the life of the
//! worker). While attached, reports go out in order and wait, sent but unconfirmed, until the
//! leader confirms them (`ReportsConfirmed { up_to }`: it handled every report up to that
//! number). When the stream breaks, the unconfirmed ones go back to the front of the queue, and
//! everything is sent again, in order, on the next stream: the leader handles each (a leader
//! aborts the checkpoints pending when a worker attaches on a new stream, since their triggers
//! may have been lost with the old one, so it refuses acknowledgements of those as late; a new
//! leader refuses what belongs to checkpoints it did not start), and a refusal changes nothing.
//!
//! Bound: at most `capacity` reports are held. Past it, a task's older status is replaced by
//! its newer one first; then the oldest acknowledgement or decline is dropped (its checkpoint
//! then expires). Pure bookkeeping, no I/O: the job host ([`super::host`]) owns one.

use std::collections::VecDeque;

use cairn_protocol::messages::TaskMessage;

/// What happened to a pushed report.
#[derive(Debug, Clone, PartialEq)]
pub enum Pushed {
    /// Held until the leader confirms it.
    Held,
    /// Held; to make room an older report was dropped (an acknowledgement or decline; its
    /// checkpoint will expire) or replaced (a status superseded by the same task's newer one).
    HeldDropping(Box<TaskMessage>),
}

#[derive(Debug)]
pub struct Outbox {
    attached: bool,
    next_seq: u64,
    /// Not sent on the current stream yet, in sequence order.
    queue: VecDeque<(u64, TaskMessage)>,
    /// Sent on the current stream, awaiting the leader's confirmation, in sequence order.
    unconfirmed: VecDeque<(u64, TaskMessage)>,
    /// Bound on `queue` + `unconfirmed`.
    capacity: usize,
}

impl Outbox {
    pub fn new(capacity: usize) -> Self {
        Self {
            attached: false,
            next_seq: 1,
            queue: VecDeque::new(),
            unconfirmed: VecDeque::new(),
            capacity: capacity.max(1),
        }
    }

    pub fn is_attached(&self) -> bool {
        self.attached
    }

    pub fn push(&mut self, msg: TaskMessage) -> Pushed {
        let dropped = if self.len() >= self.capacity { self.make_room(&msg) } else { None };
        let seq = self.next_seq;
        self.next_seq += 1;
        self.queue.push_back((seq, msg));
        match dropped {
            None => Pushed::Held,
            Some(m) => Pushed::HeldDropping(Box::new(m)),
        }
    }

    /// Frees one place: an older status of the same task (superseded by `incoming`) if
    /// unsent, else the oldest unsent acknowledgement or decline, else the oldest report.
    fn make_room(&mut self, incoming: &TaskMessage) -> Option<TaskMessage> {
        let same_task_status = |m: &TaskMessage| matches!((m, incoming), (TaskMessage::Status { task: a, .. }, TaskMessage::Status { task: b, .. }) if a == b);
        let victim = self
            .queue
            .iter()
            .position(|(_, m)| same_task_status(m))
            .or_else(|| self.queue.iter().position(|(_, m)| !matches!(m, TaskMessage::Status { .. })));
        match victim {
            Some(i) => self.queue.remove(i).map(|(_, m)| m),
            None => self.queue.pop_front().or_else(|| self.unconfirmed.pop_front()).map(|(_, m)| m),
        }
    }

    /// The stream is gone: what it did not confirm is sent again on the next one.
    pub fn detach(&mut self) -> usize {
        self.attached = false;
        let resend = self.unconfirmed.len();
        while let Some(r) = self.unconfirmed.pop_back() {
            self.queue.push_front(r);
        }
        resend
    }

    /// A leader accepted the worker: reports go out from the oldest unconfirmed one.
    pub fn attach(&mut self) {
        self.attached = true;
    }

    /// The next report to send (only while attached), with its sequence number.
    pub fn pop(&mut self) -> Option<(u64, TaskMessage)> {
        if !self.attached {
            return None;
        }
        let (seq, msg) = self.queue.pop_front()?;
        self.unconfirmed.push_back((seq, msg.clone()));
        Some((seq, msg))
    }

    /// The next report [`pop`](Self::pop) would return (only while attached).
    pub fn peek(&self) -> Option<&TaskMessage> {
        if !self.attached {
            return None;
        }
        self.queue.front().map(|(_, m)| m)
    }

    /// The leader handled every report up to `up_to` sent on this stream.
    pub fn confirm(&mut self, up_to: u64) {
        while self.unconfirmed.front().is_some_and(|(seq, _)| *seq <= up_to) {
            self.unconfirmed.pop_front();
        }
    }

    pub fn has_pending(&self) -> bool {
        self.attached && !self.queue.is_empty()
    }

    /// Reports held (unsent or unconfirmed).
    pub fn len(&self) -> usize {
        self.queue.len() + self.unconfirmed.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_protocol::messages::{DeclineReason, TaskAttemptId, TaskId, TaskStatus};

    fn id(subtask: u32) -> TaskAttemptId {
        TaskAttemptId { task: TaskId { job: "j".into(), vertex: "v".into(), subtask }, attempt: 1 }
    }

    fn status(subtask: u32, status: TaskStatus) -> TaskMessage {
        TaskMessage::Status { task: id(subtask), status }
    }

    fn decline(subtask: u32, checkpoint_id: u64) -> TaskMessage {
        TaskMessage::Decline { task: id(subtask), checkpoint_id, reason: DeclineReason::TaskNotReady }
    }

    fn drain(o: &mut Outbox) -> Vec<(u64, TaskMessage)> {
        std::iter::from_fn(|| o.pop()).collect()
    }

    #[test]
    fn reports_made_while_detached_go_out_in_order_once_attached() {
        let mut o = Outbox::new(16);
        o.push(status(0, TaskStatus::Running));
        o.push(decline(0, 1));
        assert_eq!(o.pop(), None, "nothing is sent while detached");
        assert!(!o.has_pending());
        o.attach();
        assert_eq!(drain(&mut o), vec![(1, status(0, TaskStatus::Running)), (2, decline(0, 1))]);
    }

    #[test]
    fn unconfirmed_reports_are_sent_again_after_a_broken_stream() {
        let mut o = Outbox::new(16);
        o.attach();
        for i in 1..=4 {
            o.push(decline(0, i));
        }
        assert_eq!(drain(&mut o).len(), 4);
        o.confirm(2);
        assert_eq!(o.len(), 2, "confirmed reports are forgotten");
        o.push(decline(0, 5));
        assert_eq!(o.detach(), 2);
        o.attach();
        let again: Vec<u64> = drain(&mut o).into_iter().map(|(seq, _)| seq).collect();
        assert_eq!(again, vec![3, 4, 5], "the unconfirmed first, in order, then the new one");
        o.confirm(5);
        assert!(o.is_empty());
    }

    #[test]
    fn a_confirmation_only_covers_what_it_names() {
        let mut o = Outbox::new(16);
        o.attach();
        o.push(decline(0, 1));
        o.push(decline(0, 2));
        drain(&mut o);
        o.confirm(1);
        o.confirm(0);
        assert_eq!(o.len(), 1);
    }

    #[test]
    fn memory_is_bounded_and_statuses_coalesce_first() {
        let mut o = Outbox::new(2);
        o.push(status(0, TaskStatus::Restoring));
        o.push(decline(1, 1));
        // Full: the newer status of task 0 replaces its older one.
        assert_eq!(
            o.push(status(0, TaskStatus::Running)),
            Pushed::HeldDropping(Box::new(status(0, TaskStatus::Restoring)))
        );
        // Full again: the oldest decline goes.
        assert_eq!(o.push(status(1, TaskStatus::Running)), Pushed::HeldDropping(Box::new(decline(1, 1))));
        assert_eq!(o.len(), 2);
        o.attach();
        let kept: Vec<TaskMessage> = drain(&mut o).into_iter().map(|(_, m)| m).collect();
        assert_eq!(kept, vec![status(0, TaskStatus::Running), status(1, TaskStatus::Running)]);
    }
}
