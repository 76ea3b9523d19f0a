//! A job's replicated record: identity, spec, status, checkpoint counter, completed checkpoints
//! and savepoints.

use std::fmt;

use serde::{Deserialize, Serialize};

use cairn_protocol::checkpoint::CheckpointKind;
use cairn_protocol::job::{JobId, JobSpec};
use cairn_protocol::restart::RestartState;

use super::RequestTable;

/// Lifecycle of a job as the replicated registry knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum JobStatus {
    /// Registered; not yet running.
    Created,
    Running,
    /// Restarting from its latest checkpoint after a failure.
    Restarting,
    Finished,
    Canceled,
    Failed {
        reason: String,
    },
}

impl JobStatus {
    /// Terminal states are final: a job in one never runs or checkpoints again.
    pub fn is_terminal(&self) -> bool {
        matches!(self, Self::Finished | Self::Canceled | Self::Failed { .. })
    }

    pub fn name(&self) -> &'static str {
        match self {
            Self::Created => "created",
            Self::Running => "running",
            Self::Restarting => "restarting",
            Self::Finished => "finished",
            Self::Canceled => "canceled",
            Self::Failed { .. } => "failed",
        }
    }
}

impl fmt::Display for JobStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Failed { reason } => write!(f, "failed: {reason}"),
            other => f.write_str(other.name()),
        }
    }
}

/// Pointer to a completed checkpoint's `_metadata` in checkpoint storage. The metadata itself
/// (state handles, master state) lives in storage; Raft keeps only what locates and verifies it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompletedCheckpoint {
    pub id: u64,
    pub kind: CheckpointKind,
    /// Milliseconds since the Unix epoch, as stamped by the leader.
    pub trigger_time_ms: u64,
    pub completion_time_ms: u64,
    /// Path of the `_metadata` file.
    pub metadata_path: String,
    pub metadata_size: u64,
    pub metadata_crc32: u32,
    /// Total state size referenced by the checkpoint, in bytes.
    pub state_size: u64,
}

/// A savepoint registered with its job; kept until disposed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavepointRecord {
    pub checkpoint: CompletedCheckpoint,
    /// The savepoint directory (self-contained and relocatable).
    pub path: String,
}

/// Everything the cluster remembers about one job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobRecord {
    pub id: JobId,
    pub name: String,
    pub spec: JobSpec,
    pub status: JobStatus,
    /// The ID the next allocation returns. Starts at 1 and only ever grows.
    pub next_checkpoint_id: u64,
    /// Retained completed checkpoints, oldest first, strictly increasing IDs, at most
    /// `spec.checkpoint.retained` of them.
    pub completed: Vec<CompletedCheckpoint>,
    /// Savepoints, oldest first.
    pub savepoints: Vec<SavepointRecord>,
    /// Completed checkpoints ever added (survives leader changes; feeds statistics).
    #[serde(default)]
    pub num_completed: u64,
    /// Deployment attempts started so far; the current attempt is this number.
    #[serde(default)]
    pub attempts: u32,
    /// Checkpoint statistics summary recorded by the leader (opaque to the state machine).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats: Option<serde_json::Value>,
    /// Recent operator request ids and their outcomes (idempotent retries), bounded.
    #[serde(default, skip_serializing_if = "RequestTable::is_empty")]
    pub requests: RequestTable,
    /// What the restart strategy remembers of the job's failures (a new leader continues a
    /// backoff from it).
    #[serde(default, skip_serializing_if = "is_default")]
    pub restart: RestartState,
}

fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

impl JobRecord {
    pub fn new(id: JobId, name: String, spec: JobSpec) -> Self {
        Self {
            id,
            name,
            spec,
            status: JobStatus::Created,
            next_checkpoint_id: 1,
            completed: Vec::new(),
            savepoints: Vec::new(),
            num_completed: 0,
            attempts: 0,
            stats: None,
            requests: RequestTable::default(),
            restart: RestartState::default(),
        }
    }

    pub fn latest_completed(&self) -> Option<&CompletedCheckpoint> {
        self.completed.last()
    }

    /// The snapshot a restore must use: the latest completed checkpoint, or a savepoint if one
    /// is newer.
    pub fn restore_point(&self) -> Option<&CompletedCheckpoint> {
        let sp = self.savepoints.iter().map(|s| &s.checkpoint).max_by_key(|c| c.id);
        match (self.latest_completed(), sp) {
            (Some(c), Some(s)) => Some(if s.id > c.id { s } else { c }),
            (c, s) => c.or(s),
        }
    }
}
