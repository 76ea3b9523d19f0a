//! Cairn's own durable writes on crashfs: what each acknowledges must survive a power loss.
//!
//! - the Raft stores (`cairn-storage`): a child process appends log entries, saves votes and
//!   applies commands, printing what each acknowledged; it is killed (SIGKILL) at an arbitrary
//!   point, the power is cut, and the store must open with every acknowledged entry and vote
//!   (the data directory, created two levels below the mountpoint, included), and with the
//!   acknowledged applied state once its log tail is re-applied (apply does not flush);
//! - a keyed operator's snapshots as the asynchronous part writes them (one state file per
//!   checkpoint, into a new `chk-<id>/` or a new `shared/`, each fsynced once, then each
//!   directory once), restored after the power loss;
//! - `_metadata` written into directories that do not exist yet;
//! - the demo sink's pending files and commits.
//!
//! The child is this test binary run again (`--exact <test>`) with `CAIRN_DURABILITY_CHILD_DIR`
//! set: the test function then plays the child and never returns.

#![cfg(feature = "mount-tests")]

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use cairn_crashfs::{MountOptions, TornWrites};
use cairn_raft::model::{Command as RaftCommand, CommandResponse, JobId, JobSpec, Outcome};
use cairn_raft::types::{Entry, LogId, Vote};
use cairn_storage::StorageOptions;
use common::{Mounted, mount, mount_with};
use nix::fcntl::{Flock, FlockArg};
use openraft::RaftLogReader;
use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::{CommittedLeaderId, EntryPayload};

const CHILD_DIR: &str = "CAIRN_DURABILITY_CHILD_DIR";
const CHILD_BACKGROUND_FLUSH: &str = "CAIRN_DURABILITY_CHILD_BACKGROUND_FLUSH";
const JOB: &str = "j";
/// Entries per acknowledged batch.
const BATCH: u64 = 5;
/// Acknowledgements to wait for before the kill.
const ACKS_BEFORE_KILL: usize = 10;

fn job() -> JobId {
    JobId::new(JOB).expect("valid job id")
}

fn entry(index: u64, command: RaftCommand) -> Entry {
    Entry { log_id: LogId::new(CommittedLeaderId::new(1, 1), index), payload: EntryPayload::Normal(command) }
}

fn options(background_flush: bool) -> StorageOptions {
    // Without sled's background flusher (which fsyncs every 500 ms), only the store's own
    // fsyncs make anything durable: a missing one shows at once.
    StorageOptions { flush_every_ms: background_flush.then_some(500), ..StorageOptions::default() }
}

/// What the child acknowledged last: log index, vote term, last allocated id.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
struct Acked {
    index: u64,
    term: u64,
    id: u64,
}

/// Plays the child if this process is one: appends, votes, applies, acknowledges, forever.
fn child_if_asked() {
    let Some(dir) = std::env::var_os(CHILD_DIR) else {
        return;
    };
    let dir = PathBuf::from(dir);
    let background = std::env::var_os(CHILD_BACKGROUND_FLUSH).is_some();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("child: runtime");
    runtime.block_on(async move {
        let (mut log, mut sm) = cairn_storage::open_with(&dir, &options(background)).expect("child: open");
        let mut index =
            log.get_log_state().await.expect("child: log state").last_log_id.map_or(0, |l| l.index);
        let mut term = log.read_vote().await.expect("child: vote").map_or(0, |v| v.leader_id().term);
        if index == 0 {
            let first = vec![entry(
                1,
                RaftCommand::RegisterJob { job: job(), name: String::new(), spec: JobSpec::default() },
            )];
            log.blocking_append(first.clone()).await.expect("child: append");
            sm.apply(first).await.expect("child: apply");
            index = 1;
        }
        let mut stdout = std::io::stdout().lock();
        loop {
            let batch: Vec<Entry> = (index + 1..=index + BATCH)
                .map(|i| entry(i, RaftCommand::AllocateCheckpointId { job: job() }))
                .collect();
            index += BATCH;
            log.blocking_append(batch.clone()).await.expect("child: append");
            term += 1;
            log.save_vote(&Vote::new(term, 1)).await.expect("child: save vote");
            let responses = sm.apply(batch).await.expect("child: apply");
            let id = match responses.last() {
                Some(CommandResponse(Ok(Outcome::CheckpointId { id }))) => *id,
                other => panic!("child: unexpected response {other:?}"),
            };
            writeln!(stdout, "acked {index} {term} {id}").expect("child: stdout");
            stdout.flush().expect("child: stdout");
        }
    });
    unreachable!("the parent kills the child");
}

