//! `cairn-protocol`: the contract between Cairn's control plane (the coordinator replicas) and
//! its data plane (the task runtime), and what the operator CLI needs to check a job before
//! submitting it. Both planes depend on this crate and never on each other.
//!
//! | module | owns |
//! | --- | --- |
//! | [`job`] | job ids and the submitted job spec |
//! | [`config`] | a job's checkpoint configuration (Flink's names and defaults) and its validation |
//! | [`graph`] | the job graph (JSON), its validation and typed errors |
//! | [`operators`] | operator kinds as data: names, sources and sinks, configuration schemas |
//! | [`messages`] | leader ⇄ task messages, term fencing, deployments and task commands |
//! | [`checkpoint`] | checkpoint kinds, state handles, the storage layout, `_metadata` |
//! | [`keygroups`] | key → key group → subtask, shared by partitioning and keyed state |
//! | [`assign`] | the one state assignment function used on every restore |
//! | [`restart`] | restart strategies (Flink's) and the replicated state they keep |
//!
//! Everything here is plain data plus pure functions (and the `_metadata` file's durable write
//! and verified read); it links no Raft, no storage engine and no task code.
//!
//! # Data flow
//!
//! ```text
//! cairnctl ──JobSpec (graph validated against the OperatorCatalog)──▶ replicated job registry
//! leader: _metadata ──assign_states──▶ Deployment { restore: StateAssignment } ──▶ worker
//! worker tasks ──TaskMessage::Acknowledge { SubtaskState }──▶ leader ──▶ _metadata
//! ```

pub mod assign;
pub mod checkpoint;
pub mod config;
pub mod graph;
pub mod job;
pub mod keygroups;
pub mod messages;
pub mod operators;
pub mod restart;
