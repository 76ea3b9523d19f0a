//! Everything the stores acknowledged comes back identical after the node restarts.

mod common;

use cairn_raft::model::{Command, CommandResponse, JobStatus, Outcome};
use cairn_raft::types::Vote;
use cairn_storage::{LeaderTerm, layout, open};
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

/// An apply writes its journal first and its rows after it: a crash that kept the journal but
/// lost rows written after it (or kept older ones) loses nothing, because the open lays the
/// journal over the rows.
#[tokio::test]
async fn rows_lost_after_the_apply_journal_come_back_from_it() {
    let dir = TempDir::new().unwrap();
    let older_a = {
        let (_log, mut sm) = open(dir.path()).unwrap();
        sm.apply(vec![membership(1, 1, &[1]), normal(1, 2, register("a"))]).await.unwrap();
        let older_a = sm.reader().job(&job_id("a")).unwrap();
        // The last apply: a new leader, "a" advanced, "b" registered, "c" registered and gone.
        let responses = sm
            .apply(vec![
                blank(2, 3),
                normal(2, 4, allocate("a")),
                normal(2, 5, register("b")),
                normal(2, 6, register("c")),
                normal(2, 7, Command::SetJobStatus { job: job_id("c"), status: JobStatus::Canceled }),
                normal(2, 8, Command::RemoveJob { job: job_id("c") }),
            ])
            .await
            .unwrap();
        assert!(responses.iter().all(|r| r.0.is_ok()), "{responses:?}");
        older_a
    };
    tamper(dir.path(), |db| {
        let jobs = db.open_tree(layout::SM_JOBS_TREE).unwrap();
        jobs.insert("a", serde_json::to_vec(&older_a).unwrap()).unwrap();
        jobs.remove("b").unwrap();
        // A row the journal removes, still present.
        let renamed = String::from_utf8(jobs.get("a").unwrap().unwrap().to_vec())
            .unwrap()
            .replace(r#""id":"a""#, r#""id":"c""#);
        jobs.insert("c", renamed.as_bytes()).unwrap();
        db.open_tree(layout::SM_META_TREE).unwrap().remove(layout::LEADERS_KEY).unwrap();
    });
    let (_log, sm) = open(dir.path()).unwrap();
    let reader = sm.reader();
    assert_eq!(reader.job(&job_id("a")).unwrap().next_checkpoint_id, 2, "a's lost row came back");
    assert!(reader.job(&job_id("b")).is_some(), "b's lost row came back");
    assert!(reader.job(&job_id("c")).is_none(), "c's removal came back");
    assert_eq!(reader.last_applied(), Some(log_id(2, 8)));
    assert_eq!(reader.leader_history(), [LeaderTerm { term: 2, leader_id: 1, first_index: 3 }]);
}

/// Installing a snapshot removes the journal of the applies before it: opening the store
/// afterwards shows the snapshot's state, not the snapshot with an older apply laid over it.
#[tokio::test]
async fn an_installed_snapshot_replaces_the_apply_journal() {
    let other = TempDir::new().unwrap();
    let snapshot = {
        let (_log, mut sm) = open(other.path()).unwrap();
        sm.apply(vec![membership(1, 1, &[1]), normal(1, 2, register("s")), normal(1, 3, allocate("s"))])
            .await
            .unwrap();
        sm.get_snapshot_builder().await.build_snapshot().await.unwrap()
    };
    let dir = TempDir::new().unwrap();
    {
        let (_log, mut sm) = open(dir.path()).unwrap();
        sm.apply(vec![membership(1, 1, &[1]), normal(1, 2, register("a"))]).await.unwrap();
        sm.install_snapshot(&snapshot.meta, snapshot.snapshot).await.unwrap();
    }
    let (_log, sm) = open(dir.path()).unwrap();
    let reader = sm.reader();
    assert_eq!(reader.jobs().iter().map(|j| j.id.to_string()).collect::<Vec<_>>(), ["s"]);
    assert_eq!(reader.job(&job_id("s")).unwrap().next_checkpoint_id, 2);
    assert_eq!(reader.last_applied(), Some(log_id(1, 3)));
}

/// A database written by a build of format 1 (rows and applied state written together, no
/// journal) opens with its state and is marked format 2 before anything is applied.
#[tokio::test]
async fn a_format_1_database_opens_and_is_upgraded() {
    let dir = TempDir::new().unwrap();
    {
        let (_log, mut sm) = open(dir.path()).unwrap();
        sm.apply(vec![membership(1, 1, &[1]), normal(1, 2, register("a")), normal(1, 3, allocate("a"))])
            .await
            .unwrap();
    }
    let applied = br#"{"last_applied":{"leader_id":{"term":1,"node_id":1},"index":3},"last_membership":{"log_id":{"leader_id":{"term":1,"node_id":1},"index":1},"membership":{"configs":[[1]],"nodes":{"1":{"addr":"127.0.0.1:7001"}}}}}"#;
    tamper(dir.path(), |db| {
        let meta = db.open_tree(layout::SM_META_TREE).unwrap();
        meta.remove(layout::APPLY_JOURNAL_KEY).unwrap();
        meta.insert(layout::APPLIED_KEY, &applied[..]).unwrap();
        db.open_tree(layout::RAFT_META_TREE).unwrap().insert(layout::FORMAT_KEY, "1").unwrap();
    });
    {
        let (_log, sm) = open(dir.path()).unwrap();
        assert_eq!(sm.reader().job(&job_id("a")).unwrap().next_checkpoint_id, 2);
        assert_eq!(sm.reader().last_applied(), Some(log_id(1, 3)));
    }
    tamper(dir.path(), |db| {
        let format = db.open_tree(layout::RAFT_META_TREE).unwrap().get(layout::FORMAT_KEY).unwrap();
        assert_eq!(format.as_deref(), Some(layout::FORMAT_VERSION.to_string().as_bytes()));
    });
}

/// Moves a database's log back into the one tree formats 1 and 2 used, as those builds left
/// it; `keep_segments` leaves the segment trees too (a crash part way through an upgrade).
fn as_format_2(db: &sled::Db, keep_segments: bool) {
    let legacy = db.open_tree(layout::LEGACY_LOG_TREE).unwrap();
    for name in db.tree_names() {
        if !name.starts_with(layout::LOG_SEGMENT_PREFIX.as_bytes()) {
            continue;
        }
        let tree = db.open_tree(&name).unwrap();
        for row in tree.iter() {
            let (key, value) = row.unwrap();
            legacy.insert(key, value).unwrap();
        }
        if !keep_segments {
            db.drop_tree(&name).unwrap();
        }
    }
    db.open_tree(layout::RAFT_META_TREE).unwrap().insert(layout::FORMAT_KEY, "2").unwrap();
}

fn has_tree(dir: &std::path::Path, name: &str) -> bool {
    let mut found = false;
    tamper(dir, |db| found = db.tree_names().iter().any(|n| n == name.as_bytes()));
    found
}

/// A format-2 database (the log in one tree) opens with its whole log moved into segment
/// trees, also when an earlier upgrade stopped part way (segments already written, old tree
/// still there) or after it recorded the new format but before it dropped the old tree.
#[tokio::test]
async fn a_format_2_log_moves_into_segments() {
    let last = 2 * layout::SEGMENT_LEN + 7;
    let entries: Vec<_> = (1..=last).map(|i| blank(1, i)).collect();
    for partial in [false, true] {
        let dir = TempDir::new().unwrap();
        {
            let (mut log, mut sm) = open(dir.path()).unwrap();
            append(&mut log, entries.clone()).await;
            sm.apply(entries[..5].to_vec()).await.unwrap();
            log.purge(log_id(1, 5)).await.unwrap();
            log.purged_entries_deleted(5).await;
        }
        tamper(dir.path(), |db| as_format_2(db, partial));
        assert!(has_tree(dir.path(), layout::LEGACY_LOG_TREE));
        {
            let (mut log, _sm) = open(dir.path()).unwrap();
            let read = log.try_get_log_entries(..).await.unwrap();
            assert_eq!(read, entries[5..].to_vec(), "partial: {partial}");
            let state = log.get_log_state().await.unwrap();
            assert_eq!(state.last_log_id, Some(log_id(1, last)));
            assert_eq!(state.last_purged_log_id, Some(log_id(1, 5)));
        }
        assert!(!has_tree(dir.path(), layout::LEGACY_LOG_TREE), "the old tree is dropped");
        tamper(dir.path(), |db| {
            let format = db.open_tree(layout::RAFT_META_TREE).unwrap().get(layout::FORMAT_KEY).unwrap();
            assert_eq!(format.as_deref(), Some(layout::FORMAT_VERSION.to_string().as_bytes()));
        });
    }
    // Format 3 recorded, old tree not yet dropped: it is dropped, the segments are the log.
    let dir = TempDir::new().unwrap();
    {
        let (mut log, _sm) = open(dir.path()).unwrap();
        append(&mut log, entries.clone()).await;
    }
    tamper(dir.path(), |db| {
        as_format_2(db, true);
        let format = layout::FORMAT_VERSION.to_string();
        db.open_tree(layout::RAFT_META_TREE).unwrap().insert(layout::FORMAT_KEY, format.as_bytes()).unwrap();
    });
    {
        let (mut log, _sm) = open(dir.path()).unwrap();
        assert_eq!(log.try_get_log_entries(..).await.unwrap(), entries);
    }
    assert!(!has_tree(dir.path(), layout::LEGACY_LOG_TREE));
}

/// A tree named like a log segment whose number does not parse stops the open, naming it:
/// its entries would otherwise be invisible to every read.
#[tokio::test]
async fn a_misnamed_segment_tree_fails_open() {
    let dir = TempDir::new().unwrap();
    {
        let (mut log, _sm) = open(dir.path()).unwrap();
        append(&mut log, vec![blank(1, 1)]).await;
    }
    tamper(dir.path(), |db| {
        let name = format!("{}zz", layout::LOG_SEGMENT_PREFIX);
        db.open_tree(name).unwrap().insert(layout::log_key(2), b"x".to_vec()).unwrap();
    });
    let err = open(dir.path()).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err.contains("raft_log.zz") && err.contains("16 hex digits"), "{err}");
}

/// Opening waits (bounded) for a handle that is still letting go of the database's lock, as
/// when a replica is stopped and started again in one process; a handle that keeps it makes
/// the open fail, naming the lock.
#[tokio::test]
async fn opening_waits_for_the_lock_bounded() {
    let dir = TempDir::new().unwrap();
    let held = open(dir.path()).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let releaser = std::thread::spawn(move || {
        let _ = rx.recv();
        std::thread::sleep(std::time::Duration::from_millis(300));
        drop(held);
    });
    tx.send(()).unwrap();
    let path = dir.path().to_owned();
    let reopened = tokio::task::spawn_blocking(move || open(&path)).await.unwrap();
    assert!(reopened.is_ok(), "{:?}", reopened.err());
    releaser.join().unwrap();
    let kept = reopened.unwrap();

    let path = dir.path().to_owned();
    let refused = tokio::task::spawn_blocking(move || open(&path)).await.unwrap();
    let Err(error) = refused else { panic!("opened a database that is still open") };
    assert!(error.to_string().contains("could not acquire lock"), "{error}");
    drop(kept);
}
