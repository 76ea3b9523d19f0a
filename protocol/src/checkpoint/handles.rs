//! State handles: the serializable description of the state a subtask wrote for one checkpoint.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One file of state, addressed relative to the job's checkpoint directory (or, inside a
/// savepoint, relative to the savepoint directory).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct StateFile {
    /// Relative path, e.g. `chk-7/map-0-kg-12.state` or `shared/map-kg-12-<uuid>.state`.
    pub path: String,
    pub size: u64,
    /// CRC-32 (IEEE) of the file's bytes; verified on restore.
    pub crc32: u32,
}

impl StateFile {
    /// Files under `shared/` may be referenced by several checkpoints (incremental mode) and are
    /// reference-counted; every other file belongs to exactly one checkpoint.
    pub fn is_shared(&self) -> bool {
        self.path.starts_with("shared/")
    }
}

/// An inclusive range of key groups `[start, end]`. Keyed state is split into `max_parallelism`
/// key groups; subtask `i` of `p` owns a contiguous range, so state can be reassigned when the
/// parallelism changes while the max parallelism stays fixed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct KeyGroupRange {
    pub start: u32,
    pub end: u32,
}

impl KeyGroupRange {
    /// The key groups owned by `subtask` out of `parallelism`, for `max_parallelism` key groups
    /// (Flink's formula: `[ceil(i*max/p), ceil((i+1)*max/p) - 1]`). `None` when the arguments are
    /// out of range (zero parallelism, subtask index too large, parallelism above max).
    pub fn for_subtask(max_parallelism: u32, parallelism: u32, subtask: u32) -> Option<Self> {
        if parallelism == 0 || subtask >= parallelism || parallelism > max_parallelism {
            return None;
        }
        let (max, p, i) = (max_parallelism as u64, parallelism as u64, subtask as u64);
        let start = (i * max).div_ceil(p);
        let end = ((i + 1) * max).div_ceil(p) - 1;
        Some(Self { start: start as u32, end: end as u32 })
    }

    pub fn contains(&self, key_group: u32) -> bool {
        self.start <= key_group && key_group <= self.end
    }

    pub fn len(&self) -> u32 {
        self.end - self.start + 1
    }

    pub fn is_empty(&self) -> bool {
        false
    }
}

/// How a non-keyed (operator list) state is redistributed on restore.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OperatorStateMode {
    /// Elements of all subtasks are pooled and dealt out round-robin.
    RoundRobin,
    /// Every subtask receives all elements of all subtasks.
    Union,
}

/// One operator list state of one subtask: a file of elements with the byte offset of each, so
/// that elements can be redistributed individually.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperatorListState {
    pub name: String,
    pub mode: OperatorStateMode,
    pub file: StateFile,
    /// Byte offset of each element in `file`; element `i` spans `offsets[i]..offsets[i+1]` (or to
    /// the end of the file for the last one).
    pub offsets: Vec<u64>,
}

/// The state of one operator inside one subtask.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct OperatorSubtaskState {
    /// Keyed state, one file per non-empty key group.
    pub keyed: BTreeMap<u32, StateFile>,
    pub list_states: Vec<OperatorListState>,
}

impl OperatorSubtaskState {
    pub fn is_empty(&self) -> bool {
        self.keyed.is_empty() && self.list_states.is_empty()
    }

    pub fn files(&self) -> impl Iterator<Item = &StateFile> {
        self.keyed.values().chain(self.list_states.iter().map(|l| &l.file))
    }
}

/// What one subtask acknowledges for one checkpoint: the state of each of its operators, by
/// operator id (stable across restarts; see the job graph).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SubtaskState {
    pub operators: BTreeMap<String, OperatorSubtaskState>,
}

impl SubtaskState {
    pub fn files(&self) -> impl Iterator<Item = &StateFile> {
        self.operators.values().flat_map(|o| o.files())
    }

    /// Bytes of state referenced (shared files included). Saturates: the sizes come from a
    /// task's report, and a report that cannot be true must not overflow the leader's sum.
    pub fn state_size(&self) -> u64 {
        self.files().fold(0, |total, f| total.saturating_add(f.size))
    }
}

/// Figures a subtask reports with its acknowledgement (Flink's per-subtask checkpoint stats).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TaskCheckpointMetrics {
    /// Time from the trigger's timestamp to the task starting the checkpoint.
    pub start_delay_ms: u64,
    pub alignment_ms: u64,
    pub sync_ms: u64,
    pub async_ms: u64,
    /// Bytes written for this checkpoint (new files only, in incremental mode).
    pub bytes_persisted: u64,
    /// Bytes of state referenced by this checkpoint.
    pub state_size: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_group_ranges_partition_all_groups() {
        for max in [1u32, 7, 128] {
            for p in 1..=max.min(9) {
                let ranges: Vec<_> = (0..p).map(|i| KeyGroupRange::for_subtask(max, p, i).unwrap()).collect();
                assert_eq!(ranges[0].start, 0);
                assert_eq!(ranges[p as usize - 1].end, max - 1);
                for w in ranges.windows(2) {
                    assert_eq!(w[0].end + 1, w[1].start, "max={max} p={p}");
                }
            }
        }
        assert_eq!(KeyGroupRange::for_subtask(4, 5, 0), None);
        assert_eq!(KeyGroupRange::for_subtask(4, 2, 2), None);
    }
}
