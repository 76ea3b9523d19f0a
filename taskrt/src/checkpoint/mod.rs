//! Checkpointing on the task side.
//!
//! - [`alignment`]: the pure barrier-alignment state machine (which inputs are parked, when a
//!   checkpoint triggers, when one is aborted, when an aligned checkpoint turns unaligned).
//! - [`channel_state`]: the in-flight records an unaligned checkpoint persists, their file, and
//!   their replay on restore.
//! - [`pool`]: the bounded pool running asynchronous snapshot parts, and the per-task set of
//!   in-flight parts that can be cancelled (their files removed).

pub mod alignment;
pub mod channel_state;
pub mod pool;
