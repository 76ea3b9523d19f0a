//! Strategies for the contract's types (task messages, leader messages, deployments, graphs the
//! builtin catalog accepts, `_metadata` consistent with a graph, specs, checkpoint and restart
//! configuration), shared by the fuzz tests of `cairn-protocol` and `cairn-taskrt` (included
//! with `#[path]`). Every value is a real, encodable value of its type.

#![allow(dead_code, reason = "each fuzz file uses the strategies of the decoders it covers")]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use cairn_protocol::assign::{
    AssignedListState, ByteRange, ListStatePart, OperatorRestore, StateAssignment, TaskRestore,
};
use cairn_protocol::checkpoint::metadata::METADATA_VERSION;
use cairn_protocol::checkpoint::{
    CheckpointKind, CheckpointMetadata, KeyGroupRange, KeyGroupSegment, KeyedStateHandle, OperatorListState,
    OperatorStateMode, OperatorSubtaskState, StateFile, SubtaskState, TaskCheckpointMetrics, VertexInfo,
};
use cairn_protocol::config::{CheckpointConfig, ExternalizedRetention};
use cairn_protocol::graph::{ChainedOperator, Edge, JobGraph, OperatorSpec, Partitioning, Vertex};
use cairn_protocol::job::{JobId, JobSpec, RestoreMode};
use cairn_protocol::messages::{
    CheckpointOptions, CoordinatorMessage, DeclineReason, Deployment, TaskAttemptId, TaskCommand, TaskId,
    TaskMessage, TaskStatus, ToTask,
};
use cairn_protocol::operators::builtin;
use cairn_protocol::restart::{FailureRecord, RestartState, RestartStrategy};
use proptest::prelude::*;
use serde_json::json;

pub fn name() -> BoxedStrategy<String> {
    prop_oneof![4 => "[a-z][a-z0-9_-]{0,10}", 1 => "\\PC{0,16}"].boxed()
}

pub fn text() -> BoxedStrategy<String> {
    prop_oneof![3 => "\\PC{0,24}", 1 => "[ -~]{0,200}"].boxed()
}

pub fn small_u64() -> BoxedStrategy<u64> {
    prop_oneof![3 => 0u64..1_000, 1 => any::<u64>()].boxed()
}

