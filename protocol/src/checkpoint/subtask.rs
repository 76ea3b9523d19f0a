//! The state one subtask acknowledges for one checkpoint: per operator its keyed-state handle
//! and its list states.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::handles::{OperatorListState, StateFile};
use super::keyed::{HandleError, KeyedStateHandle};
use super::layout::is_safe_relative;

/// The state of one operator inside one subtask.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct OperatorSubtaskState {
    /// Keyed state: a segment per non-empty key group, and the files they lie in.
    pub keyed: KeyedStateHandle,
    pub list_states: Vec<OperatorListState>,
    /// In-flight records of an unaligned checkpoint: what the subtask's input channels held
    /// for this operator (the head of its chain) when the barriers overtook them. Restored
    /// before any new input is read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel_state: Option<ChannelStateHandle>,
}

/// The records an unaligned checkpoint persisted from a subtask's input channels.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChannelStateHandle {
    pub file: StateFile,
    /// Number of records in the file.
    pub records: u64,
}

impl OperatorSubtaskState {
    pub fn is_empty(&self) -> bool {
        self.keyed.is_empty() && self.list_states.is_empty() && self.channel_state.is_none()
    }

    /// Every file the state references, each keyed-state file once.
    pub fn files(&self) -> impl Iterator<Item = &StateFile> {
        self.keyed
            .files
            .iter()
            .chain(self.list_states.iter().map(|l| &l.file))
            .chain(self.channel_state.iter().map(|c| &c.file))
    }

    /// Bytes of state: the key groups' segments, the list-state and channel-state files
    /// (saturating).
    pub fn state_size(&self) -> u64 {
        let lists = self.list_states.iter().fold(0u64, |total, l| total.saturating_add(l.file.size));
        let channels = self.channel_state.as_ref().map_or(0, |c| c.file.size);
        self.keyed.segment_bytes().saturating_add(lists).saturating_add(channels)
    }

    /// Checks what can be checked without the files: the keyed handle (see
    /// [`KeyedStateHandle::validate`]), safe list-state paths, list offsets ascending and within
    /// their file.
    pub fn validate(&self) -> Result<(), HandleError> {
        self.keyed.validate()?;
        for l in &self.list_states {
            if !is_safe_relative(&l.file.path) {
                return Err(HandleError::UnsafePath { path: l.file.path.clone() });
            }
            let ascending = l.offsets.windows(2).all(|w| w[0] <= w[1]);
            if !ascending || l.offsets.last().is_some_and(|last| *last > l.file.size) {
                return Err(HandleError::ListOffsets { name: l.name.clone(), size: l.file.size });
            }
        }
        if let Some(c) = &self.channel_state
            && (!is_safe_relative(&c.file.path) || c.file.is_shared())
        {
            return Err(HandleError::UnsafePath { path: c.file.path.clone() });
        }
        Ok(())
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

    /// Bytes of state referenced: key-group segments (in shared files too) and list-state
    /// files. Saturates: the sizes come from a task's report, and a report that cannot be true
    /// must not overflow the leader's sum.
    pub fn state_size(&self) -> u64 {
        self.operators.values().fold(0, |total, o| total.saturating_add(o.state_size()))
    }
}
