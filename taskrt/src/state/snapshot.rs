//! Snapshots in two parts, as the task takes them.
//!
//! - Synchronous part ([`plan_operator`]): runs on the task's loop while no record is processed.
//!   It serializes every key group that must be written (all of them, or in incremental mode only
//!   those changed since the last confirmed checkpoint) into one buffer per operator, and every
//!   list state, so processing can continue right after.
//! - Asynchronous part ([`write_plan`]): runs on the snapshot pool. It writes the files, fsyncs
//!   each once and each directory once, computes CRC-32s (per key-group segment and per file),
//!   and produces the `SubtaskState` the task acknowledges. It checks a cancel flag between
//!   files; when cancelled or failing it removes every file it wrote.
//!
//! File names: `chk-<id>/<op>-<subtask>.state` (keyed state, full),
//! `shared/<op>-<subtask>-<random>.state` (keyed state, incremental; unique so that no two
//! checkpoints ever write the same shared file), `chk-<id>/<op>-<subtask>-<list>.list` (list
//! state). Savepoints put everything, without `chk-<id>/`, in the target directory. See
//! [`super::keyed_plan`] for what a keyed-state file holds.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use cairn_protocol::checkpoint::{
    CheckpointLayout, OperatorListState, OperatorStateMode, OperatorSubtaskState, StateFile, SubtaskState,
};

use super::StateError;
use super::keyed::{KeyedStateBackend, UploadedGroups};
use super::keyed_plan::{PlannedKeyed, plan_keyed};
use super::list::OperatorStateBackend;
use super::storage::CheckpointStorage;

/// Where and how one checkpoint is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotTarget {
    pub checkpoint_id: u64,
    /// Directory relative paths resolve against.
    pub base_dir: PathBuf,
    /// Prefix of exclusive files (`chk-<id>` or empty for a savepoint directory).
    pub exclusive_prefix: Option<String>,
    /// Write only changed key groups, to `shared/`.
    pub incremental: bool,
}

impl SnapshotTarget {
    /// A checkpoint in the job's checkpoint storage.
    pub fn checkpoint(storage: &CheckpointStorage, checkpoint_id: u64, incremental: bool) -> Self {
        Self {
            checkpoint_id,
            base_dir: storage.job_dir().to_owned(),
            exclusive_prefix: Some(CheckpointLayout::chk_rel(checkpoint_id)),
            incremental,
        }
    }

    /// A self-contained savepoint in `dir`.
    pub fn savepoint(dir: &Path, checkpoint_id: u64) -> Self {
        Self { checkpoint_id, base_dir: dir.to_owned(), exclusive_prefix: None, incremental: false }
    }

    fn exclusive(&self, name: String) -> String {
        match &self.exclusive_prefix {
            Some(p) => format!("{p}/{name}"),
            None => name,
        }
    }
}

/// A file to write in the asynchronous part.
#[derive(Debug, Clone)]
pub struct PlannedFile {
    pub rel: String,
    pub bytes: Vec<u8>,
}

#[derive(Debug, Clone)]
struct PlannedList {
    name: String,
    mode: OperatorStateMode,
    file: PlannedFile,
    offsets: Vec<u64>,
}

/// The synchronous result for one operator.
#[derive(Debug, Clone)]
pub struct OperatorPlan {
    operator_id: String,
    keyed: PlannedKeyed,
    lists: Vec<PlannedList>,
}

impl OperatorPlan {
    pub fn is_empty(&self) -> bool {
        self.keyed.is_empty() && self.lists.is_empty()
    }

    /// Bytes the asynchronous part will write.
    pub fn bytes_to_write(&self) -> u64 {
        let keyed = self.keyed.file.as_ref().map_or(0, |f| f.bytes.len() as u64);
        keyed + self.lists.iter().map(|l| l.file.bytes.len() as u64).sum::<u64>()
    }
}

/// Synchronous part for one operator of one subtask.
pub fn plan_operator(
    operator_id: &str,
    subtask: u32,
    keyed: Option<&KeyedStateBackend>,
    lists: &OperatorStateBackend,
    target: &SnapshotTarget,
) -> OperatorPlan {
    let keyed = keyed
        .map(|k| {
            let exclusive = target.exclusive(format!("{operator_id}-{subtask}.state"));
            plan_keyed(k, operator_id, subtask, exclusive, target.incremental)
        })
        .unwrap_or_default();
    let lists = lists
        .lists()
        .iter()
        .filter(|(_, l)| !l.elements.is_empty())
        .map(|(name, list)| {
            let (bytes, offsets) = OperatorStateBackend::encode(list);
            PlannedList {
                name: name.clone(),
                mode: list.mode,
                file: PlannedFile {
                    rel: target.exclusive(format!("{operator_id}-{subtask}-{name}.list")),
                    bytes,
                },
                offsets,
            }
        })
        .collect();
    OperatorPlan { operator_id: operator_id.to_owned(), keyed, lists }
}