pub fn duration() -> BoxedStrategy<Duration> {
    prop_oneof![
        4 => (0u64..600_000).prop_map(Duration::from_millis),
        1 => (any::<u64>(), 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
        1 => Just(Duration::MAX),
    ]
    .boxed()
}

pub fn task_id() -> BoxedStrategy<TaskId> {
    (name(), name(), 0u32..64).prop_map(|(job, vertex, subtask)| TaskId { job, vertex, subtask }).boxed()
}

pub fn attempt_id() -> BoxedStrategy<TaskAttemptId> {
    (task_id(), any::<u32>()).prop_map(|(task, attempt)| TaskAttemptId { task, attempt }).boxed()
}

pub fn kind() -> BoxedStrategy<CheckpointKind> {
    prop_oneof![
        Just(CheckpointKind::Checkpoint),
        Just(CheckpointKind::Savepoint),
        Just(CheckpointKind::SyncSavepoint)
    ]
    .boxed()
}

pub fn to_task() -> BoxedStrategy<ToTask> {
    let options = (
        kind(),
        any::<bool>(),
        proptest::option::of(text().prop_map(PathBuf::from)),
        proptest::option::of(small_u64()),
    )
        .prop_map(|(kind, drain, target_location, unaligned_after_ms)| CheckpointOptions {
            kind,
            drain,
            target_location,
            unaligned_after_ms,
        });
    prop_oneof![
        (small_u64(), small_u64(), options).prop_map(|(checkpoint_id, timestamp_ms, options)| {
            ToTask::TriggerCheckpoint { checkpoint_id, timestamp_ms, options }
        }),
        small_u64().prop_map(|checkpoint_id| ToTask::NotifyCheckpointComplete { checkpoint_id }),
        small_u64().prop_map(|checkpoint_id| ToTask::NotifyCheckpointAborted { checkpoint_id }),
        Just(ToTask::Cancel),
    ]
    .boxed()
}

pub fn state_file() -> BoxedStrategy<StateFile> {
    (text(), small_u64(), any::<u32>())
        .prop_map(|(path, size, crc32)| StateFile { path, size, crc32 })
        .boxed()
}

pub fn list_state() -> BoxedStrategy<OperatorListState> {
    let mode = prop_oneof![Just(OperatorStateMode::RoundRobin), Just(OperatorStateMode::Union)];
    (name(), mode, state_file(), prop::collection::vec(small_u64(), 0..6))
        .prop_map(|(name, mode, file, offsets)| OperatorListState { name, mode, file, offsets })
        .boxed()
}

pub fn segment() -> BoxedStrategy<KeyGroupSegment> {
    (text(), small_u64(), small_u64(), any::<u32>())
        .prop_map(|(file, offset, length, crc32)| KeyGroupSegment { file, offset, length, crc32 })
        .boxed()
}

/// A keyed-state handle: consistent (key groups one after another in one file, as a task writes
/// them) or arbitrary.
pub fn keyed_handle() -> BoxedStrategy<KeyedStateHandle> {
    let consistent =
        (name(), prop::collection::btree_map(0u32..256, 1u64..64, 0..6)).prop_map(|(op, groups)| {
            let path = format!("chk-1/{op}-0.state");
            let mut h = KeyedStateHandle::default();
            for (kg, length) in groups {
                let offset = h.segment_bytes();
                h.key_groups.insert(kg, KeyGroupSegment { file: path.clone(), offset, length, crc32: kg });
            }
            if !h.key_groups.is_empty() {
                h.files.push(StateFile { path, size: h.segment_bytes(), crc32: 0 });
            }
            h
        });
    let arbitrary =
        (prop::collection::btree_map(0u32..256, segment(), 0..5), prop::collection::vec(state_file(), 0..3))
            .prop_map(|(key_groups, files)| KeyedStateHandle { key_groups, files });
    prop_oneof![consistent, arbitrary].boxed()
}

pub fn operator_state() -> BoxedStrategy<OperatorSubtaskState> {
    (keyed_handle(), prop::collection::vec(list_state(), 0..3))
        .prop_map(|(keyed, list_states)| OperatorSubtaskState { keyed, list_states, channel_state: None })
        .boxed()
}

pub fn subtask_state() -> BoxedStrategy<SubtaskState> {
    prop::collection::btree_map(name(), operator_state(), 0..3)
        .prop_map(|operators| SubtaskState { operators })
        .boxed()
}

pub fn metrics() -> BoxedStrategy<TaskCheckpointMetrics> {
    prop::array::uniform7(small_u64())
        .prop_map(|[a, b, c, d, e, f, g]| TaskCheckpointMetrics {
            start_delay_ms: a,
            alignment_ms: b,
            sync_ms: c,
            async_ms: d,
            bytes_persisted: e,
            state_size: f,
            channel_state_bytes: g,
        })
        .boxed()
}

pub fn decline_reason() -> BoxedStrategy<DeclineReason> {
    prop_oneof![
        Just(DeclineReason::TaskNotReady),
        Just(DeclineReason::NotASource),
        small_u64().prop_map(|newer| DeclineReason::Subsumed { newer }),
        Just(DeclineReason::CanceledUpstream),
        Just(DeclineReason::AbortedByCoordinator),
        text().prop_map(DeclineReason::SnapshotFailed),
    ]
    .boxed()
}

pub fn task_status() -> BoxedStrategy<TaskStatus> {
    prop_oneof![
        Just(TaskStatus::Created),
        Just(TaskStatus::Restoring),
        Just(TaskStatus::Running),
        Just(TaskStatus::Finishing),
        Just(TaskStatus::Finished),
        text().prop_map(TaskStatus::Failed),
        Just(TaskStatus::Canceled),
    ]
    .boxed()
}

pub fn task_message() -> BoxedStrategy<TaskMessage> {
    prop_oneof![
        (attempt_id(), small_u64(), subtask_state(), metrics()).prop_map(
            |(task, checkpoint_id, state, metrics)| {
                TaskMessage::Acknowledge { task, checkpoint_id, state, metrics }
            }
        ),
        (attempt_id(), small_u64(), decline_reason())
            .prop_map(|(task, checkpoint_id, reason)| TaskMessage::Decline { task, checkpoint_id, reason }),
        (attempt_id(), task_status()).prop_map(|(task, status)| TaskMessage::Status { task, status }),
    ]
    .boxed()
}

pub fn coordinator_message() -> BoxedStrategy<CoordinatorMessage> {
    (any::<u64>(), to_task()).prop_map(|(term, body)| CoordinatorMessage { term, body }).boxed()
}

pub fn task_command() -> BoxedStrategy<TaskCommand> {
    (name(), any::<u32>(), prop::collection::vec((name(), 0u32..64), 0..4), to_task())
        .prop_map(|(job_id, attempt, tasks, body)| TaskCommand { job_id, attempt, tasks, body })
        .boxed()
}

/// A graph the builtin catalog accepts: a source vertex, a counter (with counters chained
/// behind it), and optionally a sink, with every legal partitioning.
pub fn valid_graph() -> BoxedStrategy<JobGraph> {
    let partitioning =
        prop_oneof![Just(Partitioning::Hash), Just(Partitioning::Rebalance), Just(Partitioning::Broadcast)];
    (
        1u32..=64,
        any::<prop::sample::Index>(),
        any::<prop::sample::Index>(),
        any::<prop::sample::Index>(),
        0usize..3,
        any::<bool>(),
        partitioning,
        any::<bool>(),
        (1u64..100, proptest::option::of(1u64..1_000)),
    )
        .prop_map(|(max, p1, p2, p3, chained, sink, part, forward, (keys, records))| {
            let p = |i: prop::sample::Index| 1 + i.index(max as usize) as u32;
            let (p1, p2, p3) = (p(p1), p(p2), p(p3));
            let mut source_config = json!({ "keys": keys });
            if let Some(r) = records {
                source_config["records_per_key"] = json!(r);
            }
            let op = |kind: &str, config: serde_json::Value| OperatorSpec { kind: kind.to_owned(), config };
            let vertex = |id: &str, parallelism: u32, operator: OperatorSpec| Vertex {
                id: id.to_owned(),
                name: id.to_uppercase(),
                parallelism,
                max_parallelism: max,
                operator,
                chain: Vec::new(),
            };
            let mut counter = vertex("count", p2, op(builtin::KEYED_COUNTER, serde_json::Value::Null));
            counter.chain = (0..chained)
                .map(|i| ChainedOperator {
                    id: format!("count-{i}"),
                    operator: op(builtin::KEYED_COUNTER, serde_json::Value::Null),
                })
                .collect();
            let mut vertices =
                vec![vertex("source", p1, op(builtin::SEQUENCE_SOURCE, source_config)), counter];
            let mut edges = vec![Edge { from: "source".into(), to: "count".into(), partitioning: part }];
            if sink {
                let (p3, partitioning) = if forward { (p2, Partitioning::Forward) } else { (p3, part) };
                vertices.push(vertex(
                    "sink",
                    p3,
                    op(builtin::TWO_PHASE_FILE_SINK, json!({ "output_dir": "/tmp/cairn-fuzz-out" })),
                ));
                edges.push(Edge { from: "count".into(), to: "sink".into(), partitioning });
            }
            JobGraph { vertices, edges }
        })
        .boxed()
}

/// A `_metadata` the graph could have produced: every subtask, some key groups of its range, some
/// list-state elements inside their files; `seed` decides.
pub fn metadata_of(graph: &JobGraph, seed: u64, checkpoint_id: u64) -> CheckpointMetadata {
    let mut s = seed | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let mut vertices = BTreeMap::new();
    let mut subtasks = BTreeMap::new();
    for v in &graph.vertices {
        vertices.insert(
            v.id.clone(),
            VertexInfo { parallelism: v.parallelism, max_parallelism: v.max_parallelism },
        );
        for i in 0..v.parallelism {
            let Some(range) = KeyGroupRange::for_subtask(v.max_parallelism, v.parallelism, i) else {
                continue;
            };
            let mut st = SubtaskState::default();
            for (op, _) in v.operators() {
                let mut s = OperatorSubtaskState::default();
                let path = format!("chk-{checkpoint_id}/{op}-{i}.state");
                for kg in range.start..=range.end {
                    if next() % 3 == 0 {
                        let offset = s.keyed.segment_bytes();
                        let segment = KeyGroupSegment { file: path.clone(), offset, length: 8, crc32: kg };
                        s.keyed.key_groups.insert(kg, segment);
                    }
                }
                if !s.keyed.key_groups.is_empty() {
                    s.keyed.files.push(StateFile { path, size: s.keyed.segment_bytes(), crc32: i });
                }
                if next() % 2 == 0 {
                    let n = next() % 5;
                    let mode = if next() % 2 == 0 {
                        OperatorStateMode::RoundRobin
                    } else {
                        OperatorStateMode::Union
                    };
                    let name = if mode == OperatorStateMode::Union { "union" } else { "offsets" };
                    s.list_states.push(OperatorListState {
                        name: name.into(),
                        mode,
                        file: StateFile {
                            path: format!("chk-{checkpoint_id}/{op}-{i}-{name}"),
                            size: n * 4,
                            crc32: 0,
                        },
                        offsets: (0..n).map(|k| k * 4).collect(),
                    });
                }
                if !s.is_empty() {
                    st.operators.insert(op.to_owned(), s);
                }
            }
            subtasks.insert(CheckpointMetadata::subtask_key(&v.id, i), st);
        }
    }
    CheckpointMetadata {
        version: METADATA_VERSION,
        job: "fuzz".into(),
        checkpoint_id,
        kind: "checkpoint".into(),
        trigger_time_ms: seed % 1_000_000,
        completion_time_ms: seed % 1_000_000 + 5,
        vertices,
        subtasks,
        master_states: BTreeMap::from([("offsets".into(), seed.to_le_bytes().to_vec())]),
    }
}

/// A graph and a `_metadata` taken from it or from an earlier version of it (other parallelism).
pub fn graph_and_metadata() -> BoxedStrategy<(JobGraph, CheckpointMetadata)> {
    (valid_graph(), any::<u64>(), 1u64..1_000, any::<prop::sample::Index>())
        .prop_map(|(graph, seed, id, p)| {
            let mut old = graph.clone();
            if let Some(v) = old.vertices.get_mut(1)
                && old.edges.iter().all(|e| e.partitioning != Partitioning::Forward)
            {
                v.parallelism = 1 + p.index(v.max_parallelism as usize) as u32;
            }
            let meta = metadata_of(&old, seed, id);
            (graph, meta)
        })
        .boxed()
}

pub fn state_assignment() -> BoxedStrategy<StateAssignment> {
    let part =
        (state_file(), prop::collection::vec((small_u64(), small_u64()), 0..4)).prop_map(|(file, e)| {
            ListStatePart {
                file,
                elements: e.into_iter().map(|(start, end)| ByteRange { start, end }).collect(),
            }
        });
    let mode = prop_oneof![Just(OperatorStateMode::RoundRobin), Just(OperatorStateMode::Union)];
    let list = (name(), mode, prop::collection::vec(part, 0..3))
        .prop_map(|(name, mode, parts)| AssignedListState { name, mode, parts });
    let op = (keyed_handle(), prop::collection::vec(list, 0..2))
        .prop_map(|(keyed, list_states)| OperatorRestore { keyed, list_states, channel_state: Vec::new() });
    let restore =
        (small_u64(), text(), any::<u32>(), any::<u32>(), prop::collection::btree_map(name(), op, 0..3))
            .prop_map(|(checkpoint_id, base, start, end, operators)| TaskRestore {
                checkpoint_id,
                base_dir: PathBuf::from(base),
                key_groups: KeyGroupRange { start, end },
                operators,
            });
    (small_u64(), text(), prop::collection::btree_map(name(), restore, 0..3))
        .prop_map(|(checkpoint_id, base, subtasks)| StateAssignment {
            checkpoint_id,
            base_dir: base.into(),
            subtasks,
        })
        .boxed()
}

pub fn deployment() -> BoxedStrategy<Deployment> {
    (name(), any::<u32>(), valid_graph(), text(), proptest::option::of(state_assignment()), any::<bool>())
        .prop_map(|(job_id, attempt, graph, root, restore, incremental)| Deployment {
            job_id,
            attempt,
            graph: serde_json::to_value(graph).unwrap_or_default(),
            storage_root: root.into(),
            restore,
            incremental,
            placement: None,
        })
        .boxed()
}

pub fn finite() -> BoxedStrategy<f64> {
    prop_oneof![
        3 => 1.0f64..10.0,
        1 => 0.0f64..=1.0,
        1 => any::<f64>().prop_filter("JSON holds finite numbers only", |f| f.is_finite()),
    ]
    .boxed()
}

/// Any restart strategy, valid or not (JSON cannot hold NaN, so every float is finite).
pub fn restart_strategy() -> BoxedStrategy<RestartStrategy> {
    prop_oneof![
        Just(RestartStrategy::None),
        (any::<u32>(), duration())
            .prop_map(|(attempts, delay)| RestartStrategy::FixedDelay { attempts, delay }),
        (prop_oneof![0u32..5, Just(u32::MAX)], duration(), duration()).prop_map(
            |(max_failures_per_interval, failure_rate_interval, delay)| RestartStrategy::FailureRate {
                max_failures_per_interval,
                failure_rate_interval,
                delay,
            }
        ),
        (duration(), duration(), finite(), duration(), finite(), proptest::option::of(0u32..10)).prop_map(
            |(
                initial_backoff,
                max_backoff,
                backoff_multiplier,
                reset_backoff_threshold,
                jitter_factor,
                attempts,
            )| {
                RestartStrategy::ExponentialDelay {
                    initial_backoff,
                    max_backoff,
                    backoff_multiplier,
                    reset_backoff_threshold,
                    jitter_factor,
                    attempts_before_reset_backoff: attempts,
                }
            }
        ),
    ]
    .boxed()
}

pub fn restart_state() -> BoxedStrategy<RestartState> {
    (
        small_u64(),
        any::<u32>(),
        proptest::option::of(small_u64()),
        proptest::option::of((small_u64(), text()).prop_map(|(at_ms, cause)| FailureRecord { at_ms, cause })),
        proptest::option::of(small_u64()),
        small_u64(),
        any::<u32>(),
        prop::collection::vec_deque(small_u64(), 0..8),
    )
        .prop_map(
            |(
                failures,
                restarts,
                next_restart_ms,
                last_failure,
                previous_failure_ms,
                backoff_ms,
                attempts,
                times,
            )| {
                RestartState {
                    failures,
                    restarts,
                    next_restart_ms,
                    last_failure,
                    previous_failure_ms,
                    backoff_ms,
                    attempts_since_reset: attempts,
                    failure_times: times,
                }
            },
        )
        .boxed()
}

pub fn checkpoint_config() -> BoxedStrategy<CheckpointConfig> {
    let retention = prop_oneof![
        Just(ExternalizedRetention::RetainOnCancellation),
        Just(ExternalizedRetention::DeleteOnCancellation),
        Just(ExternalizedRetention::NoExternalized),
    ];
    (
        proptest::option::of(duration()),
        duration(),
        duration(),
        0u32..4,
        0u32..4,
        0u32..4,
        proptest::option::of(text()),
        proptest::option::of(text()),
        retention,
        any::<bool>(),
        duration(),
    )
        .prop_map(
            |(
                interval,
                timeout,
                min_pause,
                max_concurrent,
                tolerable_failures,
                retained,
                sp,
                st,
                retention,
                unaligned,
                aligned_checkpoint_timeout,
            )| {
                CheckpointConfig {
                    interval,
                    timeout,
                    min_pause,
                    max_concurrent,
                    tolerable_failures,
                    retained,
                    savepoint_dir: sp,
                    storage_dir: st,
                    externalized_retention: retention,
                    unaligned,
                    aligned_checkpoint_timeout,
                }
            },
        )
        .boxed()
}

pub fn job_spec() -> BoxedStrategy<JobSpec> {
    let graph = prop_oneof![
        3 => valid_graph().prop_map(|g| serde_json::to_value(g).unwrap_or_default()),
        1 => Just(serde_json::Value::Null),
    ];
    let mode = prop_oneof![Just(RestoreMode::NoClaim), Just(RestoreMode::Claim)];
    (
        graph,
        checkpoint_config(),
        proptest::option::of(text()),
        any::<bool>(),
        mode,
        proptest::option::of(restart_strategy()),
        any::<bool>(),
    )
        .prop_map(|(graph, checkpoint, restore_from, allow, restore_mode, restart_strategy, spread)| {
            JobSpec {
                graph,
                checkpoint,
                restore_from,
                allow_non_restored_state: allow,
                restore_mode,
                restart_strategy,
                placement: if spread {
                    cairn_protocol::job::PlacementStrategy::Spread
                } else {
                    cairn_protocol::job::PlacementStrategy::Pack
                },
            }
        })
        .boxed()
}

pub fn job_id() -> BoxedStrategy<JobId> {
    "[A-Za-z0-9_-][A-Za-z0-9_.-]{0,63}".prop_map(|s| JobId::new(s).unwrap_or_else(|e| panic!("{e}"))).boxed()
}
