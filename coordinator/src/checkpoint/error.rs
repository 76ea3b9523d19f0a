//! The checkpoint coordinator's error types: [`TriggerError`] answers a trigger request;
//! [`Error`] is everything else that can go wrong in the core and in restore.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::failure::CheckpointFailureReason;

/// Why a manual trigger request (checkpoint or savepoint) did not produce a completed snapshot.
/// Each variant tells the caller what to do next.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[serde(tag = "error", rename_all = "snake_case")]
pub enum TriggerError {
    /// Fix the request: name a target directory or configure the job's default.
    #[error("no savepoint directory: the request names none and the job configures no default")]
    NoSavepointDirectory,
    /// Fix the request: `drain` only applies to stop-with-savepoint.
    #[error("the drain flag is only valid for a synchronous savepoint (stop-with-savepoint)")]
    DrainRequiresSyncSavepoint,
    /// Nothing was started; the request may be retried later.
    #[error("trigger refused: {reason}")]
    Rejected { reason: CheckpointFailureReason },
    /// The snapshot was started and failed; its state is discarded.
    #[error("checkpoint {checkpoint_id} failed: {reason}{}", detail.as_deref().map(|d| format!(" ({d})")).unwrap_or_default())]
    Failed { checkpoint_id: u64, reason: CheckpointFailureReason, detail: Option<String> },
    /// Leadership was lost while the snapshot was being committed: read the job's record on the
    /// new leader to learn whether it completed.
    #[error(
        "the commit of checkpoint {checkpoint_id} has an unknown outcome; check the job's record on the leader"
    )]
    OutcomeUnknown { checkpoint_id: u64 },
}

/// Errors of the coordinator core and of restore.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    InvalidConfig(#[from] cairn_raft::model::ConfigError),
    #[error("invalid task set: {0}")]
    InvalidTaskSet(String),
    #[error("a master hook named {0:?} is already registered")]
    DuplicateHook(String),
    #[error("master hook names must be non-empty")]
    EmptyHookName,
    /// Retry later; never fall back to an older checkpoint (that would lose committed output).
    #[error("metadata of checkpoint {checkpoint_id} at {} cannot be read: {cause}; retry, do not fall back to an older checkpoint", path.display())]
    MetadataUnreadable { checkpoint_id: u64, path: PathBuf, cause: String },
    #[error("metadata at {} describes {found}, expected {expected}", path.display())]
    MetadataMismatch { path: PathBuf, expected: String, found: String },
    #[error(
        "checkpoint {checkpoint_id} holds master state {hook:?} that no registered hook claims; allow non-restored state to skip it"
    )]
    UnmappedMasterState { checkpoint_id: u64, hook: String },
    #[error("master hook {hook:?} failed: {detail}")]
    HookFailed { hook: String, detail: String },
}
