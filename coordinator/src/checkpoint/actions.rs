//! The core's interface: the [`Event`]s it takes and the [`Action`]s it returns, with the small
//! types they carry. The driver (one owner task per job on the Raft leader) turns I/O results
//! into events and actions into I/O; the core never does I/O itself.

use std::path::PathBuf;
use std::time::Duration;

use cairn_protocol::checkpoint::{CheckpointMetadata, MetadataPointer, SubtaskState, TaskCheckpointMetrics};
use cairn_raft::model::{CheckpointKind, Command, CommandError, JobStatus, Outcome};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::error::TriggerError;
use super::failure::CheckpointFailureReason;
use super::stats::CheckpointCounts;
use super::tasks::{TaskAttemptId, TaskSet, TaskStatus};

/// `at + d`, or a far-away instant when that overflows (durations come from user
/// configuration and may be absurdly large).
pub fn instant_after(at: Instant, d: Duration) -> Instant {
    at.checked_add(d).or_else(|| at.checked_add(Duration::from_secs(100 * 365 * 24 * 3600))).unwrap_or(at)
}

/// The time of an event: a monotonic instant for scheduling (timers, min pause, timeouts) and
/// the wall clock for timestamps that are stored (trigger and completion times).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    pub instant: Instant,
    /// Milliseconds since the Unix epoch.
    pub wall_ms: u64,
}

impl Now {
    pub fn new(instant: Instant, wall_ms: u64) -> Self {
        Self { instant, wall_ms }
    }

    /// The same clock `d` later (both clocks advance together).
    pub fn after(self, d: Duration) -> Self {
        Self {
            instant: instant_after(self.instant, d),
            wall_ms: self.wall_ms.saturating_add(d.as_millis() as u64),
        }
    }
}

/// Identifies a manual trigger request so the driver can route the answer to its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RequestId(pub u64);

/// Correlates an `AllocateCheckpointId` action with its result event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AllocationToken(pub u64);

/// Identifies one arming of the trigger timer; a fire with an older token is ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TimerToken(pub u64);

/// What a manual trigger asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TriggerKind {
    /// A checkpoint, subject to the concurrency and min-pause rules like a periodic one.
    Checkpoint,
    /// A savepoint, forced past the concurrency and min-pause rules.
    Savepoint {
        /// Parent directory; the job's default savepoint directory when `None`.
        target_dir: Option<String>,
        /// Stop-with-savepoint: tasks stop after the savepoint completes.
        sync: bool,
        /// Sources emit a final max watermark before the savepoint (only with `sync`).
        drain: bool,
    },
}

/// What tasks need to know to take part in a snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointOptions {
    pub kind: CheckpointKind,
    /// The directory every relative path of this snapshot's state handles resolves against:
    /// the job's checkpoint directory, or the savepoint directory.
    pub base_dir: PathBuf,
    /// Where exclusive state goes, relative to `base_dir`: `chk-<id>` for a checkpoint, empty
    /// for a savepoint (its directory is exclusive). Shared state (checkpoints only) goes under
    /// `shared/`.
    pub exclusive_dir: String,
    pub drain: bool,
}

/// A successful manual trigger.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TriggerSuccess {
    pub checkpoint_id: u64,
    pub kind: CheckpointKind,
    /// The checkpoint directory (`<root>/<job>/chk-<id>`) or the savepoint directory.
    pub location: PathBuf,
}

/// Why state is being discarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DiscardCause {
    /// The checkpoint failed for this reason.
    Aborted(CheckpointFailureReason),
    /// Retention removed the checkpoint from the store.
    Subsumed,
    /// The job reached a terminal state and its retention policy does not keep checkpoints.
    JobTerminated,
    /// `_metadata` was written for a checkpoint that had already failed.
    LateMetadata,
}

/// Why an acknowledgement's state is not kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StrayAck {
    /// The checkpoint is pending but the attempt is not one it waits for (an old attempt).
    UnknownAttempt,
    /// The checkpoint finished recently (it is among the remembered ids).
    Late { outcome: FinishedOutcome },
    /// The checkpoint id is unknown: too old to be remembered, or never issued.
    UnknownCheckpoint,
}

/// How a recently finished checkpoint ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishedOutcome {
    Completed,
    Failed(CheckpointFailureReason),
    /// The commit outcome is unknown (it may be in the store).
    Unknown,
}

