//! The Raft log as a run of sled trees, one per [`SEGMENT_LEN`] consecutive indexes.
//!
//! A purge deletes the log behind a snapshot: thousands of entries every few seconds on a
//! replica coordinating a thousand jobs. Removing them key by key is a sled tree update and a
//! log record each, 160–400 ms of a loaded replica's CPU (docs/SCALING.md, round 10), and the
//! seconds in which it ran were the slow seconds of every job's checkpoints. Dropping a whole
//! tree frees its pages instead, a few milliseconds for a thousand entries. So the log lives in
//! segment trees named by the first index they may hold ([`crate::layout::log_tree_name`]), and
//! a purge drops the segments that lie wholly at or below the purge point. The purged entries
//! of the segment the purge point falls into stay on disk until that segment is dropped in
//! turn; reads never return them (the log store starts every read after the purge point).
//!
//! Writes go to the segments in index order, so a crash (after which sled recovers a prefix of
//! its writes) leaves a prefix of an append, never a hole. [`Segments`] is shared by every
//! clone of the log store; its map of open trees is held only while it is looked up or
//! changed, never across a sled write or an await.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use cairn_raft::types::StorageError;
use openraft::{AnyError, ErrorSubject, ErrorVerb, StorageIOError};

use crate::layout::{self, SEGMENT_LEN};

/// The open segment trees of one log, by segment number (first index / [`SEGMENT_LEN`]).
#[derive(Clone)]
pub(crate) struct Segments {
    db: sled::Db,
    open: Arc<RwLock<BTreeMap<u64, sled::Tree>>>,
}

impl Segments {
    /// Opens every segment tree of the database. A tree whose name has the log's prefix but not
    /// a segment number is an error: it would hold entries no read finds.
    pub(crate) fn open(db: &sled::Db) -> Result<Self, StorageError> {
        let mut open = BTreeMap::new();
        for name in db.tree_names() {
            let Some(rest) = name.strip_prefix(layout::LOG_SEGMENT_PREFIX.as_bytes()) else { continue };
            let segment = layout::parse_segment(rest).ok_or_else(|| {
                let name = String::from_utf8_lossy(&name).into_owned();
                tracing::error!(tree = %name, "raft log tree with an unreadable segment number");
                StorageIOError::read_logs(AnyError::error(format!(
                    "raft log tree `{name}` does not name a segment (expected `{}` and 16 hex digits)",
                    layout::LOG_SEGMENT_PREFIX
                )))
            })?;
            let tree = db.open_tree(&name).map_err(read_logs)?;
            open.insert(segment, tree);
        }
        Ok(Self { db: db.clone(), open: Arc::new(RwLock::new(open)) })
    }

