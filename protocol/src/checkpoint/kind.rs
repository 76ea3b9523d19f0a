//! What kind of snapshot a checkpoint is: the one vocabulary of the leader, the tasks, the
//! replicated store and `_metadata`.

use serde::{Deserialize, Serialize};

/// Whether a snapshot is a checkpoint or a savepoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckpointKind {
    /// Periodic checkpoint; may be incremental.
    Checkpoint,
    /// Self-contained, always full.
    Savepoint,
    /// Stop-with-savepoint: after the snapshot, the task processes no input until notified
    /// complete, then finishes.
    SyncSavepoint,
}

impl CheckpointKind {
    pub fn is_savepoint(self) -> bool {
        !matches!(self, CheckpointKind::Checkpoint)
    }

    pub fn is_synchronous(self) -> bool {
        matches!(self, CheckpointKind::SyncSavepoint)
    }

    /// Name used in `_metadata` (`checkpoint`, `savepoint`, `sync_savepoint`).
    pub fn as_str(self) -> &'static str {
        match self {
            CheckpointKind::Checkpoint => "checkpoint",
            CheckpointKind::Savepoint => "savepoint",
            CheckpointKind::SyncSavepoint => "sync_savepoint",
        }
    }

    /// The kind named in `_metadata`; an unknown name reads as a savepoint (self-contained).
    pub fn from_metadata_name(name: &str) -> Self {
        match name {
            "checkpoint" => CheckpointKind::Checkpoint,
            "sync_savepoint" => CheckpointKind::SyncSavepoint,
            _ => CheckpointKind::Savepoint,
        }
    }
}
