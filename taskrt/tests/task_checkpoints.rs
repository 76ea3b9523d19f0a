//! Checkpoint behaviour of single tasks: fencing, asynchronous failures and cancellation,
//! incremental snapshots, and checksum verification on restore.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use cairn_protocol::assign::assign_states;
use cairn_protocol::checkpoint::{CheckpointMetadata, SubtaskState, VertexInfo};
use cairn_protocol::graph::{JobGraph, OperatorSpec, Vertex};
use cairn_protocol::messages::{CheckpointOptions, DeclineReason, TaskMessage, ToTask};
use cairn_taskrt::demo::counter::KeyedCounter;
use cairn_taskrt::demo::source::{SequenceSource, SourceConfig};
use cairn_taskrt::exchange::{Barrier, StreamElement};
use cairn_taskrt::operator::TaskInfo;
use cairn_taskrt::state::storage::{CheckpointStorage, WriteHook};
use cairn_taskrt::task::TaskOutcome;
use common::*;

fn trigger(id: u64) -> ToTask {
    ToTask::TriggerCheckpoint { checkpoint_id: id, timestamp_ms: 0, options: CheckpointOptions::checkpoint() }
}

fn barrier(id: u64) -> StreamElement {
    StreamElement::Barrier(Barrier {
        checkpoint_id: id,
        timestamp_ms: 0,
        options: CheckpointOptions::checkpoint(),
    })
}

fn source_harness(storage: CheckpointStorage) -> Harness {
    source_harness_with(storage, true)
}

/// A sequence source of 4 keys × 10 records; `idle_after_limit` keeps it running after them.
fn source_harness_with(storage: CheckpointStorage, idle_after_limit: bool) -> Harness {
    let info = TaskInfo {
        job: "job".into(),
        vertex: "v".into(),
        subtask: 0,
        parallelism: 1,
        max_parallelism: 128,
        attempt: 0,
    };
    let config =
        SourceConfig { keys: 4, records_per_key: Some(10), rate_per_sec: None, batch: 8, idle_after_limit };
    let mut o =
        HarnessOptions::new(storage, vec![("src".into(), Box::new(SequenceSource::new(config, &info)))]);
    o.inputs = 0;
    o.is_source = true;
    spawn_task(o)
}

#[tokio::test]
async fn messages_from_a_stale_term_are_ignored() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let mut h = source_harness(CheckpointStorage::new(dir.path(), "job"));
    h.wait_running().await;
    h.control(5, trigger(1)).await;
    assert!(matches!(h.next_checkpoint_report().await, TaskMessage::Acknowledge { checkpoint_id: 1, .. }));
    // A deposed leader (term 4) tries to cancel and to trigger: both ignored.
    h.control(4, ToTask::Cancel).await;
    h.control(4, trigger(2)).await;
    h.control(5, trigger(3)).await;
    match h.next_checkpoint_report().await {
        TaskMessage::Acknowledge { checkpoint_id: 3, .. } => {}
        other => panic!("the stale trigger or cancel was obeyed: {other:?}"),
    }
    assert_eq!(h.monitor.current_state(), cairn_taskrt::lifecycle::TaskState::Running);
    h.control(6, ToTask::Cancel).await;
    assert_eq!(h.handle.await.unwrap(), TaskOutcome::Canceled);
}

/// Fails every write while `failing` is set, as a full disk would.
struct FailingWrites {
    failing: Arc<std::sync::atomic::AtomicBool>,
}
impl WriteHook for FailingWrites {
    fn before_write(&self, _path: &Path) -> std::io::Result<()> {
        if self.failing.load(Ordering::SeqCst) {
            return Err(std::io::Error::other("injected disk failure"));
        }
        Ok(())
    }
}

