//! State assignment on restore: the one function that maps a snapshot's state onto the job graph
//! being deployed, possibly with changed parallelism.
//!
//! The leader calls [`assign_states`] once per deployment and sends every subtask its
//! [`TaskRestore`]; a task restores exactly what it is sent. The rules:
//!
//! - State is matched by **operator id** (stable across versions of a job), wherever the
//!   operator is chained now. State of an operator the new graph does not have is refused,
//!   naming it, unless non-restored state is allowed (then it is skipped and logged).
//! - **Keyed state** moves by key group: new subtask `i` of `p` receives the segments of the key
//!   groups in `KeyGroupRange::for_subtask(max, p, i)`, whichever old subtask wrote them, and the
//!   list of files those segments lie in (a file may serve several new subtasks, each reading
//!   its own byte ranges). The max parallelism must not change (it defines the key groups).
//! - **Round-robin list state**: with unchanged parallelism every subtask gets its own elements
//!   back; otherwise the elements are pooled (old subtask order, then element order) and dealt
//!   out, element `k` to subtask `k mod p`.
//! - **Union list state** goes whole to every subtask.
//! - **Channel state** (the in-flight records of an unaligned checkpoint) belongs to the first
//!   operator of its vertex, and must still be first. With unchanged parallelism every subtask
//!   replays its own records; with a changed one, only a vertex whose every input is
//!   hash-partitioned can be restored: each new subtask replays the records of its own key
//!   groups from all old files. Otherwise the assignment is refused, naming the vertex and the
//!   way out (restore at the old parallelism, or rescale from a savepoint, which is aligned).
//!
//! So every key group and every round-robin element lands on exactly one subtask, and every
//! union element on all of them, or the assignment is refused with a reason.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::checkpoint::{
    CheckpointMetadata, KeyGroupRange, KeyedStateHandle, OperatorStateMode, OperatorSubtaskState, StateFile,
};
use crate::graph::{JobGraph, Partitioning, Vertex};

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

/// One operator list state as assigned to one subtask.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AssignedListState {
    pub name: String,
    pub mode: OperatorStateMode,
    pub parts: Vec<ListStatePart>,
}

impl AssignedListState {
    pub fn element_count(&self) -> usize {
        self.parts.iter().map(|p| p.elements.len()).sum()
    }
}

/// The state one operator of one subtask restores.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct OperatorRestore {
    /// The segments of the subtask's key groups, and the files they lie in.
    pub keyed: KeyedStateHandle,
    pub list_states: Vec<AssignedListState>,
    /// In-flight records to replay before new input (unaligned checkpoints).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub channel_state: Vec<ChannelStatePart>,
}

/// A channel-state file to replay, whole or only the records of some key groups.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChannelStatePart {
    pub file: StateFile,
    /// After rescaling: replay only records whose key falls in these key groups (of
    /// `max_parallelism`).
    pub only: Option<KeyGroupFilter>,
}

/// Key groups a rescaled subtask owns, to filter channel-state records by their key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyGroupFilter {
    pub range: KeyGroupRange,
    pub max_parallelism: u32,
}

impl OperatorRestore {
    pub fn is_empty(&self) -> bool {
        self.keyed.is_empty() && self.list_states.is_empty() && self.channel_state.is_empty()
    }
}

/// What one subtask is deployed with when its job restores.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskRestore {
    /// Id of the checkpoint (or savepoint) restored from.
    pub checkpoint_id: u64,
    /// Directory the handles' relative paths resolve against.
    pub base_dir: PathBuf,
    /// The key groups this subtask owns from now on.
    pub key_groups: KeyGroupRange,
    /// By operator id; operators without state to restore are absent.
    pub operators: BTreeMap<String, OperatorRestore>,
}

/// What every subtask of the new graph restores.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateAssignment {
    pub checkpoint_id: u64,
    /// Relative paths in the handles resolve against this directory.
    pub base_dir: PathBuf,
    /// Every subtask of the new graph by `"<vertex>/<index>"` (see
    /// [`CheckpointMetadata::subtask_key`]), with the operators that have state to restore.
    pub subtasks: BTreeMap<String, TaskRestore>,
}

impl StateAssignment {
    /// The restore of subtask `index` of `vertex`, if the assignment covers it.
    pub fn task(&self, vertex: &str, index: u32) -> Option<&TaskRestore> {
        self.subtasks.get(&CheckpointMetadata::subtask_key(vertex, index))
    }
}

/// Why a snapshot's state cannot be mapped onto a graph.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[serde(tag = "error", rename_all = "snake_case")]
pub enum AssignError {
    #[error(
        "vertex {vertex} had max parallelism {old} when checkpoint {checkpoint_id} was taken and now has {new}; keyed state cannot be redistributed across a changed max parallelism"
    )]
    MaxParallelismChanged { checkpoint_id: u64, vertex: String, old: u32, new: u32 },
    #[error(
        "checkpoint {checkpoint_id} holds state of operator {operator} (vertex {vertex}) that maps to no operator of the new job graph; allow non-restored state to skip it"
    )]
    UnmappedState { checkpoint_id: u64, operator: String, vertex: String },
    #[error(
        "checkpoint {checkpoint_id} holds in-flight records (unaligned) of vertex {vertex}, which cannot be restored: {reason}; restore it with the job graph it was taken with, or rescale from a savepoint (savepoints are always aligned)"
    )]
    ChannelStateNotRestorable { checkpoint_id: u64, vertex: String, reason: String },
    #[error("checkpoint {checkpoint_id} has corrupt state: {detail}")]
    CorruptState { checkpoint_id: u64, detail: String },
    #[error("invalid restore target: {0}")]
    InvalidTarget(String),
}

