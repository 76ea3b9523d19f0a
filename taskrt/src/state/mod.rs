//! Operator state: what operators keep, how it is snapshotted to files, and how it comes back.
//!
//! - [`keyed`]: keyed value and map state of one operator in one subtask, organized by key
//!   group, with the incremental bookkeeping (which key-group segments can be reused).
//! - [`list`]: operator list state (round-robin or union redistribution).
//! - [`codec`]: the byte format of a key group's segment.
//! - [`storage`]: where files go (checkpoint storage, via `cairn_protocol::checkpoint`), durable
//!   writes, verified reads (size + CRC-32, of whole files or of key-group segments), and hooks
//!   to inject faults and count files and fsyncs in tests.
//! - [`snapshot`]: the synchronous part (serialize what must be written) and the asynchronous
//!   part (write it, producing the acknowledged `SubtaskState`).
//! - [`keyed_plan`]: the keyed part of a snapshot: one file per operator and checkpoint indexed
//!   by key group, and which segments an incremental checkpoint reuses.
//! - [`restore`]: loading the handles a subtask was assigned (the assignment itself is the
//!   contract crate's `cairn_protocol::assign`).

pub mod codec;
pub mod keyed;
pub mod keyed_plan;
pub mod list;
pub mod restore;
pub mod snapshot;
pub mod storage;

use std::path::PathBuf;

use cairn_protocol::checkpoint::{HandleError, KeyGroupRange};

/// Why reading, writing or using state failed.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("state file {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("state file {path} has CRC-32 {actual:08x}, its handle says {expected:08x}: the file is corrupt")]
    ChecksumMismatch { path: PathBuf, expected: u32, actual: u32 },
    #[error(
        "key group {key_group} in state file {path} has CRC-32 {actual:08x}, its handle says {expected:08x}: the file is corrupt"
    )]
    SegmentChecksumMismatch { path: PathBuf, key_group: u32, expected: u32, actual: u32 },
    #[error("state file {path} does not exist")]
    Missing { path: PathBuf },
    #[error("keyed state of operator {operator}: {source}")]
    InvalidHandle {
        operator: String,
        #[source]
        source: HandleError,
    },
    #[error("state file {path} is {actual} bytes, its handle says {expected}")]
    SizeMismatch { path: PathBuf, expected: u64, actual: u64 },
    #[error("state file {path} cannot be decoded: {reason}")]
    Corrupt { path: PathBuf, reason: String },
    #[error("state handle path {path:?} is not a safe relative path")]
    UnsafePath { path: String },
    #[error("key {key} is in key group {key_group}, outside this subtask's range {range:?}")]
    KeyOutsideRange { key: u64, key_group: u32, range: KeyGroupRange },
    #[error("state name {name:?} is invalid (use 1-64 characters from [A-Za-z0-9_-])")]
    InvalidStateName { name: String },
    #[error("element range {start}..{end} is outside state file {path} of {len} bytes")]
    ElementOutOfBounds { path: PathBuf, start: u64, end: u64, len: u64 },
    #[error("cannot restore vertex {vertex:?}: max parallelism changed from {old} to {new}")]
    MaxParallelismChanged { vertex: String, old: u32, new: u32 },
    #[error("cannot restore vertex {vertex:?}: {reason}")]
    Assignment { vertex: String, reason: String },
    #[error("snapshot of checkpoint {checkpoint_id} was cancelled")]
    Cancelled { checkpoint_id: u64 },
    #[error("snapshot worker failed: {0}")]
    Worker(String),
}
