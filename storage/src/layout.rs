//! The on-disk layout of the Raft database: which sled trees exist, what their keys are, and
//! what each value holds.
//!
//! This module owns the names so that the stores, the tests and any offline inspection tool
//! agree on them. One sled `Db` per node holds these trees:
//!
//! | tree | key | value (JSON) |
//! |------|-----|--------------|
//! | [`log_tree_name`]`(index)`: `raft_log.` and the segment's first index as 16 hex digits, one tree per [`SEGMENT_LEN`] indexes | log index, big-endian `u64` (8 bytes, so byte order is index order) | `openraft::Entry<TypeConfig>` |
//! | [`RAFT_META_TREE`] | [`VOTE_KEY`], [`COMMITTED_KEY`], [`LAST_PURGED_KEY`], [`FORMAT_KEY`] | `Vote`, `LogId`, `LogId`, `u64` |
//! | [`SM_JOBS_TREE`] | job id (UTF-8) | `JobRecord` |
//! | [`SM_META_TREE`] | [`APPLIED_KEY`], [`LEADERS_KEY`], [`APPLY_JOURNAL_KEY`] | `{ last_applied, last_membership }`, `[{ term, leader_id, first_index }]` (absent while empty), `{ applied, rows: [[job id, JobRecord or null]], leaders? }` (absent until the first apply after an install) |
//! | [`SNAPSHOT_TREE`] | [`SNAPSHOT_META_KEY`], [`SNAPSHOT_DATA_KEY`], [`SNAPSHOT_SEQ_KEY`] | `SnapshotMeta`, snapshot bytes, `u64` |
//!
//! The log is split into segment trees so that a purge drops whole trees instead of removing
//! entries one by one (see `segments`). Format 2 and older kept it in one tree,
//! [`LEGACY_LOG_TREE`], which opening a database moves into segments.
//!
//! The snapshot bytes are themselves JSON: `{ version, last_applied, last_membership, data,
//! leaders }` where `data` is the whole `StateMachineData` and `leaders` the leader history
//! (absent while empty).

use std::sync::Arc;

use cairn_raft::types::StorageError;
use openraft::{AnyError, StorageIOError};

use crate::codec;
use crate::durable::{DurableFiles, SyncError};

/// Raft log entries, before format 3 split them into segment trees.
pub const LEGACY_LOG_TREE: &str = "raft_log";
/// The name of every log segment tree starts with this, followed by the segment's first index
/// as 16 lowercase hex digits.
pub const LOG_SEGMENT_PREFIX: &str = "raft_log.";
/// Indexes per log segment tree. A purge drops the segments wholly behind the purge point, so
/// up to this many purged entries stay on disk meanwhile; at a thousand jobs (about 400
/// entries a second) a segment fills in under three seconds.
pub const SEGMENT_LEN: u64 = 1024;
/// Vote, committed log id, last purged log id and the on-disk format version.
pub const RAFT_META_TREE: &str = "raft_meta";
/// One row per job of the state machine.
pub const SM_JOBS_TREE: &str = "sm_jobs";
/// The state machine's last applied log id and last membership.
pub const SM_META_TREE: &str = "sm_meta";
/// The current snapshot.
pub const SNAPSHOT_TREE: &str = "sm_snapshot";

pub const VOTE_KEY: &str = "vote";
pub const COMMITTED_KEY: &str = "committed";
pub const LAST_PURGED_KEY: &str = "last_purged";
pub const FORMAT_KEY: &str = "format";
/// The applied state as of the last installed snapshot (or, in format 1, of the last apply).
pub const APPLIED_KEY: &str = "applied";
/// The last apply's effects: the applied state, every job row it wrote (or removed) and the
/// leader history if it changed. Written before those rows, so after a crash it covers whatever
/// part of them was lost (see `state_machine`).
pub const APPLY_JOURNAL_KEY: &str = "apply_journal";
/// The leader history ([`crate::LeaderTerm`]s, oldest first); written only when it changes.
pub const LEADERS_KEY: &str = "leaders";
pub const SNAPSHOT_META_KEY: &str = "meta";
pub const SNAPSHOT_DATA_KEY: &str = "data";
/// Counter making snapshot ids unique across rebuilds at the same log id.
pub const SNAPSHOT_SEQ_KEY: &str = "seq";

/// A file next to sled's own files, written once the database is initialized. sled treats
/// unreadable data as a torn write and recovers to an empty database; finding this marker
/// with an empty database tells that apart from a brand-new node.
pub const MARKER_FILE: &str = "CAIRN_STORAGE";

/// Version of this layout, recorded under [`FORMAT_KEY`] when a database is created.
///
/// 2: applies write the apply journal ([`APPLY_JOURNAL_KEY`]) and plain rows instead of one
/// transaction. A format-1 database is upgraded when it is opened (it has no journal, and its
/// rows match its applied state); a build that knows only format 1 refuses a format-2 database,
/// since it would ignore the journal.
///
/// 3: the log is split into segment trees ([`log_tree_name`]). Opening an older database
/// copies its log into segments, records format 3, then drops the old tree; a build that knows
/// only format 2 refuses a format-3 database, since it would find no log.
pub const FORMAT_VERSION: u64 = 3;
/// The oldest format this build opens (and upgrades).
pub const OLDEST_FORMAT_VERSION: u64 = 1;

/// The key of the log entry at `index`.
pub fn log_key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

