//! Keyed state on disk: one file per operator and checkpoint, indexed by key group. Snapshots go
//! through the task runtime's own synchronous and asynchronous parts (`plan_operator`,
//! `write_plan`), restores through the one assignment (`assign_states`) and `load`, as a task
//! does them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use cairn_protocol::assign::{TaskRestore, assign_states};
use cairn_protocol::checkpoint::metadata::METADATA_VERSION;
use cairn_protocol::checkpoint::{
    CheckpointMetadata, HandleError, KeyGroupRange, SubtaskState, VertexInfo, read_metadata_unverified,
};
use cairn_protocol::graph::{JobGraph, OperatorSpec, Vertex};
use cairn_protocol::keygroups::key_group_of;
use cairn_taskrt::state::StateError;
use cairn_taskrt::state::codec::{self, KeyGroupData};
use cairn_taskrt::state::keyed::KeyedStateBackend;
use cairn_taskrt::state::keyed_plan::MIN_LIVE_SHARE_PERCENT;
use cairn_taskrt::state::list::OperatorStateBackend;
use cairn_taskrt::state::restore::load;
use cairn_taskrt::state::snapshot::{SnapshotTarget, WrittenSnapshot, plan_operator, write_plan};
use cairn_taskrt::state::storage::{CheckpointStorage, WriteHook};

const OP: &str = "count";
const MAX: u32 = 128;

/// Records every file created and every fsync.
#[derive(Default)]
struct Recorder {
    created: Mutex<Vec<PathBuf>>,
    synced: Mutex<Vec<PathBuf>>,
}

impl Recorder {
    fn take(&self) -> (Vec<PathBuf>, Vec<PathBuf>) {
        let created = std::mem::take(&mut *self.created.lock().unwrap());
        (created, std::mem::take(&mut *self.synced.lock().unwrap()))
    }
}

impl WriteHook for Recorder {
    fn before_write(&self, path: &Path) -> std::io::Result<()> {
        self.created.lock().unwrap().push(path.to_owned());
        Ok(())
    }

    fn after_sync(&self, path: &Path) {
        self.synced.lock().unwrap().push(path.to_owned());
    }
}

fn value(key: u64, round: u64) -> u64 {
    key * 1000 + round
}

/// Subtask `i` of `p` with a count for each of `keys` that falls in its key groups.
fn backend(p: u32, i: u32, keys: u64) -> KeyedStateBackend {
    let range = KeyGroupRange::for_subtask(MAX, p, i).unwrap();
    let mut b = KeyedStateBackend::new(MAX, range);
    for key in (0..keys).filter(|k| range.contains(key_group_of(*k, MAX))) {
        b.put_value_u64("count", key, value(key, 0)).unwrap();
    }
    b
}

fn snapshot(
    storage: &CheckpointStorage,
    b: &KeyedStateBackend,
    subtask: u32,
    id: u64,
    incremental: bool,
) -> WrittenSnapshot {
    let target = SnapshotTarget::checkpoint(storage, id, incremental);
    let plan = plan_operator(OP, subtask, Some(b), &OperatorStateBackend::default(), &target);
    write_plan(storage, &target, vec![plan], &AtomicBool::new(false)).unwrap()
}

/// Snapshot, then confirm it complete (the incremental base of the next one).
fn snapshot_confirmed(
    storage: &CheckpointStorage,
    b: &mut KeyedStateBackend,
    subtask: u32,
    id: u64,
) -> WrittenSnapshot {
    let mut written = snapshot(storage, b, subtask, id, true);
    b.record_pending(id, written.uploaded.remove(OP).unwrap());
    b.confirm(id);
    written
}

fn metadata(id: u64, p: u32, subtasks: Vec<SubtaskState>) -> CheckpointMetadata {
    CheckpointMetadata {
        version: METADATA_VERSION,
        job: "job".into(),
        checkpoint_id: id,
        kind: "checkpoint".into(),
        trigger_time_ms: 0,
        completion_time_ms: 0,
        vertices: BTreeMap::from([(OP.to_owned(), VertexInfo { parallelism: p, max_parallelism: MAX })]),
        subtasks: subtasks
            .into_iter()
            .enumerate()
            .map(|(i, s)| (CheckpointMetadata::subtask_key(OP, i as u32), s))
            .collect(),
        master_states: BTreeMap::new(),
    }
}

fn graph(p: u32) -> JobGraph {
    let vertex = Vertex {
        id: OP.into(),
        name: OP.into(),
        parallelism: p,
        max_parallelism: MAX,
        operator: OperatorSpec { kind: "keyed_counter".into(), config: serde_json::Value::Null },
        chain: vec![],
    };
    JobGraph { vertices: vec![vertex], edges: vec![] }
}

