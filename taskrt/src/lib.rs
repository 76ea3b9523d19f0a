//! `cairn-taskrt`: Cairn's task runtime. It runs the subtasks of stream jobs, aligns checkpoint
//! barriers, snapshots operator state (synchronous part on the task, asynchronous part on a
//! bounded pool), acknowledges to the coordinator, and commits side effects only when a
//! checkpoint is notified complete.
//!
//! # Layout
//!
//! | module | owns |
//! | --- | --- |
//! | [`link`] | the in-process coordinator link (bounded channels) |
//! | [`lifecycle`] | the task state machine and its legal transitions |
//! | [`operator`], [`registry`] | the operator contract and the kinds a graph may name |
//! | [`chain`] | the operators of one task and the order lifecycle calls reach them |
//! | [`task`] | the mailbox loop of one task |
//! | [`element`] | what travels on a channel: records, barriers, markers, priority barriers |
//! | [`exchange`] | channels between subtasks and their priority lanes, partitioning (key → key group → subtask) |
//! | [`checkpoint`] | barrier alignment (pure), in-flight records of unaligned checkpoints, the asynchronous snapshot pool |
//! | [`state`] | keyed and list state, snapshot files (full / incremental, CRC-32), loading an assigned restore |
//! | [`runtime`] | deploying a job graph in-process ([`runtime::LocalJob`]) |
//! | [`metrics`] | observable per-task counters (records, checkpoints, busy / idle / back-pressured time) and last checkpoint figures |
//! | [`exporter`] | per-subtask checkpoint and running-time figures for the worker's `/metrics` |
//! | [`demo`] | the demo pipeline (sequence source → keyed counter → 2PC file sink) and its verifier |
//! | [`testkit`] | a scripted coordinator for tests and benchmarks |
//! | [`worker`] | the `cairn-worker run` process: leader following over the task gateway, sessions, the job host |
//!
//! # Data flow
//!
//! ```text
//! coordinator ──CoordinatorMessage (term-fenced)──▶ task control channel (priority)
//!                                                       │
//! upstream subtasks ──StreamElement (bounded)──▶ InputGate ─▶ BarrierAligner ─▶ OperatorChain ─▶ OutputGate ──▶ downstream
//!                                                       │ barrier aligned / trigger
//!                                                       ▼
//!              prepare → forward barrier → sync snapshot (serialize) → async part on SnapshotPool (write, fsync, CRC)
//!                                                       │
//! coordinator ◀──TaskMessage::Acknowledge { SubtaskState, TaskCheckpointMetrics }
//! ```
//!
//! # Running a job in-process
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use cairn_taskrt::{demo::DemoJob, runtime::*, registry::OperatorRegistry,
//!     checkpoint::pool::SnapshotPool, state::storage::CheckpointStorage, testkit::ScriptedCoordinator};
//! let graph = DemoJob {
//!     source: Default::default(), output_dir: "/tmp/out".into(),
//!     source_parallelism: 1, parallelism: 2, max_parallelism: 128,
//! }.graph();
//! let storage = CheckpointStorage::new("/tmp/checkpoints", "demo");
//! let mut job = LocalJob::deploy(
//!     JobDeployment { job_id: "demo".into(), graph: graph.clone(), attempt: 0, storage: storage.clone(),
//!                     restore: None, options: RuntimeOptions::default() },
//!     &OperatorRegistry::with_builtins(), SnapshotPool::new(4))?;
//! let mut coordinator = ScriptedCoordinator::new("demo", storage, &graph);
//! coordinator.drive_completions(&mut job, 3, std::time::Duration::from_secs(10)).await?;
//! job.kill();
//! # Ok(()) }
//! ```

pub mod chain;
pub mod checkpoint;
pub mod demo;
pub mod element;
pub mod exchange;
pub mod exporter;
pub mod lifecycle;
pub mod link;
pub mod metrics;
pub mod network;
pub mod operator;
pub mod registry;
pub mod runtime;
pub mod state;
pub mod task;
pub mod testkit;
pub mod worker;
