//! Corrupt records are errors, never "absent" or "empty".
//!
//! Each test writes through the stores, drops them, damages one record directly with sled (or
//! the sled files themselves), and reopens.

mod common;

use std::path::Path;

use cairn_raft::types::Vote;
use cairn_storage::{OpenError, layout, open};
use common::*;
use openraft::storage::{RaftLogStorage, RaftStateMachine};
use openraft::{RaftLogReader, RaftSnapshotBuilder};
use tempfile::TempDir;

/// A populated node: 5 log entries, a vote, two jobs applied, and a snapshot.
async fn populate(dir: &Path) {
    let (mut log, mut sm) = open(dir).unwrap();
    let entries = vec![
        membership(1, 1, &[1]),
        normal(1, 2, register("a")),
        normal(1, 3, register("b")),
        normal(1, 4, allocate("a")),
        blank(1, 5),
    ];
    append(&mut log, entries.clone()).await;
    log.save_vote(&Vote::new(1, 1)).await.unwrap();
    sm.apply(entries).await.unwrap();
    sm.get_snapshot_builder().await.build_snapshot().await.unwrap();
}

/// [`open`] once sled released the previous handle's lock.
fn reopen(dir: &Path) -> Result<(cairn_storage::LogStore, cairn_storage::StateMachineStore), OpenError> {
    common::when_released(|| open(dir))
}

fn put(db: &sled::Db, tree: &str, key: &[u8], value: &[u8]) {
    db.open_tree(tree).unwrap().insert(key, value).unwrap();
}

fn expect_corrupt(result: Result<impl Sized, OpenError>) -> String {
    match result {
        Err(e @ OpenError::Storage { .. }) => e.to_string(),
        Err(e) => panic!("expected a storage error, got {e}"),
        Ok(_) => panic!("opening a corrupt store succeeded"),
    }
}

#[tokio::test]
async fn garbage_log_entry_is_a_read_error() {
    let dir = TempDir::new().unwrap();
    populate(dir.path()).await;
    tamper(dir.path(), |db| put(db, &layout::log_tree_name(3), &layout::log_key(3), b"\x00garbage"));

    // Only the tail is checked at open; the damaged entry is found when it is read.
    let (mut log, _sm) = reopen(dir.path()).unwrap();
    assert!(log.try_get_log_entries(1..3).await.is_ok());
    let err = log.try_get_log_entries(1..6).await.unwrap_err();
    assert!(err.to_string().contains("Read"), "{err}");
    assert!(log.try_get_log_entries(3..4).await.is_err());
    assert!(log.try_get_log_entries(..).await.is_err());
}

#[tokio::test]
async fn garbage_last_log_entry_fails_open() {
    let dir = TempDir::new().unwrap();
    populate(dir.path()).await;
    tamper(dir.path(), |db| put(db, &layout::log_tree_name(5), &layout::log_key(5), b"{\"log_id\":"));
    expect_corrupt(reopen(dir.path()));
}

#[tokio::test]
async fn entry_under_the_wrong_index_is_an_error() {
    let dir = TempDir::new().unwrap();
    populate(dir.path()).await;
    tamper(dir.path(), |db| {
        let tree = db.open_tree(layout::log_tree_name(4)).unwrap();
        let two = tree.get(layout::log_key(2)).unwrap().unwrap();
        tree.insert(layout::log_key(4), two).unwrap();
    });
    let (mut log, _sm) = reopen(dir.path()).unwrap();
    assert!(log.try_get_log_entries(4..5).await.is_err());
}

#[tokio::test]
async fn log_key_of_wrong_length_is_an_error() {
    let dir = TempDir::new().unwrap();
    populate(dir.path()).await;
    // 4 bytes sort after every 8-byte key starting with 0: it becomes the "last entry".
    let blank_json = br#"{"log_id":{"leader_id":{"term":1,"node_id":1},"index":6},"payload":"Blank"}"#;
    tamper(dir.path(), |db| put(db, &layout::log_tree_name(6), &[0, 0, 0, 6], blank_json));
    let msg = expect_corrupt(reopen(dir.path()));
    assert!(msg.contains("expected 8"), "{msg}");
}

