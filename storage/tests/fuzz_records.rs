//! Structure-aware fuzzing of what a replica reads back from its disk and installs from its
//! peers: the sled records (log entries, vote, committed and purged log ids, applied state,
//! snapshot metadata, job rows, format and sequence numbers) and the state-machine snapshot
//! payload. A damaged record must be a typed error, never a panic and never "absent"; a damaged
//! snapshot must be refused with the previous state still readable. See `docs/FUZZING.md`.

#[path = "../../protocol/tests/support/harness.rs"]
mod harness;
#[path = "../../protocol/tests/support/mutate.rs"]
mod mutate;
#[path = "../../raft/tests/support/strategies.rs"]
mod strategies;

mod common;

use std::cell::RefCell;
use std::io::Cursor;
use std::path::Path;

use cairn_raft::model::{JobId, JobRecord, StateMachineData};
use cairn_raft::types::{Entry, LogId, SnapshotMeta, StoredMembership, Vote};
use cairn_storage::{LogStore, OpenError, StateMachineStore, layout, open};
use common::*;
use harness::{Verdict, config, config_divided, fuzz, verdict};
use mutate::{Mutation, assert_json_bytes_stable, case, check_json, mutated};
use openraft::storage::{RaftLogStorage, RaftStateMachine};
use openraft::{RaftLogReader, RaftSnapshotBuilder};
use proptest::prelude::*;
use serde::{Deserialize, Serialize};
use serde_json::json;
use strategies::{entry, job_record, small_u64, snapshot_meta, state, stored_membership, vote};
use tempfile::TempDir;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("tokio runtime: {e}"))
}

// ---------------------------------------------------------------------------------------------
// 5. sled records, as the stores decode them (serde JSON of these exact types)
// ---------------------------------------------------------------------------------------------

/// The value under `layout::APPLIED_KEY`, with the field names the store writes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Applied {
    last_applied: Option<LogId>,
    last_membership: StoredMembership,
}

#[test]
fn log_entries_decode_or_are_refused_never_panic() {
    fuzz("log entry", config(), case(entry), |(e, donor, m)| {
        let valid = serde_json::to_vec(&e).unwrap_or_default();
        let back: Entry =
            serde_json::from_slice(&valid).unwrap_or_else(|err| panic!("valid entry refused: {err}"));
        prop_assert_eq!(serde_json::to_vec(&back).ok(), Some(valid));
        let decoded = serde_json::from_slice::<Entry>(&mutated(&e, &donor, &m)).ok();
        if let Some(entry) = &decoded {
            assert_json_bytes_stable(entry);
        }
        Ok(verdict(&decoded))
    });
}

#[test]
fn votes_decode_or_are_refused_never_panic() {
    fuzz("vote", config(), case(vote), |(v, donor, m)| {
        Ok(verdict(&check_json::<Vote>(&v, &mutated(&v, &donor, &m))))
    });
}

#[test]
fn committed_and_purged_log_ids_decode_or_are_refused_never_panic() {
    let id = || proptest::option::of(strategies::log_id());
    fuzz("log id", config(), case(id), |(l, donor, m)| {
        Ok(verdict(&check_json::<Option<LogId>>(&l, &mutated(&l, &donor, &m))))
    });
}

#[test]
fn applied_states_decode_or_are_refused_never_panic() {
    let applied = || {
        (proptest::option::of(strategies::log_id()), stored_membership())
            .prop_map(|(last_applied, last_membership)| Applied { last_applied, last_membership })
    };
    fuzz("applied state", config(), case(applied), |(a, donor, m)| {
        Ok(verdict(&check_json(&a, &mutated(&a, &donor, &m))))
    });
}

#[test]
fn snapshot_metas_decode_or_are_refused_never_panic() {
    fuzz("snapshot meta", config(), case(snapshot_meta), |(s, donor, m)| {
        Ok(verdict(&check_json::<SnapshotMeta>(&s, &mutated(&s, &donor, &m))))
    });
}

