//! Strategies for the Raft-side types (log ids, votes, memberships, commands, job records, state
//! machine data, openraft's RPCs), shared by the fuzz tests of `cairn-raft` and `cairn-storage`
//! (included with `#[path]`). Values are valid encodings of real types; whether they make sense
//! to the state machine is left to chance, since `apply` must take anything that decodes.

#![allow(dead_code, reason = "each fuzz file uses the strategies of the decoders it covers")]
#![allow(
    clippy::result_large_err,
    reason = "openraft's replies are `Result`s with its own large `RaftError`"
)]

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use cairn_raft::model::request::RequestTable;
use cairn_raft::model::{
    CheckpointConfig, CheckpointKind, Command, CompletedCheckpoint, JobId, JobRecord, JobSpec, JobStatus,
    Outcome, RequestEntry, SavepointRecord, StateMachineData,
};
use cairn_raft::types::{Entry, LogId, NodeId, SnapshotMeta, StoredMembership, TypeConfig, Vote};
use openraft::error::{Fatal, InstallSnapshotError, RaftError, SnapshotMismatch};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{BasicNode, CommittedLeaderId, EntryPayload, Membership, SnapshotSegmentId};
use proptest::prelude::*;
use serde_json::json;

pub fn small_u64() -> BoxedStrategy<u64> {
    prop_oneof![4 => 0u64..16, 1 => any::<u64>(), 1 => Just(u64::MAX)].boxed()
}

pub fn text() -> BoxedStrategy<String> {
    prop_oneof![3 => "[a-z0-9/._-]{0,16}", 1 => "\\PC{0,16}"].boxed()
}

/// Jobs `a`..`d`, so that commands meet the jobs the state holds.
pub fn job_id() -> BoxedStrategy<JobId> {
    prop::sample::select(vec!["a", "b", "c", "d"])
        .prop_map(|s| JobId::new(s).unwrap_or_else(|e| panic!("{e}")))
        .boxed()
}

pub fn log_id() -> BoxedStrategy<LogId> {
    (small_u64(), 0u64..4, small_u64())
        .prop_map(|(term, node, index)| LogId::new(CommittedLeaderId::new(term, node), index))
        .boxed()
}

pub fn vote() -> BoxedStrategy<Vote> {
    (small_u64(), 0u64..4, any::<bool>())
        .prop_map(|(term, node, committed)| {
            let mut v = Vote::new(term, node);
            if committed {
                v.commit();
            }
            v
        })
        .boxed()
}

pub fn membership() -> BoxedStrategy<Membership<NodeId, BasicNode>> {
    prop::collection::btree_set(0u64..6, 1..4)
        .prop_map(|voters| {
            let nodes: BTreeMap<u64, BasicNode> =
                voters.iter().map(|n| (*n, BasicNode::new(format!("127.0.0.1:{}", 7400 + n)))).collect();
            Membership::new(vec![voters.iter().copied().collect::<BTreeSet<_>>()], nodes)
        })
        .boxed()
}

pub fn stored_membership() -> BoxedStrategy<StoredMembership> {
    (proptest::option::of(log_id()), membership()).prop_map(|(id, m)| StoredMembership::new(id, m)).boxed()
}

pub fn duration() -> BoxedStrategy<Duration> {
    prop_oneof![
        3 => (1u64..100_000).prop_map(Duration::from_millis),
        1 => (any::<u64>(), 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
    ]
    .boxed()
}

/// A humantime duration as configuration writes it.
pub fn duration_text() -> BoxedStrategy<String> {
    prop_oneof![
        3 => (1u64..100_000).prop_map(|ms| format!("{ms}ms")),
        1 => (any::<u64>(), 0u32..1_000_000_000).prop_map(|(s, n)| format!("{s}s {n}ns")),
    ]
    .boxed()
}

/// A restart strategy, valid or not, as JSON: its type lives in `cairn-protocol`, which
/// `cairn-storage` does not name, so fields of that type are decoded from this where they are
/// built ([`decode`]).
pub fn restart_strategy() -> BoxedStrategy<serde_json::Value> {
    prop_oneof![
        Just(json!({ "type": "none" })),
        (0u32..4, duration_text()).prop_map(
            |(attempts, delay)| json!({ "type": "fixed-delay", "attempts": attempts, "delay": delay })
        ),
        (0u32..4, duration_text(), duration_text()).prop_map(|(m, i, delay)| json!({
            "type": "failure-rate",
            "max_failures_per_interval": m,
            "failure_rate_interval": i,
            "delay": delay,
        })),
        (
            (duration_text(), duration_text(), duration_text()),
            0.5f64..4.0,
            0.0f64..1.5,
            proptest::option::of(0u32..4),
        )
            .prop_map(|((initial, max, reset), multiplier, jitter, attempts)| json!({
                "type": "exponential-delay",
                "initial_backoff": initial,
                "max_backoff": max,
                "backoff_multiplier": multiplier,
                "reset_backoff_threshold": reset,
                "jitter_factor": jitter,
                "attempts_before_reset_backoff": attempts,
            })),
    ]
    .boxed()
}

/// Decodes a value the strategies built as JSON.
pub fn decode<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).unwrap_or_else(|e| panic!("the strategies build valid JSON: {e}"))
}

