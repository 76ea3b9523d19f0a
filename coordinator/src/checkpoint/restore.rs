//! Restore, as pure functions: which snapshot to restore from, how its state maps onto the job
//! graph being deployed (possibly with changed parallelism), and how far the checkpoint counter
//! must be advanced.
//!
//! - [`choose_restore_point`]: the latest completed checkpoint, or a savepoint if one is newer.
//!   There is no fallback list: when the chosen point's `_metadata` cannot be read,
//!   [`RestoreCandidate::load`] returns [`Error::MetadataUnreadable`], to be retried. Restoring an
//!   older checkpoint instead would roll back output that was already committed on its basis.
//! - [`assign_states`]: keyed state goes to the subtask owning its key group for the new
//!   parallelism (the max parallelism must not change); operator list state is either pooled and
//!   dealt out round-robin, or given whole to every subtask (union). State of an operator that
//!   is not in the new graph is an error naming it, unless non-restored state is allowed.
//! - [`counter_after_restore`]: restoring snapshot N requires the id counter to be at least
//!   N + 1; returns the value to propose with `AdvanceCheckpointCounter` when it is not.
//! - Master hooks are restored with [`MasterHooks::restore`](super::hooks::MasterHooks::restore).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use cairn_raft::model::{CheckpointKind, CompletedCheckpoint, JobRecord};
use cairn_storage::checkpoint::layout::METADATA_FILE;
use cairn_storage::checkpoint::{
    CheckpointMetadata, KeyGroupRange, MetadataError, MetadataPointer, OperatorStateMode,
    OperatorSubtaskState, StateFile,
};
use serde::{Deserialize, Serialize};

use super::error::Error;
use super::tasks::MAX_PARALLELISM_UPPER_BOUND;

/// The snapshot a restore should use, before its metadata is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoreCandidate {
    pub checkpoint: CompletedCheckpoint,
    /// What to read and verify (`cairn_storage::checkpoint::read_metadata`).
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
    /// A savepoint named by path (e.g. `JobSpec::restore_from`), with the result of reading its
    /// `_metadata` (unverified: there is no pointer for it).
    pub fn from_savepoint_dir(
        dir: &Path,
        read: Result<CheckpointMetadata, MetadataError>,
    ) -> Result<Self, Error> {
        let metadata = read.map_err(|e| Error::MetadataUnreadable {
            checkpoint_id: 0,
            path: dir.join(METADATA_FILE),
            cause: e.to_string(),
        })?;
        let kind = match metadata.kind.as_str() {
            "checkpoint" => CheckpointKind::Checkpoint,
            "sync_savepoint" => CheckpointKind::SyncSavepoint,
            _ => CheckpointKind::Savepoint,
        };
        Ok(Self { checkpoint_id: metadata.checkpoint_id, kind, base_dir: dir.to_owned(), metadata })
    }
}

/// The id counter value to propose (`AdvanceCheckpointCounter { next }`) before restoring
/// snapshot `restored_id`, or `None` when the counter is already beyond it.
pub fn counter_after_restore(next_checkpoint_id: u64, restored_id: u64) -> Option<u64> {
    let required = restored_id.saturating_add(1);
    (next_checkpoint_id < required).then_some(required)
}

/// A vertex of the job graph being deployed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VertexTarget {
    pub id: String,
    pub parallelism: u32,
    pub max_parallelism: u32,
    /// Ids of the operators chained in this vertex (stable across versions of the job).
    pub operators: Vec<String>,
}

/// A byte range `[start, end)` of one list-state element in its file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ByteRange {
    pub start: u64,
    pub end: u64,
}

/// Some elements of one list-state file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListStatePart {
    pub file: StateFile,
    pub elements: Vec<ByteRange>,
}

/// One operator list state as assigned to one new subtask.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AssignedListState {
    pub name: String,
    pub mode: OperatorStateMode,
    pub parts: Vec<ListStatePart>,
}

/// The state one operator of one new subtask restores.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperatorRestore {
    /// The key groups this subtask owns from now on.
    pub key_groups: KeyGroupRange,
    /// Keyed state files of those key groups.
    pub keyed: BTreeMap<u32, StateFile>,
    pub list_states: Vec<AssignedListState>,
}

/// What every subtask of the new graph restores, by `"<vertex>/<index>"`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateAssignment {
    pub checkpoint_id: u64,
    /// Relative paths in the handles resolve against this directory.
    pub base_dir: PathBuf,
    /// Every subtask of the new graph, with the operators that have state to restore.
    pub subtasks: BTreeMap<String, BTreeMap<String, OperatorRestore>>,
    /// Master hook states, for [`MasterHooks::restore`](super::hooks::MasterHooks::restore).
    pub master_states: BTreeMap<String, Vec<u8>>,
}

