//! A scripted, in-process coordinator for tests and benchmarks.
//!
//! It stands in for the real (Raft-backed) coordinator with the same observable contract on the
//! task side: it triggers source tasks periodically (one checkpoint pending at a time), collects
//! acknowledgements, completes a checkpoint when every task acknowledged it (writing its
//! `_metadata` through `cairn_protocol::checkpoint`), and only then notifies every task; a
//! decline aborts the checkpoint and notifies the abort. A task that reported `finished` is no
//! longer waited for: later checkpoints record its state as empty, as the real coordinator does.
//! It remembers the latest completed checkpoint so a test can redeploy the job from it, and it
//! keeps its checkpoint-id counter across redeployments so ids are never reused.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use cairn_protocol::checkpoint::metadata::METADATA_VERSION;
use cairn_protocol::checkpoint::{
    CheckpointMetadata, MetadataPointer, SubtaskState, TaskCheckpointMetrics, VertexInfo,
    read_metadata_unverified, write_metadata,
};

use cairn_protocol::assign::{AssignError, StateAssignment, assign_states};
use cairn_protocol::graph::JobGraph;
use cairn_protocol::messages::{
    CheckpointOptions, CoordinatorMessage, DeclineReason, TaskAttemptId, TaskMessage, TaskStatus, ToTask,
};

use crate::element::now_ms;
use crate::runtime::LocalJob;
use crate::state::storage::CheckpointStorage;

/// Something the coordinator observed, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Triggered(u64),
    Completed(u64),
    Aborted { checkpoint_id: u64, reason: DeclineReason, by: TaskAttemptId },
    Status { task: TaskAttemptId, status: TaskStatus },
    Acknowledged { checkpoint_id: u64, task: TaskAttemptId, metrics: TaskCheckpointMetrics },
}

#[derive(Debug)]
struct Pending {
    options: CheckpointOptions,
    trigger_ms: u64,
    triggered_at: Instant,
    acks: BTreeMap<String, SubtaskState>,
}

/// Why driving stopped without reaching the goal.
#[derive(Debug, thiserror::Error)]
pub enum DriveError {
    #[error("timed out after {0:?}; events so far: {1}")]
    Timeout(Duration, String),
    #[error("writing checkpoint metadata failed: {0}")]
    Metadata(#[from] cairn_protocol::checkpoint::MetadataError),
}

pub struct ScriptedCoordinator {
    job: String,
    storage: CheckpointStorage,
    /// Raft term stamped on every message.
    pub term: u64,
    /// Time between triggers.
    pub interval: Duration,
    /// A pending checkpoint older than this is aborted.
    pub checkpoint_timeout: Duration,
    /// Trigger periodically (off: only [`ScriptedCoordinator::trigger`] triggers).
    pub periodic: bool,
    /// Options of the periodic triggers (aligned checkpoints by default).
    pub options: CheckpointOptions,
    next_id: u64,
    vertices: BTreeMap<String, VertexInfo>,
    expected_acks: usize,
    /// Subtask keys of the tasks that finished.
    finished: BTreeSet<String>,
    pending: BTreeMap<u64, Pending>,
    latest: Option<(CheckpointMetadata, MetadataPointer)>,
    pub events: Vec<Event>,
}

impl ScriptedCoordinator {
    pub fn new(job: &str, storage: CheckpointStorage, graph: &JobGraph) -> Self {
        let mut c = Self {
            job: job.to_owned(),
            storage,
            term: 1,
            interval: Duration::from_millis(100),
            checkpoint_timeout: Duration::from_secs(10),
            periodic: true,
            options: CheckpointOptions::checkpoint(),
            next_id: 1,
            vertices: BTreeMap::new(),
            expected_acks: 0,
            finished: Default::default(),
            pending: BTreeMap::new(),
            latest: None,
            events: Vec::new(),
        };
        c.set_graph(graph);
        c
    }