/// An input of the core.
#[derive(Debug, Clone)]
pub enum Event {
    /// The job runs: start periodic checkpoints (if an interval is configured) after a random
    /// initial delay in `[min pause, interval]`.
    StartScheduler,
    /// The job's running tasks were taken over from a previous leader: start periodic
    /// checkpoints with a trigger at once (its last checkpoint is at least a failover old), so
    /// the gap a leader change leaves in the checkpoint history is as short as it can be.
    ResumeScheduler,
    /// The job stopped running (e.g. it is restarting): stop periodic checkpoints and abort the
    /// pending ones.
    StopScheduler,
    /// The trigger timer armed by [`Action::ScheduleTrigger`] fired.
    TriggerTimerFired {
        token: TimerToken,
    },
    /// A user asks for a checkpoint or savepoint; answered by [`Action::AnswerTrigger`].
    TriggerRequested {
        request: RequestId,
        kind: TriggerKind,
    },
    /// The Raft commit of `AllocateCheckpointId` returned this id.
    CheckpointIdAllocated {
        token: AllocationToken,
        checkpoint_id: u64,
    },
    /// The allocation could not be committed.
    CheckpointIdAllocationFailed {
        token: AllocationToken,
        error: String,
    },
    TaskAcknowledged {
        attempt: TaskAttemptId,
        checkpoint_id: u64,
        state: SubtaskState,
        metrics: TaskCheckpointMetrics,
    },
    TaskDeclined {
        attempt: TaskAttemptId,
        checkpoint_id: u64,
        reason: CheckpointFailureReason,
        detail: Option<String>,
    },
    TaskStatusChanged {
        attempt: TaskAttemptId,
        status: TaskStatus,
    },
    /// The job was (re)deployed with new attempts; pending checkpoints of the old attempts are
    /// aborted.
    TasksRedeployed {
        tasks: TaskSet,
    },
    /// The timeout armed by [`Action::ScheduleTimeout`] fired.
    CheckpointTimeout {
        checkpoint_id: u64,
    },
    MetadataWritten {
        checkpoint_id: u64,
        pointer: MetadataPointer,
    },
    MetadataWriteFailed {
        checkpoint_id: u64,
        error: String,
    },
    /// The proposal from [`Action::ProposeCompletion`] was committed and applied.
    CompletionCommitted {
        checkpoint_id: u64,
        outcome: Outcome,
    },
    /// The proposal was committed and rejected by the state machine (nothing changed).
    CompletionRejected {
        checkpoint_id: u64,
        error: CommandError,
    },
    /// The proposal may or may not have been committed (leadership lost mid-proposal).
    CompletionOutcomeUnknown {
        checkpoint_id: u64,
        detail: String,
    },
    /// The job was restored from this checkpoint or savepoint (for statistics).
    Restored {
        checkpoint_id: u64,
        external_path: Option<String>,
    },
    /// The coordinator stops for good. With a terminal job status, the job's checkpoints are
    /// discarded as its retention policy says (send it only once the status is committed).
    Shutdown {
        job_status: JobStatus,
    },
    /// This replica is no longer the Raft leader: abort everything in memory, delete nothing
    /// replicated. The core accepts no more work afterwards.
    LeadershipLost,
}

/// An output of the core, for the driver to carry out in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Propose `Command::AllocateCheckpointId { job }`; report the result with `token`.
    AllocateCheckpointId { token: AllocationToken },
    /// Send the trigger (with the leader's term as fencing token) to these source attempts.
    TriggerTasks {
        checkpoint_id: u64,
        timestamp_ms: u64,
        options: CheckpointOptions,
        tasks: Vec<TaskAttemptId>,
    },
    /// (Re)arm the job's single trigger timer, replacing any earlier arming.
    ScheduleTrigger { at: Instant, token: TimerToken },
    /// Disarm the trigger timer.
    CancelTrigger,
    /// Report [`Event::CheckpointTimeout`] at `at`. Never cancelled: the core ignores timeouts
    /// of checkpoints that already finished.
    ScheduleTimeout { checkpoint_id: u64, at: Instant },
    /// Write `_metadata` durably at `path` (see `cairn_protocol::checkpoint::write_metadata`).
    WriteMetadata { checkpoint_id: u64, path: PathBuf, metadata: Box<CheckpointMetadata> },
    /// Propose `AddCompletedCheckpoint` or `RegisterSavepoint`.
    ProposeCompletion { checkpoint_id: u64, command: Box<Command> },
    /// The checkpoint is committed: tell these attempts.
    NotifyComplete { checkpoint_id: u64, timestamp_ms: u64, tasks: Vec<TaskAttemptId> },
    /// The checkpoint was aborted: tell these attempts to drop their work on it.
    NotifyAborted { checkpoint_id: u64, reason: CheckpointFailureReason, tasks: Vec<TaskAttemptId> },
    /// Delete these directories (recursively) and files. Idempotent; missing paths are fine.
    DiscardCheckpoint { checkpoint_id: u64, cause: DiscardCause, dirs: Vec<PathBuf>, files: Vec<PathBuf> },
    /// The job reached a terminal state and its retention policy discards its checkpoints:
    /// delete these directories (the checkpoints' directories and the shared-state directory).
    /// Savepoints are never included.
    DiscardJobCheckpoints { checkpoints: Vec<u64>, dirs: Vec<PathBuf> },
    /// Delete these files of an acknowledgement that is not kept. `files` leaves out anything a
    /// retained or in-flight checkpoint references, and may be empty.
    DiscardAckedState { checkpoint_id: u64, attempt: TaskAttemptId, cause: StrayAck, files: Vec<PathBuf> },
    /// Fail the job: checkpointing failed more often than tolerated.
    FailOver { reason: CheckpointFailureReason, message: String },
    /// The manual request got a checkpoint id and its trigger went out.
    TriggerAccepted { request: RequestId, checkpoint_id: u64 },
    /// The final answer to a manual request.
    AnswerTrigger { request: RequestId, result: Result<TriggerSuccess, TriggerError> },
    /// Statistics changed: publish `core.stats()`, persist `core.stats_summary()` if wanted.
    StatsChanged { counts: CheckpointCounts },
}
