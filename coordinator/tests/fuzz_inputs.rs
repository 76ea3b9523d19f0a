//! Structure-aware fuzzing of what a replica takes from outside that its own code (not a shared
//! crate) interprets: its TOML configuration, decoded the way `cairn` reads `--config`
//! (`NodeConfig::from_file`: `toml::from_str`) and checked (`validate`), with the openraft
//! configuration derived from a valid one; and the checkpoint acknowledgements of task reports,
//! as the leader's pending checkpoint and statistics take them after the gateway decoded them.
//! See `docs/FUZZING.md`.

#[path = "../../protocol/tests/support/harness.rs"]
mod harness;
#[path = "../../protocol/tests/support/mutate.rs"]
mod mutate;
#[path = "../../protocol/tests/support/mutate_toml.rs"]
mod mutate_toml;
#[path = "../../protocol/tests/support/strategies.rs"]
mod strategies;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use cairn_coordinator::checkpoint::actions::RequestId;
use cairn_coordinator::checkpoint::pending::{AckOutcome, Origin, PendingCheckpoint, PendingInit};
use cairn_coordinator::checkpoint::stats::CheckpointStatsTracker;
use cairn_coordinator::checkpoint::tasks::{TaskAttemptId, TaskDescriptor, TaskSet};
use cairn_coordinator::config::{ConfigError, NodeConfig, Peer, RaftTiming, WorkerTiming};
use cairn_protocol::checkpoint::{
    CheckpointKind, KeyGroupSegment, KeyedStateHandle, OperatorSubtaskState, StateFile, SubtaskState,
    TaskCheckpointMetrics,
};
use cairn_protocol::messages::TaskMessage;
use cairn_protocol::restart::RestartStrategy;
use harness::{ByteOp, Verdict, apply_bytes, config, few_byte_ops, fuzz, rarely};
use mutate::{JsonOp, case, json_ops, mutated};
use mutate_toml::{TomlOp, apply_toml_ops, mutate_toml, toml_ops};
use proptest::prelude::*;

fn duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        4 => (1u64..10_000).prop_map(Duration::from_millis),
        1 => (any::<u64>(), 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
    ]
}

fn addr() -> impl Strategy<Value = String> {
    prop_oneof![
        (1u16..=u16::MAX).prop_map(|p| format!("127.0.0.1:{p}")),
        ("[a-z]{1,8}", 1u16..=u16::MAX).prop_map(|(h, p)| format!("{h}.local:{p}")),
        Just("[::1]:7400".to_owned()),
    ]
}

fn restart_strategy() -> impl Strategy<Value = RestartStrategy> {
    prop_oneof![
        Just(RestartStrategy::None),
        (0u32..5, duration()).prop_map(|(attempts, delay)| RestartStrategy::FixedDelay { attempts, delay }),
        Just(RestartStrategy::exponential_delay()),
    ]
}

