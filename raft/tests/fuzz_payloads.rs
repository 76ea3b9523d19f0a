//! Structure-aware fuzzing of what a replica decodes from its peers: openraft's RPCs and their
//! replies as `cairn_raft::codec` carries them, the replicated commands, and the state machine
//! data a snapshot holds; and of `StateMachineData::apply` on whatever decodes (it runs on every
//! replica for every committed entry, so it must never panic). See `docs/FUZZING.md`.

#[path = "../../protocol/tests/support/harness.rs"]
mod harness;
#[path = "../../protocol/tests/support/mutate.rs"]
mod mutate;
#[path = "support/strategies.rs"]
mod strategies;

use cairn_raft::codec;
use cairn_raft::model::{Command, CommandError, CommandResponse, JobId, Outcome, StateMachineData};
use harness::{apply_bytes, config, fuzz, verdict};
use mutate::{Mutation, assert_json_bytes_stable, assert_json_round_trip, case, mutated};
use openraft::EntryPayload;
use proptest::prelude::*;
use serde::Serialize;
use serde::de::DeserializeOwned;
use strategies::*;

// ---------------------------------------------------------------------------------------------
// Checks
// ---------------------------------------------------------------------------------------------

/// `cairn_raft::codec::decode` of a damaged encoding of `value`: a typed error, or a value whose
/// encoding is stable. Valid encodings decode (and re-encode to themselves).
fn decode_stable<T: Serialize + DeserializeOwned>(what: &'static str, value: &T, input: &[u8]) -> Option<T> {
    let valid = codec::encode(what, value).unwrap_or_else(|e| panic!("{e}"));
    let back: T = codec::decode(what, &valid).unwrap_or_else(|e| panic!("a valid {what} was refused: {e}"));
    assert_eq!(codec::encode(what, &back).ok(), Some(valid), "a valid {what} does not round-trip");
    match codec::decode::<T>(what, input) {
        Ok(decoded) => {
            assert_json_bytes_stable(&decoded);
            Some(decoded)
        }
        Err(e) => {
            assert_eq!(e.what, what);
            assert!(e.to_string().starts_with("cannot decode"), "{e}");
            None
        }
    }
}