#[tokio::test]
async fn failing_asynchronous_part_declines_each_checkpoint_once_and_the_task_keeps_running() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let failing = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let storage = CheckpointStorage::new(dir.path(), "job")
        .with_write_hook(Arc::new(FailingWrites { failing: failing.clone() }));
    let mut h = source_harness(storage);
    h.wait_running().await;
    h.control(1, trigger(1)).await;
    h.control(1, trigger(2)).await;
    let mut declines = Vec::new();
    while declines.len() < 2 {
        match tokio::time::timeout(WAIT, h.reports.recv()).await {
            Ok(Some(TaskMessage::Decline { checkpoint_id, reason, .. })) => {
                declines.push((checkpoint_id, reason))
            }
            Ok(Some(TaskMessage::Status { status, .. })) => {
                assert!(!status.is_terminal(), "a failed snapshot must not end the task: {status:?}")
            }
            Ok(Some(TaskMessage::Acknowledge { .. })) => panic!("nothing can be acknowledged"),
            Ok(None) | Err(_) => panic!("no decline for each failed checkpoint: {declines:?}"),
        }
    }
    // The asynchronous parts run concurrently: the declines come in either order.
    let mut ids: Vec<u64> = declines.iter().map(|(id, _)| *id).collect();
    ids.sort_unstable();
    assert_eq!(ids, vec![1, 2], "each declined once");
    for (_, reason) in &declines {
        assert!(
            matches!(reason, DeclineReason::SnapshotFailed(cause) if cause.contains("asynchronous part") && cause.contains("injected disk failure")),
            "{reason:?}"
        );
    }
    assert_eq!(h.monitor.current_state(), cairn_taskrt::lifecycle::TaskState::Running);
    // Nothing from the failed writes is left behind.
    assert_eq!(files_under(&dir.path().join("job")), Vec::<PathBuf>::new());
    // The disk recovers: the next checkpoint is acknowledged.
    failing.store(false, Ordering::SeqCst);
    h.control(1, trigger(3)).await;
    match h.next_checkpoint_report().await {
        TaskMessage::Acknowledge { checkpoint_id: 3, .. } => {}
        other => panic!("expected the acknowledgement of checkpoint 3, got {other:?}"),
    }
    h.control(1, ToTask::Cancel).await;
    assert_eq!(h.handle.await.unwrap(), TaskOutcome::Canceled);
}

/// Fails writes into `chk-1/` as if the coordinator had just discarded that directory.
struct DiscardedCheckpointOne;
impl WriteHook for DiscardedCheckpointOne {
    fn before_write(&self, path: &Path) -> std::io::Result<()> {
        if path.components().any(|c| c.as_os_str() == "chk-1") {
            return Err(std::io::Error::new(std::io::ErrorKind::NotFound, "directory removed"));
        }
        Ok(())
    }
}

#[tokio::test]
async fn a_checkpoint_directory_discarded_by_the_coordinator_declines_without_failing_the_task() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let storage = CheckpointStorage::new(dir.path(), "job").with_write_hook(Arc::new(DiscardedCheckpointOne));
    let mut h = source_harness(storage);
    h.wait_running().await;
    h.control(1, trigger(1)).await;
    match h.next_checkpoint_report().await {
        TaskMessage::Decline { checkpoint_id: 1, reason: DeclineReason::SnapshotFailed(e), .. } => {
            assert!(e.contains("chk-1"), "{e}")
        }
        other => panic!("expected a decline of checkpoint 1, got {other:?}"),
    }
    // The task goes on: the next checkpoint is acknowledged.
    h.control(1, trigger(2)).await;
    match h.next_checkpoint_report().await {
        TaskMessage::Acknowledge { checkpoint_id: 2, .. } => {}
        other => panic!("expected an acknowledgement of checkpoint 2, got {other:?}"),
    }
    assert_eq!(h.monitor.current_state(), cairn_taskrt::lifecycle::TaskState::Running);
    h.control(1, ToTask::Cancel).await;
    assert_eq!(h.handle.await.unwrap(), TaskOutcome::Canceled);
}

/// Holds every write until released; counts writes started.
#[derive(Default)]
struct Gate {
    open: Mutex<bool>,
    cv: std::sync::Condvar,
    entered: AtomicUsize,
}
impl WriteHook for Gate {
    fn before_write(&self, _path: &Path) -> std::io::Result<()> {
        self.entered.fetch_add(1, Ordering::SeqCst);
        let mut open = self.open.lock().map_err(|_| std::io::Error::other("poisoned"))?;
        while !*open {
            open = self.cv.wait(open).map_err(|_| std::io::Error::other("poisoned"))?;
        }
        Ok(())
    }
}

fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return out };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() { out.extend(files_under(&p)) } else { out.push(p) }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asynchronous_part_running_at_cancel_is_cancelled_and_its_files_removed() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let gate = Arc::new(Gate::default());
    let storage = CheckpointStorage::new(dir.path(), "job").with_write_hook(gate.clone());
    let h = source_harness(storage);
    h.wait_running().await;
    h.control(1, trigger(1)).await;
    let g = gate.clone();
    wait_for("the asynchronous part to start writing", move || g.entered.load(Ordering::SeqCst) > 0).await;
    h.control(1, ToTask::Cancel).await;
    // Let the writer go: it must notice the cancellation and clean up.
    *gate.open.lock().unwrap() = true;
    gate.cv.notify_all();
    assert_eq!(h.handle.await.unwrap(), TaskOutcome::Canceled);
    assert_eq!(files_under(&dir.path().join("job")), Vec::<PathBuf>::new(), "cancelled snapshot left files");
}

