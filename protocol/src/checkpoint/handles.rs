//! State handles: the serializable pieces describing the state a subtask wrote for one checkpoint
//! (files, key-group ranges, list state, figures); they are put together per operator and
//! subtask in `subtask`, keyed state indexed in `keyed`.

use serde::{Deserialize, Serialize};

use super::layout::is_shared_path;

/// One file of state, addressed relative to the job's checkpoint directory (or, inside a
/// savepoint, relative to the savepoint directory).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct StateFile {
    /// Relative path, e.g. `chk-7/map-0.state` or `shared/map-0-<random>.state`.
    pub path: String,
    pub size: u64,
    /// CRC-32 (IEEE) of the file's bytes; verified on restore.
    pub crc32: u32,
}

impl StateFile {
    /// Files under `shared/` may be referenced by several checkpoints (incremental mode) and are
    /// reference-counted; every other file belongs to exactly one checkpoint.
    pub fn is_shared(&self) -> bool {
        is_shared_path(&self.path)
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
    /// Bytes of in-flight records persisted (unaligned checkpoints; Flink's persisted data).
    #[serde(default)]
    pub channel_state_bytes: u64,
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