pub fn checkpoint_config() -> BoxedStrategy<CheckpointConfig> {
    (proptest::option::of(duration()), duration(), 0u32..3, 0u32..4)
        .prop_map(|(interval, timeout, max_concurrent, retained)| CheckpointConfig {
            interval,
            timeout,
            max_concurrent,
            retained,
            ..CheckpointConfig::default()
        })
        .boxed()
}

pub fn job_spec() -> BoxedStrategy<JobSpec> {
    (checkpoint_config(), proptest::option::of(restart_strategy()))
        .prop_map(|(checkpoint, restart_strategy)| JobSpec {
            graph: serde_json::json!({ "vertices": [], "edges": [] }),
            checkpoint,
            restart_strategy: restart_strategy.map(decode),
            ..JobSpec::default()
        })
        .boxed()
}

pub fn status() -> BoxedStrategy<JobStatus> {
    prop_oneof![
        Just(JobStatus::Created),
        Just(JobStatus::Running),
        Just(JobStatus::Restarting),
        Just(JobStatus::Finished),
        Just(JobStatus::Canceled),
        text().prop_map(|reason| JobStatus::Failed { reason }),
    ]
    .boxed()
}

pub fn kind() -> BoxedStrategy<CheckpointKind> {
    prop_oneof![
        Just(CheckpointKind::Checkpoint),
        Just(CheckpointKind::Savepoint),
        Just(CheckpointKind::SyncSavepoint)
    ]
    .boxed()
}

pub fn completed() -> BoxedStrategy<CompletedCheckpoint> {
    (small_u64(), kind(), small_u64(), small_u64(), text(), small_u64(), any::<u32>(), small_u64())
        .prop_map(
            |(
                id,
                kind,
                trigger_time_ms,
                completion_time_ms,
                metadata_path,
                metadata_size,
                metadata_crc32,
                state_size,
            )| {
                CompletedCheckpoint {
                    id,
                    kind,
                    trigger_time_ms,
                    completion_time_ms,
                    metadata_path,
                    metadata_size,
                    metadata_crc32,
                    state_size,
                }
            },
        )
        .boxed()
}

pub fn outcome() -> BoxedStrategy<Outcome> {
    let leaf = prop_oneof![
        Just(Outcome::Done),
        small_u64().prop_map(|id| Outcome::CheckpointId { id }),
        (small_u64(), any::<u32>()).prop_map(|(first, count)| Outcome::CheckpointIds { first, count }),
        any::<u32>().prop_map(|attempt| Outcome::Attempt { attempt }),
        small_u64().prop_map(|next| Outcome::CounterAdvanced { next }),
        prop::collection::vec(completed(), 0..2).prop_map(|checkpoints| Outcome::Subsumed { checkpoints }),
    ];
    leaf.prop_recursive(2, 4, 1, |inner| inner.prop_map(|first| Outcome::Repeated { first: Box::new(first) }))
        .boxed()
}

