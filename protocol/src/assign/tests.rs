use std::collections::BTreeMap;

use crate::checkpoint::{KeyGroupSegment, OperatorListState, SubtaskState, VertexInfo};
use crate::graph::{ChainedOperator, OperatorSpec};

use super::*;

fn file(path: &str, size: u64) -> StateFile {
    StateFile { path: path.into(), size, crc32: 0 }
}

fn meta(
    id: u64,
    vertex: &str,
    parallelism: u32,
    max: u32,
    subtasks: Vec<SubtaskState>,
) -> CheckpointMetadata {
    CheckpointMetadata {
        version: 1,
        job: "j".into(),
        checkpoint_id: id,
        kind: "checkpoint".into(),
        trigger_time_ms: 1,
        completion_time_ms: 2,
        vertices: BTreeMap::from([(vertex.to_string(), VertexInfo { parallelism, max_parallelism: max })]),
        subtasks: subtasks
            .into_iter()
            .enumerate()
            .map(|(i, s)| (CheckpointMetadata::subtask_key(vertex, i as u32), s))
            .collect(),
        master_states: BTreeMap::from([("offsets".to_string(), vec![9])]),
    }
}

/// A one-vertex graph: vertex `vertex` (its head operator has the vertex's id) with `ops`
/// chained behind the head.
fn target(vertex: &str, parallelism: u32, max: u32, ops: &[&str]) -> JobGraph {
    let spec = || OperatorSpec { kind: "k".into(), config: serde_json::Value::Null };
    JobGraph {
        vertices: vec![Vertex {
            id: vertex.into(),
            name: vertex.into(),
            parallelism,
            max_parallelism: max,
            operator: spec(),
            chain: ops
                .iter()
                .filter(|o| **o != vertex)
                .map(|o| ChainedOperator { id: (*o).into(), operator: spec() })
                .collect(),
        }],
        edges: vec![],
    }
}

fn base() -> &'static Path {
    Path::new("/cp/j")
}

/// One operator `op` with the given key groups, 10 bytes each, in one file named after the first.
fn keyed(op: &str, groups: impl IntoIterator<Item = u32>) -> SubtaskState {
    let mut s = OperatorSubtaskState::default();
    let groups: Vec<u32> = groups.into_iter().collect();
    let path = format!("chk-1/{op}-{}.state", groups.first().copied().unwrap_or(0));
    for (i, kg) in groups.iter().enumerate() {
        let segment = KeyGroupSegment { file: path.clone(), offset: i as u64 * 10, length: 10, crc32: *kg };
        s.keyed.key_groups.insert(*kg, segment);
    }
    if !groups.is_empty() {
        s.keyed.files.push(file(&path, groups.len() as u64 * 10));
    }
    SubtaskState { operators: BTreeMap::from([(op.to_string(), s)]) }
}

fn list(
    op: &str,
    name: &str,
    mode: OperatorStateMode,
    path: &str,
    offsets: Vec<u64>,
    size: u64,
) -> SubtaskState {
    let l = OperatorListState { name: name.into(), mode, file: file(path, size), offsets };
    let s = OperatorSubtaskState {
        keyed: KeyedStateHandle::default(),
        list_states: vec![l],
        channel_state: None,
    };
    SubtaskState { operators: BTreeMap::from([(op.to_string(), s)]) }
}

#[test]
fn keyed_state_reassigned_by_key_group_on_rescale() {
    // max parallelism 8, parallelism 2 → 3: old ranges [0,3] [4,7]; new [0,2] [3,5] [6,7].
    let m = meta(1, "v", 2, 8, vec![keyed("op", 0..4), keyed("op", 4..8)]);
    let a = assign_states(&m, base(), &target("v", 3, 8, &["op"]), false).unwrap();
    let groups =
        |key: &str| a.subtasks[key].operators["op"].keyed.key_groups.keys().copied().collect::<Vec<_>>();
    assert_eq!(groups("v/0"), vec![0, 1, 2]);
    assert_eq!(groups("v/1"), vec![3, 4, 5]);
    assert_eq!(groups("v/2"), vec![6, 7]);
    assert_eq!(a.subtasks["v/1"].key_groups, KeyGroupRange { start: 3, end: 5 });
    let middle = &a.subtasks["v/1"].operators["op"].keyed;
    assert_eq!(
        middle.key_groups[&4],
        KeyGroupSegment { file: "chk-1/op-4.state".into(), offset: 0, length: 10, crc32: 4 }
    );
    assert_eq!(middle.key_groups[&3].file, "chk-1/op-0.state");
    let paths: Vec<&str> = middle.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(paths, ["chk-1/op-0.state", "chk-1/op-4.state"], "both files, each once");
    let last = &a.subtasks["v/2"].operators["op"].keyed;
    assert_eq!(last.files, vec![file("chk-1/op-4.state", 40)], "only the file of its key groups");
    assert_eq!(a.base_dir, PathBuf::from("/cp/j"));
    assert_eq!(a.task("v", 2).map(|t| t.base_dir.clone()), Some(PathBuf::from("/cp/j")));
}

