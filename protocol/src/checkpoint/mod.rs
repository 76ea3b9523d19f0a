//! Checkpoint data: what tasks write and what the coordinator writes about it.
//!
//! - [`kind`]: checkpoint, savepoint or stop-with-savepoint.
//! - [`handles`]: state handles, the descriptions of state files that tasks acknowledge and that
//!   `_metadata` stores (keyed state per key group, operator list state, file checksums).
//! - [`layout`]: where things live under the storage root (`<root>/<job>/chk-<id>/`,
//!   `<root>/<job>/shared/`, `<savepoint-dir>/savepoint-<job>-<id>-<random>/`).
//! - [`metadata`]: the `_metadata` file of a completed checkpoint: encoding, atomic durable
//!   write, and verified read.
//!
//! Paths inside handles are relative (to the job's checkpoint directory, or to the savepoint
//! directory), so a savepoint can be moved as a whole.

pub mod handles;
pub mod kind;
pub mod layout;
pub mod metadata;

pub use handles::{
    KeyGroupRange, OperatorListState, OperatorStateMode, OperatorSubtaskState, StateFile, SubtaskState,
    TaskCheckpointMetrics,
};
pub use kind::CheckpointKind;
pub use layout::CheckpointLayout;
pub use metadata::{
    CheckpointMetadata, MetadataError, MetadataPointer, VertexInfo, read_metadata, read_metadata_unverified,
    write_metadata,
};
