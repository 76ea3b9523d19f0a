//! The messages between the coordinator leader and tasks, as plain serde data.
//!
//! The task gateway (gRPC) carries them as JSON between a worker and the leader; the task
//! runtime's in-process link carries them in tests. Coordinator → task messages are
//! [`CoordinatorMessage`]s: a [`ToTask`] body fenced by the leader's Raft `term` (see
//! [`TermFence`]). Task → coordinator messages are [`TaskMessage`]s: acknowledge, decline,
//! status. A [`Deployment`] carries the whole job to a worker, with each subtask's restore
//! computed by the leader ([`crate::assign`]).

use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::assign::StateAssignment;
use crate::checkpoint::{CheckpointKind, SubtaskState, TaskCheckpointMetrics};

/// One subtask of one vertex of one job.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TaskId {
    pub job: String,
    pub vertex: String,
    pub subtask: u32,
}

/// One execution attempt of a subtask: a restarted subtask gets a new attempt number, so late
/// messages of a previous attempt can be told apart.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TaskAttemptId {
    pub task: TaskId,
    pub attempt: u32,
}

impl fmt::Display for TaskAttemptId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}#{}@{}", self.task.job, self.task.vertex, self.task.subtask, self.attempt)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointOptions {
    pub kind: CheckpointKind,
    /// For a synchronous savepoint: advance event time to the end (flush timers / windows)
    /// before the barrier, so that the job ends with everything emitted.
    #[serde(default)]
    pub drain: bool,
    /// Directory to write the state to (a savepoint directory); `None` means the job's
    /// checkpoint storage (`<root>/<job>/chk-<id>/`).
    #[serde(default)]
    pub target_location: Option<PathBuf>,
    /// How the barrier crosses backpressured channels: `None` aligned; `Some(0)` unaligned
    /// (it overtakes buffered records, which are persisted as channel state); `Some(t)` aligned
    /// until `t` ms after the trigger, then unaligned at every task that has not aligned yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unaligned_after_ms: Option<u64>,
}

impl CheckpointOptions {
    pub fn checkpoint() -> Self {
        Self {
            kind: CheckpointKind::Checkpoint,
            drain: false,
            target_location: None,
            unaligned_after_ms: None,
        }
    }

    /// Whether the barrier overtakes buffered data from the start.
    pub fn is_unaligned(&self) -> bool {
        self.unaligned_after_ms == Some(0)
    }

    /// The same options with unaligned barriers from now on (an aligned checkpoint whose
    /// alignment timed out).
    pub fn to_unaligned(&self) -> Self {
        Self { unaligned_after_ms: Some(0), ..self.clone() }
    }
}

/// What the coordinator tells a task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ToTask {
    /// Sent to source tasks only: start checkpoint `checkpoint_id`.
    TriggerCheckpoint { checkpoint_id: u64, timestamp_ms: u64, options: CheckpointOptions },
    /// The checkpoint is durable in the replicated store; commit side effects.
    NotifyCheckpointComplete { checkpoint_id: u64 },
    /// The checkpoint will never complete; release what was kept for it.
    NotifyCheckpointAborted { checkpoint_id: u64 },
    /// Stop now; dispose what was opened.
    Cancel,
}

/// A coordinator → task message, fenced by the sender's Raft term.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CoordinatorMessage {
    /// The leader's Raft term when it sent this; tasks ignore terms below the highest seen.
    pub term: u64,
    pub body: ToTask,
}

/// Why a task declined a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reason", content = "detail", rename_all = "snake_case")]
pub enum DeclineReason {
    /// The task was not running (restoring, finishing, or busy with a synchronous savepoint).
    TaskNotReady,
    /// A trigger reached a task that is not a source.
    NotASource,
    /// A barrier of a newer checkpoint arrived while aligning this one.
    Subsumed { newer: u64 },
    /// An upstream task canceled this checkpoint (cancel marker).
    CanceledUpstream,
    /// The coordinator aborted it while the task was aligning or writing.
    AbortedByCoordinator,
    /// Taking or writing the snapshot failed.
    SnapshotFailed(String),
}

impl fmt::Display for DeclineReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeclineReason::TaskNotReady => write!(f, "task not ready"),
            DeclineReason::NotASource => write!(f, "trigger sent to a task that is not a source"),
            DeclineReason::Subsumed { newer } => write!(f, "subsumed by barrier of checkpoint {newer}"),
            DeclineReason::CanceledUpstream => write!(f, "canceled by an upstream cancel marker"),
            DeclineReason::AbortedByCoordinator => write!(f, "aborted by the coordinator"),
            DeclineReason::SnapshotFailed(e) => write!(f, "snapshot failed: {e}"),
        }
    }
}

/// Lifecycle status as reported to the coordinator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", content = "cause", rename_all = "snake_case")]
pub enum TaskStatus {
    Created,
    Restoring,
    Running,
    Finishing,
    Finished,
    Failed(String),
    Canceled,
}