fn counter_vertex(p: u32) -> Vertex {
    Vertex {
        id: "count".into(),
        name: "count".into(),
        parallelism: p,
        max_parallelism: 128,
        operator: OperatorSpec { kind: "keyed_counter".into(), config: serde_json::Value::Null },
        chain: vec![],
    }
}

fn counter_harness(
    storage: CheckpointStorage,
    incremental: bool,
    restore: Option<cairn_protocol::assign::TaskRestore>,
) -> Harness {
    let mut o = HarnessOptions::new(storage, vec![("count".into(), Box::new(KeyedCounter))]);
    o.incremental = incremental;
    o.restore = restore;
    spawn_task(o)
}

async fn checkpoint(
    h: &mut Harness,
    id: u64,
) -> (SubtaskState, cairn_protocol::checkpoint::TaskCheckpointMetrics) {
    h.send(0, barrier(id)).await;
    match h.next_checkpoint_report().await {
        TaskMessage::Acknowledge { checkpoint_id, state, metrics, .. } if checkpoint_id == id => {
            (state, metrics)
        }
        other => panic!("expected ack of {id}, got {other:?}"),
    }
}

#[tokio::test]
async fn incremental_checkpoints_reuse_files_of_unchanged_key_groups() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let storage = CheckpointStorage::new(dir.path(), "job");
    let mut h = counter_harness(storage.clone(), true, None);
    h.wait_running().await;
    for key in 0..20 {
        h.send(0, StreamElement::Record(rec(key, 1))).await;
    }
    let (s1, m1) = checkpoint(&mut h, 1).await;
    let keyed1 = &s1.operators["count"].keyed;
    assert!(keyed1.key_groups.len() > 5);
    assert_eq!(keyed1.files.len(), 1, "one file for all key groups");
    assert!(keyed1.files[0].is_shared(), "incremental files live in shared/");
    assert_eq!(m1.bytes_persisted, s1.state_size());
    assert_eq!(m1.bytes_persisted, keyed1.files[0].size);

    // Not yet confirmed: checkpoint 2 must not reference checkpoint 1's file.
    let (s2, _) = checkpoint(&mut h, 2).await;
    let keyed2 = s2.operators["count"].keyed.clone();
    assert_eq!(keyed2.files.len(), 1);
    assert_ne!(keyed2.files[0].path, keyed1.files[0].path);
    h.control(1, ToTask::NotifyCheckpointComplete { checkpoint_id: 2 }).await;

    h.send(0, StreamElement::Record(rec(3, 2))).await;
    let (s3, m3) = checkpoint(&mut h, 3).await;
    let keyed3 = &s3.operators["count"].keyed;
    assert_eq!(keyed3.key_groups.len(), keyed2.key_groups.len());
    let changed: Vec<u32> =
        keyed3.key_groups.iter().filter(|(kg, s)| keyed2.key_groups[*kg] != **s).map(|(kg, _)| *kg).collect();
    assert_eq!(changed.len(), 1, "only the key group of key 3 is uploaded again");
    let new_file = &keyed3.key_groups[&changed[0]].file;
    assert_ne!(new_file, &keyed2.files[0].path);
    let paths: Vec<&str> = keyed3.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(paths.len(), 2, "the new file and checkpoint 2's, each once: {paths:?}");
    assert!(paths.contains(&new_file.as_str()) && paths.contains(&keyed2.files[0].path.as_str()));
    assert!(m3.bytes_persisted < m3.state_size, "{m3:?}");
    assert_eq!(m3.bytes_persisted, keyed3.key_groups[&changed[0]].length);

    h.control(1, ToTask::Cancel).await;
    h.handle.await.unwrap();
}

fn metadata(id: u64, vertex: &str, p: u32, subtasks: Vec<SubtaskState>) -> CheckpointMetadata {
    CheckpointMetadata {
        version: 1,
        job: "job".into(),
        checkpoint_id: id,
        kind: "checkpoint".into(),
        trigger_time_ms: 0,
        completion_time_ms: 0,
        vertices: BTreeMap::from([(vertex.to_owned(), VertexInfo { parallelism: p, max_parallelism: 128 })]),
        subtasks: subtasks
            .into_iter()
            .enumerate()
            .map(|(i, s)| (CheckpointMetadata::subtask_key(vertex, i as u32), s))
            .collect(),
        master_states: BTreeMap::new(),
    }
}