/// Configurations as operators write them: mostly valid, every section present sometimes.
fn node_config() -> impl Strategy<Value = NodeConfig> {
    let raft = (1u64..500, 3u64..10, 1u64..2_000, 1u64..10_000, 0u64..10_000).prop_map(
        |(hb, k, spread, snap, keep)| RaftTiming {
            heartbeat_interval: Duration::from_millis(hb),
            election_timeout_min: Duration::from_millis(hb * k),
            election_timeout_max: Duration::from_millis(hb * k + spread),
            snapshot_after_logs: snap,
            logs_to_keep: keep,
        },
    );
    let workers = (1u64..2_000, 3u64..10, duration()).prop_map(|(hb, k, grace)| WorkerTiming {
        heartbeat_interval: Duration::from_millis(hb),
        heartbeat_timeout: Duration::from_millis(hb * k),
        reattach_grace: grace,
    });
    let peers = prop::collection::vec((1u64..8, addr()).prop_map(|(id, addr)| Peer { id, addr }), 0..4);
    let tls = proptest::option::of(
        (
            proptest::option::of(Just(PathBuf::from("/nonexistent/cert.pem"))),
            proptest::option::of(Just(PathBuf::from("/nonexistent/key.pem"))),
            proptest::option::of(Just(PathBuf::from("/nonexistent/ca.pem"))),
        )
            .prop_map(|(cert_file, key_file, ca_file)| cairn_proto::tls::TlsFiles {
                cert_file,
                key_file,
                ca_file,
            }),
    );
    (
        (
            1u64..8,
            addr(),
            proptest::option::of(addr()),
            proptest::option::of("/[a-z]{1,8}".prop_map(PathBuf::from)),
        ),
        peers,
        (
            proptest::option::of("/[a-z]{1,8}".prop_map(PathBuf::from)),
            any::<bool>(),
            proptest::option::of(addr()),
        ),
        raft,
        workers,
        proptest::option::of(restart_strategy()),
        prop_oneof![4 => Just(None), 1 => tls],
        proptest::option::of("/[a-z]{1,8}/token".prop_map(PathBuf::from)),
    )
        .prop_map(
            |(
                (node_id, listen, advertise, data_dir),
                peers,
                (checkpoint_dir, incremental_checkpoints, metrics_listen),
                raft,
                workers,
                restart_strategy,
                tls,
                admin_token_file,
            )| NodeConfig {
                node_id,
                listen,
                advertise,
                data_dir,
                peers,
                checkpoint_dir,
                incremental_checkpoints,
                metrics_listen,
                console_listen: None,
                console_views_need_token: false,
                raft,
                workers,
                restart_strategy,
                tls,
                admin_token_file,
                admin_token: None,
                cluster_secret_file: None,
                cluster_secret: None,
                worker_token_file: None,
                worker_token: None,
            },
        )
}

#[derive(Debug, Clone)]
enum Damage {
    Structure(Vec<JsonOp>, Vec<TomlOp>, Vec<ByteOp>),
    Random(Vec<u8>),
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        9 => (json_ops(), rarely(toml_ops()), rarely(few_byte_ops()))
            .prop_map(|(j, t, b)| Damage::Structure(j, t, b)),
        1 => harness::random_bytes().prop_map(Damage::Random),
    ]
}

#[test]
fn node_configs_decode_validate_or_are_refused_never_panic() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let path = dir.path().join("cairn.toml");
    let strategy = (node_config(), node_config(), damage());
    fuzz("NodeConfig (TOML) + validate", config(), strategy, |(c, donor, damage)| {
        // A valid configuration written as TOML reads back as itself.
        let text = toml::to_string(&c).unwrap_or_else(|e| panic!("encode: {e}"));
        let back: NodeConfig =
            toml::from_str(&text).unwrap_or_else(|e| panic!("valid config refused: {e}\n{text}"));
        prop_assert_eq!(&back, &c);

        let input = match &damage {
            Damage::Structure(json, toml_ops, bytes) => {
                let doc = serde_json::to_value(&c).unwrap_or_default();
                let text = mutate_toml(&doc, json).unwrap_or(text);
                let donor = toml::to_string(&donor).unwrap_or_default();
                apply_bytes(apply_toml_ops(&text, toml_ops).as_bytes(), bytes, donor.as_bytes())
            }
            Damage::Random(bytes) => bytes.clone(),
        };
        std::fs::write(&path, &input).unwrap_or_else(|e| panic!("write: {e}"));
        match NodeConfig::from_file(&path) {
            Ok(decoded) => {
                // What the file said is what `from_str` says, and it writes back as itself.
                let text =
                    String::from_utf8(input).unwrap_or_else(|_| panic!("a file that is not UTF-8 decoded"));
                let from_str = toml::from_str::<NodeConfig>(&text).ok();
                prop_assert_eq!(from_str.as_ref(), Some(&decoded));
                let again =
                    toml::to_string(&decoded).unwrap_or_else(|e| panic!("decoded config must encode: {e}"));
                let reread = toml::from_str::<NodeConfig>(&again).ok();
                prop_assert_eq!(reread.as_ref(), Some(&decoded), "{}", again);
                // What the binary does with it next.
                if decoded.validate().is_ok() {
                    let _ = decoded.openraft_config();
                    let _ = (decoded.advertise_addr(), decoded.data_dir(), decoded.checkpoint_dir());
                    prop_assert!(!decoded.initial_members().is_empty());
                    let _ = decoded.bootstraps();
                }
                Ok(Verdict::Accepted)
            }
            Err(e) => {
                prop_assert!(matches!(e, ConfigError::Parse { .. } | ConfigError::Read { .. }), "{e}");
                Ok(Verdict::Refused)
            }
        }
    });
}