impl TaskStatus {
    pub fn is_terminal(&self) -> bool {
        matches!(self, TaskStatus::Finished | TaskStatus::Failed(_) | TaskStatus::Canceled)
    }
}

/// What a task tells the coordinator.
///
/// Its JSON is internally tagged (`"type": "acknowledge" | "decline" | "status"`). Decoding is
/// written by hand (see the `Deserialize` impl below): the derived decoder of an internally
/// tagged enum buffers the content, and that buffer cannot turn the string keys JSON gives to
/// integer-keyed maps (the key groups of `SubtaskState`) back into integers, so every
/// acknowledgement carrying keyed state failed to decode.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum TaskMessage {
    Acknowledge {
        task: TaskAttemptId,
        checkpoint_id: u64,
        state: SubtaskState,
        metrics: TaskCheckpointMetrics,
    },
    Decline {
        task: TaskAttemptId,
        checkpoint_id: u64,
        reason: DeclineReason,
    },
    Status {
        task: TaskAttemptId,
        status: TaskStatus,
    },
}

impl<'de> Deserialize<'de> for TaskMessage {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;

        fn required<T, E: Error>(value: Option<T>, field: &'static str) -> Result<T, E> {
            value.ok_or_else(|| E::missing_field(field))
        }

        /// Every field of every kind, decoded in one pass straight from the input; the kind
        /// then says which must be present. (No intermediate document: a leader decodes one of
        /// these per task and checkpoint, and going through a `serde_json::Value` first built
        /// and freed a whole tree of maps for each.) A `type` that is not a string is refused.
        #[derive(Deserialize)]
        struct Fields {
            #[serde(rename = "type")]
            kind: Option<String>,
            task: Option<TaskAttemptId>,
            checkpoint_id: Option<u64>,
            state: Option<SubtaskState>,
            metrics: Option<TaskCheckpointMetrics>,
            reason: Option<DeclineReason>,
            status: Option<TaskStatus>,
        }

        let f = Fields::deserialize(deserializer)?;
        let kind = required(f.kind, "type")?;
        Ok(match kind.as_str() {
            "acknowledge" => TaskMessage::Acknowledge {
                task: required(f.task, "task")?,
                checkpoint_id: required(f.checkpoint_id, "checkpoint_id")?,
                state: required(f.state, "state")?,
                metrics: required(f.metrics, "metrics")?,
            },
            "decline" => TaskMessage::Decline {
                task: required(f.task, "task")?,
                checkpoint_id: required(f.checkpoint_id, "checkpoint_id")?,
                reason: required(f.reason, "reason")?,
            },
            "status" => {
                TaskMessage::Status { task: required(f.task, "task")?, status: required(f.status, "status")? }
            }
            other => return Err(D::Error::unknown_variant(other, &["acknowledge", "decline", "status"])),
        })
    }
}

impl TaskMessage {
    pub fn task(&self) -> &TaskAttemptId {
        match self {
            TaskMessage::Acknowledge { task, .. }
            | TaskMessage::Decline { task, .. }
            | TaskMessage::Status { task, .. } => task,
        }
    }
}

/// Fencing by Raft term: a task obeys no message from a term lower than the highest it has seen.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TermFence {
    highest: u64,
}

impl TermFence {
    pub fn highest(&self) -> u64 {
        self.highest
    }

    /// `true` when a message of `term` may be obeyed (and records the term).
    pub fn admit(&mut self, term: u64) -> bool {
        if term < self.highest {
            return false;
        }
        self.highest = term;
        true
    }
}

/// A job attempt deployed to a worker, sent by the leader over the task gateway: the whole job
/// (its subtasks exchange data in-process), or, with a [`DeploymentPlacement`], the subtasks
/// placed on that worker, exchanging data with the job's other workers over their data links.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Deployment {
    pub job_id: String,
    /// Attempt number of every task of this deployment; allocated through Raft, so it is unique
    /// across leaders.
    pub attempt: u32,
    /// The job graph (JSON of [`crate::graph::JobGraph`]).
    pub graph: serde_json::Value,
    /// Checkpoint storage root; the job's directory is `<root>/<job_id>`.
    pub storage_root: PathBuf,
    /// What every subtask restores, computed once by the leader; `None` starts empty.
    pub restore: Option<StateAssignment>,
    /// Incremental keyed-state checkpoints.
    #[serde(default)]
    pub incremental: bool,
    /// Where each subtask runs when the job spans several workers; `None`: all of them here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<DeploymentPlacement>,
}

/// Where the subtasks of a job attempt run; every worker of the attempt gets the same one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeploymentPlacement {
    /// Every subtask of the graph with the worker that runs it.
    pub subtasks: Vec<PlacedSubtask>,
    /// The data exchange address (`host:port`) of every worker named in `subtasks`.
    pub addresses: std::collections::BTreeMap<String, String>,
    /// The attempt's exchange key, 64 hex digits: the workers prove to each other that they
    /// hold it before exchanging data.
    pub exchange_key: String,
}