fn restores(meta: &CheckpointMetadata, base: &Path, p: u32) -> Vec<TaskRestore> {
    let a = assign_states(meta, base, &graph(p), false).unwrap();
    (0..p).map(|i| a.task(OP, i).cloned().unwrap()).collect()
}

/// Loads every subtask's restore as a task does (key groups installed into a backend of its
/// range) and returns every key's count, asserting that no key is restored twice.
fn restore_counts(restores: &[TaskRestore]) -> BTreeMap<u64, u64> {
    let mut counts = BTreeMap::new();
    for r in restores {
        let loaded = load(r).unwrap();
        let mut b = KeyedStateBackend::new(MAX, r.key_groups);
        let Some(op) = loaded.operators.get(OP) else { continue };
        for g in &op.groups {
            assert!(r.key_groups.contains(g.key_group));
            b.restore_group(g.key_group, g.data.clone(), &g.segment, &g.file, true).unwrap();
            for key in g.data.keys() {
                let count = b.value_u64("count", key).unwrap().unwrap();
                assert!(counts.insert(key, count).is_none(), "key {key} restored twice");
            }
        }
    }
    counts
}

fn expected(keys: u64, round: impl Fn(u64) -> u64) -> BTreeMap<u64, u64> {
    (0..keys).map(|k| (k, value(k, round(k)))).collect()
}

fn storage_with_recorder(dir: &Path) -> (CheckpointStorage, Arc<Recorder>) {
    let recorder = Arc::new(Recorder::default());
    (CheckpointStorage::new(dir, "job").with_write_hook(recorder.clone()), recorder)
}

#[test]
fn a_full_snapshot_is_one_file_fsynced_once_and_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let (storage, recorder) = storage_with_recorder(dir.path());
    let b = backend(1, 0, 10_000);
    for id in 1..=2 {
        let written = snapshot(&storage, &b, 0, id, false);
        let (created, synced) = recorder.take();
        let state_file = storage.job_dir().join(format!("chk-{id}/{OP}-0.state"));
        assert_eq!(created, vec![state_file.clone()], "one state file for the operator");
        assert_eq!(synced.iter().filter(|p| **p == state_file).count(), 1, "fsynced once");
        let mut dirs = synced.clone();
        dirs.retain(|p| *p != state_file);
        assert!(dirs.iter().all(|d| d.is_dir()), "the other fsyncs are of directories: {dirs:?}");
        let unique: std::collections::BTreeSet<_> = dirs.iter().collect();
        assert_eq!(unique.len(), dirs.len(), "each directory synced once: {dirs:?}");

        let keyed = &written.state.operators[OP].keyed;
        assert_eq!(keyed.key_groups.len(), MAX as usize, "10,000 keys fill every key group");
        assert_eq!(keyed.files.len(), 1);
        assert_eq!(keyed.files[0].size, std::fs::metadata(&state_file).unwrap().len());
        assert_eq!(keyed.files[0].crc32, crc32fast::hash(&std::fs::read(&state_file).unwrap()));
        assert_eq!(written.bytes_persisted, keyed.files[0].size);
        assert_eq!(written.state.state_size(), keyed.files[0].size);
        assert_eq!(keyed.validate(), Ok(()));
        assert_eq!(written.state.files().count(), 1);

        let meta = metadata(id, 1, vec![written.state]);
        assert_eq!(restore_counts(&restores(&meta, storage.job_dir(), 1)), expected(10_000, |_| 0));
    }
}

