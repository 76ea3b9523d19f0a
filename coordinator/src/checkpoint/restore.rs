//! Restore, as pure functions: which snapshot to restore from and how far the checkpoint counter
//! must be advanced. How the snapshot's state maps onto the graph being deployed is the contract
//! crate's one assignment function, `cairn_protocol::assign::assign_states`, called on the
//! [`RestorePoint`] chosen here.
//!
//! - [`choose_restore_point`]: the latest completed checkpoint, or a savepoint if one is newer.
//!   There is no fallback list: when the chosen point's `_metadata` cannot be read,
//!   [`RestoreCandidate::load`] returns [`Error::MetadataUnreadable`], to be retried. Restoring an
//!   older checkpoint instead would roll back output that was already committed on its basis.
//! - [`counter_after_restore`]: restoring snapshot N requires the id counter to be at least
//!   N + 1; returns the value to propose with `AdvanceCheckpointCounter` when it is not.
//! - Master hooks are restored with [`MasterHooks::restore`](super::hooks::MasterHooks::restore).

use std::path::{Path, PathBuf};

use cairn_protocol::assign::{AssignError, StateAssignment, assign_states};
use cairn_protocol::checkpoint::layout::METADATA_FILE;
use cairn_protocol::checkpoint::{CheckpointLayout, CheckpointMetadata, MetadataError, MetadataPointer};
use cairn_protocol::graph::JobGraph;
use cairn_raft::model::{CheckpointKind, CompletedCheckpoint, JobRecord};

use super::error::Error;

/// The snapshot a restore should use, before its metadata is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoreCandidate {
    pub checkpoint: CompletedCheckpoint,
    /// What to read and verify (`cairn_protocol::checkpoint::read_metadata`).
    pub pointer: MetadataPointer,
    /// Directory the state handles' relative paths resolve against.
    pub base_dir: PathBuf,
}

/// A snapshot whose metadata was read: everything a restore needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestorePoint {
    pub checkpoint_id: u64,
    pub kind: CheckpointKind,
    pub base_dir: PathBuf,
    pub metadata: CheckpointMetadata,
}

/// The latest completed checkpoint or a newer savepoint; `None` when the job has neither.
pub fn choose_restore_point(job: &JobRecord) -> Option<RestoreCandidate> {
    let checkpoint = job.restore_point()?.clone();
    let metadata_path = PathBuf::from(&checkpoint.metadata_path);
    let savepoint_dir =
        job.savepoints.iter().find(|s| s.checkpoint.id == checkpoint.id && s.checkpoint == checkpoint);
    let base_dir = match savepoint_dir {
        Some(sp) => PathBuf::from(&sp.path),
        // <root>/<job>/chk-<id>/_metadata → <root>/<job>
        None => metadata_path.parent().and_then(Path::parent).map(Path::to_path_buf).unwrap_or_default(),
    };
    let pointer = MetadataPointer {
        path: metadata_path,
        size: checkpoint.metadata_size,
        crc32: checkpoint.metadata_crc32,
    };
    Some(RestoreCandidate { checkpoint, pointer, base_dir })
}

impl RestoreCandidate {
    /// Takes the result of reading the candidate's metadata. An unreadable file is an error to
    /// retry, never a reason to pick an older checkpoint.
    pub fn load(self, read: Result<CheckpointMetadata, MetadataError>) -> Result<RestorePoint, Error> {
        let id = self.checkpoint.id;
        let metadata = read.map_err(|e| Error::MetadataUnreadable {
            checkpoint_id: id,
            path: self.pointer.path.clone(),
            cause: e.to_string(),
        })?;
        if metadata.checkpoint_id != id {
            return Err(Error::MetadataMismatch {
                path: self.pointer.path,
                expected: format!("checkpoint {id}"),
                found: format!("checkpoint {}", metadata.checkpoint_id),
            });
        }
        Ok(RestorePoint { checkpoint_id: id, kind: self.checkpoint.kind, base_dir: self.base_dir, metadata })
    }
}

impl RestorePoint {
    /// A snapshot named by path (`JobSpec::restore_from`): a savepoint directory, or the
    /// `chk-<id>` directory of a retained checkpoint (of this or another job), with the result
    /// of reading its `_metadata` (unverified: there is no pointer for it). A savepoint's handles
    /// resolve against its own directory; a checkpoint's against its job's directory (the parent
    /// of `chk-<id>`), where its `shared/` files are too.
    pub fn from_path(dir: &Path, read: Result<CheckpointMetadata, MetadataError>) -> Result<Self, Error> {
        let metadata = read.map_err(|e| Error::MetadataUnreadable {
            checkpoint_id: 0,
            path: dir.join(METADATA_FILE),
            cause: e.to_string(),
        })?;
        let kind = CheckpointKind::from_metadata_name(&metadata.kind);
        let base_dir = match kind {
            CheckpointKind::Checkpoint => {
                let expected = CheckpointLayout::chk_rel(metadata.checkpoint_id);
                match (dir.file_name().and_then(|n| n.to_str()), dir.parent()) {
                    (Some(name), Some(job_dir)) if name == expected => job_dir.to_owned(),
                    _ => {
                        return Err(Error::MetadataMismatch {
                            path: dir.join(METADATA_FILE),
                            expected: format!("a retained checkpoint in a directory named {expected}"),
                            found: format!("checkpoint {} in {}", metadata.checkpoint_id, dir.display()),
                        });
                    }
                }
            }
            CheckpointKind::Savepoint | CheckpointKind::SyncSavepoint => dir.to_owned(),
        };
        Ok(Self { checkpoint_id: metadata.checkpoint_id, kind, base_dir, metadata })
    }
}

impl RestorePoint {
    /// Maps this snapshot's state onto `graph` (see `cairn_protocol::assign`).
    pub fn assign(
        &self,
        graph: &JobGraph,
        allow_non_restored_state: bool,
    ) -> Result<StateAssignment, AssignError> {
        assign_states(&self.metadata, &self.base_dir, graph, allow_non_restored_state)
    }
}

/// The id counter value to propose (`AdvanceCheckpointCounter { next }`) before restoring
/// snapshot `restored_id`, or `None` when the counter is already beyond it.
pub fn counter_after_restore(next_checkpoint_id: u64, restored_id: u64) -> Option<u64> {
    let required = restored_id.saturating_add(1);
    (next_checkpoint_id < required).then_some(required)
}

#[cfg(test)]
mod tests;