fn parse_ack(line: &str) -> Option<Acked> {
    let (_, rest) = line.rsplit_once("acked ")?;
    let mut numbers = rest.split_whitespace().map(|n| n.parse::<u64>().ok());
    Some(Acked { index: numbers.next()??, term: numbers.next()??, id: numbers.next()?? })
}

/// Runs a child on `dir` until it acknowledged a few batches, kills it at an arbitrary point,
/// and returns its last acknowledgement.
fn run_child_and_kill(test: &str, dir: &Path, background_flush: bool) -> Acked {
    let exe = std::env::current_exe().expect("test binary path");
    let mut command = Command::new(exe);
    command.args([test, "--exact", "--nocapture", "--test-threads=1"]).env(CHILD_DIR, dir);
    if background_flush {
        command.env(CHILD_BACKGROUND_FLUSH, "1");
    }
    let mut child = command.stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn().expect("spawn child");
    let stdout = child.stdout.take().expect("child stdout");
    let (acks_tx, acks_rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Some(acked) = parse_ack(&line)
                && acks_tx.send(acked).is_err()
            {
                break;
            }
        }
    });
    let mut last = None;
    for _ in 0..ACKS_BEFORE_KILL {
        match acks_rx.recv_timeout(Duration::from_secs(60)) {
            Ok(acked) => last = Some(acked),
            Err(error) => {
                kill(&mut child);
                panic!("the storage child stopped acknowledging ({error}); see its stderr above");
            }
        }
    }
    std::thread::sleep(Duration::from_millis(rand::random::<u64>() % 40));
    kill(&mut child);
    reader.join().expect("reader thread");
    let last = acks_rx.try_iter().fold(last, |last, acked| Some(acked).max(last));
    last.expect("at least one acknowledgement")
}

fn kill(child: &mut Child) {
    child.kill().expect("SIGKILL the child");
    child.wait().expect("reap the child");
}

