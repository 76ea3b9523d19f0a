//! Unaligned checkpoints on one task's channels: a barrier on a priority lane triggers the
//! checkpoint at once and overtakes the backlog, the records it overtook are persisted as
//! channel state and replayed on restore, and an aligned checkpoint whose alignment times out
//! turns unaligned.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use cairn_protocol::assign::{ChannelStatePart, OperatorRestore, TaskRestore};
use cairn_protocol::checkpoint::{KeyGroupRange, SubtaskState};
use cairn_protocol::messages::{CheckpointOptions, TaskMessage};
use cairn_taskrt::checkpoint::channel_state;
use cairn_taskrt::exchange::{Barrier, PriorityBarrier, StreamElement};
use cairn_taskrt::state::storage::CheckpointStorage;
use common::*;

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

fn barrier(id: u64, unaligned_after_ms: Option<u64>) -> Barrier {
    Barrier {
        checkpoint_id: id,
        timestamp_ms: now_ms(),
        options: CheckpointOptions { unaligned_after_ms, ..CheckpointOptions::checkpoint() },
    }
}

fn pass_through(storage: CheckpointStorage, inputs: usize, restore: Option<TaskRestore>) -> Harness {
    let mut o = HarnessOptions::new(
        storage,
        vec![("op".into(), Box::new(Recorder { name: "op".into(), log: CallLog::default() }))],
    );
    o.inputs = inputs;
    o.restore = restore;
    spawn_task(o)
}

/// The acknowledgement of `id` (panics on anything else).
async fn ack(h: &mut Harness, id: u64) -> (SubtaskState, cairn_protocol::checkpoint::TaskCheckpointMetrics) {
    match h.next_checkpoint_report().await {
        TaskMessage::Acknowledge { checkpoint_id, state, metrics, .. } if checkpoint_id == id => {
            (state, metrics)
        }
        other => panic!("expected the acknowledgement of {id}, got {other:?}"),
    }
}

fn seqs(records: &[cairn_taskrt::exchange::Record]) -> Vec<u64> {
    records.iter().map(|r| r.seq).collect()
}

#[tokio::test(start_paused = true)]
async fn a_back_pressured_source_answers_a_trigger_at_once() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    // Bursts of 5 records into a channel of 8.
    let mut h = spawn_task(producer(CheckpointStorage::new(dir.path(), "job"), 5, None, 8));
    h.wait_running().await;
    // Nobody reads the output: it fills. The source then waits for room for a whole burst in
    // its mailbox, not inside a send, so a trigger still reaches it.
    wait_for("the output to fill", || h.output.len() >= 5).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let options = CheckpointOptions { unaligned_after_ms: Some(0), ..CheckpointOptions::checkpoint() };
    h.control(
        1,
        cairn_protocol::messages::ToTask::TriggerCheckpoint {
            checkpoint_id: 1,
            timestamp_ms: now_ms(),
            options,
        },
    )
    .await;
    let forwarded = tokio::time::timeout(WAIT, h.output_lane.recv()).await.unwrap().unwrap();
    assert_eq!(forwarded.barrier.checkpoint_id, 1);
    assert_eq!(forwarded.records_before, h.output.len() as u64, "every record it sent precedes the barrier");
    // It acknowledges (a stateless source: nothing to store).
    let (state, _) = ack(&mut h, 1).await;
    assert!(state.operators.is_empty(), "{state:?}");
    // Reading the output lets it go on, bursts whole.
    let sent = h.output.len();
    for _ in 0..sent {
        h.next_output().await;
    }
    wait_for("the source to fill its output again", || h.output.len() >= 5).await;
}