#[test]
fn an_incremental_snapshot_writes_only_changed_key_groups_into_one_new_file() {
    let dir = tempfile::tempdir().unwrap();
    let (storage, recorder) = storage_with_recorder(dir.path());
    let mut b = backend(1, 0, 10_000);
    let first = snapshot_confirmed(&storage, &mut b, 0, 1);
    let keyed1 = first.state.operators[OP].keyed.clone();
    assert_eq!(keyed1.files.len(), 1);
    assert!(keyed1.files[0].is_shared(), "{:?}", keyed1.files[0]);
    recorder.take();

    // Keys 0..4 change: their (at most four) key groups are written again.
    let changed_keys = 0..4u64;
    for key in changed_keys.clone() {
        b.put_value_u64("count", key, value(key, 1)).unwrap();
    }
    let changed: std::collections::BTreeSet<u32> =
        changed_keys.clone().map(|k| key_group_of(k, MAX)).collect();
    let second = snapshot_confirmed(&storage, &mut b, 0, 2);
    let (created, synced) = recorder.take();
    assert_eq!(created.len(), 1, "one new file: {created:?}");
    assert!(created[0].starts_with(storage.layout().shared_dir()));
    assert_eq!(synced.iter().filter(|p| **p == created[0]).count(), 1);

    let keyed2 = &second.state.operators[OP].keyed;
    assert_eq!(keyed2.key_groups.len(), MAX as usize);
    let new_rel = created[0].strip_prefix(storage.job_dir()).unwrap().to_str().unwrap().to_owned();
    for (kg, segment) in &keyed2.key_groups {
        if changed.contains(kg) {
            assert_eq!(segment.file, new_rel, "changed key group {kg} is in the new file");
        } else {
            assert_eq!(
                segment, &keyed1.key_groups[kg],
                "unchanged key group {kg} points at the earlier file"
            );
        }
    }
    let new_bytes: u64 = changed.iter().map(|kg| keyed2.key_groups[kg].length).sum();
    assert_eq!(second.bytes_persisted, new_bytes, "only the changed key groups are written");
    assert_eq!(keyed2.files.len(), 2, "each referenced file once");
    assert_eq!(keyed2.file(&keyed1.files[0].path), Some(&keyed1.files[0]));
    assert_eq!(keyed2.file(&new_rel).map(|f| f.size), Some(new_bytes));
    assert_eq!(keyed2.validate(), Ok(()));
    assert_eq!(second.state.files().count(), 2);

    let meta = metadata(2, 1, vec![second.state.clone()]);
    let round = |k: u64| u64::from(changed_keys.contains(&k));
    assert_eq!(restore_counts(&restores(&meta, storage.job_dir(), 1)), expected(10_000, round));

    // Nothing changed: nothing is written, every segment is referenced.
    let third = snapshot_confirmed(&storage, &mut b, 0, 3);
    assert_eq!(recorder.take().0, Vec::<PathBuf>::new());
    assert_eq!(third.bytes_persisted, 0);
    assert_eq!(third.state.operators[OP].keyed, *keyed2);
}

#[test]
fn a_mostly_unreferenced_shared_file_stops_being_referenced() {
    assert_eq!(MIN_LIVE_SHARE_PERCENT, 25, "the cases below are for a quarter");
    let dir = tempfile::tempdir().unwrap();
    let storage = CheckpointStorage::new(dir.path(), "job");
    let mut b = backend(1, 0, 10_000);
    let first = snapshot_confirmed(&storage, &mut b, 0, 1);
    let old = first.state.operators[OP].keyed.files[0].clone();
    let change = |b: &mut KeyedStateBackend, groups: std::ops::Range<u32>, round: u64| {
        for key in (0..10_000u64).filter(|k| groups.contains(&key_group_of(*k, MAX))) {
            b.put_value_u64("count", key, value(key, round)).unwrap();
        }
    };
    // 64 of 128 key groups change: the rest of the first file is still referenced.
    change(&mut b, 0..64, 1);
    let second = snapshot_confirmed(&storage, &mut b, 0, 2);
    let keyed = &second.state.operators[OP].keyed;
    assert!(keyed.file(&old.path).is_some());
    assert_eq!(keyed.key_groups.values().filter(|s| s.file == old.path).count(), 64);
    // 40 more: 24 of its 128 key groups are left, under a quarter of its bytes. They are written
    // again, with the changed ones, and the first file is no longer referenced.
    change(&mut b, 64..104, 2);
    let third = snapshot_confirmed(&storage, &mut b, 0, 3);
    let keyed = &third.state.operators[OP].keyed;
    assert!(keyed.file(&old.path).is_none(), "the thin file {} is still referenced", old.path);
    let second_file = &second.state.operators[OP].keyed;
    let second_file = second_file.files.iter().find(|f| f.path != old.path).unwrap();
    assert_eq!(keyed.files.len(), 2, "the second checkpoint's file (all live) and a new one");
    assert!(keyed.file(&second_file.path).is_some());
    let new_file = keyed.files.iter().find(|f| f.path != second_file.path).unwrap();
    assert_eq!(third.bytes_persisted, new_file.size);
    assert_eq!(keyed.key_groups.values().filter(|s| s.file == new_file.path).count(), 40 + 24);
    let meta = metadata(3, 1, vec![third.state.clone()]);
    let round = |k: u64| match key_group_of(k, MAX) {
        0..64 => 1,
        64..104 => 2,
        _ => 0,
    };
    assert_eq!(restore_counts(&restores(&meta, storage.job_dir(), 1)), expected(10_000, round));
}