    fn read(&self) -> RwLockReadGuard<'_, BTreeMap<u64, sled::Tree>> {
        // A panic while the map was held leaves it whole (every change is one map call).
        self.open.read().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, BTreeMap<u64, sled::Tree>> {
        self.open.write().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The tree of the segment holding `index`, created if it does not exist yet.
    pub(crate) fn tree_for(&self, index: u64) -> Result<sled::Tree, StorageError> {
        let segment = index / SEGMENT_LEN;
        if let Some(tree) = self.read().get(&segment) {
            return Ok(tree.clone());
        }
        let tree = self.db.open_tree(layout::log_tree_name(index)).map_err(write_logs)?;
        Ok(self.write().entry(segment).or_insert(tree).clone())
    }

    /// Writes log rows, given in index order, segment by segment: each segment's rows in one
    /// sled batch, so atomically, and a crash keeps a prefix of them. A segment's lone row (the
    /// usual append under group commit) is one insert: a sled batch seals sled's current write
    /// buffer to keep the batch in one piece, which costs a write on sled's thread pool that a
    /// single insert, atomic by itself, does not need. The first failing row stops the writing.
    pub(crate) fn write_rows(
        &self,
        rows: impl IntoIterator<Item = Result<Row, StorageError>>,
    ) -> Result<(), StorageError> {
        let mut pending: Option<(u64, Vec<Row>)> = None;
        for row in rows {
            let row = row?;
            let segment = row.0 / SEGMENT_LEN;
            match &mut pending {
                Some((s, rows)) if *s == segment => rows.push(row),
                _ => {
                    if let Some((s, rows)) = pending.replace((segment, vec![row])) {
                        self.write_segment(s, rows)?;
                    }
                }
            }
        }
        match pending {
            Some((s, rows)) => self.write_segment(s, rows),
            None => Ok(()),
        }
    }

    fn write_segment(&self, segment: u64, mut rows: Vec<Row>) -> Result<(), StorageError> {
        let tree = self.tree_for(segment * SEGMENT_LEN)?;
        if rows.len() == 1
            && let Some((index, bytes)) = rows.pop()
        {
            tree.insert(layout::log_key(index), bytes).map_err(write_logs)?;
        } else {
            let mut batch = sled::Batch::default();
            for (index, bytes) in rows {
                batch.insert(&layout::log_key(index), bytes);
            }
            tree.apply_batch(batch).map_err(write_logs)?;
        }
        Ok(())
    }

    /// The trees of the segments that may hold indexes in `start..=end`, in index order.
    pub(crate) fn covering(&self, start: u64, end: u64) -> Vec<sled::Tree> {
        if start > end {
            return Vec::new();
        }
        self.read().range(start / SEGMENT_LEN..=end / SEGMENT_LEN).map(|(_, tree)| tree.clone()).collect()
    }

    /// Every segment tree, newest first.
    pub(crate) fn newest_first(&self) -> Vec<sled::Tree> {
        self.read().values().rev().cloned().collect()
    }

    /// Drops every segment that holds only indexes at or below `upto`; returns how many.
    pub(crate) fn drop_through(&self, upto: u64) -> Result<usize, StorageError> {
        // Segment `s` holds `s * LEN ..= s * LEN + LEN - 1`.
        let below = (upto.saturating_add(1)) / SEGMENT_LEN;
        self.drop_where(|segment| segment < below)
    }

    /// Drops every segment that holds only indexes at or above `from`; returns how many.
    pub(crate) fn drop_from(&self, from: u64) -> Result<usize, StorageError> {
        let first = from.div_ceil(SEGMENT_LEN);
        self.drop_where(|segment| segment >= first)
    }

    fn drop_where(&self, doomed: impl Fn(u64) -> bool) -> Result<usize, StorageError> {
        let segments: Vec<u64> = self.read().keys().copied().filter(|s| doomed(*s)).collect();
        for segment in &segments {
            // Out of the map first: nothing looks the tree up while sled frees its pages.
            self.write().remove(segment);
            self.db.drop_tree(layout::log_tree_name(segment * SEGMENT_LEN)).map_err(delete_logs)?;
        }
        Ok(segments.len())
    }

    /// Entries stored, purged ones included.
    pub(crate) fn stored_entries(&self) -> usize {
        self.read().values().map(sled::Tree::len).sum()
    }
}

/// A log row: the entry's index and its encoding.
pub(crate) type Row = (u64, Vec<u8>);

/// The key range of `start..=end` within one segment tree.
pub(crate) fn key_range(start: u64, end: u64) -> (Bound<[u8; 8]>, Bound<[u8; 8]>) {
    (Bound::Included(layout::log_key(start)), Bound::Included(layout::log_key(end)))
}

pub(crate) fn read_logs(e: sled::Error) -> StorageIOError<u64> {
    StorageIOError::read_logs(&e)
}

/// The index a log key encodes; a key that is not 8 bytes long is corrupt.
pub(crate) fn key_index(key: &[u8]) -> Result<u64, StorageError> {
    layout::log_index(key).ok_or_else(|| {
        tracing::error!(key = ?key, "corrupt raft log key");
        StorageIOError::read_logs(AnyError::error(format!(
            "log key {key:?} is {} bytes long, expected 8",
            key.len()
        )))
        .into()
    })
}

fn write_logs(e: sled::Error) -> StorageIOError<u64> {
    StorageIOError::write_logs(&e)
}

pub(crate) fn delete_logs(e: sled::Error) -> StorageIOError<u64> {
    StorageIOError::new(ErrorSubject::Logs, ErrorVerb::Delete, &e)
}

/// Moves the entries of a database written before the log was split into segments (format 2
/// and older: one tree, [`layout::LEGACY_LOG_TREE`]) into segment trees. Idempotent: a crash
/// part way leaves the old tree whole, and the next open copies again. The caller makes the
/// copy durable, records the new format, and only then drops the old tree
/// ([`drop_legacy_log`]).
pub(crate) fn copy_legacy_log(db: &sled::Db, segments: &Segments) -> Result<u64, StorageError> {
    if !has_legacy_log(db) {
        return Ok(0);
    }
    let legacy = db.open_tree(layout::LEGACY_LOG_TREE).map_err(read_logs)?;
    let mut copied = 0;
    segments.write_rows(legacy.iter().map(|row| {
        let (key, value) = row.map_err(read_logs)?;
        copied += 1;
        Ok((key_index(&key)?, value.to_vec()))
    }))?;
    Ok(copied)
}

/// Drops the pre-segment log tree, once its entries are durably in segments and the new format
/// is recorded.
pub(crate) fn drop_legacy_log(db: &sled::Db) -> Result<bool, StorageError> {
    if !has_legacy_log(db) {
        return Ok(false);
    }
    db.drop_tree(layout::LEGACY_LOG_TREE).map_err(delete_logs)?;
    Ok(true)
}

fn has_legacy_log(db: &sled::Db) -> bool {
    db.tree_names().iter().any(|name| name == layout::LEGACY_LOG_TREE.as_bytes())
}