/// sled's background threads may hold its file (and its `flock`) a moment after the store is
/// dropped; the next opener must not find it still open.
fn wait_until_closed(db_file: &Path) {
    for _ in 0..500 {
        let file = std::fs::File::open(db_file).expect("open sled's db file");
        if Flock::lock(file, FlockArg::LockExclusiveNonblock).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("sled still holds {} 5 s after the store was dropped", db_file.display());
}

/// Opens the store after a power loss and returns what it holds.
fn reopen(dir: &Path) -> Acked {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let held = runtime.block_on(async {
        let (mut log, mut sm) = cairn_storage::open_with(dir, &options(false))
            .unwrap_or_else(|e| panic!("the store must open after a power loss: {e}"));
        let index = log.get_log_state().await.expect("log state").last_log_id.map_or(0, |l| l.index);
        let term = log.read_vote().await.expect("vote").map_or(0, |v| v.leader_id().term);
        let (applied, _) = sm.applied_state().await.expect("applied state");
        let applied = applied.map_or(0, |a| a.index);
        assert!(applied <= index, "applied {applied} beyond the log end {index}");
        // `apply` does not flush: the state machine may come back behind the log, and the node
        // re-applies the log's tail (every entry here counts as committed), as openraft does.
        let tail = log.try_get_log_entries(applied + 1..=index).await.expect("log tail");
        assert_eq!(tail.len() as u64, index - applied, "a hole in the log after the applied entry {applied}");
        sm.apply(tail).await.expect("re-apply the log tail");
        let next = sm.reader().job(&job()).map_or(1, |j| j.next_checkpoint_id);
        Acked { index, term, id: next - 1 }
    });
    drop(runtime);
    wait_until_closed(&dir.join("db"));
    held
}

fn store_dir(fs: &Mounted) -> PathBuf {
    fs.path("cairn/node-1")
}

/// Three rounds of: a child works on the store, is killed, the power is cut; every round's
/// acknowledgements must be in the reopened store.
fn acknowledged_state_survives(test: &str, options: MountOptions, background_flush: bool) {
    let fs = mount_with(options);
    let dir = store_dir(&fs);
    for round in 0..3 {
        let acked = run_child_and_kill(test, &dir, background_flush);
        let report = fs.power_loss().expect("power loss");
        let held = reopen(&dir);
        eprintln!("round {round}: acknowledged {acked:?}, the store holds {held:?}; power loss: {report}");
        assert!(
            held.index >= acked.index,
            "round {round}: log entries lost: acknowledged {acked:?}, held {held:?}"
        );
        assert!(held.term >= acked.term, "round {round}: vote lost: acknowledged {acked:?}, held {held:?}");
        assert!(
            held.id >= acked.id,
            "round {round}: applied state lost: acknowledged {acked:?}, held {held:?}"
        );
    }
    eprintln!("{}", fs.stats());
}

#[test]
fn raft_store_keeps_what_it_acknowledged_across_power_loss() {
    child_if_asked();
    acknowledged_state_survives(
        "raft_store_keeps_what_it_acknowledged_across_power_loss",
        MountOptions::default(),
        false,
    );
}

#[test]
fn raft_store_keeps_what_it_acknowledged_across_torn_writes() {
    child_if_asked();
    let torn_writes = Some(TornWrites { seed: rand::random(), keep_probability: 0.5 });
    eprintln!("torn writes: {torn_writes:?}");
    acknowledged_state_survives(
        "raft_store_keeps_what_it_acknowledged_across_torn_writes",
        MountOptions { torn_writes, ..MountOptions::default() },
        true,
    );
}

#[test]
fn a_new_raft_store_is_not_mistaken_for_a_damaged_one_after_power_loss() {
    child_if_asked();
    // Created and initialized, then the power goes before anything was acknowledged.
    let fs = mount();
    let dir = store_dir(&fs);
    drop(cairn_storage::open_with(&dir, &options(false)).expect("create the store"));
    wait_until_closed(&dir.join("db"));
    fs.power_loss().expect("power loss");
    assert_eq!(reopen(&dir), Acked::default());
}

mod files {
    use std::collections::BTreeMap;
    use std::sync::atomic::AtomicBool;

    use cairn_protocol::assign::{OperatorRestore, TaskRestore};
    use cairn_protocol::checkpoint::metadata::METADATA_VERSION;
    use cairn_protocol::checkpoint::{
        CheckpointMetadata, KeyGroupRange, SubtaskState, read_metadata, write_metadata,
        write_metadata_reusing,
    };
    use cairn_taskrt::demo::sink::{COMMITTED_DIR, PENDING_DIR, SinkConfig, TwoPhaseFileSink};
    use cairn_taskrt::exchange::Record;
    use cairn_taskrt::operator::{Operator, OperatorContext, TaskInfo};
    use cairn_taskrt::state::keyed::KeyedStateBackend;
    use cairn_taskrt::state::list::OperatorStateBackend;
    use cairn_taskrt::state::restore::load;
    use cairn_taskrt::state::snapshot::{SnapshotTarget, plan_operator, write_plan};
    use cairn_taskrt::state::storage::CheckpointStorage;

    use super::common::{mount, names};

    /// What a restore of `state` (one subtask of operator `op`, 16 key groups) loads: every
    /// key's `count`.
    fn restored_counts(storage: &CheckpointStorage, id: u64, state: &SubtaskState) -> BTreeMap<u64, u64> {
        let keyed = state.operators["op"].keyed.clone();
        let restore = TaskRestore {
            checkpoint_id: id,
            base_dir: storage.job_dir().to_owned(),
            key_groups: KeyGroupRange { start: 0, end: 15 },
            operators: BTreeMap::from([(
                "op".to_owned(),
                OperatorRestore { keyed, list_states: Vec::new(), channel_state: Vec::new() },
            )]),
        };
        let loaded = load(&restore).unwrap_or_else(|e| panic!("checkpoint {id} after the power loss: {e}"));
        let mut counts = BTreeMap::new();
        for g in &loaded.operators["op"].groups {
            for (key, v) in g.data.values.get("count").into_iter().flatten() {
                let v: [u8; 8] = v.as_slice().try_into().expect("u64 count");
                counts.insert(*key, u64::from_le_bytes(v));
            }
        }
        counts
    }

    #[test]
    fn keyed_snapshots_survive_in_new_directories() {
        let fs = mount();
        let storage = CheckpointStorage::new(fs.path("checkpoints"), "job");
        let mut keyed = KeyedStateBackend::new(16, KeyGroupRange { start: 0, end: 15 });
        for key in 0..100 {
            keyed.put_value_u64("count", key, 1).expect("put");
        }
        let lists = OperatorStateBackend::default();
        let cancel = AtomicBool::new(false);
        // Checkpoint 1 full (a new `chk-1/`), 2 incremental (a new `shared/`), 3 incremental
        // after one change (referencing checkpoint 2's file).
        let mut states = Vec::new();
        for (id, incremental) in [(1, false), (2, true), (3, true)] {
            if id == 3 {
                keyed.put_value_u64("count", 7, 2).expect("put");
            }
            let target = SnapshotTarget::checkpoint(&storage, id, incremental);
            let plan = plan_operator("op", 0, Some(&keyed), &lists, &target);
            let mut written = write_plan(&storage, &target, vec![plan], &cancel).expect("snapshot");
            if let Some(uploaded) = written.uploaded.remove("op") {
                keyed.record_pending(id, uploaded);
                keyed.confirm(id);
            }
            states.push((id, written.state));
        }
        fs.power_loss().expect("power loss");
        let expected = |changed: bool| -> BTreeMap<u64, u64> {
            (0..100).map(|k| (k, if changed && k == 7 { 2 } else { 1 })).collect()
        };
        for (id, state) in states {
            assert_eq!(restored_counts(&storage, id, &state), expected(id == 3), "checkpoint {id}");
        }
    }

    fn metadata(id: u64, kind: &str, padding: usize) -> CheckpointMetadata {
        CheckpointMetadata {
            version: METADATA_VERSION,
            job: "job".into(),
            checkpoint_id: id,
            kind: kind.into(),
            trigger_time_ms: 1,
            completion_time_ms: 2,
            vertices: Default::default(),
            subtasks: Default::default(),
            master_states: BTreeMap::from([("hook".to_owned(), vec![7; padding])]),
        }
    }

    #[test]
    fn metadata_in_a_new_directory_survives() {
        let fs = mount();
        let path = fs.path("savepoints/savepoint-job-7/_metadata");
        let meta = metadata(7, "savepoint", 0);
        let pointer = write_metadata(&path, &meta).expect("write _metadata");
        fs.power_loss().expect("power loss");
        assert_eq!(read_metadata(&pointer).expect("_metadata after the power loss"), meta);
    }

    /// The leader's reuse of a subsumed checkpoint's directory: kept as a spare (a rename, not
    /// synced), claimed (another rename), overwritten with shorter content and renamed into
    /// place. The new `_metadata` survives whole; the old checkpoint's name does not come back.
    #[test]
    fn metadata_in_a_reused_directory_survives() {
        let fs = mount();
        let job = fs.path("checkpoints/job");
        write_metadata(&job.join("chk-1/_metadata"), &metadata(1, "checkpoint", 4096)).expect("write chk-1");
        std::fs::rename(job.join("chk-1"), job.join(".spare-chk-1")).expect("keep a spare");
        std::fs::rename(job.join(".spare-chk-1"), job.join(".spare-chk-2")).expect("claim it");
        let meta = metadata(2, "checkpoint", 10);
        let pointer = write_metadata_reusing(&job.join(".spare-chk-2"), &job.join("chk-2/_metadata"), &meta)
            .expect("write chk-2 into the spare");
        fs.power_loss().expect("power loss");
        assert_eq!(read_metadata(&pointer).expect("_metadata after the power loss"), meta);
        assert_eq!(names(&job), ["chk-2"]);
    }

    fn info() -> TaskInfo {
        TaskInfo {
            job: "job".into(),
            vertex: "sink".into(),
            subtask: 0,
            parallelism: 1,
            max_parallelism: 8,
            attempt: 1,
        }
    }

    #[test]
    fn sink_commits_survive_and_leave_no_pending_copy() {
        let fs = mount();
        let output = fs.path("out");
        let info = info();
        let config = SinkConfig { output_dir: output.clone(), max_records_per_sec: None };
        let mut sink = TwoPhaseFileSink::new(config, &info);
        let mut keyed =
            KeyedStateBackend::new(8, cairn_protocol::checkpoint::KeyGroupRange { start: 0, end: 7 });
        let mut lists = OperatorStateBackend::default();
        let mut out = Vec::new();
        let mut ctx = OperatorContext::new(&info, "sink", &mut keyed, &mut lists, &mut out);
        sink.initialize_state(&mut ctx, None).expect("initialize");
        sink.process_record(Record { key: 1, value: 1, seq: 1 }, &mut ctx).expect("record");
        sink.snapshot_state(1, &mut ctx).expect("pre-commit");
        sink.notify_checkpoint_complete(1, &mut ctx).expect("commit");
        fs.power_loss().expect("power loss");
        let committed = names(&output.join(COMMITTED_DIR));
        assert_eq!(committed.len(), 1, "the committed file was lost: {committed:?}");
        assert!(names(&output.join(PENDING_DIR)).is_empty(), "a committed file is pending again");
    }
}