#[tokio::test]
async fn checksum_mismatch_is_detected_on_restore() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let storage = CheckpointStorage::new(dir.path(), "job");
    let mut h = counter_harness(storage.clone(), false, None);
    h.wait_running().await;
    for key in 0..10 {
        h.send(0, StreamElement::Record(rec(key, 1))).await;
    }
    let (state, _) = checkpoint(&mut h, 1).await;
    h.control(1, ToTask::Cancel).await;
    h.handle.await.unwrap();

    let meta = metadata(1, "count", 1, vec![state.clone()]);
    // Intact: restores and runs.
    let graph = JobGraph { vertices: vec![counter_vertex(1)], edges: vec![] };
    let assignment = assign_states(&meta, storage.job_dir(), &graph, false).unwrap();
    let restore = assignment.task("count", 0).cloned().unwrap();
    let ok = counter_harness(storage.clone(), false, Some(restore.clone()));
    ok.wait_running().await;
    ok.control(1, ToTask::Cancel).await;
    ok.handle.await.unwrap();

    // One flipped byte in the segment of one key group.
    let (kg, victim) = state.operators["count"].keyed.key_groups.iter().nth(1).unwrap();
    let path = storage.job_dir().join(&victim.file);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[(victim.offset + victim.length / 2) as usize] ^= 0x01;
    std::fs::write(&path, bytes).unwrap();
    let bad = counter_harness(storage, false, Some(restore));
    match bad.handle.await.unwrap() {
        TaskOutcome::Failed(cause) => assert!(
            cause.contains("CRC-32")
                && cause.contains(&victim.file)
                && cause.contains(&format!("key group {kg} ")),
            "cause: {cause}"
        ),
        other => panic!("a corrupt state file must fail the restore, got {other:?}"),
    }
}

#[tokio::test]
async fn savepoint_with_a_target_is_self_contained_in_its_directory() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let mut h = source_harness(CheckpointStorage::new(dir.path(), "job"));
    h.wait_running().await;
    let target = dir.path().join("savepoints/sp-1");
    let options = CheckpointOptions {
        kind: cairn_protocol::checkpoint::CheckpointKind::Savepoint,
        drain: false,
        target_location: Some(target.clone()),
        unaligned_after_ms: None,
    };
    h.control(1, ToTask::TriggerCheckpoint { checkpoint_id: 4, timestamp_ms: 0, options }).await;
    match h.next_checkpoint_report().await {
        TaskMessage::Acknowledge { checkpoint_id: 4, state, .. } => {
            let files: Vec<_> = state.files().collect();
            assert!(!files.is_empty());
            for f in files {
                assert!(!f.path.contains('/'), "savepoint paths are relative to the savepoint: {}", f.path);
                assert!(target.join(&f.path).is_file());
            }
        }
        other => panic!("expected ack, got {other:?}"),
    }
    assert!(!dir.path().join("job/chk-4").exists());
    h.control(1, ToTask::Cancel).await;
    h.handle.await.unwrap();
}

/// An operator whose synchronous snapshot fails for one checkpoint.
struct FailsSnapshotOf(u64);
impl cairn_taskrt::operator::Operator for FailsSnapshotOf {
    fn process_record(
        &mut self,
        record: cairn_taskrt::exchange::Record,
        ctx: &mut cairn_taskrt::operator::OperatorContext<'_>,
    ) -> Result<(), cairn_taskrt::operator::OperatorError> {
        ctx.emit(record);
        Ok(())
    }

    fn snapshot_state(
        &mut self,
        checkpoint_id: u64,
        _ctx: &mut cairn_taskrt::operator::OperatorContext<'_>,
    ) -> Result<(), cairn_taskrt::operator::OperatorError> {
        if checkpoint_id == self.0 {
            return Err(cairn_taskrt::operator::OperatorError::Failed("injected snapshot failure".into()));
        }
        Ok(())
    }
}

