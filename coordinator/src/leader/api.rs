//! What the leader's callers (the gateway, the services) and the job drivers exchange through
//! the term's runtime: views of a job, and the answers to trigger requests. Plain data, so the
//! runtime's handle, the runtime and the drivers can all name it without depending on each other.

use serde::Serialize;

use crate::checkpoint::TriggerSuccess;

/// Answer to a trigger request: where the snapshot went, or why it failed.
pub type TriggerReply = Result<TriggerSuccess, String>;

/// What a job driver is doing, in brief: what a listing of every job shows.
#[derive(Debug, Clone, Serialize)]
pub struct JobSummary {
    pub job: String,
    pub phase: String,
    pub attempt: Option<u32>,
    pub worker: Option<String>,
    pub pending_checkpoints: Vec<u64>,
    /// Restarts of the job's tasks driven by this leader term.
    pub restarts: u64,
}

/// A job driver's state, for status calls about one job.
#[derive(Debug, Clone, Serialize)]
pub struct JobView {
    #[serde(flatten)]
    pub summary: JobSummary,
    /// The job's subtasks and where they run.
    pub tasks: Vec<TaskView>,
    /// Checkpoint statistics of the running coordinator (absent before the first deployment).
    pub stats: Option<crate::checkpoint::JobCheckpointStats>,
    /// The checkpoint configuration the coordinator applies right now.
    pub checkpoint: Option<cairn_raft::model::CheckpointConfig>,
}

/// One subtask in a [`JobView`].
#[derive(Debug, Clone, Serialize)]
pub struct TaskView {
    pub vertex: String,
    pub subtask: u32,
    pub parallelism: u32,
    pub worker: Option<String>,
    /// `deploying`, `running`, `finished` or `not_deployed`.
    pub status: &'static str,
    /// Busy, idle and back-pressured time per second over the last seconds (absent until the
    /// leader has two samples from the worker of the current attempt).
    pub load: Option<super::job::load::Load>,
}

/// An operator request id attached to a manual trigger, so that a retry maps to the same
/// checkpoint id (recorded through Raft as soon as the id is known).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TriggerKey {
    pub request_id: String,
    pub fingerprint: u64,
}

/// Why a trigger did not start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartRefusal {
    /// The request id is in flight (or recorded) with other arguments.
    RequestIdReused,
    /// The job cannot take the snapshot now; the reason says why.
    Refused(String),
}

/// Answer to a trigger that waits only until its checkpoint id is known.
pub type StartedReply = Result<u64, StartRefusal>;