#[test]
fn job_rows_decode_or_are_refused_never_panic() {
    let row = || job_record(JobId::new("a").unwrap_or_else(|e| panic!("{e}")));
    fuzz("job row", config(), case(row), |(j, donor, m)| {
        Ok(verdict(&check_json::<JobRecord>(&j, &mutated(&j, &donor, &m))))
    });
}

#[test]
fn format_and_sequence_numbers_decode_or_are_refused_never_panic() {
    fuzz("format / snapshot seq", config(), case(small_u64), |(n, donor, m)| {
        Ok(verdict(&check_json::<u64>(&n, &mutated(&n, &donor, &m))))
    });
}

// ---------------------------------------------------------------------------------------------
// 3. Snapshots installed from a peer
// ---------------------------------------------------------------------------------------------

/// The snapshot payload format (`SnapshotPayload`, pinned by the golden test in `codec.rs`).
#[derive(Debug, Deserialize)]
struct Payload {
    version: u32,
    last_applied: Option<LogId>,
    last_membership: StoredMembership,
    data: StateMachineData,
}

/// A payload in that format.
fn payload(meta: &SnapshotMeta, data: &StateMachineData) -> serde_json::Value {
    json!({
        "version": 1,
        "last_applied": meta.last_log_id,
        "last_membership": meta.last_membership,
        "data": data,
    })
}

/// A store holding a vote, a few applied entries and a snapshot of them.
fn populated(rt: &tokio::runtime::Runtime, dir: &Path) -> (LogStore, StateMachineStore) {
    rt.block_on(async {
        let (mut log, mut sm) = open(dir).unwrap_or_else(|e| panic!("open: {e}"));
        let entries = vec![membership(1, 1, &[1]), normal(1, 2, register("a")), normal(1, 3, allocate("a"))];
        append(&mut log, entries.clone()).await;
        log.save_vote(&Vote::new(1, 1)).await.unwrap_or_else(|e| panic!("vote: {e}"));
        sm.apply(entries).await.unwrap_or_else(|e| panic!("apply: {e}"));
        sm.get_snapshot_builder().await.build_snapshot().await.unwrap_or_else(|e| panic!("snapshot: {e}"));
        (log, sm)
    })
}

#[derive(Debug, Clone)]
enum SnapshotDamage {
    /// The payload damaged, the metadata as sent.
    Payload(Mutation),
    /// The metadata damaged too (when it still decodes), so payload and metadata disagree.
    Both(Mutation, Mutation),
}

