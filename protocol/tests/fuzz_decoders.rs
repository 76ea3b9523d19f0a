//! Structure-aware fuzzing of every decoder of the contract crate that takes outside bytes: task
//! reports and leader messages (task gateway JSON), job specs, graphs, checkpoint and restart
//! configuration (operator input), and `_metadata` files (checkpoint storage), plus the state
//! assignment run on whatever `_metadata` decodes to. See `docs/FUZZING.md`.
//!
//! Each property starts from valid values built by the strategies below, checks that their
//! encoding decodes to them, then damages it ([`mutate::Mutation`]) and checks that the decoder
//! returns a value that round-trips or a typed error, and never panics.

#[path = "support/harness.rs"]
mod harness;
#[path = "support/mutate.rs"]
mod mutate;
#[path = "support/strategies.rs"]
mod strategies;

use cairn_protocol::assign::{StateAssignment, assign_states};
use cairn_protocol::checkpoint::metadata::METADATA_VERSION;
use cairn_protocol::checkpoint::{MetadataError, MetadataPointer, read_metadata, read_metadata_unverified};
use cairn_protocol::graph::{GraphError, JobGraph};
use cairn_protocol::messages::TaskMessage;
use cairn_protocol::operators::OperatorCatalog;
use cairn_protocol::restart::{MAX_CAUSE_LEN, RestartDecision, RestartStrategy};
use harness::{Verdict, config, fuzz, verdict};
use mutate::{case, check_json, mutated, mutation};
use proptest::prelude::*;
use strategies::*;

// ---------------------------------------------------------------------------------------------
// 1. Task gateway: task reports and leader messages
// ---------------------------------------------------------------------------------------------

#[test]
fn task_reports_decode_or_are_refused_never_panic() {
    fuzz("TaskMessage", config(), case(task_message), |(msg, donor, m)| {
        let decoded = check_json(&msg, &mutated(&msg, &donor, &m));
        if let Some(report) = &decoded {
            // What the gateway does next with a report: name its task.
            let _ = report.task().to_string();
            if let TaskMessage::Acknowledge { state, .. } = report {
                let _ = state.state_size();
                let _ = state.files().count();
                for op in state.operators.values() {
                    let _ = op.validate();
                }
            }
        }
        Ok(verdict(&decoded))
    });
}

#[test]
fn coordinator_messages_decode_or_are_refused_never_panic() {
    fuzz("CoordinatorMessage", config(), case(coordinator_message), |(msg, donor, m)| {
        Ok(verdict(&check_json(&msg, &mutated(&msg, &donor, &m))))
    });
}

#[test]
fn deployments_decode_or_are_refused_never_panic() {
    fuzz("Deployment", config(), case(deployment), |(d, donor, m)| {
        let decoded = check_json(&d, &mutated(&d, &donor, &m));
        if let Some(d) = &decoded {
            // What a worker does next: decode and validate the graph, look up its restores.
            if let Ok(graph) = serde_json::from_value::<JobGraph>(d.graph.clone())
                && graph.validate(&OperatorCatalog::builtin()).is_ok()
                && let Some(restore) = &d.restore
            {
                for v in &graph.vertices {
                    let _ = restore.task(&v.id, 0);
                }
            }
        }
        Ok(verdict(&decoded))
    });
}

#[test]
fn task_commands_decode_or_are_refused_never_panic() {
    fuzz("TaskCommand", config(), case(task_command), |(c, donor, m)| {
        Ok(verdict(&check_json(&c, &mutated(&c, &donor, &m))))
    });
}

// ---------------------------------------------------------------------------------------------
// 4. `_metadata` and the state assignment on whatever it decodes to
// ---------------------------------------------------------------------------------------------