#[test]
fn max_parallelism_change_is_a_typed_error() {
    let m = meta(1, "v", 2, 8, vec![keyed("op", 0..4), keyed("op", 4..8)]);
    let err = assign_states(&m, base(), &target("v", 2, 16, &["op"]), false).unwrap_err();
    assert_eq!(
        err,
        AssignError::MaxParallelismChanged { checkpoint_id: 1, vertex: "v".into(), old: 8, new: 16 }
    );
}

#[test]
fn round_robin_list_state_is_pooled_and_dealt() {
    // Old subtask 0 has elements e0, e1 (file a, 20 bytes); subtask 1 has e2 (file b, 5 bytes).
    let rr = OperatorStateMode::RoundRobin;
    let old = || {
        meta(
            1,
            "src",
            2,
            8,
            vec![
                list("op", "offsets", rr, "chk-1/a", vec![0, 10], 20),
                list("op", "offsets", rr, "chk-1/b", vec![0], 5),
            ],
        )
    };
    let a = assign_states(&old(), base(), &target("src", 3, 8, &["op"]), false).unwrap();
    let parts = |key: &str| {
        let l = &a.subtasks[key].operators["op"].list_states[0];
        assert_eq!((l.name.as_str(), l.mode), ("offsets", rr));
        l.parts.iter().map(|p| (p.file.path.clone(), p.elements.clone())).collect::<Vec<_>>()
    };
    assert_eq!(parts("src/0"), vec![("chk-1/a".into(), vec![ByteRange { start: 0, end: 10 }])]);
    assert_eq!(parts("src/1"), vec![("chk-1/a".into(), vec![ByteRange { start: 10, end: 20 }])]);
    assert_eq!(parts("src/2"), vec![("chk-1/b".into(), vec![ByteRange { start: 0, end: 5 }])]);
    // Scaling in to 1: everything to the one subtask.
    let a = assign_states(&old(), base(), &target("src", 1, 8, &["op"]), false).unwrap();
    assert_eq!(a.subtasks["src/0"].operators["op"].list_states[0].element_count(), 3);
}

#[test]
fn round_robin_list_state_with_unchanged_parallelism_stays_put() {
    let rr = OperatorStateMode::RoundRobin;
    let m = meta(
        1,
        "src",
        2,
        8,
        vec![list("op", "s", rr, "chk-1/a", vec![0, 10], 20), list("op", "s", rr, "chk-1/b", vec![0], 5)],
    );
    let a = assign_states(&m, base(), &target("src", 2, 8, &["op"]), false).unwrap();
    assert_eq!(a.subtasks["src/0"].operators["op"].list_states[0].parts[0].elements.len(), 2);
    assert_eq!(a.subtasks["src/1"].operators["op"].list_states[0].parts[0].file.path, "chk-1/b");
}

#[test]
fn union_list_state_goes_to_every_subtask() {
    let u = OperatorStateMode::Union;
    let m = meta(
        1,
        "src",
        2,
        8,
        vec![list("op", "all", u, "chk-1/a", vec![0, 10], 20), list("op", "all", u, "chk-1/b", vec![0], 5)],
    );
    let a = assign_states(&m, base(), &target("src", 3, 8, &["op"]), false).unwrap();
    for i in 0..3 {
        let l = &a.subtasks[&format!("src/{i}")].operators["op"].list_states[0];
        let files: Vec<_> = l.parts.iter().map(|p| p.file.path.as_str()).collect();
        assert_eq!(files, vec!["chk-1/a", "chk-1/b"], "subtask {i}");
        assert_eq!(l.parts[0].elements.len(), 2);
    }
}