/// The state of one operator in the snapshot, gathered from all its old subtasks.
struct OldOperator<'a> {
    vertex: &'a str,
    parallelism: u32,
    max_parallelism: u32,
    /// By old subtask index.
    subtasks: BTreeMap<u32, &'a OperatorSubtaskState>,
}

/// Maps the snapshot `meta` (whose relative paths resolve against `base_dir`) onto `graph`. See
/// the module docs for the rules.
pub fn assign_states(
    meta: &CheckpointMetadata,
    base_dir: &Path,
    graph: &JobGraph,
    allow_non_restored_state: bool,
) -> Result<StateAssignment, AssignError> {
    let id = meta.checkpoint_id;
    let op_to_vertex = index_target(graph)?;
    let old = gather_old(meta)?;

    let mut subtasks: BTreeMap<String, TaskRestore> = BTreeMap::new();
    for v in &graph.vertices {
        for i in 0..v.parallelism {
            let key_groups = range_of(v, i)?;
            subtasks.insert(
                CheckpointMetadata::subtask_key(&v.id, i),
                TaskRestore {
                    checkpoint_id: id,
                    base_dir: base_dir.to_owned(),
                    key_groups,
                    operators: BTreeMap::new(),
                },
            );
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
            return Err(AssignError::UnmappedState {
                checkpoint_id: id,
                operator: op.clone(),
                vertex: old_op.vertex.into(),
            });
        };
        let keyed = pool_keyed(op, old_op, id)?;
        if !keyed.is_empty() && old_op.max_parallelism != new_vertex.max_parallelism {
            return Err(AssignError::MaxParallelismChanged {
                checkpoint_id: id,
                vertex: new_vertex.id.clone(),
                old: old_op.max_parallelism,
                new: new_vertex.max_parallelism,
            });
        }
        let lists = assign_list_states(old_op, new_vertex.parallelism, id)?;
        let channels = ChannelStateSources::gather(op, old_op, new_vertex, graph, id)?;
        for (j, list_states) in (0..new_vertex.parallelism).zip(lists) {
            let Some(task) = subtasks.get_mut(&CheckpointMetadata::subtask_key(&new_vertex.id, j)) else {
                continue;
            };
            let range = task.key_groups;
            let keyed = keyed.restricted_to(range);
            let channel_state = channels.for_subtask(j, range, new_vertex.max_parallelism);
            let restore = OperatorRestore { keyed, list_states, channel_state };
            if !restore.is_empty() {
                task.operators.insert(op.clone(), restore);
            }
        }
    }
    Ok(StateAssignment { checkpoint_id: id, base_dir: base_dir.to_owned(), subtasks })
}

fn range_of(v: &Vertex, subtask: u32) -> Result<KeyGroupRange, AssignError> {
    KeyGroupRange::for_subtask(v.max_parallelism, v.parallelism, subtask).ok_or_else(|| {
        AssignError::InvalidTarget(format!(
            "vertex {} has parallelism {} and max parallelism {}",
            v.id, v.parallelism, v.max_parallelism
        ))
    })
}

/// Maps each operator of the new graph to its vertex (refusing a graph that names one twice).
fn index_target(graph: &JobGraph) -> Result<BTreeMap<&str, &Vertex>, AssignError> {
    let mut vertices = BTreeSet::new();
    let mut ops = BTreeMap::new();
    for v in &graph.vertices {
        if !vertices.insert(v.id.as_str()) {
            return Err(AssignError::InvalidTarget(format!("vertex {} appears twice", v.id)));
        }
        for (op, _) in v.operators() {
            if ops.insert(op, v).is_some() {
                return Err(AssignError::InvalidTarget(format!("operator {op} appears twice")));
            }
        }
    }
    Ok(ops)
}

/// Groups the snapshot's subtask states by operator.
fn gather_old(meta: &CheckpointMetadata) -> Result<BTreeMap<String, OldOperator<'_>>, AssignError> {
    let id = meta.checkpoint_id;
    let corrupt = |detail: String| AssignError::CorruptState { checkpoint_id: id, detail };
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