#[tokio::test]
async fn a_priority_barrier_checkpoints_at_once_and_persists_the_records_it_overtook() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let storage = CheckpointStorage::new(dir.path(), "job");
    let mut h = pass_through(storage.clone(), 2, None);
    h.wait_running().await;

    // Channel 0's producer sent 3 records, then an unaligned barrier that overtakes them: the
    // task hears of the barrier before it has seen any of the 3.
    h.lanes[0].send(PriorityBarrier { barrier: barrier(1, Some(0)), records_before: 3 }).await.unwrap();
    // The barrier goes on downstream on the priority lane, ahead of everything.
    let forwarded = tokio::time::timeout(WAIT, h.output_lane.recv()).await.unwrap().unwrap();
    assert_eq!((forwarded.barrier.checkpoint_id, forwarded.records_before), (1, 0));
    assert!(forwarded.barrier.options.is_unaligned());

    for seq in 1..=4 {
        h.send(0, StreamElement::Record(rec(1, seq))).await;
    }
    // Channel 1: one record before its barrier (which arrives in-band), one after.
    h.send(1, StreamElement::Record(rec(2, 10))).await;
    h.send(1, StreamElement::Barrier(barrier(1, Some(0)))).await;
    h.send(1, StreamElement::Record(rec(2, 11))).await;

    let (state, metrics) = ack(&mut h, 1).await;
    let handle = state.operators["op"].channel_state.clone().expect("channel state");
    assert_eq!(handle.records, 4, "records 1-3 of channel 0 and 10 of channel 1");
    assert!(handle.file.path.starts_with("chk-1/"), "{}", handle.file.path);
    assert_eq!(metrics.channel_state_bytes, handle.file.size);
    let records =
        channel_state::read(storage.job_dir(), &[ChannelStatePart { file: handle.file.clone(), only: None }])
            .unwrap();
    let mut got = seqs(&records);
    got.sort_unstable();
    assert_eq!(got, vec![1, 2, 3, 10]);

    // Every record was processed (unaligned checkpoints never hold input back).
    let mut out = Vec::new();
    while out.len() < 6 {
        if let StreamElement::Record(r) = h.next_output().await {
            out.push(r.seq);
        }
    }
    out.sort_unstable();
    assert_eq!(out, vec![1, 2, 3, 4, 10, 11]);
}

#[tokio::test]
async fn a_restored_task_replays_its_channel_state_before_any_new_input() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let storage = CheckpointStorage::new(dir.path(), "job");
    let handle = channel_state::write(
        &storage,
        storage.job_dir(),
        "chk-5/op-0.channels".into(),
        &[rec(1, 7), rec(2, 8), rec(300, 9)],
    )
    .unwrap();
    let key_groups = KeyGroupRange::for_subtask(128, 1, 0).unwrap();
    let restore = TaskRestore {
        checkpoint_id: 5,
        base_dir: storage.job_dir().to_owned(),
        key_groups,
        operators: BTreeMap::from([(
            "op".to_owned(),
            OperatorRestore {
                channel_state: vec![ChannelStatePart { file: handle.file.clone(), only: None }],
                ..Default::default()
            },
        )]),
    };
    let mut h = pass_through(storage.clone(), 1, Some(restore));
    h.send(0, StreamElement::Record(rec(1, 100))).await;
    let mut out = Vec::new();
    while out.len() < 4 {
        if let StreamElement::Record(r) = h.next_output().await {
            out.push(r.seq);
        }
    }
    assert_eq!(out, vec![7, 8, 9, 100], "the in-flight records come first, in order");

    // A damaged channel-state file fails the restore, naming the file.
    std::fs::write(storage.job_dir().join("chk-5/op-0.channels"), b"garbage!").unwrap();
    let restore = TaskRestore {
        checkpoint_id: 5,
        base_dir: storage.job_dir().to_owned(),
        key_groups,
        operators: BTreeMap::from([(
            "op".to_owned(),
            OperatorRestore {
                channel_state: vec![ChannelStatePart { file: handle.file, only: None }],
                ..Default::default()
            },
        )]),
    };
    let h = pass_through(storage, 1, Some(restore));
    match tokio::time::timeout(WAIT, h.handle).await.unwrap().unwrap() {
        cairn_taskrt::task::TaskOutcome::Failed(cause) => {
            assert!(cause.contains("op-0.channels"), "{cause}");
        }
        other => panic!("expected a failed restore, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn an_aligned_checkpoint_turns_unaligned_when_alignment_times_out() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let mut h = pass_through(CheckpointStorage::new(dir.path(), "job"), 2, None);
    h.wait_running().await;

    // Checkpoint 1 is aligned with a 1 s timeout. Channel 0 delivers its barrier and parks;
    // channel 1's producer announced its barrier after 2 records it has not delivered yet.
    let b = barrier(1, Some(1000));
    h.send(0, StreamElement::Barrier(b.clone())).await;
    h.send(0, StreamElement::Record(rec(1, 50))).await;
    h.lanes[1].send(PriorityBarrier { barrier: b.clone(), records_before: 2 }).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(h.output_lane.try_recv().is_err(), "still aligning after 500 ms");
    assert!(h.output.try_recv().is_err(), "the parked record is held back while aligning");

    // The deadline passes: the checkpoint is taken unaligned and its barrier overtakes.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let forwarded = tokio::time::timeout(WAIT, h.output_lane.recv()).await.unwrap().unwrap();
    assert_eq!(forwarded.barrier.checkpoint_id, 1);
    assert!(forwarded.barrier.options.is_unaligned(), "turned unaligned: {forwarded:?}");
    // Channel 0 is released; channel 1's two announced records are in flight, then its barrier.
    h.send(1, StreamElement::Record(rec(2, 60))).await;
    h.send(1, StreamElement::Record(rec(2, 61))).await;
    h.send(1, StreamElement::Barrier(b)).await;
    let (state, metrics) = ack(&mut h, 1).await;
    // Aligning at 500 ms, unaligned by the deadline: 1 s after the trigger, so the alignment
    // lasted 1 s less the (wall-clock) time the barrier took to arrive.
    assert!((500..=1000).contains(&metrics.alignment_ms), "{metrics:?}");
    let handle = state.operators["op"].channel_state.clone().expect("channel state");
    assert_eq!(handle.records, 2, "the announced records of channel 1; none of channel 0");
}

#[tokio::test]
async fn savepoints_and_plain_checkpoints_stay_aligned() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let mut h = pass_through(CheckpointStorage::new(dir.path(), "job"), 2, None);
    h.wait_running().await;
    h.send(0, StreamElement::Barrier(barrier(1, None))).await;
    h.send(0, StreamElement::Record(rec(1, 5))).await;
    h.send(1, StreamElement::Record(rec(2, 6))).await;
    h.send(1, StreamElement::Barrier(barrier(1, None))).await;
    let (state, _) = ack(&mut h, 1).await;
    assert!(state.operators.get("op").is_none_or(|o| o.channel_state.is_none()));
    assert!(h.output_lane.try_recv().is_err(), "an aligned barrier travels in-band only");
}