/// The state of one operator in the snapshot, gathered from all its old subtasks.
struct OldOperator<'a> {
    vertex: &'a str,
    parallelism: u32,
    max_parallelism: u32,
    /// By old subtask index.
    subtasks: BTreeMap<u32, &'a OperatorSubtaskState>,
}

/// Maps the snapshot's state onto the new graph. See the module docs for the rules.
pub fn assign_states(
    point: &RestorePoint,
    target: &[VertexTarget],
    allow_non_restored_state: bool,
) -> Result<StateAssignment, Error> {
    let id = point.checkpoint_id;
    let meta = &point.metadata;
    let op_to_vertex = index_target(target)?;
    let old = gather_old(meta, id)?;

    let mut subtasks: BTreeMap<String, BTreeMap<String, OperatorRestore>> = BTreeMap::new();
    for v in target {
        for i in 0..v.parallelism {
            subtasks.insert(CheckpointMetadata::subtask_key(&v.id, i), BTreeMap::new());
        }
    }
    for (op, old_op) in &old {
        if old_op.subtasks.values().all(|s| s.is_empty()) {
            continue;
        }
        let Some(new_vertex) = op_to_vertex.get(op.as_str()) else {
            if allow_non_restored_state {
                tracing::info!(checkpoint = id, operator = %op, "skipping state of an operator not in the job graph");
                continue;
            }
            return Err(Error::UnmappedState {
                checkpoint_id: id,
                operator: op.clone(),
                vertex: old_op.vertex.into(),
            });
        };
        let keyed = pool_keyed(old_op, id)?;
        if !keyed.is_empty() && old_op.max_parallelism != new_vertex.max_parallelism {
            return Err(Error::MaxParallelismChanged {
                checkpoint_id: id,
                vertex: new_vertex.id.clone(),
                old: old_op.max_parallelism,
                new: new_vertex.max_parallelism,
            });
        }
        let lists = assign_list_states(old_op, new_vertex.parallelism, id)?;
        for (j, lists) in (0..new_vertex.parallelism).zip(lists) {
            let range = KeyGroupRange::for_subtask(new_vertex.max_parallelism, new_vertex.parallelism, j)
                .ok_or_else(|| {
                    Error::InvalidRestoreTarget(format!("vertex {} has an invalid shape", new_vertex.id))
                })?;
            let keyed = keyed.range(range.start..=range.end).map(|(kg, f)| (*kg, f.clone())).collect();
            let restore = OperatorRestore { key_groups: range, keyed, list_states: lists };
            if let Some(ops) = subtasks.get_mut(&CheckpointMetadata::subtask_key(&new_vertex.id, j)) {
                ops.insert(op.clone(), restore);
            }
        }
    }
    Ok(StateAssignment {
        checkpoint_id: id,
        base_dir: point.base_dir.clone(),
        subtasks,
        master_states: meta.master_states.clone(),
    })
}

/// Validates the new graph and maps each operator to its vertex.
fn index_target(target: &[VertexTarget]) -> Result<BTreeMap<&str, &VertexTarget>, Error> {
    let mut vertices = BTreeSet::new();
    let mut ops = BTreeMap::new();
    for v in target {
        if !vertices.insert(v.id.as_str()) {
            return Err(Error::InvalidRestoreTarget(format!("vertex {} appears twice", v.id)));
        }
        if v.parallelism == 0
            || v.parallelism > v.max_parallelism
            || v.max_parallelism > MAX_PARALLELISM_UPPER_BOUND
        {
            return Err(Error::InvalidRestoreTarget(format!(
                "vertex {} has parallelism {} and max parallelism {}",
                v.id, v.parallelism, v.max_parallelism
            )));
        }
        for op in &v.operators {
            if ops.insert(op.as_str(), v).is_some() {
                return Err(Error::InvalidRestoreTarget(format!("operator {op} appears in two vertices")));
            }
        }
    }
    Ok(ops)
}

