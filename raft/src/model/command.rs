//! Commands of the replicated state machine, their outcomes and their typed errors.

use std::fmt;

use serde::{Deserialize, Serialize};

use cairn_protocol::restart::{RestartDecision, RestartStrategy};

use super::{CheckpointConfig, CompletedCheckpoint, ConfigError, JobId, JobSpec, JobStatus, SavepointRecord};

/// The most checkpoint IDs one [`Command::ReserveCheckpointIds`] may reserve.
pub const MAX_ID_RESERVATION: u32 = 10_000;

/// A change to the replicated state, proposed by the leader through Raft.
///
/// Encoded as a map whose `cmd` entry names the command, first, then its fields. Decoding reads
/// that tag first and the fields straight into the variant (see [`super::command_de`]), instead
/// of buffering the whole map as serde's internally tagged enums do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Command {
    /// Adds a job to the registry in state `created`.
    RegisterJob { job: JobId, name: String, spec: JobSpec },
    /// Replaces a live job's checkpoint configuration. Lowering `retained` subsumes the
    /// checkpoints beyond the new limit.
    UpdateJobConfig { job: JobId, checkpoint: CheckpointConfig },
    /// Moves a job through its lifecycle; terminal states are final.
    SetJobStatus { job: JobId, status: JobStatus },
    /// Returns the job's next checkpoint ID and advances the counter past it.
    AllocateCheckpointId { job: JobId },
    /// Reserves the next `count` checkpoint IDs (1..=[`MAX_ID_RESERVATION`]) in one commit and
    /// advances the counter past them: the leader hands them out without a Raft round trip
    /// per checkpoint. A later leader starts above every reserved ID, so IDs stay strictly
    /// increasing and are never reused; the unused rest of a range is skipped. Near the end of
    /// the ID space fewer IDs are reserved (at least one).
    ReserveCheckpointIds { job: JobId, count: u32 },
    /// Raises the counter so that the next ID is at least `next` (restore from savepoint N sets
    /// `next = N + 1`). Requesting a value below the current counter is an error.
    AdvanceCheckpointCounter { job: JobId, next: u64 },
    /// Appends a completed checkpoint and applies retention; the outcome lists what was subsumed.
    AddCompletedCheckpoint { job: JobId, checkpoint: CompletedCheckpoint },
    /// Records a completed savepoint.
    RegisterSavepoint { job: JobId, savepoint: SavepointRecord },
    /// Forgets a savepoint; the outcome returns it so the caller can delete its files.
    DisposeSavepoint { job: JobId, checkpoint_id: u64 },
    /// Removes a job in a terminal state; the outcome returns its retained checkpoints.
    RemoveJob { job: JobId },
    /// Forgets the retained checkpoints of a job in a terminal state whose retention policy
    /// discards them (Flink's `NEVER_RETAIN_AFTER_TERMINATION`); the outcome returns them as
    /// [`Outcome::Subsumed`], and their files may be deleted only after this commit.
    DiscardRetainedCheckpoints { job: JobId },
    /// Replaces the job's checkpoint statistics summary (owned by the coordinator, opaque here),
    /// so that counts and latest entries survive a leader change.
    RecordStats { job: JobId, stats: serde_json::Value },
    /// The job failed (a task, its worker, its restore, or checkpointing past its tolerance):
    /// `strategy` decides, from the job's replicated restart state, whether it restarts (the
    /// job becomes `restarting` until the outcome's time) or fails for good (`failed`, with the
    /// strategy's reason). `at_ms` is the leader's wall clock; `jitter_permille` a random
    /// sample in -1000..=1000 drawn by the leader, so every replica decides the same.
    RecordFailure { job: JobId, at_ms: u64, cause: String, strategy: RestartStrategy, jitter_permille: i16 },
    /// Forgets one retained checkpoint of a job that ended (a job restoring from it in `claim`
    /// mode took it over); the outcome returns it as [`Outcome::Subsumed`].
    ReleaseRetainedCheckpoint { job: JobId, checkpoint_id: u64 },
    /// Starts a new deployment attempt of the job's tasks; the outcome is its attempt number,
    /// unique across leaders, so a message from an older attempt is always recognisable.
    BeginAttempt { job: JobId },
    /// An operator request with a client-chosen id: applies `command` once and remembers its
    /// outcome in the job's request table (see [`super::request`]); a retry with the same id and
    /// fingerprint returns the first outcome as [`Outcome::Repeated`] and changes nothing.
    Deduplicated { request_id: String, fingerprint: u64, command: Box<Command> },
    /// Records `outcome` for a request id without changing anything else (e.g. the checkpoint id
    /// a trigger request was given); a repeat returns the recorded outcome.
    RecordRequest { job: JobId, request_id: String, fingerprint: u64, outcome: Outcome },
    /// Concurrent proposals packed into one log entry (group commit: one append, one flush, one
    /// replication round for all of them). Each command is applied in order exactly as if it
    /// were its own entry; one's rejection does not affect the others. The outcome is
    /// [`Outcome::Batch`], one result per command. A batch holds 1..=[`MAX_BATCH`] commands, none
    /// of them a batch.
    Batch { commands: Vec<Command> },
}