/// All keyed state of an operator: every key group's segment, every file once (old subtasks may
/// reference one shared file, each for its own key groups), checked as one handle.
fn pool_keyed(op: &str, old: &OldOperator<'_>, id: u64) -> Result<KeyedStateHandle, AssignError> {
    let corrupt = |detail: String| AssignError::CorruptState { checkpoint_id: id, detail };
    let mut key_groups = BTreeMap::new();
    let mut files: BTreeMap<&str, &StateFile> = BTreeMap::new();
    for state in old.subtasks.values() {
        for (kg, segment) in &state.keyed.key_groups {
            if *kg >= old.max_parallelism {
                return Err(corrupt(format!(
                    "operator {op}: key group {kg} is not below max parallelism {}",
                    old.max_parallelism
                )));
            }
            if key_groups.insert(*kg, segment.clone()).is_some() {
                return Err(corrupt(format!(
                    "operator {op}: key group {kg} appears in two subtasks of vertex {}",
                    old.vertex
                )));
            }
        }
        for f in &state.keyed.files {
            match files.insert(&f.path, f) {
                Some(other) if other != f => {
                    return Err(corrupt(format!(
                        "operator {op}: keyed state file {:?} is listed with different sizes or checksums",
                        f.path
                    )));
                }
                _ => {}
            }
        }
    }
    let pool = KeyedStateHandle { key_groups, files: files.into_values().cloned().collect() };
    pool.validate().map_err(|e| corrupt(format!("operator {op}: {e}")))?;
    Ok(pool)
}

/// The channel-state files of one operator, and whether they are replayed per subtask or
/// filtered by key group.
struct ChannelStateSources<'a> {
    /// By old subtask index.
    files: BTreeMap<u32, &'a StateFile>,
    rescaled: bool,
}

impl<'a> ChannelStateSources<'a> {
    fn gather(
        op: &str,
        old: &OldOperator<'a>,
        new_vertex: &Vertex,
        graph: &JobGraph,
        id: u64,
    ) -> Result<Self, AssignError> {
        let files: BTreeMap<u32, &StateFile> = old
            .subtasks
            .iter()
            .filter_map(|(i, s)| s.channel_state.as_ref().map(|c| (*i, &c.file)))
            .collect();
        let rescaled = old.parallelism != new_vertex.parallelism;
        if files.is_empty() {
            return Ok(Self { files, rescaled });
        }
        let refuse = |reason: String| AssignError::ChannelStateNotRestorable {
            checkpoint_id: id,
            vertex: new_vertex.id.clone(),
            reason,
        };
        if new_vertex.operators().next().map(|(first, _)| first) != Some(op) {
            return Err(refuse(format!("operator {op} is no longer the first operator of its vertex")));
        }
        if rescaled {
            let mut inputs = graph.edges.iter().filter(|e| e.to == new_vertex.id);
            if let Some(e) = inputs.find(|e| e.partitioning != Partitioning::Hash) {
                return Err(refuse(format!(
                    "its parallelism changes from {} to {} and its input from {} is {:?}-partitioned, so its in-flight records cannot be redistributed (only hash-partitioned inputs can)",
                    old.parallelism, new_vertex.parallelism, e.from, e.partitioning
                )));
            }
        }
        Ok(Self { files, rescaled })
    }

    fn for_subtask(&self, subtask: u32, range: KeyGroupRange, max_parallelism: u32) -> Vec<ChannelStatePart> {
        if !self.rescaled {
            return self
                .files
                .get(&subtask)
                .map(|f| ChannelStatePart { file: (*f).clone(), only: None })
                .into_iter()
                .collect();
        }
        let only = Some(KeyGroupFilter { range, max_parallelism });
        self.files.values().map(|f| ChannelStatePart { file: (*f).clone(), only }).collect()
    }
}

/// Element byte ranges of one list-state file; offsets must rise and stay inside the file.
fn element_ranges(name: &str, offsets: &[u64], size: u64, id: u64) -> Result<Vec<ByteRange>, AssignError> {
    let mut ranges = Vec::with_capacity(offsets.len());
    for (i, start) in offsets.iter().enumerate() {
        let end = offsets.get(i + 1).copied().unwrap_or(size);
        if *start > end || end > size {
            return Err(AssignError::CorruptState {
                checkpoint_id: id,
                detail: format!("list state {name:?} has element offsets outside its {size}-byte file"),
            });
        }
        ranges.push(ByteRange { start: *start, end });
    }
    Ok(ranges)
}

/// One old subtask's part of a list state: its index, file and element ranges.
type ListSource<'a> = (u32, &'a StateFile, Vec<ByteRange>);

/// Assigns every list state of an operator to `new_parallelism` subtasks (one `Vec` each).
fn assign_list_states(
    old: &OldOperator<'_>,
    new_parallelism: u32,
    id: u64,
) -> Result<Vec<Vec<AssignedListState>>, AssignError> {
    // name → (mode, [(old subtask, file, elements)]) in old-subtask order
    let mut by_name: BTreeMap<&str, (OperatorStateMode, Vec<ListSource<'_>>)> = BTreeMap::new();
    for (index, state) in &old.subtasks {
        for l in &state.list_states {
            let entry = by_name.entry(l.name.as_str()).or_insert((l.mode, Vec::new()));
            if entry.0 != l.mode {
                return Err(AssignError::CorruptState {
                    checkpoint_id: id,
                    detail: format!("list state {:?} is both round-robin and union", l.name),
                });
            }
            entry.1.push((*index, &l.file, element_ranges(&l.name, &l.offsets, l.file.size, id)?));
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
mod proptests;
#[cfg(test)]
mod tests;