#[tokio::test]
async fn garbage_vote_fails_open() {
    let dir = TempDir::new().unwrap();
    populate(dir.path()).await;
    tamper(dir.path(), |db| put(db, layout::RAFT_META_TREE, layout::VOTE_KEY.as_bytes(), b"\xff\xfe"));
    let msg = expect_corrupt(reopen(dir.path()));
    assert!(msg.contains("Vote"), "{msg}");
}

#[tokio::test]
async fn garbage_committed_and_purged_fail_open() {
    for key in [layout::COMMITTED_KEY, layout::LAST_PURGED_KEY] {
        let dir = TempDir::new().unwrap();
        populate(dir.path()).await;
        tamper(dir.path(), |db| put(db, layout::RAFT_META_TREE, key.as_bytes(), b"[1,2"));
        expect_corrupt(reopen(dir.path()));
    }
}

#[tokio::test]
async fn garbage_job_row_fails_open() {
    let dir = TempDir::new().unwrap();
    populate(dir.path()).await;
    tamper(dir.path(), |db| put(db, layout::SM_JOBS_TREE, b"b", b"{\"id\":\"b\"}"));
    let msg = expect_corrupt(reopen(dir.path()));
    assert!(msg.contains("StateMachine"), "{msg}");
}

#[tokio::test]
async fn job_row_under_the_wrong_key_fails_open() {
    let dir = TempDir::new().unwrap();
    populate(dir.path()).await;
    tamper(dir.path(), |db| {
        let jobs = db.open_tree(layout::SM_JOBS_TREE).unwrap();
        let a = jobs.get("a").unwrap().unwrap();
        jobs.insert("b", a).unwrap();
    });
    expect_corrupt(reopen(dir.path()));
}

#[tokio::test]
async fn garbage_applied_state_fails_open() {
    let dir = TempDir::new().unwrap();
    populate(dir.path()).await;
    tamper(dir.path(), |db| put(db, layout::SM_META_TREE, layout::APPLIED_KEY.as_bytes(), b"nope"));
    expect_corrupt(reopen(dir.path()));
}

#[tokio::test]
async fn garbage_apply_journal_fails_open() {
    for garbage in [&b"nope"[..], br#"{"applied":{}}"#, br#"{"applied":null,"rows":[["b",{"id":"b"}]]}"#] {
        let dir = TempDir::new().unwrap();
        populate(dir.path()).await;
        tamper(dir.path(), |db| put(db, layout::SM_META_TREE, layout::APPLY_JOURNAL_KEY.as_bytes(), garbage));
        let msg = expect_corrupt(reopen(dir.path()));
        assert!(msg.contains("StateMachine"), "{msg}");
    }
}