/// Passes records through, taking `pause` for each: a slow operator.
struct Slow {
    pause: Duration,
}

impl cairn_taskrt::operator::Operator for Slow {
    fn process_record(
        &mut self,
        record: cairn_taskrt::exchange::Record,
        ctx: &mut cairn_taskrt::operator::OperatorContext<'_>,
    ) -> Result<(), cairn_taskrt::operator::OperatorError> {
        ctx.emit(record);
        Ok(())
    }

    fn throttle(&mut self) -> Option<Duration> {
        Some(self.pause)
    }
}

/// A slow task does not have to work through its backlog before it can acknowledge: the input
/// gate takes the records ahead of the barrier out of the channel and records them at once.
#[tokio::test]
async fn a_slow_task_acknowledges_without_working_through_its_backlog() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let mut o = HarnessOptions::new(
        CheckpointStorage::new(dir.path(), "job"),
        vec![("op".into(), Box::new(Slow { pause: Duration::from_millis(500) }))],
    );
    o.inputs = 1;
    let mut h = spawn_task(o);
    h.wait_running().await;
    for seq in 0..30 {
        h.send(0, StreamElement::Record(rec(1, seq))).await;
    }
    h.lanes[0].send(PriorityBarrier { barrier: barrier(1, Some(0)), records_before: 30 }).await.unwrap();
    let (state, _) = ack(&mut h, 1).await;
    let handle = state.operators["op"].channel_state.clone().expect("channel state");
    let mut processed = 0;
    while let Ok(e) = h.output.try_recv() {
        processed += u64::from(matches!(e, StreamElement::Record(_)));
    }
    // Processing all 30 takes 15 s: the acknowledgement came long before.
    assert!(processed < 30, "the backlog was worked through first ({processed} records)");
    // The in-flight records are the tail of the backlog: whatever the snapshot had not seen.
    let records = channel_state::read(
        dir.path().join("job").as_path(),
        &[ChannelStatePart { file: handle.file, only: None }],
    )
    .unwrap();
    let first = 30 - records.len() as u64;
    assert!(first <= 2, "at most the record in progress was processed before the snapshot: {first}");
    assert_eq!(seqs(&records), (first..30).collect::<Vec<_>>());
}