    /// Adopts a (redeployed, possibly rescaled) graph; forgets pending checkpoints.
    pub fn set_graph(&mut self, graph: &JobGraph) {
        self.vertices = graph
            .vertices
            .iter()
            .map(|v| {
                (v.id.clone(), VertexInfo { parallelism: v.parallelism, max_parallelism: v.max_parallelism })
            })
            .collect();
        self.expected_acks = graph.vertices.iter().map(|v| v.parallelism as usize).sum();
        self.finished.clear();
        self.pending.clear();
    }

    /// The latest completed checkpoint assigned onto `graph` (as the leader would), to
    /// redeploy from; `None` when nothing completed yet.
    pub fn restore(&self, graph: &JobGraph) -> Option<Result<StateAssignment, AssignError>> {
        self.latest.as_ref().map(|(meta, _)| self.assign(meta, graph))
    }

    /// A given completed checkpoint assigned onto `graph`, to redeploy from.
    pub fn assign(
        &self,
        meta: &CheckpointMetadata,
        graph: &JobGraph,
    ) -> Result<StateAssignment, AssignError> {
        assign_states(meta, self.storage.job_dir(), graph, false)
    }

    pub fn latest_completed(&self) -> Option<&CheckpointMetadata> {
        self.latest.as_ref().map(|(m, _)| m)
    }

    /// The checkpoint a finishing job's last tasks finished on: among the events from `since` on,
    /// the last completed checkpoint that some task acknowledged. A checkpoint triggered while
    /// the tasks were finishing reaches none of them (the sources are gone), completes as they
    /// report `finished`, and records every task's state as empty, so it can be later than the
    /// final one. Read back from its `_metadata`; `None` when none completed.
    pub fn final_checkpoint(
        &self,
        since: usize,
    ) -> Result<Option<CheckpointMetadata>, cairn_protocol::checkpoint::MetadataError> {
        let events = self.events.get(since..).unwrap_or_default();
        let acknowledged: BTreeSet<u64> = events
            .iter()
            .filter_map(|e| match e {
                Event::Acknowledged { checkpoint_id, .. } => Some(*checkpoint_id),
                _ => None,
            })
            .collect();
        let id = events.iter().rev().find_map(|e| match e {
            Event::Completed(id) if acknowledged.contains(id) => Some(*id),
            _ => None,
        });
        id.map(|id| read_metadata_unverified(&self.storage.layout().metadata_path(id))).transpose()
    }

    pub fn completed_count(&self) -> usize {
        self.events.iter().filter(|e| matches!(e, Event::Completed(_))).count()
    }

    fn msg(&self, body: ToTask) -> CoordinatorMessage {
        CoordinatorMessage { term: self.term, body }
    }

    /// Triggers a checkpoint now; returns its id.
    pub async fn trigger(&mut self, job: &LocalJob, options: CheckpointOptions) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        let trigger_ms = now_ms();
        let acks = self.finished.iter().map(|k| (k.clone(), SubtaskState::default())).collect();
        self.pending
            .insert(id, Pending { options: options.clone(), trigger_ms, triggered_at: Instant::now(), acks });
        self.events.push(Event::Triggered(id));
        let gone = job
            .link
            .send_to_sources(&self.msg(ToTask::TriggerCheckpoint {
                checkpoint_id: id,
                timestamp_ms: trigger_ms,
                options,
            }))
            .await;
        if !gone.is_empty() {
            tracing::debug!(checkpoint_id = id, ?gone, "some sources are gone");
        }
        id
    }

    async fn abort(&mut self, job: &LocalJob, checkpoint_id: u64) {
        if self.pending.remove(&checkpoint_id).is_some() {
            job.link.broadcast(&self.msg(ToTask::NotifyCheckpointAborted { checkpoint_id })).await;
        }
    }

