//! The in-process coordinator link: bounded tokio channels between a coordinator (a test's
//! scripted one today, the gRPC gateway bridge later) and the tasks of a job.
//!
//! Each task gets a [`TaskLink`]: its own bounded control channel (coordinator → task) and a
//! clone of one bounded report channel (task → coordinator) shared by all tasks. The
//! coordinator side is a [`CoordinatorLink`]. Messages are the plain types of
//! [`crate::protocol`], so a network transport can replace these channels without touching
//! tasks.

use std::collections::BTreeMap;

use tokio::sync::mpsc;

use cairn_protocol::messages::{CoordinatorMessage, TaskAttemptId, TaskMessage};

/// The task's end.
#[derive(Debug)]
pub struct TaskLink {
    pub control: mpsc::Receiver<CoordinatorMessage>,
    pub reports: mpsc::Sender<TaskMessage>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LinkError {
    #[error("no task {0} on this link")]
    UnknownTask(TaskAttemptId),
    #[error("task {0} is gone (its control channel is closed)")]
    TaskGone(TaskAttemptId),
}

/// The coordinator's end.
#[derive(Debug)]
pub struct CoordinatorLink {
    to_tasks: BTreeMap<TaskAttemptId, mpsc::Sender<CoordinatorMessage>>,
    sources: Vec<TaskAttemptId>,
    from_tasks: mpsc::Receiver<TaskMessage>,
    reports_tx: mpsc::Sender<TaskMessage>,
    control_capacity: usize,
}

impl CoordinatorLink {
    pub fn new(report_capacity: usize, control_capacity: usize) -> Self {
        let (reports_tx, from_tasks) = mpsc::channel(report_capacity.max(1));
        Self {
            to_tasks: BTreeMap::new(),
            sources: Vec::new(),
            from_tasks,
            reports_tx,
            control_capacity: control_capacity.max(1),
        }
    }

    /// Connects a task; `is_source` tasks receive triggers.
    pub fn connect(&mut self, task: TaskAttemptId, is_source: bool) -> TaskLink {
        let (tx, control) = mpsc::channel(self.control_capacity);
        if is_source {
            self.sources.push(task.clone());
        }
        self.to_tasks.insert(task, tx);
        TaskLink { control, reports: self.reports_tx.clone() }
    }

    /// Takes over `other`'s tasks: their control channels, and their reports, forwarded into this
    /// link by the returned task (none when `other` has no tasks).
    pub fn absorb(&mut self, other: CoordinatorLink) -> Option<tokio::task::JoinHandle<()>> {
        if other.to_tasks.is_empty() {
            return None;
        }
        self.to_tasks.extend(other.to_tasks);
        self.sources.extend(other.sources);
        let (mut from, into) = (other.from_tasks, self.reports_tx.clone());
        drop(other.reports_tx);
        Some(tokio::spawn(async move {
            while let Some(report) = from.recv().await {
                if into.send(report).await.is_err() {
                    return;
                }
            }
        }))
    }

    pub fn tasks(&self) -> impl Iterator<Item = &TaskAttemptId> {
        self.to_tasks.keys()
    }

    pub fn sources(&self) -> &[TaskAttemptId] {
        &self.sources
    }

    pub async fn send(&self, task: &TaskAttemptId, msg: CoordinatorMessage) -> Result<(), LinkError> {
        let tx = self.to_tasks.get(task).ok_or_else(|| LinkError::UnknownTask(task.clone()))?;
        tx.send(msg).await.map_err(|_| LinkError::TaskGone(task.clone()))
    }

    /// Sends to every task; returns the tasks that are gone.
    pub async fn broadcast(&self, msg: &CoordinatorMessage) -> Vec<TaskAttemptId> {
        let mut gone = Vec::new();
        for (task, tx) in &self.to_tasks {
            if tx.send(msg.clone()).await.is_err() {
                gone.push(task.clone());
            }
        }
        gone
    }

    /// Sends to every source task; returns the sources that are gone.
    pub async fn send_to_sources(&self, msg: &CoordinatorMessage) -> Vec<TaskAttemptId> {
        let mut gone = Vec::new();
        for task in &self.sources {
            if self.send(task, msg.clone()).await.is_err() {
                gone.push(task.clone());
            }
        }
        gone
    }

    /// The next report of any task. The link keeps a sender itself (to connect more tasks), so
    /// this waits while no task reports: select it against a deadline.
    pub async fn recv(&mut self) -> Option<TaskMessage> {
        self.from_tasks.recv().await
    }

    pub fn try_recv(&mut self) -> Option<TaskMessage> {
        self.from_tasks.try_recv().ok()
    }
}