fn write(path: &std::path::Path, bytes: &[u8]) {
    std::fs::write(path, bytes).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

#[test]
fn metadata_files_decode_or_are_refused_and_assignment_never_panics() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let path = dir.path().join("_metadata");
    let strategy = (graph_and_metadata(), graph_and_metadata(), mutation(), any::<bool>());
    fuzz("_metadata", config(), strategy, |((graph, meta), (_, donor), m, allow)| {
        // A valid file reads back exactly, verified and unverified.
        let valid = serde_json::to_vec_pretty(&meta).unwrap_or_default();
        write(&path, &valid);
        let ptr =
            MetadataPointer { path: path.clone(), size: valid.len() as u64, crc32: crc32fast::hash(&valid) };
        let (verified, unverified) = (read_metadata(&ptr).ok(), read_metadata_unverified(&path).ok());
        prop_assert_eq!(verified.as_ref(), Some(&meta));
        prop_assert_eq!(unverified.as_ref(), Some(&meta));
        // The graph it came from (or a rescaled version of it) restores from it.
        let assigned = assign_states(&meta, dir.path(), &graph, false);
        prop_assert!(assigned.is_ok(), "a consistent snapshot must assign: {:?}", assigned.err());

        let input = mutated(&meta, &donor, &m);
        write(&path, &input);
        // A pointer that does not match is refused before decoding ...
        let wrong = MetadataPointer { size: input.len() as u64 + 1, ..ptr.clone() };
        assert!(matches!(read_metadata(&wrong), Err(MetadataError::SizeMismatch { .. })));
        let wrong = MetadataPointer { size: input.len() as u64, crc32: crc32fast::hash(&input) ^ 1, ..ptr };
        assert!(matches!(read_metadata(&wrong), Err(MetadataError::ChecksumMismatch { .. })));
        // ... and one that matches lets the decoder see the damaged bytes.
        let ptr =
            MetadataPointer { path: path.clone(), size: input.len() as u64, crc32: crc32fast::hash(&input) };
        let verified = read_metadata(&ptr);
        let unverified = read_metadata_unverified(&path);
        prop_assert_eq!(verified.as_ref().ok(), unverified.as_ref().ok());
        match unverified {
            Ok(decoded) => {
                prop_assert!(decoded.version <= METADATA_VERSION);
                mutate::assert_json_round_trip(&decoded);
                let _ = decoded.state_size();
                // Whatever decodes is assigned or refused with a reason; never a panic.
                if let Ok(a) = assign_states(&decoded, dir.path(), &graph, allow) {
                    check_assignment(&graph, &a);
                }
                Ok(Verdict::Accepted)
            }
            Err(e) => {
                prop_assert!(
                    matches!(
                        e,
                        MetadataError::Decode { .. }
                            | MetadataError::UnsupportedVersion { .. }
                            | MetadataError::InvalidHandle { .. }
                    ),
                    "{e}"
                );
                Ok(Verdict::Refused)
            }
        }
    });
}

/// What every assignment promises: each subtask of the graph is present, and its keyed state
/// lies in the key groups it owns.
fn check_assignment(graph: &JobGraph, a: &StateAssignment) {
    for v in &graph.vertices {
        for i in 0..v.parallelism {
            let task = a.task(&v.id, i).unwrap_or_else(|| panic!("subtask {}/{i} missing", v.id));
            for op in task.operators.values() {
                assert_eq!(op.keyed.validate(), Ok(()), "an assigned handle is consistent");
                for kg in op.keyed.key_groups.keys() {
                    assert!(task.key_groups.contains(*kg), "key group {kg} outside {:?}", task.key_groups);
                }
            }
        }
    }
}

#[test]
fn metadata_files_that_do_not_exist_or_are_not_files_are_read_errors() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    for path in [dir.path().join("missing"), dir.path().to_owned()] {
        assert!(matches!(read_metadata_unverified(&path), Err(MetadataError::Read { .. })));
        let ptr = MetadataPointer { path, size: 0, crc32: 0 };
        assert!(matches!(read_metadata(&ptr), Err(MetadataError::Read { .. })));
    }
}

// ---------------------------------------------------------------------------------------------
// 6. Job specs, graphs, checkpoint configuration, restart strategies
// ---------------------------------------------------------------------------------------------