/// A journal naming a job row that does not match its id is as corrupt as such a row.
#[tokio::test]
async fn apply_journal_row_under_the_wrong_id_fails_open() {
    let dir = TempDir::new().unwrap();
    populate(dir.path()).await;
    tamper(dir.path(), |db| {
        let meta = db.open_tree(layout::SM_META_TREE).unwrap();
        let journal = meta.get(layout::APPLY_JOURNAL_KEY).unwrap().unwrap();
        let text = String::from_utf8(journal.to_vec()).unwrap();
        let a_row = db.open_tree(layout::SM_JOBS_TREE).unwrap().get("a").unwrap().unwrap();
        let a_row = String::from_utf8(a_row.to_vec()).unwrap();
        let damaged = text.replacen(r#""rows":["#, &format!(r#""rows":[["b",{a_row}],"#), 1);
        assert_ne!(damaged, text);
        meta.insert(layout::APPLY_JOURNAL_KEY, damaged.as_bytes()).unwrap();
    });
    expect_corrupt(reopen(dir.path()));
}

#[tokio::test]
async fn garbage_snapshot_meta_fails_open() {
    let dir = TempDir::new().unwrap();
    populate(dir.path()).await;
    tamper(dir.path(), |db| put(db, layout::SNAPSHOT_TREE, layout::SNAPSHOT_META_KEY.as_bytes(), b"{}"));
    expect_corrupt(reopen(dir.path()));
}

#[tokio::test]
async fn garbage_snapshot_data_is_a_read_error() {
    let dir = TempDir::new().unwrap();
    populate(dir.path()).await;
    tamper(dir.path(), |db| {
        put(db, layout::SNAPSHOT_TREE, layout::SNAPSHOT_DATA_KEY.as_bytes(), b"\x00\x01")
    });
    let (_log, mut sm) = reopen(dir.path()).unwrap();
    let err = sm.get_current_snapshot().await.unwrap_err();
    assert!(err.to_string().contains("Snapshot"), "{err}");
}

#[tokio::test]
async fn missing_snapshot_data_is_a_read_error() {
    let dir = TempDir::new().unwrap();
    populate(dir.path()).await;
    tamper(dir.path(), |db| {
        db.open_tree(layout::SNAPSHOT_TREE).unwrap().remove(layout::SNAPSHOT_DATA_KEY).unwrap();
    });
    let (_log, mut sm) = reopen(dir.path()).unwrap();
    assert!(sm.get_current_snapshot().await.is_err());
}

#[tokio::test]
async fn unknown_format_version_fails_open() {
    let dir = TempDir::new().unwrap();
    populate(dir.path()).await;
    tamper(dir.path(), |db| put(db, layout::RAFT_META_TREE, layout::FORMAT_KEY.as_bytes(), b"99"));
    match reopen(dir.path()) {
        Err(OpenError::UnsupportedFormat { found: 99, expected: layout::FORMAT_VERSION, .. }) => {}
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("opened a database of an unknown format"),
    }
}

/// Damage to sled's own files surfaces as an `OpenError`, not a panic or an empty store.
#[tokio::test]
async fn corrupt_sled_files_fail_open() {
    for file in ["conf", "db"] {
        let dir = TempDir::new().unwrap();
        populate(dir.path()).await;
        let path = dir.path().join(file);
        let len = std::fs::metadata(&path).unwrap().len() as usize;
        std::fs::write(&path, vec![0xA5; len.max(64)]).unwrap();
        match reopen(dir.path()) {
            Err(e @ (OpenError::Db { .. } | OpenError::DataLost { .. })) => eprintln!("{file}: {e}"),
            Err(e) => panic!("unexpected error for a garbage `{file}`: {e}"),
            Ok((_log, sm)) => panic!("opened a store whose `{file}` is garbage: {sm:?}"),
        }
    }
}

/// sled recreates a missing database silently; the marker file catches it.
#[tokio::test]
async fn removed_sled_files_fail_open() {
    let dir = TempDir::new().unwrap();
    populate(dir.path()).await;
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let path = entry.unwrap().path();
        if path.file_name().is_some_and(|n| n != layout::MARKER_FILE) {
            if path.is_dir() {
                std::fs::remove_dir_all(&path).unwrap();
            } else {
                std::fs::remove_file(&path).unwrap();
            }
        }
    }
    assert!(matches!(reopen(dir.path()), Err(OpenError::DataLost { .. })));
}

/// Records that each decode but contradict each other (what sled leaves behind when it drops
/// the writes after a damaged spot) fail the open.
#[tokio::test]
async fn lost_applied_state_behind_purged_log_fails_open() {
    let dir = TempDir::new().unwrap();
    populate(dir.path()).await;
    {
        let (mut log, _sm) = reopen(dir.path()).unwrap();
        log.purge(log_id(1, 3)).await.unwrap();
    }
    tamper(dir.path(), |db| {
        let meta = db.open_tree(layout::SM_META_TREE).unwrap();
        meta.remove(layout::APPLIED_KEY).unwrap();
        meta.remove(layout::APPLY_JOURNAL_KEY).unwrap();
    });
    assert!(matches!(reopen(dir.path()), Err(OpenError::Inconsistent { .. })));
}

#[tokio::test]
async fn applied_state_behind_snapshot_fails_open() {
    let dir = TempDir::new().unwrap();
    populate(dir.path()).await;
    tamper(dir.path(), |db| {
        let applied = br#"{"last_applied":{"leader_id":{"term":1,"node_id":1},"index":2},"last_membership":{"log_id":null,"membership":{"configs":[],"nodes":{}}}}"#;
        put(db, layout::SM_META_TREE, layout::APPLIED_KEY.as_bytes(), applied);
        db.open_tree(layout::SM_META_TREE).unwrap().remove(layout::APPLY_JOURNAL_KEY).unwrap();
    });
    let err = reopen(dir.path()).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err.contains("inconsistent"), "{err}");
}