/// Groups the snapshot's subtask states by operator.
fn gather_old(meta: &CheckpointMetadata, id: u64) -> Result<BTreeMap<String, OldOperator<'_>>, Error> {
    let corrupt = |detail: String| Error::CorruptState { checkpoint_id: id, detail };
    let mut old: BTreeMap<String, OldOperator<'_>> = BTreeMap::new();
    for (key, state) in &meta.subtasks {
        let (vertex, index) =
            key.rsplit_once('/')
                .and_then(|(v, i)| i.parse::<u32>().ok().map(|i| (v, i)))
                .ok_or_else(|| corrupt(format!("subtask key {key:?} is not <vertex>/<index>")))?;
        let info =
            meta.vertices.get(vertex).ok_or_else(|| corrupt(format!("vertex {vertex} has no shape")))?;
        if index >= info.parallelism {
            return Err(corrupt(format!(
                "subtask {key} is beyond the vertex's parallelism {}",
                info.parallelism
            )));
        }
        for (op, op_state) in &state.operators {
            let entry = old.entry(op.clone()).or_insert_with(|| OldOperator {
                vertex,
                parallelism: info.parallelism,
                max_parallelism: info.max_parallelism,
                subtasks: BTreeMap::new(),
            });
            if entry.vertex != vertex {
                return Err(corrupt(format!(
                    "operator {op} appears in vertices {} and {vertex}",
                    entry.vertex
                )));
            }
            entry.subtasks.insert(index, op_state);
        }
    }
    Ok(old)
}

/// All keyed state of an operator by key group.
fn pool_keyed(old: &OldOperator<'_>, id: u64) -> Result<BTreeMap<u32, StateFile>, Error> {
    let mut pool = BTreeMap::new();
    for state in old.subtasks.values() {
        for (kg, file) in &state.keyed {
            if *kg >= old.max_parallelism {
                return Err(Error::CorruptState {
                    checkpoint_id: id,
                    detail: format!("key group {kg} is not below max parallelism {}", old.max_parallelism),
                });
            }
            if pool.insert(*kg, file.clone()).is_some() {
                return Err(Error::CorruptState {
                    checkpoint_id: id,
                    detail: format!("key group {kg} appears in two subtasks of vertex {}", old.vertex),
                });
            }
        }
    }
    Ok(pool)
}

/// Element byte ranges of one list-state file.
fn element_ranges(offsets: &[u64], size: u64) -> Vec<ByteRange> {
    offsets
        .iter()
        .enumerate()
        .map(|(i, start)| ByteRange { start: *start, end: offsets.get(i + 1).copied().unwrap_or(size) })
        .collect()
}

/// One old subtask's part of a list state: its index, file and element ranges.
type ListSource<'a> = (u32, &'a StateFile, Vec<ByteRange>);

/// Assigns every list state of an operator to `new_parallelism` subtasks (one `Vec` each).
fn assign_list_states(
    old: &OldOperator<'_>,
    new_parallelism: u32,
    id: u64,
) -> Result<Vec<Vec<AssignedListState>>, Error> {
    // name → (mode, [(old subtask, file, elements)]) in old-subtask order
    let mut by_name: BTreeMap<&str, (OperatorStateMode, Vec<ListSource<'_>>)> = BTreeMap::new();
    for (index, state) in &old.subtasks {
        for l in &state.list_states {
            let entry = by_name.entry(l.name.as_str()).or_insert((l.mode, Vec::new()));
            if entry.0 != l.mode {
                return Err(Error::CorruptState {
                    checkpoint_id: id,
                    detail: format!("list state {:?} is both round-robin and union", l.name),
                });
            }
            entry.1.push((*index, &l.file, element_ranges(&l.offsets, l.file.size)));
        }
    }
    let n = new_parallelism as usize;
    let mut assigned: Vec<Vec<AssignedListState>> = vec![Vec::new(); n];
    for (name, (mode, sources)) in by_name {
        let mut per_subtask: Vec<Vec<ListStatePart>> = vec![Vec::new(); n];
        match mode {
            OperatorStateMode::Union => {
                for parts in &mut per_subtask {
                    *parts = sources
                        .iter()
                        .map(|(_, file, elements)| ListStatePart {
                            file: (*file).clone(),
                            elements: elements.clone(),
                        })
                        .collect();
                }
            }
            OperatorStateMode::RoundRobin if new_parallelism == old.parallelism => {
                // Same parallelism: every subtask gets its own elements back.
                for (index, file, elements) in &sources {
                    if let Some(parts) = per_subtask.get_mut(*index as usize) {
                        parts.push(ListStatePart { file: (*file).clone(), elements: elements.clone() });
                    }
                }
            }
            OperatorStateMode::RoundRobin => {
                let pooled =
                    sources.iter().flat_map(|(_, file, elements)| elements.iter().map(move |e| (*file, *e)));
                for (k, (file, element)) in pooled.enumerate() {
                    let parts = &mut per_subtask[k % n];
                    match parts.last_mut() {
                        Some(last) if last.file == *file => last.elements.push(element),
                        _ => parts.push(ListStatePart { file: file.clone(), elements: vec![element] }),
                    }
                }
            }
        }
        for (slot, parts) in assigned.iter_mut().zip(per_subtask) {
            slot.push(AssignedListState { name: name.to_owned(), mode, parts });
        }
    }
    Ok(assigned)
}

#[cfg(test)]
mod tests;