// Defects of `coordinator/src/config.rs` the fuzzer found, now fixed: durations beyond what timers
// can hold are refused by `validate`, naming the key.

#[test]
fn huge_raft_heartbeat_interval_is_refused_not_a_panic() {
    let c: NodeConfig = toml::from_str("[raft]\nheartbeat_interval = \"18446744073709551615s\"")
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(c.validate().is_err());
}

#[test]
fn huge_worker_heartbeat_interval_is_refused_not_a_panic() {
    let c: NodeConfig = toml::from_str("[workers]\nheartbeat_interval = \"18446744073709551615s\"")
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(c.validate().is_err());
}

#[test]
fn validated_timings_are_usable_by_the_node() {
    for toml_text in [
        "[raft]\nelection_timeout_max = \"584542046090years\"",
        "[workers]\nreattach_grace = \"584542046090years\"",
    ] {
        let c: NodeConfig = toml::from_str(toml_text).unwrap_or_else(|e| panic!("{e}"));
        if c.validate().is_ok() {
            // What the node does with them: openraft's config, the bootstrap wait (3 election
            // timeouts) and the re-attach deadline.
            assert!(c.openraft_config().is_ok(), "{toml_text}");
            assert!(c.raft.election_timeout_max.checked_mul(3).is_some(), "{toml_text}");
            let now = std::time::Instant::now();
            assert!(now.checked_add(c.workers.reattach_grace).is_some(), "{toml_text}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 1. Acknowledgements of task reports, as the leader keeps them
// ---------------------------------------------------------------------------------------------

/// A pending checkpoint waiting for two subtasks of vertex `v` (max parallelism 8).
fn pending(id: u64, kind: CheckpointKind) -> PendingCheckpoint {
    let task = |subtask: u32| TaskDescriptor {
        vertex: "v".into(),
        subtask,
        parallelism: 2,
        max_parallelism: 8,
        is_source: true,
        inputs: Vec::new(),
        attempt: TaskAttemptId(u64::from(subtask) + 1),
    };
    let tasks = TaskSet::new(vec![task(0), task(1)]).unwrap_or_else(|e| panic!("{e}"));
    let init = PendingInit {
        id,
        kind,
        origin: if id.is_multiple_of(2) { Origin::Periodic } else { Origin::Manual(RequestId(id)) },
        base_dir: "/cp/job".into(),
        dir: format!("/cp/job/chk-{id}").into(),
        trigger_time_ms: 1_000,
        deadline: tokio::time::Instant::now(),
    };
    PendingCheckpoint::new(init, &tasks)
}

/// An acknowledgement a task of `pending(7, ..)` could really send: per operator one new file
/// under `chk-7/` or `shared/` and maybe an earlier shared one, key groups below 8 one after
/// another in their file.
fn valid_ack() -> impl Strategy<Value = SubtaskState> {
    let groups = prop::collection::btree_map(0u32..8, (1u64..1_000, any::<bool>()), 0..6);
    let op =
        (groups, "[a-z0-9-]{1,12}", any::<bool>(), any::<u32>()).prop_map(|(groups, name, shared, crc32)| {
            let new_file = if shared { format!("shared/{name}") } else { format!("chk-7/{name}") };
            let earlier = format!("shared/earlier-{name}");
            let mut keyed = KeyedStateHandle::default();
            let mut sizes: BTreeMap<String, u64> = BTreeMap::new();
            for (kg, (length, reused)) in groups {
                let file = if reused { earlier.clone() } else { new_file.clone() };
                let offset = sizes.get(&file).copied().unwrap_or(0);
                sizes.insert(file.clone(), offset + length);
                keyed.key_groups.insert(kg, KeyGroupSegment { file, offset, length, crc32: crc32 ^ kg });
            }
            keyed.files = sizes.into_iter().map(|(path, size)| StateFile { path, size, crc32 }).collect();
            OperatorSubtaskState { keyed, list_states: Vec::new(), channel_state: None }
        });
    prop::collection::btree_map("[a-z]{1,6}", op, 0..3).prop_map(|operators| SubtaskState { operators })
}

#[test]
fn acknowledgements_from_task_reports_are_kept_or_refused_never_panic() {
    let strategy = (case(valid_ack), case(valid_ack), strategies::metrics(), any::<bool>());
    fuzz(
        "acknowledgement (pending checkpoint + stats)",
        config(),
        strategy,
        |((a, a_donor, am), (b, b_donor, bm), metrics, savepoint)| {
            let kind = if savepoint { CheckpointKind::Savepoint } else { CheckpointKind::Checkpoint };
            let mut p = pending(7, kind);
            let mut stats = CheckpointStatsTracker::new(10);
            stats.report_pending(7, kind, 1_000, 2);
            let mut accepted = 0;
            for (attempt, (state, donor, m)) in [(1, (a, a_donor, am)), (2, (b, b_donor, bm))] {
                // The report as the gateway decodes it: a damaged acknowledgement is refused there.
                let report = TaskMessage::Acknowledge {
                    task: cairn_protocol::messages::TaskAttemptId {
                        task: cairn_protocol::messages::TaskId {
                            job: "job".into(),
                            vertex: "v".into(),
                            subtask: attempt - 1,
                        },
                        attempt: 1,
                    },
                    checkpoint_id: 7,
                    state,
                    metrics,
                };
                let donor = TaskMessage::Acknowledge {
                    task: report.task().clone(),
                    checkpoint_id: 7,
                    state: donor,
                    metrics,
                };
                let Ok(TaskMessage::Acknowledge { state, metrics, .. }) =
                    serde_json::from_slice::<TaskMessage>(&mutated(&report, &donor, &m))
                else {
                    continue;
                };
                match p.acknowledge(TaskAttemptId(u64::from(attempt)), state) {
                    AckOutcome::Accepted { .. } => {
                        accepted += 1;
                        stats.report_ack(7, "v", attempt - 1, 2_000, metrics);
                    }
                    AckOutcome::Invalid(why) => prop_assert!(!why.is_empty()),
                    other => prop_assert!(false, "unexpected outcome {:?}", other),
                }
            }
            // What completion does with the acknowledged state (sizes are saturating sums).
            let size = p.state_size();
            let meta = p.build_metadata("job", 2_000);
            prop_assert_eq!(meta.state_size(), size);
            mutate::assert_json_round_trip(&meta);
            let _ = stats.summary();
            Ok(if accepted > 0 { Verdict::Accepted } else { Verdict::Refused })
        },
    );
}

// Regressions found by the fuzzers: a task's report is outside input, and the leader added the
// sizes it claims without a bound (a panic in debug builds, a wrapped total in release).

#[test]
fn acknowledged_state_sizes_beyond_u64_saturate() {
    let file = |name: &str| StateFile { path: format!("chk-7/{name}"), size: u64::MAX / 2 + 1, crc32: 0 };
    let huge = SubtaskState {
        operators: [(
            "op".to_owned(),
            OperatorSubtaskState {
                keyed: KeyedStateHandle::from_file_per_key_group([(0, file("a")), (1, file("b"))].into()),
                list_states: Vec::new(),
                channel_state: None,
            },
        )]
        .into(),
    };
    let mut p = pending(7, CheckpointKind::Checkpoint);
    assert!(matches!(p.acknowledge(TaskAttemptId(1), huge.clone()), AckOutcome::Accepted { .. }));
    assert!(matches!(p.acknowledge(TaskAttemptId(2), huge), AckOutcome::Accepted { all_acked: true }));
    assert_eq!(p.state_size(), u64::MAX);
    assert_eq!(p.build_metadata("job", 2_000).state_size(), u64::MAX);
}

#[test]
fn reported_checkpoint_figures_beyond_u64_saturate() {
    let mut stats = CheckpointStatsTracker::new(10);
    stats.report_pending(7, CheckpointKind::Checkpoint, 1_000, 2);
    let metrics =
        TaskCheckpointMetrics { state_size: u64::MAX, bytes_persisted: u64::MAX, ..Default::default() };
    stats.report_ack(7, "v", 0, 2_000, metrics);
    stats.report_ack(7, "v", 1, 2_000, metrics);
    let latest = stats.stats().history.back().map(|c| (c.state_size, c.bytes_persisted));
    assert_eq!(latest, Some((u64::MAX, u64::MAX)));
}