/// Any command, valid or not, on jobs `a`..`d`, possibly wrapped in `Deduplicated` or packed in
/// a `Batch` a few times.
pub fn command() -> BoxedStrategy<Command> {
    let leaf = prop_oneof![
        (job_id(), text(), job_spec()).prop_map(|(job, name, spec)| Command::RegisterJob { job, name, spec }),
        (job_id(), checkpoint_config())
            .prop_map(|(job, checkpoint)| Command::UpdateJobConfig { job, checkpoint }),
        (job_id(), status()).prop_map(|(job, status)| Command::SetJobStatus { job, status }),
        job_id().prop_map(|job| Command::AllocateCheckpointId { job }),
        (job_id(), 0u32..=20_000).prop_map(|(job, count)| Command::ReserveCheckpointIds { job, count }),
        (job_id(), small_u64()).prop_map(|(job, next)| Command::AdvanceCheckpointCounter { job, next }),
        (job_id(), completed())
            .prop_map(|(job, checkpoint)| Command::AddCompletedCheckpoint { job, checkpoint }),
        (job_id(), completed(), text()).prop_map(|(job, checkpoint, path)| Command::RegisterSavepoint {
            job,
            savepoint: SavepointRecord { checkpoint, path }
        }),
        (job_id(), small_u64())
            .prop_map(|(job, checkpoint_id)| Command::DisposeSavepoint { job, checkpoint_id }),
        job_id().prop_map(|job| Command::RemoveJob { job }),
        job_id().prop_map(|job| Command::DiscardRetainedCheckpoints { job }),
        (job_id(), prop_oneof![Just(serde_json::json!({"count": 1})), Just(serde_json::json!([1]))])
            .prop_map(|(job, stats)| Command::RecordStats { job, stats }),
        (job_id(), small_u64(), text(), restart_strategy(), any::<i16>()).prop_map(
            |(job, at_ms, cause, strategy, jitter_permille)| Command::RecordFailure {
                job,
                at_ms,
                cause,
                strategy: decode(strategy),
                jitter_permille
            }
        ),
        (job_id(), small_u64())
            .prop_map(|(job, checkpoint_id)| Command::ReleaseRetainedCheckpoint { job, checkpoint_id }),
        job_id().prop_map(|job| Command::BeginAttempt { job }),
        (job_id(), "[a-z0-9]{1,4}", 0u64..3, outcome()).prop_map(
            |(job, request_id, fingerprint, outcome)| {
                Command::RecordRequest { job, request_id, fingerprint, outcome }
            }
        ),
    ];
    leaf.prop_recursive(3, 12, 4, |inner| {
        prop_oneof![
            ("[a-z0-9]{1,4}", 0u64..3, inner.clone()).prop_map(|(request_id, fingerprint, command)| {
                Command::Deduplicated { request_id, fingerprint, command: Box::new(command) }
            }),
            prop::collection::vec(inner, 0..4).prop_map(|commands| Command::Batch { commands }),
        ]
    })
    .boxed()
}

/// What a restart strategy remembers of a job, as JSON (see [`restart_strategy`]).
pub fn restart_state() -> BoxedStrategy<serde_json::Value> {
    (small_u64(), any::<u32>(), small_u64(), any::<u32>(), prop::collection::vec(small_u64(), 0..5))
        .prop_map(|(failures, restarts, backoff_ms, attempts_since_reset, failure_times)| {
            json!({
                "failures": failures,
                "restarts": restarts,
                "backoff_ms": backoff_ms,
                "attempts_since_reset": attempts_since_reset,
                "failure_times": failure_times,
                "previous_failure_ms": backoff_ms / 2,
            })
        })
        .boxed()
}

/// A job record as a snapshot or a job row may hold it: consistent or not, counters anywhere
/// from zero to their maximum.
pub fn job_record(id: JobId) -> BoxedStrategy<JobRecord> {
    (
        (text(), job_spec(), status(), small_u64()),
        prop::collection::vec(completed(), 0..4),
        prop::collection::vec(
            (completed(), text()).prop_map(|(checkpoint, path)| SavepointRecord { checkpoint, path }),
            0..3,
        ),
        (small_u64(), prop_oneof![0u32..4, Just(u32::MAX)]),
        proptest::option::of(Just(serde_json::json!({"completed": 3}))),
        prop::collection::vec(("[a-z0-9]{1,4}", 0u64..3, outcome()), 0..4),
        restart_state(),
    )
        .prop_map(
            move |(
                (name, spec, status, next),
                completed,
                savepoints,
                (num_completed, attempts),
                stats,
                requests,
                restart,
            )| {
                let mut table = RequestTable::default();
                for (id, fingerprint, outcome) in requests {
                    table.record(RequestEntry { id, fingerprint, outcome });
                }
                JobRecord {
                    id: id.clone(),
                    name,
                    spec,
                    status,
                    next_checkpoint_id: next,
                    completed,
                    savepoints,
                    num_completed,
                    attempts,
                    stats,
                    requests: table,
                    restart: decode(restart),
                }
            },
        )
        .boxed()
}