/// The most commands one [`Command::Batch`] may hold.
pub const MAX_BATCH: usize = 1024;

impl Command {
    /// The one job whose record the command reads and writes; `None` for a batch.
    pub fn job(&self) -> Option<&JobId> {
        Some(match self {
            Self::RegisterJob { job, .. }
            | Self::UpdateJobConfig { job, .. }
            | Self::SetJobStatus { job, .. }
            | Self::AllocateCheckpointId { job }
            | Self::ReserveCheckpointIds { job, .. }
            | Self::AdvanceCheckpointCounter { job, .. }
            | Self::AddCompletedCheckpoint { job, .. }
            | Self::RegisterSavepoint { job, .. }
            | Self::DisposeSavepoint { job, .. }
            | Self::RemoveJob { job }
            | Self::DiscardRetainedCheckpoints { job }
            | Self::BeginAttempt { job }
            | Self::RecordFailure { job, .. }
            | Self::ReleaseRetainedCheckpoint { job, .. }
            | Self::RecordStats { job, .. }
            | Self::RecordRequest { job, .. } => job,
            Self::Deduplicated { command, .. } => return command.job(),
            Self::Batch { .. } => return None,
        })
    }

    /// Every job the command (or, for a batch, any command in it) reads and writes.
    pub fn jobs(&self) -> Vec<&JobId> {
        match self {
            Self::Batch { commands } => commands.iter().flat_map(Command::jobs).collect(),
            Self::Deduplicated { command, .. } => command.jobs(),
            other => other.job().into_iter().collect(),
        }
    }

    /// Short name for logs and metrics.
    pub fn name(&self) -> &'static str {
        match self {
            Self::RegisterJob { .. } => "register_job",
            Self::UpdateJobConfig { .. } => "update_job_config",
            Self::SetJobStatus { .. } => "set_job_status",
            Self::AllocateCheckpointId { .. } => "allocate_checkpoint_id",
            Self::ReserveCheckpointIds { .. } => "reserve_checkpoint_ids",
            Self::AdvanceCheckpointCounter { .. } => "advance_checkpoint_counter",
            Self::AddCompletedCheckpoint { .. } => "add_completed_checkpoint",
            Self::RegisterSavepoint { .. } => "register_savepoint",
            Self::DisposeSavepoint { .. } => "dispose_savepoint",
            Self::RemoveJob { .. } => "remove_job",
            Self::DiscardRetainedCheckpoints { .. } => "discard_retained_checkpoints",
            Self::BeginAttempt { .. } => "begin_attempt",
            Self::RecordFailure { .. } => "record_failure",
            Self::ReleaseRetainedCheckpoint { .. } => "release_retained_checkpoint",
            Self::RecordStats { .. } => "record_stats",
            Self::Deduplicated { .. } => "deduplicated",
            Self::RecordRequest { .. } => "record_request",
            Self::Batch { .. } => "batch",
        }
    }
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self, self.job()) {
            (Self::Batch { commands }, _) => write!(f, "batch({} commands)", commands.len()),
            (_, Some(job)) => write!(f, "{}(job={job})", self.name()),
            (_, None) => write!(f, "{}", self.name()),
        }
    }
}