#[test]
fn unmapped_operator_state_is_named_in_error() {
    let m = meta(1, "v", 1, 8, vec![keyed("gone-op", 0..8)]);
    let err = assign_states(&m, base(), &target("v", 1, 8, &["op"]), false).unwrap_err();
    assert_eq!(
        err,
        AssignError::UnmappedState { checkpoint_id: 1, operator: "gone-op".into(), vertex: "v".into() }
    );
    assert!(err.to_string().contains("gone-op"));
}

#[test]
fn a_renamed_vertex_is_refused_not_restored_empty() {
    // The head operator's state is recorded under the vertex id: renaming the vertex leaves it
    // unmapped, which must be refused (the task would otherwise start with empty state).
    let m = meta(1, "count", 1, 8, vec![keyed("count", 0..8)]);
    let err = assign_states(&m, base(), &target("counter", 1, 8, &[]), false).unwrap_err();
    assert!(matches!(&err, AssignError::UnmappedState { operator, .. } if operator == "count"), "{err}");
}

#[test]
fn state_follows_an_operator_into_another_vertex() {
    let m = meta(1, "old", 2, 8, vec![keyed("op", 0..4), keyed("op", 4..8)]);
    let a = assign_states(&m, base(), &target("new", 1, 8, &["op"]), false).unwrap();
    assert_eq!(a.subtasks["new/0"].operators["op"].keyed.key_groups.len(), 8);
}

#[test]
fn allow_non_restored_state_skips_unmapped_state() {
    let m = meta(1, "v", 1, 8, vec![keyed("gone-op", 0..8)]);
    let a = assign_states(&m, base(), &target("v", 2, 8, &["op"]), true).unwrap();
    assert_eq!(a.subtasks.len(), 2);
    assert!(a.subtasks.values().all(|t| t.operators.is_empty()));
}

#[test]
fn corrupt_key_groups_are_reported() {
    let m = meta(1, "v", 2, 8, vec![keyed("op", 0..5), keyed("op", 4..8)]);
    let err = assign_states(&m, base(), &target("v", 2, 8, &["op"]), false).unwrap_err();
    assert!(matches!(err, AssignError::CorruptState { .. }), "{err}");
}

#[test]
fn list_offsets_outside_the_file_are_corrupt() {
    let rr = OperatorStateMode::RoundRobin;
    let m = meta(1, "src", 1, 8, vec![list("op", "s", rr, "chk-1/a", vec![0, 30], 20)]);
    let err = assign_states(&m, base(), &target("src", 1, 8, &["op"]), false).unwrap_err();
    assert!(matches!(err, AssignError::CorruptState { .. }), "{err}");
}

#[test]
fn keyed_state_of_four_subtasks_merges_into_two() {
    let m =
        meta(1, "v", 4, 8, vec![keyed("op", 0..2), keyed("op", 2..4), keyed("op", 4..6), keyed("op", 6..8)]);
    let a = assign_states(&m, base(), &target("v", 2, 8, &["op"]), false).unwrap();
    for (key, firsts) in [("v/0", [0, 2]), ("v/1", [4, 6])] {
        let keyed = &a.subtasks[key].operators["op"].keyed;
        assert_eq!(keyed.key_groups.len(), 4);
        let paths: Vec<String> = keyed.files.iter().map(|f| f.path.clone()).collect();
        assert_eq!(paths, firsts.map(|f| format!("chk-1/op-{f}.state")));
        assert_eq!(keyed.validate(), Ok(()));
    }
}

