//! How values are encoded on disk, and the record types that exist only on disk.
//!
//! Every persisted value is serde JSON: self-describing, so records written by an older build
//! remain decodable as fields are added (with `#[serde(default)]`), and an operator can inspect
//! a node's database with generic tools. The golden tests below pin the exact encoding of each
//! record kind, so an accidental change of the on-disk format fails a test instead of silently
//! stranding existing clusters.

use cairn_raft::model::{JobId, StateMachineData};
use cairn_raft::types::{LogId, StoredMembership};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::leaders::LeaderHistory;

pub(crate) fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, serde_json::Error> {
    serde_json::to_vec(value)
}

pub(crate) fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, serde_json::Error> {
    serde_json::from_slice(bytes)
}

/// The state machine's position, stored under [`crate::layout::APPLIED_KEY`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct AppliedState {
    pub last_applied: Option<LogId>,
    pub last_membership: StoredMembership,
}

/// The effects of the last apply, stored under [`crate::layout::APPLY_JOURNAL_KEY`]: its applied
/// state, every job row it wrote (`None`: removed), and the leader history when it changed. Each
/// row is embedded exactly as it is written under its own key.
#[derive(Debug, Deserialize)]
pub(crate) struct ApplyJournal {
    pub applied: AppliedState,
    pub rows: Vec<(JobId, Option<Box<RawValue>>)>,
    #[serde(default)]
    pub leaders: Option<LeaderHistory>,
}

/// Borrowing twin of [`ApplyJournal`], for writing it.
#[derive(Serialize)]
pub(crate) struct ApplyJournalRef<'a> {
    pub applied: &'a AppliedState,
    pub rows: &'a [(JobId, Option<Box<RawValue>>)],
    #[serde(skip_serializing_if = "Option::is_none")]
    pub leaders: Option<&'a LeaderHistory>,
}

/// A value's encoding as an embeddable JSON value (what [`encode`] writes, without a copy).
pub(crate) fn encode_raw<T: Serialize + ?Sized>(value: &T) -> Result<Box<RawValue>, serde_json::Error> {
    serde_json::value::to_raw_value(value)
}

/// Version of the snapshot payload encoding.
pub(crate) const SNAPSHOT_VERSION: u32 = 1;

/// The content of a snapshot, as built by one node and installed by another.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub(crate) struct SnapshotPayload {
    pub version: u32,
    pub last_applied: Option<LogId>,
    pub last_membership: StoredMembership,
    pub data: StateMachineData,
    /// Absent in snapshots built before the history was kept, and while it is empty.
    #[serde(default)]
    pub leaders: LeaderHistory,
}