#[test]
fn damaged_snapshots_are_refused_and_the_previous_state_stays_readable() {
    let rt = runtime();
    let dir = TempDir::new().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let (log, sm) = populated(&rt, dir.path());
    let sm = RefCell::new(sm);
    let damage = prop_oneof![
        3 => mutate::mutation().prop_map(SnapshotDamage::Payload),
        1 => (mutate::mutation(), mutate::mutation()).prop_map(|(a, b)| SnapshotDamage::Both(a, b)),
    ];
    let strategy = (snapshot_meta(), state(), state(), damage);
    fuzz("snapshot install", config(), strategy, |(meta, data, donor, damage)| {
        let mut sm = sm.borrow_mut();
        let before = (sm.reader().data(), sm.reader().last_applied(), sm.reader().last_membership());
        let current = rt.block_on(sm.get_current_snapshot()).ok().flatten().map(|s| s.meta);

        let doc = payload(&meta, &data);
        let donor = payload(&meta, &donor);
        let (meta, bytes) = match &damage {
            SnapshotDamage::Payload(m) => (meta.clone(), mutated(&doc, &donor, m)),
            SnapshotDamage::Both(m, mm) => {
                let meta_bytes = mutated(&meta, &meta, mm);
                let meta = serde_json::from_slice::<SnapshotMeta>(&meta_bytes).unwrap_or(meta);
                (meta, mutated(&doc, &donor, m))
            }
        };
        let mut received = rt.block_on(sm.begin_receiving_snapshot()).unwrap_or_else(|e| panic!("{e}"));
        *received = Cursor::new(bytes.clone());
        let installed = rt.block_on(sm.install_snapshot(&meta, received));

        // Installed or not, the store answers every read.
        let snapshot = rt.block_on(sm.get_current_snapshot());
        prop_assert!(snapshot.is_ok(), "current snapshot unreadable: {:?}", snapshot.err());
        let after = (sm.reader().data(), sm.reader().last_applied(), sm.reader().last_membership());
        match installed {
            Ok(()) => {
                // Only what decodes to this exact format and agrees with its metadata installs.
                let decoded: Payload =
                    serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("installed garbage: {e}"));
                let data = decoded.data;
                prop_assert_eq!(decoded.version, 1);
                prop_assert_eq!(decoded.last_applied, meta.last_log_id);
                prop_assert_eq!(&decoded.last_membership, &meta.last_membership);
                prop_assert_eq!(&after.0, &data);
                prop_assert_eq!(after.1, meta.last_log_id);
                prop_assert_eq!(&after.2, &meta.last_membership);
                prop_assert_eq!(snapshot.ok().flatten().map(|s| s.meta), Some(meta));
                for (id, job) in &data.jobs {
                    prop_assert_eq!(id, &job.id);
                }
                Ok(Verdict::Accepted)
            }
            Err(e) => {
                prop_assert!(!e.to_string().is_empty());
                prop_assert_eq!(after, before, "a refused snapshot changed the state");
                prop_assert_eq!(snapshot.ok().flatten().map(|s| s.meta), current);
                Ok(Verdict::Refused)
            }
        }
    });
    // The store that took all of this still opens.
    drop((log, sm));
    let reopened = open(dir.path());
    assert!(reopened.is_ok(), "store unreadable after the fuzzed installs: {:?}", reopened.err());
}

// ---------------------------------------------------------------------------------------------
// 5. Damaged records found when a node restarts
// ---------------------------------------------------------------------------------------------

/// Which record a case damages, and under which key it writes the damaged bytes.
#[derive(Debug, Clone)]
enum Target {
    JobRow { under_other_key: bool },
    Applied,
    Vote,
    Committed,
    LastPurged,
    Format,
    SnapshotMeta,
    SnapshotData,
    SnapshotSeq,
    LastLogEntry,
    LogKey { len: usize },
}

fn target() -> impl Strategy<Value = Target> {
    prop_oneof![
        3 => any::<bool>().prop_map(|under_other_key| Target::JobRow { under_other_key }),
        1 => Just(Target::Applied),
        1 => Just(Target::Vote),
        1 => Just(Target::Committed),
        1 => Just(Target::LastPurged),
        1 => Just(Target::Format),
        1 => Just(Target::SnapshotMeta),
        1 => Just(Target::SnapshotData),
        1 => Just(Target::SnapshotSeq),
        2 => Just(Target::LastLogEntry),
        1 => (0usize..16).prop_map(|len| Target::LogKey { len }),
    ]
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap_or_else(|e| panic!("mkdir: {e}"));
    for entry in std::fs::read_dir(from).unwrap_or_else(|e| panic!("read_dir: {e}")).flatten() {
        let dest = to.join(entry.file_name());
        if entry.path().is_dir() {
            copy_dir(&entry.path(), &dest);
        } else {
            std::fs::copy(entry.path(), dest).unwrap_or_else(|e| panic!("copy: {e}"));
        }
    }
}

