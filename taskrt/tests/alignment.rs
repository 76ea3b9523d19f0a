//! Barrier alignment, cancel markers and sync savepoints, observed on one task's channels.

mod common;

use std::time::Duration;

use cairn_protocol::checkpoint::CheckpointKind;
use cairn_protocol::messages::{CheckpointOptions, DeclineReason, TaskMessage, ToTask};
use cairn_taskrt::exchange::{Barrier, StreamElement};
use cairn_taskrt::state::storage::CheckpointStorage;
use common::*;

fn barrier(id: u64) -> StreamElement {
    StreamElement::Barrier(Barrier {
        checkpoint_id: id,
        timestamp_ms: 0,
        options: CheckpointOptions::checkpoint(),
    })
}

fn pass_through(dir: &std::path::Path, inputs: usize) -> Harness {
    let log = CallLog::default();
    let mut o = HarnessOptions::new(
        CheckpointStorage::new(dir, "job"),
        vec![("op".into(), Box::new(Recorder { name: "op".into(), log }))],
    );
    o.inputs = inputs;
    spawn_task(o)
}

fn record_of(e: &StreamElement) -> Option<u64> {
    match e {
        StreamElement::Record(r) => Some(r.seq),
        _ => None,
    }
}

#[tokio::test]
async fn three_inputs_with_interleaved_barriers_align_and_newer_barrier_subsumes_older() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let mut h = pass_through(dir.path(), 3);
    h.wait_running().await;

    // Channel 0 delivers its barrier first; what follows it on channel 0 must wait.
    h.send(0, StreamElement::Record(rec(1, 1))).await;
    h.send(0, barrier(1)).await;
    h.send(0, StreamElement::Record(rec(1, 100))).await;
    h.send(1, StreamElement::Record(rec(2, 2))).await;
    h.send(1, barrier(1)).await;
    h.send(2, StreamElement::Record(rec(3, 3))).await;
    h.send(2, barrier(1)).await;

    let mut before = Vec::new();
    loop {
        match h.next_output().await {
            StreamElement::Barrier(b) => {
                assert_eq!(b.checkpoint_id, 1);
                break;
            }
            e => before.push(record_of(&e).expect("record")),
        }
    }
    before.sort_unstable();
    assert_eq!(
        before,
        vec![1, 2, 3],
        "pre-barrier records of all inputs precede the barrier; 100 is held back"
    );
    assert_eq!(record_of(&h.next_output().await), Some(100), "the parked record follows the barrier");
    match h.next_checkpoint_report().await {
        TaskMessage::Acknowledge { checkpoint_id: 1, metrics, .. } => assert!(metrics.sync_ms < 10_000),
        other => panic!("expected ack of 1, got {other:?}"),
    }

    // Interleaved: checkpoint 2 starts on channel 0, checkpoint 3 arrives on channel 1.
    h.send(0, barrier(2)).await;
    h.send(1, barrier(3)).await;
    match h.next_checkpoint_report().await {
        TaskMessage::Decline { checkpoint_id: 2, reason: DeclineReason::Subsumed { newer: 3 }, .. } => {}
        other => panic!("expected decline of 2, got {other:?}"),
    }
    assert_eq!(h.next_output().await, StreamElement::CancelMarker(2));
    h.send(2, barrier(2)).await; // stale: dropped
    h.send(0, barrier(3)).await;
    h.send(2, barrier(3)).await;
    match h.next_output().await {
        StreamElement::Barrier(b) => assert_eq!(b.checkpoint_id, 3),
        other => panic!("expected barrier 3, got {other:?}"),
    }
    match h.next_checkpoint_report().await {
        TaskMessage::Acknowledge { checkpoint_id: 3, .. } => {}
        other => panic!("expected ack of 3, got {other:?}"),
    }
    h.control(1, ToTask::Cancel).await;
    assert_eq!(h.handle.await.unwrap(), cairn_taskrt::task::TaskOutcome::Canceled);
}

#[tokio::test]
async fn cancel_marker_aborts_alignment_declines_and_is_forwarded() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let mut h = pass_through(dir.path(), 2);
    h.wait_running().await;
    h.send(0, barrier(4)).await;
    h.send(0, StreamElement::Record(rec(1, 7))).await;
    h.send(1, StreamElement::CancelMarker(4)).await;
    match h.next_checkpoint_report().await {
        TaskMessage::Decline { checkpoint_id: 4, reason: DeclineReason::CanceledUpstream, .. } => {}
        other => panic!("expected decline of 4, got {other:?}"),
    }
    assert_eq!(h.next_output().await, StreamElement::CancelMarker(4));
    assert_eq!(record_of(&h.next_output().await), Some(7), "released after the abort");
    // The late barrier of the canceled checkpoint is dropped; the next checkpoint works.
    h.send(1, barrier(4)).await;
    h.send(0, barrier(5)).await;
    h.send(1, barrier(5)).await;
    match h.next_output().await {
        StreamElement::Barrier(b) => assert_eq!(b.checkpoint_id, 5, "barrier 4 must not be forwarded"),
        other => panic!("expected barrier 5, got {other:?}"),
    }
    h.control(1, ToTask::Cancel).await;
    h.handle.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn sync_savepoint_blocks_input_until_notified_complete() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let mut h = pass_through(dir.path(), 1);
    h.wait_running().await;
    let options = CheckpointOptions {
        kind: CheckpointKind::SyncSavepoint,
        drain: false,
        target_location: None,
        unaligned_after_ms: None,
    };
    h.send(0, StreamElement::Barrier(Barrier { checkpoint_id: 9, timestamp_ms: 0, options })).await;
    assert!(matches!(h.next_output().await, StreamElement::Barrier(_)));
    assert!(matches!(h.next_checkpoint_report().await, TaskMessage::Acknowledge { checkpoint_id: 9, .. }));
    h.send(0, StreamElement::Record(rec(1, 1))).await;
    // Paused clock: this sleep returns only once every task is idle, so the record had every
    // chance to be processed.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let processed = cairn_taskrt::metrics::TaskCounters::get(&h.monitor.counters.records_in);
    assert_eq!(processed, 0, "no input may be processed during a synchronous savepoint");
    assert!(h.output.try_recv().is_err());
    h.control(1, ToTask::NotifyCheckpointComplete { checkpoint_id: 9 }).await;
    assert_eq!(record_of(&h.next_output().await), Some(1), "input resumes after completion");
    h.control(1, ToTask::Cancel).await;
    h.handle.await.unwrap();
}
