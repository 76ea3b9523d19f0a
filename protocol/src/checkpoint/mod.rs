//! Checkpoint data: what tasks write and what the coordinator writes about it.
//!
//! - [`kind`]: checkpoint, savepoint or stop-with-savepoint.
//! - [`handles`]: state handles, the descriptions of state files that tasks acknowledge and that
//!   `_metadata` stores (operator list state, file checksums, key-group ranges).
//! - [`subtask`]: what one subtask acknowledges: per operator its keyed and list state.
//! - [`keyed`]: keyed-state handles: one file per operator and checkpoint, indexed by key group
//!   (offset, length, CRC-32 of each key group's segment), and their validation.
//! - [`layout`]: where things live under the storage root (`<root>/<job>/chk-<id>/`,
//!   `<root>/<job>/shared/`, `<savepoint-dir>/savepoint-<job>-<id>-<random>/`).
//! - [`metadata`]: the `_metadata` file of a completed checkpoint: encoding, atomic durable
//!   write, and verified read.
//!
//! Paths inside handles are relative (to the job's checkpoint directory, or to the savepoint
//! directory), so a savepoint can be moved as a whole.

pub mod handles;
pub mod keyed;
pub mod kind;
pub mod layout;
pub mod metadata;
pub mod subtask;

pub use handles::{KeyGroupRange, OperatorListState, OperatorStateMode, StateFile, TaskCheckpointMetrics};
pub use keyed::{HandleError, KeyGroupSegment, KeyedStateHandle};
pub use kind::CheckpointKind;
pub use layout::CheckpointLayout;
pub use metadata::{
    CheckpointMetadata, MetadataError, MetadataPointer, VertexInfo, read_metadata, read_metadata_unverified,
    write_metadata, write_metadata_reusing,
};
pub use subtask::{ChannelStateHandle, OperatorSubtaskState, SubtaskState};