/// One subtask and the worker it runs on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlacedSubtask {
    pub vertex: String,
    pub subtask: u32,
    pub worker: String,
}

/// A command for tasks of one deployed job attempt, sent by the leader over the task gateway.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskCommand {
    pub job_id: String,
    pub attempt: u32,
    /// `(vertex, subtask)` of the addressed tasks; empty means every task of the attempt.
    #[serde(default)]
    pub tasks: Vec<(String, u32)>,
    pub body: ToTask,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn term_fence_rejects_lower_terms_only() {
        let mut f = TermFence::default();
        assert!(f.admit(3));
        assert!(f.admit(3));
        assert!(!f.admit(2));
        assert!(f.admit(5));
        assert!(!f.admit(4));
        assert_eq!(f.highest(), 5);
    }

    #[test]
    fn messages_have_a_stable_json_shape() {
        let msg = CoordinatorMessage {
            term: 7,
            body: ToTask::TriggerCheckpoint {
                checkpoint_id: 3,
                timestamp_ms: 10,
                options: CheckpointOptions::checkpoint(),
            },
        };
        let json = serde_json::to_string(&msg).unwrap();
        assert_eq!(
            json,
            r#"{"term":7,"body":{"type":"trigger_checkpoint","checkpoint_id":3,"timestamp_ms":10,"options":{"kind":"checkpoint","drain":false,"target_location":null}}}"#
        );
        let status = TaskStatus::Failed("boom".into());
        assert_eq!(serde_json::to_string(&status).unwrap(), r#"{"status":"failed","cause":"boom"}"#);
        let back: CoordinatorMessage = serde_json::from_str(&json).unwrap();
        assert_eq!(back, msg);
    }

    #[test]
    fn task_messages_with_keyed_state_round_trip_through_json() {
        use crate::checkpoint::{KeyGroupSegment, OperatorSubtaskState, StateFile};
        let task = TaskAttemptId {
            task: TaskId { job: "j".into(), vertex: "count".into(), subtask: 1 },
            attempt: 2,
        };
        let mut op = OperatorSubtaskState::default();
        let path = "chk-1/count-1.state";
        op.keyed.key_groups.insert(3, KeyGroupSegment { file: path.into(), offset: 0, length: 10, crc32: 7 });
        op.keyed.files.push(StateFile { path: path.into(), size: 10, crc32: 7 });
        let mut state = SubtaskState::default();
        state.operators.insert("count".into(), op);
        let messages = [
            TaskMessage::Acknowledge {
                task: task.clone(),
                checkpoint_id: 1,
                state,
                metrics: TaskCheckpointMetrics::default(),
            },
            TaskMessage::Decline {
                task: task.clone(),
                checkpoint_id: 2,
                reason: DeclineReason::Subsumed { newer: 3 },
            },
            TaskMessage::Status { task, status: TaskStatus::Failed("boom".into()) },
        ];
        for msg in messages {
            let json = serde_json::to_string(&msg).unwrap();
            let back: TaskMessage = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{json}: {e}"));
            assert_eq!(back, msg);
        }
        let status = r#"{"type":"status","task":{"task":{"job":"j","vertex":"v","subtask":0},"attempt":1},"status":{"status":"running"}}"#;
        assert!(matches!(serde_json::from_str::<TaskMessage>(status), Ok(TaskMessage::Status { .. })));
        assert!(
            serde_json::from_str::<TaskMessage>(r#"{"type":"bogus"}"#)
                .unwrap_err()
                .to_string()
                .contains("bogus")
        );
        assert!(serde_json::from_str::<TaskMessage>(r#"{"task":1}"#).is_err());
    }

    /// A report missing what its kind needs is refused naming the field; fields may come in any
    /// order (the kind last, too).
    #[test]
    fn task_messages_name_what_is_missing() {
        let task = r#""task":{"task":{"job":"j","vertex":"v","subtask":0},"attempt":1}"#;
        let error = |json: String| serde_json::from_str::<TaskMessage>(&json).unwrap_err().to_string();
        assert!(error(format!("{{{task}}}")).contains("missing field `type`"));
        assert!(error(r#"{"type":"status"}"#.to_owned()).contains("missing field `task`"));
        assert!(error(format!(r#"{{"type":"status",{task}}}"#)).contains("missing field `status`"));
        assert!(
            error(format!(r#"{{"type":"decline",{task},"checkpoint_id":3}}"#))
                .contains("missing field `reason`")
        );
        let ack =
            format!(r#"{{"type":"acknowledge",{task},"checkpoint_id":3,"state":{{"operators":{{}}}}}}"#);
        assert!(error(ack).contains("missing field `metrics`"));
        assert!(error(format!(r#"{{"type":7,{task}}}"#)).contains("invalid type"));
        let last = format!(r#"{{{task},"status":{{"status":"running"}},"type":"status"}}"#);
        assert!(matches!(
            serde_json::from_str::<TaskMessage>(&last),
            Ok(TaskMessage::Status { status: TaskStatus::Running, .. })
        ));
    }
}
