//! The replicated state machine: what a checkpoint coordinator must never lose.
//!
//! [`StateMachineData`] holds the job registry; each [`JobRecord`] owns its checkpoint ID
//! counter, its completed checkpoint store (with retention) and its savepoints. A [`Command`]
//! is proposed through Raft and applied by [`StateMachineData::apply`], which is deterministic
//! and pure: every replica computes the same [`Outcome`] or the same [`CommandError`] for the
//! same log. Validation errors are ordinary, committed responses that travel back to the
//! proposer; they never change state.
//!
//! Storage (the sled store in `cairn-storage`) persists the record of the one job a command
//! touches ([`Command::job`]) together with the applied log id, in one transaction.

mod command;
mod config;
mod job;
pub mod request;
mod state;

pub use command::{Command, CommandError, CommandResponse, Outcome};
pub use config::{CheckpointConfig, ConfigError};
pub use job::{
    CheckpointKind, CompletedCheckpoint, JobId, JobIdError, JobRecord, JobSpec, JobStatus, SavepointRecord,
};
pub use request::{RequestEntry, RequestTable};
pub use state::StateMachineData;
