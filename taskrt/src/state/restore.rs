//! Loading a [`TaskRestore`] into memory: every file is read once, its size and CRC-32
//! verified against its handle, key-group files decoded, and list elements cut out of their
//! files by byte range. Blocking I/O: the task runs this on a blocking thread.

use std::collections::{BTreeMap, HashMap};

use cairn_protocol::checkpoint::{OperatorStateMode, StateFile};

use super::StateError;
use super::codec::{self, KeyGroupData};
use super::storage::{read_verified, resolve};
use cairn_protocol::assign::TaskRestore;

/// One restored operator's state, in memory.
#[derive(Debug, Default)]
pub struct LoadedOperator {
    pub groups: Vec<(u32, KeyGroupData, StateFile)>,
    pub lists: Vec<(String, OperatorStateMode, Vec<Vec<u8>>)>,
}

/// All restored operators of a task, by operator id.
#[derive(Debug, Default)]
pub struct LoadedRestore {
    pub checkpoint_id: u64,
    pub operators: BTreeMap<String, LoadedOperator>,
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
    let mut out = LoadedRestore { checkpoint_id: restore.checkpoint_id, operators: BTreeMap::new() };
    for (op_id, op) in &restore.operators {
        let mut loaded = LoadedOperator::default();
        for (kg, file) in &op.keyed {
            let bytes = read_verified(base, file)?;
            let (declared, data) = codec::decode(&bytes)
                .map_err(|e| StateError::Corrupt { path: base.join(&file.path), reason: e.0 })?;
            if declared != *kg {
                return Err(StateError::Corrupt {
                    path: base.join(&file.path),
                    reason: format!("file holds key group {declared}, handle says {kg}"),
                });
            }
            loaded.groups.push((*kg, data, file.clone()));
        }
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