/// The name of the log segment tree that holds `index`.
pub fn log_tree_name(index: u64) -> String {
    format!("{LOG_SEGMENT_PREFIX}{:016x}", index / SEGMENT_LEN * SEGMENT_LEN)
}

/// The segment number (first index / [`SEGMENT_LEN`]) a log tree name encodes after its
/// [`LOG_SEGMENT_PREFIX`]; `None` unless it is 16 lowercase hex digits naming a segment's
/// first index.
pub fn parse_segment(suffix: &[u8]) -> Option<u64> {
    if suffix.len() != 16 || !suffix.iter().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b)) {
        return None;
    }
    let first = u64::from_str_radix(std::str::from_utf8(suffix).ok()?, 16).ok()?;
    (first % SEGMENT_LEN == 0).then_some(first / SEGMENT_LEN)
}

/// The index a log key encodes; `None` if the key is not 8 bytes long.
pub fn log_index(key: &[u8]) -> Option<u64> {
    let bytes: [u8; 8] = key.try_into().ok()?;
    Some(u64::from_be_bytes(bytes))
}

/// Handles to every tree of a node's database.
#[derive(Clone)]
pub(crate) struct Trees {
    pub db: sled::Db,
    pub raft_meta: sled::Tree,
    pub jobs: sled::Tree,
    pub sm_meta: sled::Tree,
    pub snapshot: sled::Tree,
    /// What must be fsynced after a flush (sled's flush alone is not durable).
    pub durable: Arc<DurableFiles>,
}

/// Why [`Trees::flush_durably`] failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FlushError {
    #[error("sled flush failed: {0}")]
    Sled(#[from] sled::Error),
    #[error(transparent)]
    Sync(#[from] SyncError),
    #[error("the fsync task did not complete: {0}")]
    Task(#[from] tokio::task::JoinError),
}

impl Trees {
    pub fn open(db: sled::Db, durable: DurableFiles) -> Result<Self, sled::Error> {
        Ok(Self {
            raft_meta: db.open_tree(RAFT_META_TREE)?,
            jobs: db.open_tree(SM_JOBS_TREE)?,
            sm_meta: db.open_tree(SM_META_TREE)?,
            snapshot: db.open_tree(SNAPSHOT_TREE)?,
            db,
            durable: Arc::new(durable),
        })
    }

    /// Flushes every write made so far and makes it durable: sled's flush, then the fsyncs
    /// sled leaves out (see [`crate::durable`]). Call before acknowledging anything written.
    ///
    /// Both run in one blocking task. sled's `flush_async` would hand the flush to sled's own
    /// thread pool, whose every job wakes all of its idle threads: with the write sled itself
    /// hands to that pool, a flush woke fourteen threads, a third of a replica's CPU under load.
    pub async fn flush_durably(&self) -> Result<(), FlushError> {
        let db = self.db.clone();
        let durable = Arc::clone(&self.durable);
        tokio::task::spawn_blocking(move || -> Result<(), FlushError> {
            db.flush()?;
            // Taken after the flush completed, as `DurableFiles::sync` requires.
            let ticket = durable.ticket();
            durable.sync(ticket)?;
            Ok(())
        })
        .await?
    }
}

/// Reads the format version recorded in the database; `None` for a database sled just created
/// (or found empty).
pub(crate) fn read_format(raft_meta: &sled::Tree) -> Result<Option<u64>, StorageError> {
    let read_err = |e: AnyError| StorageIOError::read(e.add_context(|| "reading the on-disk format version"));
    match raft_meta.get(FORMAT_KEY).map_err(|e| read_err(AnyError::new(&e)))? {
        Some(raw) => Ok(Some(codec::decode(&raw).map_err(|e| read_err(AnyError::new(&e)))?)),
        None => Ok(None),
    }
}

/// Records [`FORMAT_VERSION`] in a new (or upgraded) database.
pub(crate) fn write_format(raft_meta: &sled::Tree) -> Result<(), StorageError> {
    let bytes = codec::encode(&FORMAT_VERSION).map_err(|e| StorageIOError::write(&e))?;
    raft_meta.insert(FORMAT_KEY, bytes).map_err(|e| StorageIOError::write(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_keys_sort_like_indexes() {
        let mut keys: Vec<[u8; 8]> = [300u64, 2, 1 << 40, 0, 255, 256].iter().map(|i| log_key(*i)).collect();
        keys.sort();
        let indexes: Vec<u64> = keys.iter().map(|k| log_index(k).unwrap_or(u64::MAX)).collect();
        assert_eq!(indexes, vec![0, 2, 255, 256, 300, 1 << 40]);
        assert_eq!(log_index(b"short"), None);
        assert_eq!(log_index(&[0; 9]), None);
    }

    #[test]
    fn segment_tree_names_round_trip() {
        for index in [0, 1, SEGMENT_LEN - 1, SEGMENT_LEN, 5 * SEGMENT_LEN + 7, u64::MAX] {
            let name = log_tree_name(index);
            let suffix = name.strip_prefix(LOG_SEGMENT_PREFIX).unwrap_or_default();
            assert_eq!(parse_segment(suffix.as_bytes()), Some(index / SEGMENT_LEN), "{name}");
        }
        assert_eq!(log_tree_name(SEGMENT_LEN + 3), "raft_log.0000000000000400");
        for bad in
            ["", "400", "000000000000040G", "0000000000000401", "00000000000004000", "000000000000040A"]
        {
            assert_eq!(parse_segment(bad.as_bytes()), None, "{bad:?}");
        }
    }
}