#[test]
fn job_specs_decode_or_are_refused_never_panic() {
    fuzz("JobSpec", config(), case(job_spec), |(spec, donor, m)| {
        let decoded = check_json(&spec, &mutated(&spec, &donor, &m));
        if let Some(spec) = &decoded {
            // What submission checks next (`check_spec`), and what a job's driver asks.
            let _ = spec.checkpoint.validate();
            let _ = spec.checkpoint.effective_interval();
            if let Ok(graph) = serde_json::from_value::<JobGraph>(spec.graph.clone()) {
                let _ = graph.validate(&OperatorCatalog::builtin());
            }
            if let Some(s) = &spec.restart_strategy {
                let _ = s.validate();
            }
            let _ = spec.effective_restart_strategy(None).validate();
        }
        Ok(verdict(&decoded))
    });
}

#[test]
fn job_graphs_decode_validate_or_are_refused_never_panic() {
    fuzz("JobGraph::from_json + validate", config(), case(valid_graph), |(graph, donor, m)| {
        let catalog = OperatorCatalog::builtin();
        prop_assert_eq!(graph.validate(&catalog), Ok(()));
        let back = JobGraph::from_json(&graph.to_json());
        prop_assert_eq!(back.as_ref(), Ok(&graph));
        let input = mutated(&graph, &donor, &m);
        let text = String::from_utf8_lossy(&input);
        match JobGraph::from_json(&text) {
            Ok(decoded) => {
                mutate::assert_json_round_trip(&decoded);
                match decoded.validate(&catalog) {
                    Ok(()) => {
                        let order = decoded.topological_order();
                        prop_assert!(order.is_ok_and(|o| o.len() == decoded.vertices.len()));
                    }
                    Err(e) => prop_assert!(!e.to_string().is_empty()),
                }
                Ok(Verdict::Accepted)
            }
            Err(e) => {
                prop_assert!(matches!(e, GraphError::Decode(_)));
                Ok(Verdict::Refused)
            }
        }
    });
}

#[test]
fn checkpoint_configs_decode_or_are_refused_never_panic() {
    fuzz("CheckpointConfig", config(), case(checkpoint_config), |(c, donor, m)| {
        let decoded = check_json(&c, &mutated(&c, &donor, &m));
        if let Some(c) = &decoded {
            if let Err(e) = c.validate() {
                prop_assert!(!e.field.is_empty());
            }
            let _ = c.effective_interval();
        }
        Ok(verdict(&decoded))
    });
}

#[test]
fn restart_strategies_decode_validate_and_decide_never_panic() {
    let strategy = (case(restart_strategy), restart_state(), any::<u64>(), any::<f64>(), text(), 1usize..4);
    fuzz("RestartStrategy", config(), strategy, |((s, donor, m), state, now, jitter, cause, failures)| {
        let decoded = check_json(&s, &mutated(&s, &donor, &m));
        if let Some(s) = &decoded
            && s.validate().is_ok()
        {
            // Any validated strategy decides any failure, whatever the state, time and jitter.
            let mut state = state;
            let mut now = now;
            for _ in 0..failures {
                let before = state.clone();
                let cause = if failures > 2 { cause.repeat(200) } else { cause.clone() };
                let decision = s.on_failure(&mut state, now, jitter, &cause);
                prop_assert_eq!(state.failures, before.failures.saturating_add(1));
                prop_assert!(
                    state
                        .last_failure
                        .as_ref()
                        .is_some_and(|f| f.cause.len() <= MAX_CAUSE_LEN + '…'.len_utf8())
                );
                match decision {
                    RestartDecision::Restart { at_ms, delay_ms } => {
                        prop_assert_eq!(at_ms, now.saturating_add(delay_ms));
                        prop_assert_eq!(state.next_restart_ms, Some(at_ms));
                    }
                    RestartDecision::GiveUp { reason } => {
                        prop_assert!(!reason.is_empty());
                        prop_assert_eq!(state.next_restart_ms, None);
                    }
                }
                if let RestartStrategy::FailureRate { max_failures_per_interval, .. } = s {
                    prop_assert!(state.failure_times.len() <= *max_failures_per_interval as usize + 1);
                }
                mutate::assert_json_round_trip(&state);
                now = now.saturating_add(1_000);
            }
        }
        Ok(verdict(&decoded))
    });
}

