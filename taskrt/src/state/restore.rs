//! Loading a [`TaskRestore`] into memory. Keyed state: each handle is checked (see
//! `KeyedStateHandle::validate`), then each file's size is verified and only the segments of
//! the subtask's key groups are read, each verified against its CRC-32 and decoded. List state:
//! every file is read once, its size and CRC-32 verified, and elements cut out of it by byte
//! range. Blocking I/O: the task runs this on a blocking thread.

use std::collections::{BTreeMap, HashMap};

use cairn_protocol::checkpoint::{KeyGroupSegment, KeyedStateHandle, OperatorStateMode, StateFile};

use super::StateError;
use super::codec::{self, KeyGroupData};
use super::storage::{read_segments, read_verified, resolve};
use crate::checkpoint::channel_state;
use crate::exchange::Record;
use cairn_protocol::assign::TaskRestore;

/// One restored key group.
#[derive(Debug)]
pub struct LoadedGroup {
    pub key_group: u32,
    pub data: KeyGroupData,
    /// Where it was read from (an incremental checkpoint may reference it again).
    pub segment: KeyGroupSegment,
    pub file: StateFile,
}

/// One restored operator's state, in memory.
#[derive(Debug, Default)]
pub struct LoadedOperator {
    pub groups: Vec<LoadedGroup>,
    pub lists: Vec<(String, OperatorStateMode, Vec<Vec<u8>>)>,
}

/// All restored operators of a task, by operator id.
#[derive(Debug, Default)]
pub struct LoadedRestore {
    pub checkpoint_id: u64,
    pub operators: BTreeMap<String, LoadedOperator>,
    /// In-flight records of an unaligned checkpoint, replayed before new input.
    pub in_flight: Vec<Record>,
}

pub fn load(restore: &TaskRestore) -> Result<LoadedRestore, StateError> {
    let base = &restore.base_dir;
    let mut cache: HashMap<String, Vec<u8>> = HashMap::new();
    let mut read = |file: &StateFile| -> Result<Vec<u8>, StateError> {
        if let Some(b) = cache.get(&file.path) {
            return Ok(b.clone());
        }
        let bytes = read_verified(base, file)?;
        cache.insert(file.path.clone(), bytes.clone());
        Ok(bytes)
    };
    let mut out = LoadedRestore {
        checkpoint_id: restore.checkpoint_id,
        operators: BTreeMap::new(),
        in_flight: Vec::new(),
    };
    for (op_id, op) in &restore.operators {
        out.in_flight.extend(channel_state::read(base, &op.channel_state)?);
        let mut loaded = LoadedOperator { groups: load_keyed(restore, op_id, &op.keyed)?, lists: Vec::new() };
        for list in &op.list_states {
            let mut elements = Vec::with_capacity(list.element_count());
            for part in &list.parts {
                let bytes = read(&part.file)?;
                let len = bytes.len() as u64;
                for e in &part.elements {
                    if e.start > e.end || e.end > len {
                        return Err(StateError::ElementOutOfBounds {
                            path: resolve(base, &part.file.path)?,
                            start: e.start,
                            end: e.end,
                            len,
                        });
                    }
                    elements.push(bytes[e.start as usize..e.end as usize].to_vec());
                }
            }
            loaded.lists.push((list.name.clone(), list.mode, elements));
        }
        out.operators.insert(op_id.clone(), loaded);
    }
    Ok(out)
}

/// The key groups of one operator, read segment by segment, file by file.
fn load_keyed(
    restore: &TaskRestore,
    operator: &str,
    keyed: &KeyedStateHandle,
) -> Result<Vec<LoadedGroup>, StateError> {
    keyed.validate().map_err(|source| StateError::InvalidHandle { operator: operator.to_owned(), source })?;
    let base = &restore.base_dir;
    let mut groups = Vec::with_capacity(keyed.key_groups.len());
    let mut by_file: BTreeMap<&str, Vec<(u32, &KeyGroupSegment)>> = BTreeMap::new();
    for (kg, s) in &keyed.key_groups {
        by_file.entry(s.file.as_str()).or_default().push((*kg, s));
    }
    for file in &keyed.files {
        let segments = by_file.remove(file.path.as_str()).unwrap_or_default();
        read_segments(base, file, segments, |kg, bytes| {
            let corrupt = |reason: String| StateError::Corrupt {
                path: base.join(&file.path),
                reason: format!("key group {kg}: {reason}"),
            };
            let (declared, data) = codec::decode(bytes).map_err(|e| corrupt(e.0))?;
            if declared != kg {
                return Err(corrupt(format!("the segment holds key group {declared}")));
            }
            let segment = keyed.key_groups.get(&kg).cloned().ok_or_else(|| corrupt("no segment".into()))?;
            groups.push(LoadedGroup { key_group: kg, data, segment, file: file.clone() });
            Ok(())
        })?;
    }
    groups.sort_unstable_by_key(|g| g.key_group);
    tracing::debug!(
        checkpoint_id = restore.checkpoint_id,
        operator,
        key_groups = groups.len(),
        files = keyed.files.len(),
        "keyed state restored"
    );
    Ok(groups)
}