/// The asynchronous result: what to acknowledge and what to remember.
#[derive(Debug, Clone, Default)]
pub struct WrittenSnapshot {
    pub state: SubtaskState,
    /// For incremental bookkeeping, per operator.
    pub uploaded: BTreeMap<String, UploadedGroups>,
    /// Absolute paths of the files this snapshot created (to remove if it is never acknowledged).
    pub written: Vec<PathBuf>,
    pub bytes_persisted: u64,
}

/// Removes files written by a snapshot that will not be acknowledged (best effort, logged).
pub fn remove_files(paths: &[PathBuf]) {
    for p in paths {
        if let Err(e) = std::fs::remove_file(p)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(path = %p.display(), error = %e, "cannot remove state file of a dropped snapshot");
        }
    }
}

/// Asynchronous part: writes all planned files.
pub fn write_plan(
    storage: &CheckpointStorage,
    target: &SnapshotTarget,
    plans: Vec<OperatorPlan>,
    cancel: &AtomicBool,
) -> Result<WrittenSnapshot, StateError> {
    let mut out = WrittenSnapshot::default();
    let result = write_all(storage, target, plans, cancel, &mut out);
    if let Err(e) = result {
        remove_files(&out.written);
        return Err(e);
    }
    Ok(out)
}

/// Writes one file (fsynced, its directory noted for one sync at the end).
fn write_one(
    storage: &CheckpointStorage,
    target: &SnapshotTarget,
    rel: &str,
    bytes: &[u8],
    cancel: &AtomicBool,
    out: &mut WrittenSnapshot,
    dirs: &mut BTreeSet<PathBuf>,
) -> Result<(), StateError> {
    if cancel.load(Ordering::Acquire) {
        return Err(StateError::Cancelled { checkpoint_id: target.checkpoint_id });
    }
    let abs = target.base_dir.join(rel);
    if let Some(d) = abs.parent() {
        dirs.insert(d.to_owned());
    }
    // Record before writing: a partially written file must be removed too.
    out.written.push(abs.clone());
    storage.write_file(&abs, bytes)?;
    out.bytes_persisted += bytes.len() as u64;
    Ok(())
}

fn write_all(
    storage: &CheckpointStorage,
    target: &SnapshotTarget,
    plans: Vec<OperatorPlan>,
    cancel: &AtomicBool,
    out: &mut WrittenSnapshot,
) -> Result<(), StateError> {
    let mut dirs = BTreeSet::new();
    for plan in plans {
        let mut op_state = OperatorSubtaskState::default();
        if let Some(file) = &plan.keyed.file {
            write_one(storage, target, &file.rel, &file.bytes, cancel, out, &mut dirs)?;
        }
        let (written_groups, reused_groups) = (plan.keyed.written_groups(), plan.keyed.reused_groups());
        let (keyed, uploaded) = plan.keyed.finish();
        tracing::debug!(
            checkpoint_id = target.checkpoint_id,
            operator = %plan.operator_id,
            written_groups,
            reused_groups,
            files = keyed.files.len(),
            "keyed state written"
        );
        op_state.keyed = keyed;
        for list in plan.lists {
            write_one(storage, target, &list.file.rel, &list.file.bytes, cancel, out, &mut dirs)?;
            let bytes = &list.file.bytes;
            let file =
                StateFile { path: list.file.rel, size: bytes.len() as u64, crc32: crc32fast::hash(bytes) };
            op_state.list_states.push(OperatorListState {
                name: list.name,
                mode: list.mode,
                file,
                offsets: list.offsets,
            });
        }
        if !op_state.is_empty() {
            out.state.operators.insert(plan.operator_id.clone(), op_state);
        }
        if target.incremental {
            out.uploaded.insert(plan.operator_id, uploaded);
        }
    }
    for d in &dirs {
        storage.sync_dir(d)?;
    }
    if cancel.load(Ordering::Acquire) {
        return Err(StateError::Cancelled { checkpoint_id: target.checkpoint_id });
    }
    Ok(())
}
