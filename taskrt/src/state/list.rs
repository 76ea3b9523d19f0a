//! Operator list state: named lists of opaque elements per operator per subtask (e.g. a
//! source's offsets, a sink's pending transactions). On restore with a different parallelism
//! the elements are redistributed individually: round-robin, or the union to every subtask.

use std::collections::BTreeMap;

use cairn_protocol::checkpoint::OperatorStateMode;

use super::StateError;
use cairn_protocol::graph::is_valid_id;

/// One named list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListState {
    pub mode: OperatorStateMode,
    pub elements: Vec<Vec<u8>>,
}

/// The list states of one operator in one subtask. Owned by the task's operator chain; operators
/// reach it through their context.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OperatorStateBackend {
    lists: BTreeMap<String, ListState>,
}

impl OperatorStateBackend {
    /// The elements of list `name` (empty when it does not exist).
    pub fn get(&self, name: &str) -> &[Vec<u8>] {
        self.lists.get(name).map(|l| l.elements.as_slice()).unwrap_or(&[])
    }

    /// Replaces list `name`.
    pub fn set(
        &mut self,
        name: &str,
        mode: OperatorStateMode,
        elements: Vec<Vec<u8>>,
    ) -> Result<(), StateError> {
        if !is_valid_id(name) {
            return Err(StateError::InvalidStateName { name: name.to_owned() });
        }
        self.lists.insert(name.to_owned(), ListState { mode, elements });
        Ok(())
    }

    pub fn lists(&self) -> &BTreeMap<String, ListState> {
        &self.lists
    }

    pub fn is_empty(&self) -> bool {
        self.lists.values().all(|l| l.elements.is_empty())
    }

    /// Encodes one list as a file body plus the byte offset of each element.
    pub fn encode(list: &ListState) -> (Vec<u8>, Vec<u64>) {
        let mut bytes = Vec::with_capacity(list.elements.iter().map(Vec::len).sum());
        let mut offsets = Vec::with_capacity(list.elements.len());
        for e in &list.elements {
            offsets.push(bytes.len() as u64);
            bytes.extend_from_slice(e);
        }
        (bytes, offsets)
    }
}
