//! State assignment on restore: which handles each new subtask of a vertex restores from.
//!
//! Keyed state moves by key group: new subtask `i` of `p` receives the files of the key groups in
//! `KeyGroupRange::for_subtask(max, p, i)`, whichever old subtask wrote them. List state moves by
//! element: round-robin lists are pooled (old subtask order, then element order) and dealt out
//! (`element g → subtask g mod p`); union lists go whole to every subtask. The max parallelism
//! must not change (it defines the key groups).

use std::collections::BTreeMap;
use std::path::Path;

use cairn_storage::checkpoint::{CheckpointMetadata, KeyGroupRange, OperatorStateMode, StateFile};

use super::StateError;
use crate::graph::Vertex;
use crate::protocol::{ListElementHandle, OperatorRestore, RestoredListState, TaskRestore};

/// The per-subtask restore descriptors of `vertex` (index = subtask) from a completed checkpoint
/// or savepoint whose relative paths resolve against `base_dir`.
pub fn assign_vertex(
    meta: &CheckpointMetadata,
    base_dir: &Path,
    vertex: &Vertex,
) -> Result<Vec<TaskRestore>, StateError> {
    let fail = |reason: String| StateError::Assignment { vertex: vertex.id.clone(), reason };
    let p = vertex.parallelism;
    let mut out = Vec::with_capacity(p as usize);
    for i in 0..p {
        let key_groups = KeyGroupRange::for_subtask(vertex.max_parallelism, p, i).ok_or_else(|| {
            fail(format!("parallelism {p} exceeds max parallelism {}", vertex.max_parallelism))
        })?;
        out.push(TaskRestore {
            checkpoint_id: meta.checkpoint_id,
            base_dir: base_dir.to_owned(),
            key_groups,
            operators: BTreeMap::new(),
        });
    }
    let old_parallelism = match meta.vertices.get(&vertex.id) {
        Some(info) => {
            if info.max_parallelism != vertex.max_parallelism {
                return Err(StateError::MaxParallelismChanged {
                    vertex: vertex.id.clone(),
                    old: info.max_parallelism,
                    new: vertex.max_parallelism,
                });
            }
            info.parallelism
        }
        // A vertex added since the checkpoint starts empty.
        None => return Ok(out),
    };
    let old_subtasks: Vec<_> = (0..old_parallelism)
        .filter_map(|i| meta.subtasks.get(&CheckpointMetadata::subtask_key(&vertex.id, i)))
        .collect();
    for (op_id, _) in vertex.operators() {
        let mut keyed: BTreeMap<u32, &StateFile> = BTreeMap::new();
        let mut lists: Vec<(String, OperatorStateMode, Vec<ListElementHandle>)> = Vec::new();
        for st in &old_subtasks {
            let Some(op) = st.operators.get(op_id) else { continue };
            for (kg, file) in &op.keyed {
                if *kg >= vertex.max_parallelism {
                    return Err(fail(format!("operator {op_id} has key group {kg} beyond max parallelism")));
                }
                if keyed.insert(*kg, file).is_some() {
                    return Err(fail(format!(
                        "key group {kg} of operator {op_id} is claimed by two subtasks"
                    )));
                }
            }
            for list in &op.list_states {
                let idx = match lists.iter().position(|(n, _, _)| *n == list.name) {
                    Some(idx) => idx,
                    None => {
                        lists.push((list.name.clone(), list.mode, Vec::new()));
                        lists.len() - 1
                    }
                };
                if lists[idx].1 != list.mode {
                    return Err(fail(format!(
                        "list state {} of operator {op_id} has mixed modes",
                        list.name
                    )));
                }
                for (j, start) in list.offsets.iter().enumerate() {
                    let end = list.offsets.get(j + 1).copied().unwrap_or(list.file.size);
                    if *start > end || end > list.file.size {
                        return Err(fail(format!(
                            "list state {} of operator {op_id} has bad offsets",
                            list.name
                        )));
                    }
                    lists[idx].2.push(ListElementHandle { file: list.file.clone(), start: *start, end });
                }
            }
        }
        for (i, restore) in out.iter_mut().enumerate() {
            let mut op = OperatorRestore {
                keyed: keyed
                    .iter()
                    .filter(|(kg, _)| restore.key_groups.contains(**kg))
                    .map(|(kg, f)| (*kg, (*f).clone()))
                    .collect(),
                lists: Vec::new(),
            };
            for (name, mode, elements) in &lists {
                let elements = match mode {
                    OperatorStateMode::Union => elements.clone(),
                    OperatorStateMode::RoundRobin => {
                        elements.iter().skip(i).step_by(p as usize).cloned().collect()
                    }
                };
                op.lists.push(RestoredListState { name: name.clone(), mode: *mode, elements });
            }
            if !op.keyed.is_empty() || !op.lists.is_empty() {
                restore.operators.insert(op_id.to_owned(), op);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::OperatorSpec;
    use cairn_storage::checkpoint::{OperatorListState, OperatorSubtaskState, SubtaskState, VertexInfo};

    fn file(path: &str, size: u64) -> StateFile {
        StateFile { path: path.into(), size, crc32: 0 }
    }

    fn meta() -> CheckpointMetadata {
        let mut subtasks = BTreeMap::new();
        for i in 0..2u32 {
            let range = KeyGroupRange::for_subtask(8, 2, i).unwrap();
            let mut op = OperatorSubtaskState::default();
            for kg in range.start..=range.end {
                op.keyed.insert(kg, file(&format!("chk-3/v-kg-{kg}.state"), 4));
            }
            op.list_states.push(OperatorListState {
                name: "offsets".into(),
                mode: OperatorStateMode::RoundRobin,
                file: file(&format!("chk-3/v-{i}-offsets.list"), 6),
                offsets: vec![0, 2, 4],
            });
            op.list_states.push(OperatorListState {
                name: "txns".into(),
                mode: OperatorStateMode::Union,
                file: file(&format!("chk-3/v-{i}-txns.list"), 1),
                offsets: vec![0],
            });
            subtasks.insert(
                CheckpointMetadata::subtask_key("v", i),
                SubtaskState { operators: BTreeMap::from([("v".to_owned(), op)]) },
            );
        }
        CheckpointMetadata {
            version: 1,
            job: "j".into(),
            checkpoint_id: 3,
            kind: "checkpoint".into(),
            trigger_time_ms: 0,
            completion_time_ms: 0,
            vertices: BTreeMap::from([("v".to_owned(), VertexInfo { parallelism: 2, max_parallelism: 8 })]),
            subtasks,
            master_states: BTreeMap::new(),
        }
    }

    fn vertex(p: u32, max: u32) -> Vertex {
        Vertex {
            id: "v".into(),
            name: "v".into(),
            parallelism: p,
            max_parallelism: max,
            operator: OperatorSpec { kind: "k".into(), config: serde_json::Value::Null },
            chain: vec![],
        }
    }

    #[test]
    fn rescaling_two_to_three_covers_every_key_group_and_element_once() {
        let restores = assign_vertex(&meta(), Path::new("/cp/j"), &vertex(3, 8)).unwrap();
        assert_eq!(restores.len(), 3);
        let mut kgs: Vec<u32> =
            restores.iter().flat_map(|r| r.operators["v"].keyed.keys().copied()).collect();
        kgs.sort_unstable();
        assert_eq!(kgs, (0..8).collect::<Vec<_>>());
        let rr: usize = restores.iter().map(|r| r.operators["v"].lists[0].elements.len()).sum();
        assert_eq!(rr, 6);
        for r in &restores {
            assert_eq!(r.operators["v"].lists[1].elements.len(), 2, "union goes to everyone");
            for kg in r.operators["v"].keyed.keys() {
                assert!(r.key_groups.contains(*kg));
            }
        }
    }

    #[test]
    fn changed_max_parallelism_is_refused() {
        assert!(matches!(
            assign_vertex(&meta(), Path::new("/cp/j"), &vertex(2, 16)),
            Err(StateError::MaxParallelismChanged { old: 8, new: 16, .. })
        ));
    }
}