#[test]
fn damaged_records_are_typed_errors_when_a_node_restarts() {
    let rt = runtime();
    let template = TempDir::new().unwrap_or_else(|e| panic!("tempdir: {e}"));
    drop(populated(&rt, template.path()));
    let valid_job = serde_json::to_value(JobRecord::new(
        JobId::new("a").unwrap_or_else(|e| panic!("{e}")),
        "a".into(),
        Default::default(),
    ))
    .unwrap_or_default();
    // Restart cases copy and open a database twice each: a quarter of the cases of the others.
    let strategy = (target(), mutate::mutation(), entry(), snapshot_meta());
    fuzz("records at restart", config_divided(4), strategy, |(target, m, donor_entry, donor_meta)| {
        let dir = TempDir::new().unwrap_or_else(|e| panic!("tempdir: {e}"));
        copy_dir(template.path(), dir.path());
        let log_tree = layout::log_tree_name(3);
        let (tree, key, doc): (&str, Vec<u8>, serde_json::Value) = match &target {
            Target::JobRow { under_other_key } => {
                let key = if *under_other_key { b"b".to_vec() } else { b"a".to_vec() };
                (layout::SM_JOBS_TREE, key, valid_job.clone())
            }
            Target::Applied => (
                layout::SM_META_TREE,
                layout::APPLIED_KEY.into(),
                json!({
                    "last_applied": null,
                    "last_membership": { "log_id": null, "membership": { "configs": [], "nodes": {} } },
                }),
            ),
            Target::Vote => (layout::RAFT_META_TREE, layout::VOTE_KEY.into(), json!(Vote::new(1, 1))),
            Target::Committed => {
                (layout::RAFT_META_TREE, layout::COMMITTED_KEY.into(), json!(log_id_of(1, 3)))
            }
            Target::LastPurged => {
                (layout::RAFT_META_TREE, layout::LAST_PURGED_KEY.into(), json!(log_id_of(1, 1)))
            }
            Target::Format => {
                (layout::RAFT_META_TREE, layout::FORMAT_KEY.into(), json!(layout::FORMAT_VERSION))
            }
            Target::SnapshotMeta => {
                (layout::SNAPSHOT_TREE, layout::SNAPSHOT_META_KEY.into(), json!(donor_meta))
            }
            Target::SnapshotData => {
                (layout::SNAPSHOT_TREE, layout::SNAPSHOT_DATA_KEY.into(), json!({"version": 1}))
            }
            Target::SnapshotSeq => (layout::SNAPSHOT_TREE, layout::SNAPSHOT_SEQ_KEY.into(), json!(1)),
            Target::LastLogEntry => (log_tree.as_str(), layout::log_key(3).to_vec(), json!(donor_entry)),
            Target::LogKey { len } => (log_tree.as_str(), vec![0xff; *len], json!(donor_entry)),
        };
        let bytes = mutated(&doc, &json!(donor_entry), &m);
        {
            let db = sled::open(dir.path()).unwrap_or_else(|e| panic!("sled: {e}"));
            db.open_tree(tree).and_then(|t| t.insert(key, bytes)).unwrap_or_else(|e| panic!("tamper: {e}"));
            db.flush().unwrap_or_else(|e| panic!("flush: {e}"));
        }
        match common::when_released(|| open(dir.path())) {
            Ok((mut log, mut sm)) => {
                // Opened: every read still answers (an error is fine, a panic is not).
                rt.block_on(async {
                    let _ = log.try_get_log_entries(..).await;
                    let _ = log.get_log_state().await;
                    let _ = log.read_vote().await;
                    let _ = sm.get_current_snapshot().await;
                    let _ = sm.applied_state().await;
                    let _ = sm.get_snapshot_builder().await.build_snapshot().await;
                });
                let _ = sm.reader().jobs();
                Ok(Verdict::Accepted)
            }
            Err(e) => {
                prop_assert!(
                    matches!(
                        e,
                        OpenError::Storage { .. }
                            | OpenError::Inconsistent { .. }
                            | OpenError::UnsupportedFormat { .. }
                    ),
                    "unexpected error kind: {e}"
                );
                Ok(Verdict::Refused)
            }
        }
    });
}

fn log_id_of(term: u64, index: u64) -> LogId {
    common::log_id(term, index)
}
