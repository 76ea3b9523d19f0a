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
mod command_de;
mod job;
pub mod request;
mod state;

pub use command::{Command, CommandError, CommandResponse, MAX_BATCH, MAX_ID_RESERVATION, Outcome};
// The submitted job's vocabulary is the contract crate's; the registry stores it as it is.
pub use cairn_protocol::checkpoint::CheckpointKind;
pub use cairn_protocol::config::{CheckpointConfig, ConfigError};
pub use cairn_protocol::job::{JobId, JobIdError, JobSpec, PlacementStrategy};
pub use job::{CompletedCheckpoint, JobRecord, JobStatus, SavepointRecord};
pub use request::{RequestEntry, RequestTable};
pub use state::StateMachineData;