/// Borrowing twin of [`SnapshotPayload`], so a snapshot is serialized straight from the live
/// state without cloning it first.
#[derive(Serialize)]
pub(crate) struct SnapshotPayloadRef<'a> {
    pub version: u32,
    pub last_applied: &'a Option<LogId>,
    pub last_membership: &'a StoredMembership,
    pub data: &'a StateMachineData,
    #[serde(skip_serializing_if = "LeaderHistory::is_empty")]
    pub leaders: &'a LeaderHistory,
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use cairn_raft::model::{
        CheckpointConfig, CheckpointKind, Command, CompletedCheckpoint, JobId, JobRecord, JobSpec, JobStatus,
    };
    use cairn_raft::types::{Entry, SnapshotMeta, Vote};
    use openraft::{BasicNode, CommittedLeaderId, EntryPayload, Membership};

    use super::*;

    fn log_id(term: u64, node: u64, index: u64) -> LogId {
        LogId::new(CommittedLeaderId::new(term, node), index)
    }

    fn membership() -> StoredMembership {
        let nodes =
            BTreeMap::from([(1, BasicNode::new("10.0.0.1:7000")), (2, BasicNode::new("10.0.0.2:7000"))]);
        StoredMembership::new(Some(log_id(1, 1, 2)), Membership::new(vec![BTreeSet::from([1, 2])], nodes))
    }

    fn job() -> JobRecord {
        let id = JobId::new("wordcount").unwrap_or_else(|e| panic!("{e}"));
        let spec = JobSpec {
            graph: serde_json::json!({"ops": 3}),
            checkpoint: CheckpointConfig { retained: 2, ..Default::default() },
            ..JobSpec::default()
        };
        let mut job = JobRecord::new(id, "WordCount".to_owned(), spec);
        job.status = JobStatus::Running;
        job.next_checkpoint_id = 8;
        job.num_completed = 1;
        job.completed.push(CompletedCheckpoint {
            id: 7,
            kind: CheckpointKind::Checkpoint,
            trigger_time_ms: 1000,
            completion_time_ms: 1200,
            metadata_path: "/ckpt/wordcount/chk-7/_metadata".to_owned(),
            metadata_size: 512,
            metadata_crc32: 0xdead_beef,
            state_size: 4096,
        });
        job
    }

    /// Encodes `value`, compares it with `golden`, and checks that `golden` decodes back to it.
    fn assert_golden<T>(value: &T, golden: &str)
    where
        T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug,
    {
        let bytes = encode(value).unwrap_or_else(|e| panic!("encode: {e}"));
        assert_eq!(String::from_utf8_lossy(&bytes), golden);
        let back: T = decode(golden.as_bytes()).unwrap_or_else(|e| panic!("decode golden: {e}"));
        assert_eq!(&back, value);
    }

    #[test]
    fn golden_vote() {
        let mut vote = Vote::new(3, 2);
        assert_golden(&vote, r#"{"leader_id":{"term":3,"node_id":2},"committed":false}"#);
        vote.commit();
        assert_golden(&vote, r#"{"leader_id":{"term":3,"node_id":2},"committed":true}"#);
    }

    #[test]
    fn golden_log_id() {
        assert_golden(&log_id(2, 1, 42), r#"{"leader_id":{"term":2,"node_id":1},"index":42}"#);
        assert_golden(&Some(log_id(2, 1, 42)), r#"{"leader_id":{"term":2,"node_id":1},"index":42}"#);
        assert_golden(&None::<LogId>, "null");
    }

    #[test]
    fn golden_format_version() {
        assert_golden(&crate::layout::FORMAT_VERSION, "3");
    }

    #[test]
    fn golden_log_entries() {
        let blank = Entry { log_id: log_id(1, 1, 1), payload: EntryPayload::Blank };
        let normal = Entry {
            log_id: log_id(1, 1, 3),
            payload: EntryPayload::Normal(Command::AllocateCheckpointId {
                job: JobId::new("wordcount").unwrap_or_else(|e| panic!("{e}")),
            }),
        };
        let member = Entry {
            log_id: log_id(1, 1, 2),
            payload: EntryPayload::Membership(membership().membership().clone()),
        };
        // openraft's Entry does not implement PartialEq for every config; compare via re-encoding.
        for (entry, golden) in [
            (blank, r#"{"log_id":{"leader_id":{"term":1,"node_id":1},"index":1},"payload":"Blank"}"#),
            (
                normal,
                r#"{"log_id":{"leader_id":{"term":1,"node_id":1},"index":3},"payload":{"Normal":{"cmd":"allocate_checkpoint_id","job":"wordcount"}}}"#,
            ),
            (
                member,
                r#"{"log_id":{"leader_id":{"term":1,"node_id":1},"index":2},"payload":{"Membership":{"configs":[[1,2]],"nodes":{"1":{"addr":"10.0.0.1:7000"},"2":{"addr":"10.0.0.2:7000"}}}}}"#,
            ),
        ] {
            let bytes = encode(&entry).unwrap_or_else(|e| panic!("encode: {e}"));
            assert_eq!(String::from_utf8_lossy(&bytes), golden);
            let back: Entry = decode(golden.as_bytes()).unwrap_or_else(|e| panic!("decode golden: {e}"));
            assert_eq!(encode(&back).ok(), Some(bytes));
        }
    }

    #[test]
    fn golden_job_row() {
        assert_golden(
            &job(),
            concat!(
                r#"{"id":"wordcount","name":"WordCount","spec":{"graph":{"ops":3},"checkpoint":{"interval":null,"#,
                r#""timeout":"10m","min_pause":"0s","max_concurrent":1,"#,
                r#""tolerable_failures":0,"retained":2,"savepoint_dir":null,"storage_dir":null},"#,
                r#""restore_from":null,"allow_non_restored_state":false},"status":{"state":"running"},"#,
                r#""next_checkpoint_id":8,"completed":[{"id":7,"kind":"checkpoint","trigger_time_ms":1000,"#,
                r#""completion_time_ms":1200,"metadata_path":"/ckpt/wordcount/chk-7/_metadata","#,
                r#""metadata_size":512,"metadata_crc32":3735928559,"state_size":4096}],"savepoints":[],"#,
                r#""num_completed":1,"attempts":0}"#
            ),
        );
    }

    #[test]
    fn golden_deduplicated_command_and_request_table() {
        let id = JobId::new("wordcount").unwrap_or_else(|e| panic!("{e}"));
        assert_golden(
            &Command::Deduplicated {
                request_id: "cli-1".into(),
                fingerprint: 42,
                command: Box::new(Command::AllocateCheckpointId { job: id }),
            },
            r#"{"cmd":"deduplicated","request_id":"cli-1","fingerprint":42,"command":{"cmd":"allocate_checkpoint_id","job":"wordcount"}}"#,
        );
        let mut record = job();
        record.requests.record(cairn_raft::model::RequestEntry {
            id: "cli-1".into(),
            fingerprint: 42,
            outcome: cairn_raft::model::Outcome::Repeated {
                first: Box::new(cairn_raft::model::Outcome::CheckpointId { id: 7 }),
            },
        });
        let json = String::from_utf8_lossy(&encode(&record).unwrap_or_else(|e| panic!("{e}"))).into_owned();
        assert!(
            json.ends_with(
                r#""requests":[{"id":"cli-1","fingerprint":42,"outcome":{"outcome":"repeated","first":{"outcome":"checkpoint_id","id":7}}}]}"#
            ),
            "{json}"
        );
        let back: JobRecord = decode(json.as_bytes()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(back, record);
    }

    const MEMBERSHIP_JSON: &str = concat!(
        r#"{"log_id":{"leader_id":{"term":1,"node_id":1},"index":2},"membership":{"configs":[[1,2]],"#,
        r#""nodes":{"1":{"addr":"10.0.0.1:7000"},"2":{"addr":"10.0.0.2:7000"}}}}"#
    );

    #[test]
    fn golden_applied_state() {
        let applied = AppliedState { last_applied: Some(log_id(1, 1, 9)), last_membership: membership() };
        let golden = format!(
            r#"{{"last_applied":{{"leader_id":{{"term":1,"node_id":1}},"index":9}},"last_membership":{MEMBERSHIP_JSON}}}"#
        );
        assert_golden(&applied, &golden);
        assert_golden(
            &AppliedState::default(),
            r#"{"last_applied":null,"last_membership":{"log_id":null,"membership":{"configs":[],"nodes":{}}}}"#,
        );
    }

    #[test]
    fn golden_snapshot_meta() {
        let meta = SnapshotMeta {
            last_log_id: Some(log_id(1, 1, 9)),
            last_membership: membership(),
            snapshot_id: "1-9-4".to_owned(),
        };
        let golden = format!(
            r#"{{"last_log_id":{{"leader_id":{{"term":1,"node_id":1}},"index":9}},"last_membership":{MEMBERSHIP_JSON},"snapshot_id":"1-9-4"}}"#
        );
        assert_golden(&meta, &golden);
    }

    #[test]
    fn golden_snapshot_payload() {
        let mut data = StateMachineData::default();
        let job = job();
        data.jobs.insert(job.id.clone(), std::sync::Arc::new(job));
        let last_applied = Some(log_id(1, 1, 9));
        let last_membership = membership();
        let bytes = encode(&SnapshotPayloadRef {
            version: SNAPSHOT_VERSION,
            last_applied: &last_applied,
            last_membership: &last_membership,
            data: &data,
            leaders: &LeaderHistory::default(),
        })
        .unwrap_or_else(|e| panic!("encode: {e}"));
        let job_json = String::from_utf8(encode(&data.jobs.values().next()).unwrap_or_default())
            .unwrap_or_else(|e| panic!("{e}"));
        let golden = format!(
            r#"{{"version":1,"last_applied":{{"leader_id":{{"term":1,"node_id":1}},"index":9}},"last_membership":{MEMBERSHIP_JSON},"data":{{"jobs":{{"wordcount":{job_json}}}}}}}"#
        );
        assert_eq!(String::from_utf8_lossy(&bytes), golden);
        let back: SnapshotPayload = decode(&bytes).unwrap_or_else(|e| panic!("decode: {e}"));
        assert_eq!(
            back,
            SnapshotPayload {
                version: 1,
                last_applied,
                last_membership: last_membership.clone(),
                data: data.clone(),
                leaders: LeaderHistory::default()
            }
        );

        // With a leader history, it follows the data.
        let mut leaders = LeaderHistory::default();
        leaders.record(&log_id(1, 1, 1));
        let bytes = encode(&SnapshotPayloadRef {
            version: SNAPSHOT_VERSION,
            last_applied: &last_applied,
            last_membership: &last_membership,
            data: &data,
            leaders: &leaders,
        })
        .unwrap_or_else(|e| panic!("encode: {e}"));
        let text = String::from_utf8_lossy(&bytes);
        assert!(text.ends_with(r#"}}},"leaders":[{"term":1,"leader_id":1,"first_index":1}]}"#), "{text}");
        let back: SnapshotPayload = decode(&bytes).unwrap_or_else(|e| panic!("decode: {e}"));
        assert_eq!(back.leaders, leaders);
    }
}
