use std::collections::BTreeMap;

use cairn_protocol::checkpoint::{StateFile, SubtaskState, VertexInfo};
use cairn_raft::model::{JobId, JobSpec, SavepointRecord};

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

/// One operator `op` with keyed files for the given key groups.
fn keyed(op: &str, groups: impl IntoIterator<Item = u32>) -> SubtaskState {
    let mut s = cairn_protocol::checkpoint::OperatorSubtaskState::default();
    for kg in groups {
        s.keyed.insert_whole_file(kg, file(&format!("chk-1/kg-{kg}"), 1));
    }
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
fn restoring_savepoint_advances_counter() {
    assert_eq!(counter_after_restore(1, 41), Some(42));
    assert_eq!(counter_after_restore(42, 41), None, "already past it");
    assert_eq!(counter_after_restore(100, 41), None, "never lowered");
}

#[test]
fn savepoint_restored_by_path_resolves_against_its_directory() {
    let mut m = meta(7, "v", 1, 8, vec![keyed("op", 0..8)]);
    m.kind = "savepoint".into();
    let p = RestorePoint::from_path(Path::new("/sp/savepoint-j-7"), Ok(m)).unwrap();
    assert_eq!((p.checkpoint_id, p.kind), (7, CheckpointKind::Savepoint));
    let graph = JobGraph {
        vertices: vec![cairn_protocol::graph::Vertex {
            id: "v".into(),
            name: "v".into(),
            parallelism: 1,
            max_parallelism: 8,
            operator: cairn_protocol::graph::OperatorSpec {
                kind: "k".into(),
                config: serde_json::Value::Null,
            },
            chain: vec![cairn_protocol::graph::ChainedOperator {
                id: "op".into(),
                operator: cairn_protocol::graph::OperatorSpec {
                    kind: "k".into(),
                    config: serde_json::Value::Null,
                },
            }],
        }],
        edges: vec![],
    };
    let a = p.assign(&graph, false).unwrap();
    assert_eq!(a.base_dir, PathBuf::from("/sp/savepoint-j-7"));
    assert_eq!(a.subtasks["v/0"].operators["op"].keyed.key_groups.len(), 8);
}

#[test]
fn a_retained_checkpoint_restored_by_path_resolves_against_its_job_directory() {
    // Another job's retained checkpoint: `chk-7/...` and `shared/...` are relative to `/cp/a`.
    let m = meta(7, "v", 1, 8, vec![keyed("op", 0..8)]);
    let p = RestorePoint::from_path(Path::new("/cp/a/chk-7"), Ok(m.clone())).unwrap();
    assert_eq!((p.checkpoint_id, p.kind), (7, CheckpointKind::Checkpoint));
    assert_eq!(p.base_dir, PathBuf::from("/cp/a"));
    let err = RestorePoint::from_path(Path::new("/cp/a/chk-8"), Ok(m)).unwrap_err();
    assert!(matches!(err, Error::MetadataMismatch { .. }), "{err}");
    assert!(err.to_string().contains("chk-7"), "{err}");
}
