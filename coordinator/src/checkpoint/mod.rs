//! The checkpoint coordinator core: pure, I/O-free rules for one job's checkpoints.
//!
//! The Raft leader runs one owner task per job that feeds [`Event`]s into a
//! [`CheckpointCoordinatorCore`] and carries out the [`Action`]s it returns (Raft proposals,
//! messages to tasks, timers, `_metadata` writes, deletions). Time comes in with each event
//! ([`Now`]); the only randomness (the initial trigger delay) is seeded from [`CoreConfig`].
//!
//! | module | owns |
//! | --- | --- |
//! | [`actions`] | the interface: events, actions and the types they carry |
//! | [`config`] | per-job configuration: the replicated `CheckpointConfig` plus coordinator-only settings |
//! | [`core`] | the state machine itself: triggering, the completion pipeline, failures, lifecycle |
//! | [`trigger`] | the trigger timer, min pause, queued request, savepoint request validation |
//! | [`pending`] | a checkpoint in flight: acks, validation of state handles, `_metadata` |
//! | [`registry`] | reference counts of the files retained checkpoints use (rebuilt on leader change) |
//! | [`failure`] | failure reasons and the tolerable-failure count |
//! | [`stats`] | per-checkpoint and per-job statistics (serde) |
//! | [`hooks`] | master hooks: coordinator-side state in checkpoints |
//! | [`restore`] | choosing a restore point, state assignment on rescale, counter advance |
//! | [`tasks`] | the job's subtasks and their attempts |
//! | [`error`] | `TriggerError` (answers to requests) and `Error` |
//!
//! Invariants (checked by the unit tests and a property test):
//! 1. A task hears of a checkpoint id only after the id was allocated through Raft.
//! 2. No task is notified of a completion before the completion's Raft commit.
//! 3. Completed checkpoint ids strictly increase.
//! 4. No discard names a file a retained (or possibly retained) checkpoint references; when a
//!    commit outcome is unknown, nothing is deleted.
//! 5. With periodic checkpoints on, the trigger timer is armed or a request is queued.

pub mod actions;
pub mod config;
pub mod core;
pub mod error;
pub mod failure;
pub mod hooks;
pub mod pending;
pub mod registry;
pub mod restore;
pub mod stats;
pub mod tasks;
pub mod trigger;

#[cfg(test)]
mod proptests;

pub use self::core::{CheckpointCoordinatorCore, Recovered};
pub use actions::{
    Action, AllocationToken, CheckpointOptions, DiscardCause, Event, FinishedOutcome, Now, RequestId,
    StrayAck, TimerToken, TriggerKind, TriggerSuccess,
};
pub use config::{CoreConfig, discards_on};
pub use error::{Error, TriggerError};
pub use failure::{CheckpointFailureReason, FailureManager};
pub use hooks::{HookError, MasterHook, MasterHooks};
pub use registry::SharedStateRegistry;
pub use restore::{RestoreCandidate, RestorePoint, choose_restore_point, counter_after_restore};
pub use stats::{CheckpointStats, CheckpointStatsTracker, JobCheckpointStats, StatsSummary};
pub use tasks::{TaskAttemptId, TaskDescriptor, TaskSet, TaskStatus};