    /// Handles one task report.
    pub async fn on_report(&mut self, job: &LocalJob, msg: TaskMessage) -> Result<(), DriveError> {
        match msg {
            TaskMessage::Status { task, status } => {
                if status == TaskStatus::Finished {
                    let key = CheckpointMetadata::subtask_key(&task.task.vertex, task.task.subtask);
                    self.finished.insert(key.clone());
                    let ready: Vec<u64> = self
                        .pending
                        .iter_mut()
                        .filter_map(|(id, p)| {
                            p.acks.entry(key.clone()).or_default();
                            (p.acks.len() == self.expected_acks).then_some(*id)
                        })
                        .collect();
                    for id in ready {
                        self.complete(job, id).await?;
                    }
                }
                self.events.push(Event::Status { task, status });
            }
            TaskMessage::Decline { task, checkpoint_id, reason } => {
                if self.pending.contains_key(&checkpoint_id) {
                    self.events.push(Event::Aborted { checkpoint_id, reason, by: task });
                    self.abort(job, checkpoint_id).await;
                }
            }
            TaskMessage::Acknowledge { task, checkpoint_id, state, metrics } => {
                self.events.push(Event::Acknowledged { checkpoint_id, task: task.clone(), metrics });
                let Some(p) = self.pending.get_mut(&checkpoint_id) else { return Ok(()) };
                p.acks.insert(CheckpointMetadata::subtask_key(&task.task.vertex, task.task.subtask), state);
                if p.acks.len() == self.expected_acks {
                    self.complete(job, checkpoint_id).await?;
                }
            }
        }
        Ok(())
    }

    async fn complete(&mut self, job: &LocalJob, checkpoint_id: u64) -> Result<(), DriveError> {
        let Some(p) = self.pending.remove(&checkpoint_id) else { return Ok(()) };
        let meta = CheckpointMetadata {
            version: METADATA_VERSION,
            job: self.job.clone(),
            checkpoint_id,
            kind: p.options.kind.as_str().to_owned(),
            trigger_time_ms: p.trigger_ms,
            completion_time_ms: now_ms(),
            vertices: self.vertices.clone(),
            subtasks: p.acks,
            master_states: BTreeMap::new(),
        };
        // Durable before anyone is told (the real coordinator also commits through Raft here).
        let ptr = write_metadata(&self.storage.layout().metadata_path(checkpoint_id), &meta)?;
        self.latest = Some((meta, ptr));
        self.events.push(Event::Completed(checkpoint_id));
        // Older pending checkpoints are subsumed.
        let older: Vec<u64> = self.pending.range(..checkpoint_id).map(|(id, _)| *id).collect();
        for id in older {
            self.abort(job, id).await;
        }
        job.link.broadcast(&self.msg(ToTask::NotifyCheckpointComplete { checkpoint_id })).await;
        Ok(())
    }

    /// Runs the coordinator until `goal` holds (checked after every event) or `timeout` passes.
    pub async fn drive_until(
        &mut self,
        job: &mut LocalJob,
        timeout: Duration,
        mut goal: impl FnMut(&Self) -> bool,
    ) -> Result<(), DriveError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut ticker = tokio::time::interval(self.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while !goal(self) {
            tokio::select! {
                biased;
                msg = job.link.recv() => {
                    if let Some(msg) = msg {
                        self.on_report(job, msg).await?;
                    }
                }
                _ = ticker.tick(), if self.periodic => {
                    let expired: Vec<u64> = self
                        .pending
                        .iter()
                        .filter(|(_, p)| p.triggered_at.elapsed() > self.checkpoint_timeout)
                        .map(|(id, _)| *id)
                        .collect();
                    for id in expired {
                        tracing::warn!(checkpoint_id = id, "checkpoint timed out");
                        self.abort(job, id).await;
                    }
                    if self.pending.is_empty() {
                        self.trigger(job, self.options.clone()).await;
                    }
                }
                _ = tokio::time::sleep_until(deadline) => {
                    let tail: Vec<String> = self.events.iter().rev().take(20).map(|e| format!("{e:?}")).collect();
                    return Err(DriveError::Timeout(timeout, tail.join("; ")));
                }
            }
        }
        Ok(())
    }

    /// Runs until `n` more checkpoints completed.
    pub async fn drive_completions(
        &mut self,
        job: &mut LocalJob,
        n: usize,
        timeout: Duration,
    ) -> Result<(), DriveError> {
        let target = self.completed_count() + n;
        self.drive_until(job, timeout, |c| c.completed_count() >= target).await
    }
}
