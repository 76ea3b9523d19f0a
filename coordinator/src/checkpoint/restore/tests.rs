use std::collections::BTreeMap;

use cairn_raft::model::{JobId, JobSpec, SavepointRecord};
use cairn_storage::checkpoint::{OperatorListState, SubtaskState, VertexInfo};

use super::*;

fn file(path: &str, size: u64) -> StateFile {
    StateFile { path: path.into(), size, crc32: 0 }
}

fn completed(id: u64, kind: CheckpointKind, metadata_path: &str) -> CompletedCheckpoint {
    CompletedCheckpoint {
        id,
        kind,
        trigger_time_ms: 1,
        completion_time_ms: 2,
        metadata_path: metadata_path.into(),
        metadata_size: 10,
        metadata_crc32: 3,
        state_size: 0,
    }
}

fn job_with(checkpoints: &[u64], savepoints: &[u64]) -> JobRecord {
    let mut job = JobRecord::new(JobId::new("j").unwrap(), "j".into(), JobSpec::default());
    for id in checkpoints {
        job.completed.push(completed(*id, CheckpointKind::Checkpoint, &format!("/cp/j/chk-{id}/_metadata")));
    }
    for id in savepoints {
        let dir = format!("/sp/savepoint-j-{id}");
        let checkpoint = completed(*id, CheckpointKind::Savepoint, &format!("{dir}/_metadata"));
        job.savepoints.push(SavepointRecord { checkpoint, path: dir });
    }
    job
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

fn point(meta: CheckpointMetadata) -> RestorePoint {
    RestorePoint {
        checkpoint_id: meta.checkpoint_id,
        kind: CheckpointKind::Checkpoint,
        base_dir: "/cp/j".into(),
        metadata: meta,
    }
}

fn target(vertex: &str, parallelism: u32, max: u32, ops: &[&str]) -> VertexTarget {
    VertexTarget {
        id: vertex.into(),
        parallelism,
        max_parallelism: max,
        operators: ops.iter().map(|o| o.to_string()).collect(),
    }
}

/// One operator `op` with keyed files for the given key groups.
fn keyed(op: &str, groups: impl IntoIterator<Item = u32>) -> SubtaskState {
    let mut s = OperatorSubtaskState::default();
    for kg in groups {
        s.keyed.insert(kg, file(&format!("chk-1/kg-{kg}"), 1));
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
    let s = OperatorSubtaskState { keyed: BTreeMap::new(), list_states: vec![l] };
    SubtaskState { operators: BTreeMap::from([(op.to_string(), s)]) }
}

#[test]
fn restore_uses_latest_checkpoint() {
    let c = choose_restore_point(&job_with(&[3, 5], &[4])).unwrap();
    assert_eq!(c.checkpoint.id, 5);
    assert_eq!(c.base_dir, PathBuf::from("/cp/j"));
    assert_eq!(c.pointer, MetadataPointer { path: "/cp/j/chk-5/_metadata".into(), size: 10, crc32: 3 });
    assert_eq!(choose_restore_point(&job_with(&[], &[])), None);
}

#[test]
fn restore_prefers_newer_savepoint() {
    let c = choose_restore_point(&job_with(&[3, 5], &[6])).unwrap();
    assert_eq!((c.checkpoint.id, c.checkpoint.kind), (6, CheckpointKind::Savepoint));
    assert_eq!(c.base_dir, PathBuf::from("/sp/savepoint-j-6"));
}

#[test]
fn unreadable_latest_checkpoint_is_an_error_not_a_fallback() {
    let c = choose_restore_point(&job_with(&[3, 5], &[])).unwrap();
    let read = Err(MetadataError::ChecksumMismatch { path: c.pointer.path.clone(), expected: 3, actual: 4 });
    let err = c.load(read).unwrap_err();
    assert!(matches!(err, Error::MetadataUnreadable { checkpoint_id: 5, .. }), "{err}");
    assert!(err.to_string().contains("retry"), "{err}");
}

#[test]
fn metadata_of_another_checkpoint_is_rejected() {
    let c = choose_restore_point(&job_with(&[5], &[])).unwrap();
    let err = c.load(Ok(meta(4, "v", 1, 8, vec![]))).unwrap_err();
    assert!(matches!(err, Error::MetadataMismatch { .. }), "{err}");
}

#[test]
fn keyed_state_reassigned_by_key_group_on_rescale() {
    // max parallelism 8, parallelism 2 → 3: old ranges [0,3] [4,7]; new [0,2] [3,5] [6,7].
    let m = meta(1, "v", 2, 8, vec![keyed("op", 0..4), keyed("op", 4..8)]);
    let a = assign_states(&point(m), &[target("v", 3, 8, &["op"])], false).unwrap();
    let groups = |key: &str| a.subtasks[key]["op"].keyed.keys().copied().collect::<Vec<_>>();
    assert_eq!(groups("v/0"), vec![0, 1, 2]);
    assert_eq!(groups("v/1"), vec![3, 4, 5]);
    assert_eq!(groups("v/2"), vec![6, 7]);
    assert_eq!(a.subtasks["v/1"]["op"].key_groups, KeyGroupRange { start: 3, end: 5 });
    assert_eq!(a.subtasks["v/1"]["op"].keyed[&4].path, "chk-1/kg-4");
    assert_eq!(a.master_states["offsets"], vec![9]);
    assert_eq!(a.base_dir, PathBuf::from("/cp/j"));
}

#[test]
fn max_parallelism_change_is_a_typed_error() {
    let m = meta(1, "v", 2, 8, vec![keyed("op", 0..4), keyed("op", 4..8)]);
    let err = assign_states(&point(m), &[target("v", 2, 16, &["op"])], false).unwrap_err();
    assert_eq!(err, Error::MaxParallelismChanged { checkpoint_id: 1, vertex: "v".into(), old: 8, new: 16 });
}

#[test]
fn round_robin_list_state_is_pooled_and_dealt() {
    // Old subtask 0 has elements e0, e1 (file a, 20 bytes); subtask 1 has e2 (file b, 5 bytes).
    let rr = OperatorStateMode::RoundRobin;
    let m = meta(
        1,
        "src",
        2,
        8,
        vec![
            list("op", "offsets", rr, "chk-1/a", vec![0, 10], 20),
            list("op", "offsets", rr, "chk-1/b", vec![0], 5),
        ],
    );
    let a = assign_states(&point(m), &[target("src", 3, 8, &["op"])], false).unwrap();
    let parts = |key: &str| {
        let l = &a.subtasks[key]["op"].list_states[0];
        assert_eq!((l.name.as_str(), l.mode), ("offsets", rr));
        l.parts.iter().map(|p| (p.file.path.clone(), p.elements.clone())).collect::<Vec<_>>()
    };
    assert_eq!(parts("src/0"), vec![("chk-1/a".into(), vec![ByteRange { start: 0, end: 10 }])]);
    assert_eq!(parts("src/1"), vec![("chk-1/a".into(), vec![ByteRange { start: 10, end: 20 }])]);
    assert_eq!(parts("src/2"), vec![("chk-1/b".into(), vec![ByteRange { start: 0, end: 5 }])]);
    // Scaling in to 1: everything to the one subtask.
    let m = meta(
        1,
        "src",
        2,
        8,
        vec![
            list("op", "offsets", rr, "chk-1/a", vec![0, 10], 20),
            list("op", "offsets", rr, "chk-1/b", vec![0], 5),
        ],
    );
    let a = assign_states(&point(m), &[target("src", 1, 8, &["op"])], false).unwrap();
    let elements: usize =
        a.subtasks["src/0"]["op"].list_states[0].parts.iter().map(|p| p.elements.len()).sum();
    assert_eq!(elements, 3);
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
    let a = assign_states(&point(m), &[target("src", 2, 8, &["op"])], false).unwrap();
    assert_eq!(a.subtasks["src/0"]["op"].list_states[0].parts[0].elements.len(), 2);
    assert_eq!(a.subtasks["src/1"]["op"].list_states[0].parts[0].file.path, "chk-1/b");
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
    let a = assign_states(&point(m), &[target("src", 3, 8, &["op"])], false).unwrap();
    for i in 0..3 {
        let l = &a.subtasks[&format!("src/{i}")]["op"].list_states[0];
        let files: Vec<_> = l.parts.iter().map(|p| p.file.path.as_str()).collect();
        assert_eq!(files, vec!["chk-1/a", "chk-1/b"], "subtask {i}");
        assert_eq!(l.parts[0].elements.len(), 2);
    }
}

#[test]
fn unmapped_operator_state_is_named_in_error() {
    let m = meta(1, "v", 1, 8, vec![keyed("gone-op", 0..8)]);
    let err = assign_states(&point(m), &[target("v", 1, 8, &["op"])], false).unwrap_err();
    assert_eq!(
        err,
        Error::UnmappedState { checkpoint_id: 1, operator: "gone-op".into(), vertex: "v".into() }
    );
    assert!(err.to_string().contains("gone-op"));
}

#[test]
fn allow_non_restored_state_skips_unmapped_state() {
    let m = meta(1, "v", 1, 8, vec![keyed("gone-op", 0..8)]);
    let a = assign_states(&point(m), &[target("v", 2, 8, &["op"])], true).unwrap();
    assert_eq!(a.subtasks.len(), 2);
    assert!(a.subtasks.values().all(|ops| ops.is_empty()));
}

#[test]
fn corrupt_key_groups_are_reported() {
    let m = meta(1, "v", 2, 8, vec![keyed("op", 0..5), keyed("op", 4..8)]);
    let err = assign_states(&point(m), &[target("v", 2, 8, &["op"])], false).unwrap_err();
    assert!(matches!(err, Error::CorruptState { .. }), "{err}");
}

#[test]
fn restoring_savepoint_advances_counter() {
    assert_eq!(counter_after_restore(1, 41), Some(42));
    assert_eq!(counter_after_restore(42, 41), None, "already past it");
    assert_eq!(counter_after_restore(100, 41), None, "never lowered");
}

#[test]
fn savepoint_restored_by_path_resolves_against_its_directory() {
    let mut m = meta(7, "v", 1, 8, vec![keyed("op", 0..8)]);
    m.kind = "savepoint".into();
    let p = RestorePoint::from_savepoint_dir(Path::new("/sp/savepoint-j-7"), Ok(m)).unwrap();
    assert_eq!((p.checkpoint_id, p.kind), (7, CheckpointKind::Savepoint));
    let a = assign_states(&p, &[target("v", 1, 8, &["op"])], false).unwrap();
    assert_eq!(a.base_dir, PathBuf::from("/sp/savepoint-j-7"));
}