#[test]
fn restart_states_decode_or_are_refused_never_panic() {
    fuzz("RestartState", config(), case(restart_state), |(s, donor, m)| {
        Ok(verdict(&check_json(&s, &mutated(&s, &donor, &m))))
    });
}

#[test]
fn job_ids_decode_only_when_valid() {
    fuzz("JobId", config(), case(job_id), |(id, donor, m)| {
        let input = mutated(&id, &donor, &m);
        let decoded = check_json(&id, &input);
        if let Some(decoded) = &decoded {
            prop_assert!(cairn_protocol::job::JobId::new(decoded.as_str()).is_ok());
        }
        Ok(verdict(&decoded))
    });
}

// ---------------------------------------------------------------------------------------------
// Regressions found by the fuzzers
// ---------------------------------------------------------------------------------------------

/// An acknowledgement claiming files whose sizes add up beyond `u64` (a broken or hostile
/// worker) overflowed `SubtaskState::state_size`: a panic in debug builds.
#[test]
fn acknowledged_state_of_impossible_size_saturates() {
    let json = concat!(
        r#"{"type":"acknowledge","task":{"task":{"job":"j","vertex":"v","subtask":0},"attempt":1},"#,
        r#""checkpoint_id":1,"state":{"operators":{"op":{"keyed":{"#,
        r#""0":{"path":"chk-1/a","size":18446744073709551615,"crc32":0},"#,
        r#""1":{"path":"chk-1/b","size":1,"crc32":0}},"list_states":[]}}},"#,
        r#""metrics":{"start_delay_ms":0,"alignment_ms":0,"sync_ms":0,"async_ms":0,"#,
        r#""bytes_persisted":0,"state_size":0}}"#
    );
    let Ok(TaskMessage::Acknowledge { state, .. }) = serde_json::from_str::<TaskMessage>(json) else {
        panic!("the acknowledgement decodes");
    };
    assert_eq!(state.state_size(), u64::MAX);
    let meta = cairn_protocol::checkpoint::CheckpointMetadata {
        version: METADATA_VERSION,
        job: "j".into(),
        checkpoint_id: 1,
        kind: "checkpoint".into(),
        trigger_time_ms: 0,
        completion_time_ms: 0,
        vertices: Default::default(),
        subtasks: [("v/0".to_owned(), state.clone()), ("v/1".to_owned(), state)].into(),
        master_states: Default::default(),
    };
    assert_eq!(meta.state_size(), u64::MAX);
}

/// serde_json's default float parser is off by an ulp for some numbers: a restart strategy's
/// factors changed on every decode and re-encode (the log entry, the job row, the snapshot), so
/// replicas could disagree. The workspace enables `float_roundtrip`.
#[test]
fn restart_strategy_factors_survive_json_round_trips_exactly() {
    let json = concat!(
        r#"{"type":"exponential-delay","backoff_multiplier":1.8371450202383597,"#,
        r#""jitter_factor":0.18364235097433337}"#
    );
    let s: RestartStrategy = serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}"));
    let RestartStrategy::ExponentialDelay { backoff_multiplier, jitter_factor, .. } = &s else {
        panic!("exponential delay");
    };
    assert_eq!(backoff_multiplier.to_bits(), 1.8371450202383597f64.to_bits());
    assert_eq!(jitter_factor.to_bits(), 0.18364235097433337f64.to_bits());
    mutate::assert_json_round_trip(&s);
    for x in [1.0715660391465826e-75f64, 0.1, 1.5, 2.2250738585072014e-308, 1.7976931348623157e308] {
        let back: f64 =
            serde_json::from_str(&serde_json::to_string(&x).unwrap_or_default()).unwrap_or(f64::NAN);
        assert_eq!(back.to_bits(), x.to_bits(), "{x:e}");
    }
}