/// Like [`decode_stable`], comparing values.
fn decode_equal<T>(what: &'static str, value: &T, input: &[u8]) -> Option<T>
where
    T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug,
{
    let valid = codec::encode(what, value).unwrap_or_else(|e| panic!("{e}"));
    let back: T = codec::decode(what, &valid).unwrap_or_else(|e| panic!("a valid {what} was refused: {e}"));
    assert_eq!(&back, value, "a valid {what} decoded to another value");
    match codec::decode::<T>(what, input) {
        Ok(decoded) => {
            assert_json_round_trip(&decoded);
            Some(decoded)
        }
        Err(e) => {
            assert_eq!(e.what, what);
            None
        }
    }
}

/// The input a case feeds to `codec::decode`: structural edits of the JSON encoding (what older
/// peers send, decoded by the JSON path), raw byte edits of the MessagePack encoding (what peers
/// of this version send), or random bytes.
fn wire_mutated<T: Serialize>(value: &T, donor: &T, m: &Mutation) -> Vec<u8> {
    match m {
        Mutation::Json(..) | Mutation::Random(_) => mutated(value, donor, m),
        Mutation::Bytes(ops) => {
            let valid = codec::encode("value", value).unwrap_or_else(|e| panic!("{e}"));
            let donor = codec::encode("donor", donor).unwrap_or_else(|e| panic!("{e}"));
            apply_bytes(&valid, ops, &donor)
        }
    }
}

/// Applies `cmd` to `state` as every replica does: deterministic (a second replica holding the
/// same state computes the same response and state), a rejection changes nothing, and the
/// response (committed to the log's responses) encodes and decodes.
fn apply_like_a_replica(state: &mut StateMachineData, cmd: &Command) -> Result<Outcome, CommandError> {
    let before = state.clone();
    let mut other = state.clone();
    let result = state.apply(cmd);
    assert_eq!(other.apply(cmd), result, "apply is not deterministic for {cmd}");
    assert_eq!(&other, state, "apply left two replicas in different states for {cmd}");
    if result.is_err() {
        assert_eq!(state, &before, "a rejected command changed the state: {cmd} -> {result:?}");
    }
    assert_json_round_trip(&CommandResponse(result.clone()));
    result
}

// ---------------------------------------------------------------------------------------------
// 2. Raft RPCs and replies
// ---------------------------------------------------------------------------------------------

#[test]
fn append_entries_requests_decode_or_are_refused_never_panic() {
    fuzz(
        "AppendEntriesRequest",
        config(),
        (case(append_entries), state()),
        |((req, donor, m), mut state)| {
            let decoded = decode_stable("append-entries request", &req, &wire_mutated(&req, &donor, &m));
            if let Some(req) = &decoded {
                // A follower appends these and, once committed, applies the commands.
                for entry in &req.entries {
                    if let EntryPayload::Normal(cmd) = &entry.payload {
                        let _ = apply_like_a_replica(&mut state, cmd);
                    }
                }
            }
            Ok(verdict(&decoded))
        },
    );
}

#[test]
fn vote_requests_decode_or_are_refused_never_panic() {
    fuzz("VoteRequest", config(), case(vote_request), |(req, donor, m)| {
        Ok(verdict(&decode_equal("vote request", &req, &wire_mutated(&req, &donor, &m))))
    });
}

#[test]
fn install_snapshot_requests_decode_or_are_refused_never_panic() {
    fuzz("InstallSnapshotRequest", config(), case(install_snapshot), |(req, donor, m)| {
        Ok(verdict(&decode_stable("install-snapshot request", &req, &wire_mutated(&req, &donor, &m))))
    });
}

#[test]
fn append_entries_replies_decode_or_are_refused_never_panic() {
    fuzz("AppendEntries reply", config(), case(append_reply), |(reply, donor, m)| {
        Ok(verdict(&decode_stable("raft reply", &reply, &wire_mutated(&reply, &donor, &m))))
    });
}

#[test]
fn vote_replies_decode_or_are_refused_never_panic() {
    fuzz("Vote reply", config(), case(vote_reply), |(reply, donor, m)| {
        Ok(verdict(&decode_equal("raft reply", &reply, &wire_mutated(&reply, &donor, &m))))
    });
}

#[test]
fn install_snapshot_replies_decode_or_are_refused_never_panic() {
    fuzz("InstallSnapshot reply", config(), case(install_reply), |(reply, donor, m)| {
        Ok(verdict(&decode_equal("raft reply", &reply, &wire_mutated(&reply, &donor, &m))))
    });
}

// ---------------------------------------------------------------------------------------------
// 2. Replicated commands, applied
// ---------------------------------------------------------------------------------------------

#[test]
fn commands_decode_and_apply_deterministically_never_panic() {
    fuzz(
        "Command + apply",
        config(),
        (case(command), state(), prop::collection::vec(command(), 0..6)),
        |((cmd, donor, m), mut state, history)| {
            // A history of valid commands first, so that the damaged one meets live jobs.
            for earlier in &history {
                let _ = apply_like_a_replica(&mut state, earlier);
            }
            prop_assert_eq!(apply_like_a_replica(&mut state.clone(), &cmd), state.clone().apply(&cmd));
            let decoded = decode_equal("command", &cmd, &wire_mutated(&cmd, &donor, &m));
            if let Some(cmd) = &decoded {
                let _ = cmd.to_string();
                let _ = apply_like_a_replica(&mut state, cmd);
            }
            Ok(verdict(&decoded))
        },
    );
}

#[test]
fn state_machine_data_decodes_and_takes_any_command_never_panics() {
    fuzz(
        "StateMachineData + apply",
        config(),
        (case(state), prop::collection::vec(command(), 1..8)),
        |((data, donor, m), commands)| {
            let decoded = decode_equal("state machine data", &data, &wire_mutated(&data, &donor, &m));
            // Whatever a snapshot installed (consistent or not) takes every command without a panic.
            let mut state = decoded.clone().unwrap_or(data);
            for cmd in &commands {
                let _ = apply_like_a_replica(&mut state, cmd);
            }
            Ok(verdict(&decoded))
        },
    );
}

#[test]
fn job_records_decode_or_are_refused_never_panic() {
    let record = || job_record(JobId::new("a").unwrap_or_else(|e| panic!("{e}")));
    fuzz("JobRecord", config(), case(record), |(job, donor, m)| {
        let decoded = decode_equal("job record", &job, &wire_mutated(&job, &donor, &m));
        if let Some(job) = &decoded {
            let _ = job.restore_point();
            let _ = job.status.to_string();
        }
        Ok(verdict(&decoded))
    });
}

// ---------------------------------------------------------------------------------------------
// Regressions found by the fuzzers
// ---------------------------------------------------------------------------------------------

/// A job whose completed-checkpoint count is at its maximum (as a snapshot from a peer or a job
/// row may hold it) overflowed `num_completed += 1` on the next completed checkpoint: a panic
/// in `apply`, on every replica, for a committed entry.
#[test]
fn completing_a_checkpoint_with_the_completed_count_at_its_maximum_saturates() {
    let id = JobId::new("a").unwrap_or_else(|e| panic!("{e}"));
    let mut job = cairn_raft::model::JobRecord::new(id.clone(), "a".into(), Default::default());
    job.status = cairn_raft::model::JobStatus::Running;
    job.next_checkpoint_id = 10;
    job.num_completed = u64::MAX;
    let mut state = StateMachineData { jobs: [(id.clone(), std::sync::Arc::new(job))].into() };
    let checkpoint = cairn_raft::model::CompletedCheckpoint {
        id: 5,
        kind: cairn_raft::model::CheckpointKind::Checkpoint,
        trigger_time_ms: 1,
        completion_time_ms: 2,
        metadata_path: "/cp/a/chk-5/_metadata".into(),
        metadata_size: 10,
        metadata_crc32: 0,
        state_size: 0,
    };
    let result =
        apply_like_a_replica(&mut state, &Command::AddCompletedCheckpoint { job: id.clone(), checkpoint });
    assert_eq!(result, Ok(Outcome::Subsumed { checkpoints: Vec::new() }));
    assert_eq!(state.jobs[&id].num_completed, u64::MAX);
}