#[tokio::test]
async fn failing_synchronous_part_declines_and_the_task_keeps_running() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let storage = CheckpointStorage::new(dir.path(), "job");
    let mut o = HarnessOptions::new(
        storage,
        vec![("count".into(), Box::new(KeyedCounter)), ("flaky".into(), Box::new(FailsSnapshotOf(1)))],
    );
    o.incremental = false;
    let mut h = spawn_task(o);
    h.wait_running().await;
    h.send(0, StreamElement::Record(rec(1, 1))).await;
    h.send(0, barrier(1)).await;
    match h.next_checkpoint_report().await {
        TaskMessage::Decline { checkpoint_id: 1, reason: DeclineReason::SnapshotFailed(cause), .. } => {
            assert!(
                cause.contains("synchronous part") && cause.contains("injected snapshot failure"),
                "{cause}"
            )
        }
        other => panic!("expected a decline of checkpoint 1, got {other:?}"),
    }
    assert_eq!(h.monitor.current_state(), cairn_taskrt::lifecycle::TaskState::Running);
    let (state, _) = checkpoint(&mut h, 2).await;
    assert!(!state.operators["count"].keyed.is_empty(), "the next checkpoint carries the state");
    h.control(1, ToTask::Cancel).await;
    assert_eq!(h.handle.await.unwrap(), TaskOutcome::Canceled);
}

/// A checkpoint of the former format (one shared file per key group, `_metadata` version 1)
/// restores into a running task, whose next incremental checkpoint keeps referencing the files
/// of unchanged key groups and writes the changed one into one new file.
#[tokio::test]
async fn a_checkpoint_with_a_file_per_key_group_restores_and_is_reused() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let storage = CheckpointStorage::new(dir.path(), "job");
    let mut groups: BTreeMap<u32, cairn_taskrt::state::codec::KeyGroupData> = BTreeMap::new();
    for key in 0..10u64 {
        let data = groups.entry(cairn_protocol::keygroups::key_group_of(key, 128)).or_default();
        data.values.entry("count".into()).or_default().insert(key, 5u64.to_le_bytes().to_vec());
    }
    let mut keyed = serde_json::Map::new();
    for (kg, data) in &groups {
        let rel = format!("shared/count-kg-{kg}-00{kg:030x}.state");
        let bytes = cairn_taskrt::state::codec::encode(*kg, data);
        std::fs::create_dir_all(storage.layout().shared_dir()).unwrap();
        std::fs::write(storage.job_dir().join(&rel), &bytes).unwrap();
        let file = serde_json::json!({ "path": rel, "size": bytes.len(), "crc32": crc32fast::hash(&bytes) });
        keyed.insert(kg.to_string(), file);
    }
    let v1 = serde_json::json!({
        "version": 1, "job": "job", "checkpoint_id": 3, "kind": "checkpoint",
        "trigger_time_ms": 1, "completion_time_ms": 2,
        "vertices": { "count": { "parallelism": 1, "max_parallelism": 128 } },
        "subtasks": { "count/0": { "operators": { "count": { "keyed": keyed, "list_states": [] } } } },
        "master_states": {}
    });
    let path = storage.layout().metadata_path(3);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, serde_json::to_vec(&v1).unwrap()).unwrap();
    let meta = cairn_protocol::checkpoint::read_metadata_unverified(&path).unwrap();
    let graph = JobGraph { vertices: vec![counter_vertex(1)], edges: vec![] };
    let restore = assign_states(&meta, storage.job_dir(), &graph, false).unwrap().task("count", 0).cloned();

    let mut h = counter_harness(storage.clone(), true, restore);
    h.wait_running().await;
    h.send(0, StreamElement::Record(rec(3, 1))).await;
    let (state, m4) = checkpoint(&mut h, 4).await;
    h.control(1, ToTask::Cancel).await;
    h.handle.await.unwrap();

    let changed = cairn_protocol::keygroups::key_group_of(3, 128);
    let keyed = &state.operators["count"].keyed;
    assert_eq!(keyed.key_groups.len(), groups.len());
    for (kg, segment) in &keyed.key_groups {
        if *kg == changed {
            assert_eq!(segment.length, m4.bytes_persisted, "only key group {kg} is written");
        } else {
            let old = meta.subtasks["count/0"].operators["count"].keyed.key_groups[kg].clone();
            assert_eq!(*segment, old, "unchanged key group {kg} references its former file");
        }
    }
    assert_eq!(keyed.files.len(), groups.len(), "the unchanged groups' files and one new file");
    let counts =
        keyed_counts(&metadata(4, "count", 1, vec![state.clone()]), storage.job_dir(), "count", "count");
    let expected: BTreeMap<u64, u64> = (0..10).map(|k| (k, if k == 3 { 6 } else { 5 })).collect();
    assert_eq!(counts, expected);
}

