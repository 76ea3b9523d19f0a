//! Everything the stores acknowledged comes back identical after the node restarts.

mod common;

use cairn_raft::model::{CommandResponse, Outcome};
use cairn_raft::types::Vote;
use cairn_storage::{LeaderTerm, open};
use common::*;
use openraft::storage::{RaftLogStorage, RaftStateMachine};
use openraft::{RaftLogReader, RaftSnapshotBuilder};
use tempfile::TempDir;

#[tokio::test]
async fn state_survives_restart() {
    let dir = TempDir::new().unwrap();

    let entries = vec![
        membership(1, 1, &[1, 2, 3]),
        blank(1, 2),
        normal(1, 3, register("wordcount")),
        normal(1, 4, allocate("wordcount")),
        normal(1, 5, allocate("wordcount")),
        normal(2, 6, register("pagerank")),
        normal(2, 7, allocate("pagerank")),
        normal(2, 8, allocate("missing")),
        normal(2, 9, allocate("wordcount")),
        blank(2, 10),
    ];

    let (before_logs, before_state, before_applied, before_snapshot, before_vote) = {
        let (mut log, mut sm) = open(dir.path()).unwrap();
        append(&mut log, entries.clone()).await;
        log.save_vote(&Vote::new(2, 1)).await.unwrap();
        log.save_committed(Some(log_id(2, 9))).await.unwrap();
        log.purge(log_id(1, 1)).await.unwrap();

        let responses = sm.apply(entries[..7].to_vec()).await.unwrap();
        assert_eq!(responses.len(), 7);
        assert_eq!(responses[3], CommandResponse(Ok(Outcome::CheckpointId { id: 1 })));
        assert_eq!(responses[4], CommandResponse(Ok(Outcome::CheckpointId { id: 2 })));
        assert_eq!(responses[6], CommandResponse(Ok(Outcome::CheckpointId { id: 1 })));

        let snapshot = sm.get_snapshot_builder().await.build_snapshot().await.unwrap();
        assert_eq!(snapshot.meta.last_log_id, Some(log_id(2, 7)));

        // Applied after the snapshot: must come back from the job rows, not the snapshot.
        let responses = sm.apply(entries[7..9].to_vec()).await.unwrap();
        assert!(responses[0].0.is_err(), "allocating for an unknown job is a rejected command");
        assert_eq!(responses[1], CommandResponse(Ok(Outcome::CheckpointId { id: 3 })));

        let reader = sm.reader();
        let wordcount = reader.job(&job_id("wordcount")).unwrap();
        assert_eq!(wordcount.next_checkpoint_id, 4);
        assert_eq!(reader.jobs().len(), 2);
        assert_eq!(reader.last_applied(), Some(log_id(2, 9)));
        assert_eq!(reader.leader_history(), [LeaderTerm { term: 1, leader_id: 1, first_index: 2 }]);

        let logs = log.try_get_log_entries(..).await.unwrap();
        let current = sm.get_current_snapshot().await.unwrap().unwrap();
        (logs, reader.data(), sm.applied_state().await.unwrap(), current, log.read_vote().await.unwrap())
    };
    assert_eq!(before_logs, entries[1..].to_vec());
    assert_eq!(before_vote, Some(Vote::new(2, 1)));

    // Everything above was dropped: reopen the same directory.
    let (mut log, mut sm) = open(dir.path()).unwrap();
    assert_eq!(log.read_vote().await.unwrap(), before_vote);
    assert_eq!(log.read_committed().await.unwrap(), Some(log_id(2, 9)));
    assert_eq!(log.try_get_log_entries(..).await.unwrap(), before_logs);
    let state = log.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 1)));
    assert_eq!(state.last_log_id, Some(log_id(2, 10)));

    assert_eq!(sm.applied_state().await.unwrap(), before_applied);
    assert_eq!(before_applied.0, Some(log_id(2, 9)));
    assert_eq!(before_applied.1.log_id(), &Some(log_id(1, 1)));
    let reader = sm.reader();
    assert_eq!(reader.data(), before_state);
    assert_eq!(reader.last_applied(), Some(log_id(2, 9)));
    assert_eq!(reader.job(&job_id("pagerank")).unwrap().next_checkpoint_id, 2);
    assert_eq!(reader.leader_history(), [LeaderTerm { term: 1, leader_id: 1, first_index: 2 }]);

    let current = sm.get_current_snapshot().await.unwrap().unwrap();
    assert_eq!(current.meta, before_snapshot.meta);
    assert_eq!(current.snapshot.get_ref(), before_snapshot.snapshot.get_ref());

    // The restarted node keeps going where it stopped; term 2's blank entry is its leader's.
    let responses = sm.apply(vec![blank(2, 10), normal(2, 11, allocate("wordcount"))]).await.unwrap();
    assert_eq!(responses[1], CommandResponse(Ok(Outcome::CheckpointId { id: 4 })));
    assert_eq!(
        sm.reader().leader_history(),
        [
            LeaderTerm { term: 2, leader_id: 1, first_index: 10 },
            LeaderTerm { term: 1, leader_id: 1, first_index: 2 }
        ]
    );

    // A new snapshot gets a fresh id even though the counter lives on disk.
    let next = sm.get_snapshot_builder().await.build_snapshot().await.unwrap();
    assert_ne!(next.meta.snapshot_id, before_snapshot.meta.snapshot_id);
    assert_eq!(next.meta.snapshot_id, "2-11-2");
}

#[tokio::test]
async fn truncated_and_fully_purged_logs_survive_restart() {
    let dir = TempDir::new().unwrap();
    {
        let (mut log, mut sm) = open(dir.path()).unwrap();
        append(&mut log, (1..=10).map(|i| blank(1, i)).collect()).await;
        sm.apply((1..=7).map(|i| blank(1, i))).await.unwrap();
        log.truncate(log_id(1, 8)).await.unwrap();
        log.purge(log_id(1, 7)).await.unwrap();
    }
    let (mut log, _sm) = open(dir.path()).unwrap();
    let state = log.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 7)));
    assert_eq!(state.last_log_id, Some(log_id(1, 7)), "all logs purged: last log id is the purge point");
    assert!(log.try_get_log_entries(..).await.unwrap().is_empty());
    assert_eq!(log.entry_count(), 0);
}

/// Lone appends (one insert each) and batched ones (one sled batch) mix in one log, and every
/// acknowledged entry comes back in order after a restart.
#[tokio::test]
async fn lone_and_batched_appends_survive_restart() {
    let dir = TempDir::new().unwrap();
    let entries: Vec<_> =
        std::iter::once(blank(1, 1)).chain((2..=40).map(|i| normal(1, i, allocate("wordcount")))).collect();
    {
        let (mut log, _sm) = open(dir.path()).unwrap();
        // 1, then 2..=4 together, then each of 5..=20 alone, then 21..=40 together.
        append(&mut log, entries[..1].to_vec()).await;
        append(&mut log, entries[1..4].to_vec()).await;
        for entry in &entries[4..20] {
            append(&mut log, vec![entry.clone()]).await;
        }
        append(&mut log, entries[20..].to_vec()).await;
        assert_eq!(log.try_get_log_entries(..).await.unwrap(), entries);
    }
    let (mut log, _sm) = open(dir.path()).unwrap();
    assert_eq!(log.try_get_log_entries(..).await.unwrap(), entries);
    assert_eq!(log.get_log_state().await.unwrap().last_log_id, Some(log_id(1, 40)));
}