#[test]
fn rescaling_one_to_three_reads_each_key_group_from_the_one_file() {
    let dir = tempfile::tempdir().unwrap();
    let storage = CheckpointStorage::new(dir.path(), "job");
    let written = snapshot(&storage, &backend(1, 0, 1_000), 0, 1, false);
    let meta = metadata(1, 1, vec![written.state.clone()]);
    let rs = restores(&meta, storage.job_dir(), 3);
    let file = &written.state.operators[OP].keyed.files[0];
    for r in &rs {
        let keyed = &r.operators[OP].keyed;
        assert_eq!(keyed.files, vec![file.clone()], "all three read the one file");
        assert!(keyed.key_groups.keys().all(|kg| r.key_groups.contains(*kg)));
    }
    assert_eq!(restore_counts(&rs), expected(1_000, |_| 0));
}

#[test]
fn rescaling_four_incremental_subtasks_to_two_restores_each_key_once() {
    let dir = tempfile::tempdir().unwrap();
    let storage = CheckpointStorage::new(dir.path(), "job");
    let keys = 2_000;
    let mut states = Vec::new();
    for i in 0..4 {
        let mut b = backend(4, i, keys);
        snapshot_confirmed(&storage, &mut b, i, 1);
        // One key of this subtask changes: checkpoint 2 spans two files per subtask.
        let key = (0..keys).find(|k| b.range().contains(key_group_of(*k, MAX))).unwrap();
        b.put_value_u64("count", key, value(key, 2)).unwrap();
        let second = snapshot_confirmed(&storage, &mut b, i, 2);
        assert_eq!(second.state.operators[OP].keyed.files.len(), 2);
        states.push(second.state);
    }
    let changed: Vec<u64> = (0..4)
        .map(|i| {
            let range = KeyGroupRange::for_subtask(MAX, 4, i).unwrap();
            (0..keys).find(|k| range.contains(key_group_of(*k, MAX))).unwrap()
        })
        .collect();
    let meta = metadata(2, 4, states);
    let rs = restores(&meta, storage.job_dir(), 2);
    for r in &rs {
        assert_eq!(r.operators[OP].keyed.files.len(), 4, "two files of each of two old subtasks");
    }
    let round = |k: u64| if changed.contains(&k) { 2 } else { 0 };
    assert_eq!(restore_counts(&rs), expected(keys, round));
}

/// One checkpoint of four subtasks' worth of key groups in one file, and its restore at
/// parallelism 2.
fn one_file_restored_by_two() -> (tempfile::TempDir, SubtaskState, Vec<TaskRestore>) {
    let dir = tempfile::tempdir().unwrap();
    let storage = CheckpointStorage::new(dir.path(), "job");
    let written = snapshot(&storage, &backend(1, 0, 1_000), 0, 1, false);
    let rs = restores(&metadata(1, 1, vec![written.state.clone()]), storage.job_dir(), 2);
    (dir, written.state, rs)
}

#[test]
fn a_corrupted_segment_is_detected_naming_its_key_group() {
    let (dir, state, rs) = one_file_restored_by_two();
    let keyed = &state.operators[OP].keyed;
    let (kg, victim) = keyed.key_groups.iter().nth(100).map(|(kg, s)| (*kg, s.clone())).unwrap();
    let path = dir.path().join("job").join(&victim.file);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[(victim.offset + victim.length - 1) as usize] ^= 0x40;
    std::fs::write(&path, bytes).unwrap();

    let owner = rs.iter().find(|r| r.key_groups.contains(kg)).unwrap();
    match load(owner) {
        Err(StateError::SegmentChecksumMismatch { path: p, key_group, expected, .. }) => {
            assert_eq!((p, key_group, expected), (path.clone(), kg, victim.crc32));
        }
        other => panic!("expected a segment checksum mismatch, got {other:?}"),
    }
    let message = load(owner).unwrap_err().to_string();
    assert!(message.contains(&format!("key group {kg} ")) && message.contains(&victim.file), "{message}");
    // The other subtask reads only its own segments, which are intact.
    let other = rs.iter().find(|r| !r.key_groups.contains(kg)).unwrap();
    assert!(load(other).is_ok());
}