/// After a rescale, incremental checkpoints of two subtasks may reference one shared file, each
/// for its own key groups.
#[test]
fn a_shared_file_referenced_by_two_subtasks_is_pooled_once() {
    let shared = file("shared/op-0-ab.state", 20);
    let half = |kg: u32| {
        let mut s = OperatorSubtaskState::default();
        let segment =
            KeyGroupSegment { file: shared.path.clone(), offset: u64::from(kg) * 10, length: 10, crc32: 0 };
        s.keyed.key_groups.insert(kg, segment);
        s.keyed.files.push(shared.clone());
        SubtaskState { operators: BTreeMap::from([("op".to_string(), s)]) }
    };
    let m = meta(1, "v", 2, 2, vec![half(0), half(1)]);
    let a = assign_states(&m, base(), &target("v", 1, 2, &["op"]), false).unwrap();
    let keyed = &a.subtasks["v/0"].operators["op"].keyed;
    assert_eq!(keyed.files, vec![shared.clone()]);
    assert_eq!(keyed.key_groups.len(), 2);

    let mut conflicting = half(1);
    conflicting.operators.get_mut("op").unwrap().keyed.files[0].crc32 = 9;
    let m = meta(1, "v", 2, 2, vec![half(0), conflicting]);
    let err = assign_states(&m, base(), &target("v", 1, 2, &["op"]), false).unwrap_err();
    assert!(err.to_string().contains("different sizes or checksums"), "{err}");

    let mut overlapping = half(1);
    overlapping.operators.get_mut("op").unwrap().keyed.key_groups.get_mut(&1).unwrap().offset = 5;
    let m = meta(1, "v", 2, 2, vec![half(0), overlapping]);
    let err = assign_states(&m, base(), &target("v", 1, 2, &["op"]), false).unwrap_err();
    assert!(err.to_string().contains("key groups 0 and 1 overlap"), "{err}");
}

/// Subtask state holding only channel state of `op`.
fn in_flight(op: &str, path: &str) -> SubtaskState {
    let s = OperatorSubtaskState {
        channel_state: Some(crate::checkpoint::ChannelStateHandle { file: file(path, 28), records: 1 }),
        ..Default::default()
    };
    SubtaskState { operators: BTreeMap::from([(op.to_string(), s)]) }
}

/// `target` with an input edge of `partitioning` from vertex `up`.
fn with_input(mut g: JobGraph, partitioning: Partitioning) -> JobGraph {
    let mut up = g.vertices[0].clone();
    up.id = "up".into();
    up.name = "up".into();
    up.chain.clear();
    up.operator.kind = "src".into();
    g.vertices.insert(0, up);
    let to = g.vertices[1].id.clone();
    g.edges.push(crate::graph::Edge { from: "up".into(), to, partitioning });
    g
}

#[test]
fn channel_state_goes_back_to_its_subtask_or_is_filtered_by_key_group_when_rescaled() {
    let m =
        meta(3, "v", 2, 8, vec![in_flight("v", "chk-3/v-0.channels"), in_flight("v", "chk-3/v-1.channels")]);
    // Same parallelism: each subtask replays its own file, whole.
    let a = assign_states(&m, base(), &with_input(target("v", 2, 8, &["v"]), Partitioning::Rebalance), false)
        .unwrap();
    let parts = |a: &StateAssignment, key: &str| a.subtasks[key].operators["v"].channel_state.clone();
    assert_eq!(parts(&a, "v/1"), vec![ChannelStatePart { file: file("chk-3/v-1.channels", 28), only: None }]);

    // Rescaled behind a hash edge: every new subtask reads all files, keeping its key groups.
    let a =
        assign_states(&m, base(), &with_input(target("v", 3, 8, &["v"]), Partitioning::Hash), false).unwrap();
    let p = parts(&a, "v/2");
    assert_eq!(p.len(), 2);
    assert!(
        p.iter().all(|p| p.only
            == Some(KeyGroupFilter { range: KeyGroupRange { start: 6, end: 7 }, max_parallelism: 8 }))
    );
}

#[test]
fn channel_state_that_cannot_be_redistributed_is_refused_with_the_way_out() {
    let m =
        meta(3, "v", 2, 8, vec![in_flight("v", "chk-3/v-0.channels"), in_flight("v", "chk-3/v-1.channels")]);
    let err =
        assign_states(&m, base(), &with_input(target("v", 3, 8, &["v"]), Partitioning::Rebalance), false)
            .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, AssignError::ChannelStateNotRestorable { checkpoint_id: 3, .. }), "{err:?}");
    assert!(text.contains("from 2 to 3") && text.contains("savepoint"), "{text}");

    // The operator is no longer first in its vertex: its in-flight records have nowhere to go.
    let m = meta(3, "v", 1, 8, vec![in_flight("op", "chk-3/op-0.channels")]);
    let err = assign_states(&m, base(), &target("v", 1, 8, &["op"]), false).unwrap_err();
    assert!(err.to_string().contains("no longer the first operator"), "{err}");
}
