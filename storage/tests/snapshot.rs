//! Snapshots built on one node restore identical state on another.

mod common;

use cairn_raft::model::{CommandResponse, JobStatus, Outcome};
use cairn_storage::open;
use common::*;
use openraft::RaftSnapshotBuilder;
use openraft::storage::RaftStateMachine;
use tempfile::TempDir;

fn leader_entries() -> Vec<cairn_raft::types::Entry> {
    vec![
        membership(1, 1, &[1, 2, 3]),
        normal(1, 2, register("a")),
        normal(1, 3, register("b")),
        normal(1, 4, allocate("a")),
        normal(1, 5, allocate("a")),
        normal(2, 6, allocate("b")),
        normal(
            2,
            7,
            cairn_raft::model::Command::SetJobStatus { job: job_id("b"), status: JobStatus::Running },
        ),
        blank(2, 8),
    ]
}

#[tokio::test]
async fn snapshot_restores_identical_state_on_another_node() {
    let leader_dir = TempDir::new().unwrap();
    let follower_dir = TempDir::new().unwrap();
    let (_leader_log, mut leader) = open(leader_dir.path()).unwrap();
    leader.apply(leader_entries()).await.unwrap();
    let built = leader.get_snapshot_builder().await.build_snapshot().await.unwrap();
    assert_eq!(built.meta.last_log_id, Some(log_id(2, 8)));
    assert_eq!(built.meta.snapshot_id, "2-8-1");

    // The follower has state of its own that the snapshot must replace, not merge with.
    let (_follower_log, mut follower) = open(follower_dir.path()).unwrap();
    follower.apply(vec![normal(1, 1, register("stale")), normal(1, 2, register("a"))]).await.unwrap();

    let mut received = follower.begin_receiving_snapshot().await.unwrap();
    assert!(received.get_ref().is_empty());
    *received = *built.snapshot.clone();
    follower.install_snapshot(&built.meta, received).await.unwrap();

    assert_eq!(follower.reader().data(), leader.reader().data());
    assert!(follower.reader().job(&job_id("stale")).is_none());
    assert_eq!(
        follower.reader().leader_history(),
        [cairn_storage::LeaderTerm { term: 2, leader_id: 1, first_index: 8 }],
        "the leader history travels with the snapshot"
    );
    assert_eq!(follower.applied_state().await.unwrap(), leader.applied_state().await.unwrap());
    let current = follower.get_current_snapshot().await.unwrap().unwrap();
    assert_eq!(current.meta, built.meta);
    assert_eq!(current.snapshot.get_ref(), built.snapshot.get_ref());

    // Both continue identically from there.
    let next = vec![normal(2, 9, allocate("a"))];
    let from_leader = leader.apply(next.clone()).await.unwrap();
    let from_follower = follower.apply(next).await.unwrap();
    assert_eq!(from_leader, from_follower);
    assert_eq!(from_leader[0], CommandResponse(Ok(Outcome::CheckpointId { id: 3 })));

    // The installed state is on disk, rows and all.
    drop((_follower_log, follower));
    let (_log, mut reopened) = open(follower_dir.path()).unwrap();
    assert_eq!(reopened.reader().data(), leader.reader().data());
    assert_eq!(reopened.reader().leader_history(), leader.reader().leader_history());
    assert_eq!(reopened.applied_state().await.unwrap(), leader.applied_state().await.unwrap());
    assert_eq!(reopened.get_current_snapshot().await.unwrap().unwrap().meta, built.meta);
}

#[tokio::test]
async fn install_on_a_fresh_store_replaces_state() {
    let leader_dir = TempDir::new().unwrap();
    let (_l, mut leader) = open(leader_dir.path()).unwrap();
    leader.apply(leader_entries()).await.unwrap();
    let built = leader.get_snapshot_builder().await.build_snapshot().await.unwrap();

    let dir = TempDir::new().unwrap();
    let (_log, mut fresh) = open(dir.path()).unwrap();
    assert_eq!(fresh.applied_state().await.unwrap().0, None);
    assert!(fresh.get_current_snapshot().await.unwrap().is_none());
    fresh.install_snapshot(&built.meta, built.snapshot.clone()).await.unwrap();

    let reader = fresh.reader();
    assert_eq!(reader.last_applied(), Some(log_id(2, 8)));
    assert_eq!(reader.jobs().len(), 2);
    assert_eq!(reader.job(&job_id("a")).unwrap().next_checkpoint_id, 3);
    assert_eq!(reader.job(&job_id("b")).unwrap().status, JobStatus::Running);
    assert_eq!(reader.last_membership(), built.meta.last_membership);
}

#[tokio::test]
async fn snapshot_whose_content_contradicts_its_metadata_is_rejected() {
    let leader_dir = TempDir::new().unwrap();
    let (_l, mut leader) = open(leader_dir.path()).unwrap();
    leader.apply(leader_entries()).await.unwrap();
    let built = leader.get_snapshot_builder().await.build_snapshot().await.unwrap();

    let dir = TempDir::new().unwrap();
    let (_log, mut fresh) = open(dir.path()).unwrap();
    let mut meta = built.meta.clone();
    meta.last_log_id = Some(log_id(2, 9));
    assert!(fresh.install_snapshot(&meta, built.snapshot.clone()).await.is_err());
    let garbage = Box::new(std::io::Cursor::new(b"not json".to_vec()));
    assert!(fresh.install_snapshot(&built.meta, garbage).await.is_err());
    // Nothing changed.
    assert_eq!(fresh.reader().last_applied(), None);
    assert!(fresh.get_current_snapshot().await.unwrap().is_none());
}