#[test]
fn a_truncated_or_missing_file_is_detected_naming_it() {
    let (dir, state, rs) = one_file_restored_by_two();
    let file = &state.operators[OP].keyed.files[0];
    let path = dir.path().join("job").join(&file.path);
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 1]).unwrap();
    for r in &rs {
        match load(r) {
            Err(StateError::SizeMismatch { path: p, expected, actual }) => {
                assert_eq!((p, expected, actual), (path.clone(), file.size, file.size - 1));
            }
            other => panic!("expected a size mismatch, got {other:?}"),
        }
    }
    std::fs::remove_file(&path).unwrap();
    let err = load(&rs[0]).unwrap_err();
    assert!(matches!(&err, StateError::Missing { path: p } if *p == path), "{err:?}");
    assert!(err.to_string().contains(&file.path), "{err}");
}

#[test]
fn an_inconsistent_handle_is_refused_before_reading() {
    let (_dir, _state, rs) = one_file_restored_by_two();
    let mut r = rs[0].clone();
    let keyed = &mut r.operators.get_mut(OP).unwrap().keyed;
    let second = *keyed.key_groups.keys().nth(1).unwrap();
    keyed.key_groups.get_mut(&second).unwrap().offset -= 1;
    match load(&r) {
        Err(StateError::InvalidHandle {
            operator,
            source: HandleError::OverlappingSegments { second: s, .. },
        }) => {
            assert_eq!((operator.as_str(), s), (OP, second));
        }
        other => panic!("expected an invalid handle, got {other:?}"),
    }
    let mut r = rs[0].clone();
    r.operators.get_mut(OP).unwrap().keyed.files[0].path = "../elsewhere.state".into();
    assert!(matches!(
        load(&r),
        Err(StateError::InvalidHandle { source: HandleError::UnsafePath { .. }, .. })
    ));
}

/// The checkpoint and savepoint layouts of the former format: one file per key group, handles
/// as a map of key group → file, `_metadata` version 1.
fn write_file_per_key_group(base: &Path, chk: Option<u64>, kind: &str, keys: u64) -> PathBuf {
    let prefix = chk.map(|id| format!("chk-{id}/")).unwrap_or_default();
    let mut groups: BTreeMap<u32, KeyGroupData> = BTreeMap::new();
    for key in 0..keys {
        let data = groups.entry(key_group_of(key, MAX)).or_default();
        data.values.entry("count".into()).or_default().insert(key, value(key, 7).to_le_bytes().to_vec());
    }
    let mut keyed = serde_json::Map::new();
    for (kg, data) in &groups {
        let rel = format!("{prefix}{OP}-kg-{kg}.state");
        let bytes = codec::encode(*kg, data);
        std::fs::create_dir_all(base.join(&rel).parent().unwrap()).unwrap();
        std::fs::write(base.join(&rel), &bytes).unwrap();
        let file = serde_json::json!({ "path": rel, "size": bytes.len(), "crc32": crc32fast::hash(&bytes) });
        keyed.insert(kg.to_string(), file);
    }
    let meta = serde_json::json!({
        "version": 1,
        "job": "job",
        "checkpoint_id": chk.unwrap_or(9),
        "kind": kind,
        "trigger_time_ms": 1,
        "completion_time_ms": 2,
        "vertices": { "count": { "parallelism": 1, "max_parallelism": MAX } },
        "subtasks": { "count/0": { "operators": { "count": { "keyed": keyed, "list_states": [] } } } },
        "master_states": {}
    });
    let path = base.join(format!("{prefix}_metadata"));
    std::fs::write(&path, serde_json::to_vec_pretty(&meta).unwrap()).unwrap();
    path
}

#[test]
fn checkpoints_and_savepoints_of_the_file_per_key_group_format_restore() {
    let dir = tempfile::tempdir().unwrap();
    let job_dir = dir.path().join("job");
    let savepoint_dir = dir.path().join("savepoint-job-9");
    for (base, meta_path) in [
        (job_dir.clone(), write_file_per_key_group(&job_dir, Some(3), "checkpoint", 1_000)),
        (savepoint_dir.clone(), write_file_per_key_group(&savepoint_dir, None, "savepoint", 1_000)),
    ] {
        let meta = read_metadata_unverified(&meta_path).unwrap();
        let subtask = &meta.subtasks[&format!("{OP}/0")];
        let groups: std::collections::BTreeSet<u32> = (0..1_000).map(|k| key_group_of(k, MAX)).collect();
        assert_eq!(subtask.operators[OP].keyed.key_groups.len(), groups.len());
        assert_eq!(subtask.files().count(), groups.len(), "a file per key group");
        for p in [1, 3] {
            let rs = restores(&meta, &base, p);
            assert_eq!(restore_counts(&rs), expected(1_000, |_| 7), "{} at parallelism {p}", base.display());
        }
    }
}