/// What an applied command did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome {
    /// Blank and membership entries, and commands with nothing to report.
    Done,
    CheckpointId {
        id: u64,
    },
    /// IDs `first..first + count` are reserved.
    CheckpointIds {
        first: u64,
        count: u32,
    },
    Attempt {
        attempt: u32,
    },
    CounterAdvanced {
        next: u64,
    },
    /// Checkpoints removed from the store by retention; their exclusive state may be discarded.
    Subsumed {
        checkpoints: Vec<CompletedCheckpoint>,
    },
    SavepointDisposed {
        savepoint: SavepointRecord,
    },
    JobRemoved {
        checkpoints: Vec<CompletedCheckpoint>,
        savepoints: Vec<SavepointRecord>,
    },
    /// What the restart strategy decided about a recorded failure.
    RestartDecided {
        decision: RestartDecision,
    },
    /// A request id seen before with the same arguments: what its first execution returned.
    Repeated {
        first: Box<Outcome>,
    },
    /// The result of each command of a [`Command::Batch`], in order.
    Batch {
        results: Vec<Result<Outcome, CommandError>>,
    },
}

/// Why a command was rejected. A rejected command changes nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[serde(tag = "error", rename_all = "snake_case")]
pub enum CommandError {
    #[error("unknown job `{job}`")]
    UnknownJob { job: JobId },
    #[error("job `{job}` is already registered")]
    JobExists { job: JobId },
    #[error("job `{job}` is {status}; it accepts no more changes")]
    JobTerminal { job: JobId, status: String },
    #[error("job `{job}` is {status}; only a finished, canceled or failed job can be removed")]
    JobNotTerminal { job: JobId, status: String },
    #[error("job `{job}` cannot go from {from} to {to}")]
    IllegalTransition { job: JobId, from: String, to: String },
    #[error(transparent)]
    InvalidConfig(#[from] ConfigError),
    #[error("checkpoint counter of job `{job}` is at {current}; it cannot be lowered to {requested}")]
    CounterRegression { job: JobId, current: u64, requested: u64 },
    #[error("statistics of job `{job}` are invalid: {reason}")]
    InvalidStats { job: JobId, reason: String },
    #[error("attempt counter of job `{job}` is exhausted")]
    AttemptsExhausted { job: JobId },
    #[error("checkpoint counter of job `{job}` is exhausted")]
    CounterExhausted { job: JobId },
    #[error(
        "cannot reserve {count} checkpoint ids for job `{job}`: between 1 and {max} may be reserved at once"
    )]
    InvalidReservation { job: JobId, count: u32, max: u32 },
    #[error("checkpoint {id} of job `{job}` was never allocated (next ID is {next})")]
    NotAllocated { job: JobId, id: u64, next: u64 },
    #[error("checkpoint {id} of job `{job}` is already completed")]
    DuplicateCheckpoint { job: JobId, id: u64 },
    #[error("checkpoint {id} of job `{job}` is older than the latest completed checkpoint {latest}")]
    OutOfOrder { job: JobId, id: u64, latest: u64 },
    #[error("savepoint {id} of job `{job}` is already registered")]
    DuplicateSavepoint { job: JobId, id: u64 },
    #[error("job `{job}` has no savepoint {id}")]
    UnknownSavepoint { job: JobId, id: u64 },
    #[error(
        "request_id {request_id:?} was already used on job `{job}` with different arguments; \
         choose a new request id"
    )]
    RequestIdReused { job: JobId, request_id: String },
    #[error("{field} of checkpoint {id} of job `{job}` is invalid: {reason}")]
    InvalidCheckpoint { job: JobId, id: u64, field: String, reason: String },
    #[error("job `{job}` retains no checkpoint {id}")]
    UnknownCheckpoint { job: JobId, id: u64 },
    #[error(transparent)]
    InvalidRestartStrategy(#[from] cairn_protocol::restart::RestartStrategyError),
    #[error("invalid batch: {reason}")]
    InvalidBatch { reason: String },
}

/// The response of one applied log entry. Rejections are committed responses too, so that
/// every replica agrees on them and the proposer learns the precise reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandResponse(pub Result<Outcome, CommandError>);

impl CommandResponse {
    pub fn done() -> Self {
        Self(Ok(Outcome::Done))
    }
}
