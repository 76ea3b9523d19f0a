//! Checkpointing on the task side.
//!
//! - [`alignment`]: the pure barrier-alignment state machine (which inputs are parked, when a
//!   checkpoint triggers, when one is aborted).
//! - [`pool`]: the bounded pool running asynchronous snapshot parts, and the per-task set of
//!   in-flight parts that can be cancelled (their files removed).

pub mod alignment;
pub mod pool;