pub fn state() -> BoxedStrategy<StateMachineData> {
    let record = |name: &'static str| {
        let id = JobId::new(name).unwrap_or_else(|e| panic!("{e}"));
        proptest::option::of(job_record(id))
    };
    (record("a"), record("b"), record("c"))
        .prop_map(|(a, b, c)| StateMachineData {
            jobs: [a, b, c].into_iter().flatten().map(|j| (j.id.clone(), std::sync::Arc::new(j))).collect(),
        })
        .boxed()
}

pub fn entry() -> BoxedStrategy<Entry> {
    let payload = prop_oneof![
        1 => Just(EntryPayload::Blank),
        4 => command().prop_map(EntryPayload::Normal),
        1 => membership().prop_map(EntryPayload::Membership),
    ];
    (log_id(), payload).prop_map(|(log_id, payload)| Entry { log_id, payload }).boxed()
}

pub fn append_entries() -> BoxedStrategy<AppendEntriesRequest<TypeConfig>> {
    (
        vote(),
        proptest::option::of(log_id()),
        prop::collection::vec(entry(), 0..4),
        proptest::option::of(log_id()),
    )
        .prop_map(|(vote, prev_log_id, entries, leader_commit)| AppendEntriesRequest {
            vote,
            prev_log_id,
            entries,
            leader_commit,
        })
        .boxed()
}

pub fn snapshot_meta() -> BoxedStrategy<SnapshotMeta> {
    (proptest::option::of(log_id()), stored_membership(), text())
        .prop_map(|(last_log_id, last_membership, snapshot_id)| SnapshotMeta {
            last_log_id,
            last_membership,
            snapshot_id,
        })
        .boxed()
}

pub fn install_snapshot() -> BoxedStrategy<InstallSnapshotRequest<TypeConfig>> {
    (vote(), snapshot_meta(), small_u64(), prop::collection::vec(any::<u8>(), 0..64), any::<bool>())
        .prop_map(|(vote, meta, offset, data, done)| InstallSnapshotRequest {
            vote,
            meta,
            offset,
            data,
            done,
        })
        .boxed()
}

pub fn fatal() -> BoxedStrategy<Fatal<NodeId>> {
    prop_oneof![Just(Fatal::Stopped), Just(Fatal::Panicked)].boxed()
}

pub fn append_reply() -> BoxedStrategy<Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>> {
    prop_oneof![
        Just(()).prop_map(|()| Ok(AppendEntriesResponse::Success)),
        proptest::option::of(log_id()).prop_map(|l| Ok(AppendEntriesResponse::PartialSuccess(l))),
        Just(()).prop_map(|()| Ok(AppendEntriesResponse::Conflict)),
        vote().prop_map(|v| Ok(AppendEntriesResponse::HigherVote(v))),
        fatal().prop_map(|f| Err(RaftError::Fatal(f))),
    ]
    .boxed()
}

pub fn vote_reply() -> BoxedStrategy<Result<VoteResponse<NodeId>, RaftError<NodeId>>> {
    prop_oneof![
        3 => (vote(), any::<bool>(), proptest::option::of(log_id())).prop_map(
            |(vote, vote_granted, last_log_id)| Ok(VoteResponse { vote, vote_granted, last_log_id })
        ),
        1 => fatal().prop_map(|f| Err(RaftError::Fatal(f))),
    ]
    .boxed()
}

pub type InstallReply = Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>;

pub fn install_reply() -> BoxedStrategy<InstallReply> {
    prop_oneof![
        3 => vote().prop_map(|vote| Ok(InstallSnapshotResponse { vote })),
        1 => (text(), small_u64(), text(), small_u64()).prop_map(|(a, ao, b, bo)| Err(RaftError::APIError(
            InstallSnapshotError::SnapshotMismatch(SnapshotMismatch {
                expect: SnapshotSegmentId { id: a, offset: ao },
                got: SnapshotSegmentId { id: b, offset: bo },
            })
        ))),
        1 => fatal().prop_map(|f| Err(RaftError::Fatal(f))),
    ]
    .boxed()
}

pub fn vote_request() -> BoxedStrategy<VoteRequest<NodeId>> {
    (vote(), proptest::option::of(log_id()))
        .prop_map(|(vote, last_log_id)| VoteRequest { vote, last_log_id })
        .boxed()
}