async fn wait_state(h: &Harness, want: cairn_taskrt::lifecycle::TaskState) {
    let mut state = h.monitor.state.clone();
    tokio::time::timeout(WAIT, state.wait_for(|s| *s == want))
        .await
        .unwrap_or_else(|_| panic!("task never reached {want}"))
        .expect("state watch");
}

/// Reads the task's output up to (and including) the first element that is not a record.
async fn skip_records(h: &mut Harness) -> (usize, StreamElement) {
    let mut records = 0;
    loop {
        match h.next_output().await {
            StreamElement::Record(_) => records += 1,
            other => return (records, other),
        }
    }
}

#[tokio::test]
async fn a_bounded_source_finishes_after_a_checkpoint_taken_after_its_end_of_data_completed() {
    use cairn_taskrt::lifecycle::TaskState;
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let mut h = source_harness_with(CheckpointStorage::new(dir.path(), "job"), false);
    wait_state(&h, TaskState::Finishing).await;
    let (records, next) = skip_records(&mut h).await;
    assert_eq!(records, 40, "every record, then the end of data");
    assert_eq!(next, StreamElement::EndOfData);

    // The completion of a checkpoint it did not take after its end of data does not finish it:
    // the trigger after it is still taken and forwarded.
    h.control(1, ToTask::NotifyCheckpointComplete { checkpoint_id: 7 }).await;
    h.control(1, trigger(8)).await;
    assert!(matches!(h.next_checkpoint_report().await, TaskMessage::Acknowledge { checkpoint_id: 8, .. }));
    assert!(matches!(h.next_output().await, StreamElement::Barrier(b) if b.checkpoint_id == 8));
    assert_eq!(h.monitor.current_state(), TaskState::Finishing);

    // The final checkpoint completed: end of input, then finished.
    h.control(1, ToTask::NotifyCheckpointComplete { checkpoint_id: 8 }).await;
    assert_eq!(h.next_output().await, StreamElement::EndOfInput);
    assert_eq!(tokio::time::timeout(WAIT, h.handle).await.unwrap().unwrap(), TaskOutcome::Finished);
}

#[tokio::test]
async fn a_task_whose_inputs_ended_takes_triggers_and_finishes_once_its_upstream_did() {
    use cairn_taskrt::lifecycle::TaskState;
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let storage = CheckpointStorage::new(dir.path(), "job");
    let mut o = HarnessOptions::new(storage, vec![("count".into(), Box::new(KeyedCounter))]);
    o.inputs = 2;
    let mut h = spawn_task(o);
    h.wait_running().await;
    h.send(0, StreamElement::Record(rec(1, 1))).await;
    h.send(0, StreamElement::EndOfData).await;
    h.send(1, StreamElement::EndOfData).await;
    wait_state(&h, TaskState::Finishing).await;
    let (_, next) = skip_records(&mut h).await;
    assert_eq!(next, StreamElement::EndOfData, "its end of data goes downstream");

    // Barriers still align across both channels after their end of data.
    h.send(0, barrier(5)).await;
    h.send(1, barrier(5)).await;
    assert!(matches!(h.next_checkpoint_report().await, TaskMessage::Acknowledge { checkpoint_id: 5, .. }));
    h.control(1, ToTask::NotifyCheckpointComplete { checkpoint_id: 5 }).await;

    // Its final checkpoint completed, but its upstream has not finished: it still takes part
    // (here through a direct trigger, as the coordinator sends once every source finished).
    h.control(1, trigger(6)).await;
    assert!(matches!(h.next_checkpoint_report().await, TaskMessage::Acknowledge { checkpoint_id: 6, .. }));
    assert_eq!(h.monitor.current_state(), TaskState::Finishing);

    h.send(0, StreamElement::EndOfInput).await;
    h.send(1, StreamElement::EndOfInput).await;
    assert_eq!(tokio::time::timeout(WAIT, h.handle).await.unwrap().unwrap(), TaskOutcome::Finished);
}

#[tokio::test]
async fn a_record_after_the_end_of_data_fails_the_task() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let h = counter_harness(CheckpointStorage::new(dir.path(), "job"), false, None);
    h.wait_running().await;
    h.send(0, StreamElement::EndOfData).await;
    h.send(0, StreamElement::Record(rec(1, 1))).await;
    match tokio::time::timeout(WAIT, h.handle).await.unwrap().unwrap() {
        TaskOutcome::Failed(cause) => assert!(cause.contains("after its end of data"), "{cause}"),
        other => panic!("{other:?}"),
    }
}
