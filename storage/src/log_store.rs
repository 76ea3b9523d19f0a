//! The Raft log store: log entries, the vote, the committed log id and the purge point.
//!
//! [`LogStore`] owns the [`LOG_TREE`](crate::layout::LOG_TREE) and
//! [`RAFT_META_TREE`](crate::layout::RAFT_META_TREE) trees. Openraft serializes all writes to
//! it; durability is what matters here:
//!
//! - `save_vote` returns only after the vote is durable on disk (a node must never vote twice
//!   in a term, even across a power loss);
//! - `append` writes all entries in one atomic batch and hands openraft's callback to the
//!   [group commit](crate::group_commit): the callback completes (and openraft may acknowledge
//!   the entries to the leader) only after a flush and fsync that covers them, one flush for
//!   every append that queued meanwhile;
//! - `truncate` first waits for every earlier append to complete, so that no completion of a
//!   removed entry arrives after the removal;
//! - `purge` records the new purge point before deleting the entries behind it, so a crash in
//!   between leaves extra entries (deleted again at the next open), never a hole; it neither
//!   deletes them itself (the [purger](crate::purger) does, on a blocking thread, by dropping
//!   the [segment](crate::segments) trees wholly behind the purge point) nor flushes (the next
//!   append's flush covers it), so openraft's core is never held up by it. Reads start after
//!   the purge point, so the purged entries that share a segment with live ones stay unseen
//!   until their segment goes.
//!
//! "Flushed" here always means [`Trees::flush_durably`]: sled's flush followed by the fsyncs
//! sled leaves out (see [`crate::durable`]).
//!
//! Reads decode every record they return; a record that does not decode, or a log key that is
//! not 8 bytes, is a [`StorageError`], never "no entry". The exception is the log's
//! [tail](crate::tail): the last entries appended are kept decoded in memory and reads within
//! them are answered from there, as written.

use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use cairn_raft::TypeConfig;
use cairn_raft::types::{Entry, LogId, StorageError, Vote};
use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{AnyError, ErrorSubject, ErrorVerb, OptionalSend, RaftLogReader, StorageIOError};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::codec;
use crate::group_commit::GroupCommit;
use crate::layout::{self, COMMITTED_KEY, LAST_PURGED_KEY, Trees, VOTE_KEY};
use crate::purger::Purger;
use crate::segments::{self, Segments, delete_logs, key_index, read_logs};
use crate::tail::Tail;

/// The sled-backed Raft log store. Cheap to clone: clones share the same trees, and a clone is
/// also the log reader handed to openraft's replication tasks.
#[derive(Clone)]
pub struct LogStore {
    trees: Trees,
    segments: Segments,
    /// The first index a read may return: one past the purge point (0 before any purge).
    first_readable: Arc<AtomicU64>,
    meta: sled::Tree,
    commit: GroupCommit,
    purger: Purger,
    /// The last entries appended, decoded, for the reads that follow an append.
    tail: Tail,
}

impl std::fmt::Debug for LogStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogStore")
            .field("stored_entries", &self.segments.stored_entries())
            .finish_non_exhaustive()
    }
}

impl LogStore {
    /// Validates the persisted metadata and the last entry, and completes a purge that a crash
    /// interrupted.
    pub(crate) fn open(trees: &Trees) -> Result<Self, StorageError> {
        let store = Self {
            trees: trees.clone(),
            segments: Segments::open(&trees.db)?,
            first_readable: Arc::new(AtomicU64::new(0)),
            meta: trees.raft_meta.clone(),
            commit: GroupCommit::default(),
            purger: Purger::default(),
            tail: Tail::default(),
        };
        store.vote()?;
        store.committed()?;
        if let Some(purged) = store.last_purged()? {
            store.first_readable.store(purged.index.saturating_add(1), Ordering::Release);
            let leftover = store.segments.drop_through(purged.index)?;
            if leftover > 0 {
                tracing::info!(upto = %purged, segments = leftover, "completed an interrupted log purge");
            }
        }
        let state = store.log_state()?;
        tracing::debug!(
            last_purged = ?state.last_purged_log_id,
            last_log = ?state.last_log_id,
            stored_entries = store.segments.stored_entries(),
            "opened raft log"
        );
        Ok(store)
    }

    /// Number of entries the log holds after its purge point (what reads can return).
    pub fn entry_count(&self) -> usize {
        let from = self.first_readable.load(Ordering::Acquire);
        self.segments
            .covering(from, u64::MAX)
            .iter()
            .map(|tree| tree.range(segments::key_range(from, u64::MAX)).count())
            .sum()
    }

    /// Number of entries on disk, purged ones included: a purge deletes its entries in the
    /// background (see [`LogStore::purged_entries_deleted`]), and purged entries that share a
    /// segment with live ones stay until their segment is dropped.
    pub fn stored_entry_count(&self) -> usize {
        self.segments.stored_entries()
    }

    /// Waits until the segments wholly at or below `upto`, purged by this store, are dropped.
    pub async fn purged_entries_deleted(&self, upto: u64) {
        self.purger.deleted(upto).await
    }

    /// The vote saved by `save_vote`.
    pub fn vote(&self) -> Result<Option<Vote>, StorageError> {
        self.read_meta(VOTE_KEY, ErrorSubject::Vote)
    }

    /// The committed log id saved by `save_committed`.
    pub fn committed(&self) -> Result<Option<LogId>, StorageError> {
        self.read_meta(COMMITTED_KEY, ErrorSubject::Logs)
    }

    /// The last purged log id.
    pub fn last_purged(&self) -> Result<Option<LogId>, StorageError> {
        self.read_meta(LAST_PURGED_KEY, ErrorSubject::Logs)
    }

    /// The purge point and the last log id; the last log id is the purge point when every
    /// entry has been purged.
    pub fn log_state(&self) -> Result<LogState<TypeConfig>, StorageError> {
        let last_purged_log_id = self.last_purged()?;
        let mut last_entry = None;
        for tree in self.segments.newest_first() {
            if let Some((key, value)) = tree.last().map_err(read_logs)? {
                last_entry = Some(decode_entry(&key, &value)?.log_id);
                break;
            }
        }
        let last_log_id = std::cmp::max(last_entry, last_purged_log_id);
        Ok(LogState { last_purged_log_id, last_log_id })
    }

    /// Entries with index in `range` after the purge point, in index order. Missing entries are
    /// skipped. Answered from the [tail](crate::tail) of recent entries when it covers the
    /// range.
    pub fn entries(&self, range: impl RangeBounds<u64>) -> Result<Vec<Entry>, StorageError> {
        if let Some(entries) = self.tail.read(&range) {
            return Ok(entries);
        }
        self.entries_on_disk(range)
    }

    /// [`LogStore::entries`], always read from sled.
    fn entries_on_disk(&self, range: impl RangeBounds<u64>) -> Result<Vec<Entry>, StorageError> {
        let start = match range.start_bound() {
            Bound::Included(s) => *s,
            Bound::Excluded(s) => match s.checked_add(1) {
                Some(s) => s,
                None => return Ok(Vec::new()),
            },
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(e) => *e,
            Bound::Excluded(e) => match e.checked_sub(1) {
                Some(e) => e,
                None => return Ok(Vec::new()),
            },
            Bound::Unbounded => u64::MAX,
        };
        let start = start.max(self.first_readable.load(Ordering::Acquire));
        let mut entries = Vec::new();
        for tree in self.segments.covering(start, end) {
            for item in tree.range(segments::key_range(start, end)) {
                let (key, value) = item.map_err(read_logs)?;
                entries.push(decode_entry(&key, &value)?);
            }
        }
        Ok(entries)
    }

    fn read_meta<T: DeserializeOwned>(
        &self,
        key: &str,
        subject: ErrorSubject<u64>,
    ) -> Result<Option<T>, StorageError> {
        let io_err = |e: AnyError| {
            StorageIOError::new(
                subject.clone(),
                ErrorVerb::Read,
                e.add_context(|| format!("raft meta `{key}`")),
            )
        };
        let Some(raw) = self.meta.get(key).map_err(|e| io_err(AnyError::new(&e)))? else {
            return Ok(None);
        };
        match codec::decode(&raw) {
            Ok(value) => Ok(Some(value)),
            Err(e) => {
                tracing::error!(key, error = %e, "corrupt raft meta record");
                Err(io_err(AnyError::new(&e)).into())
            }
        }
    }

    fn write_meta<T: Serialize>(
        &self,
        key: &str,
        value: &T,
        subject: ErrorSubject<u64>,
    ) -> Result<(), StorageError> {
        let io_err = |e: AnyError| {
            StorageIOError::new(
                subject.clone(),
                ErrorVerb::Write,
                e.add_context(|| format!("raft meta `{key}`")),
            )
        };
        let bytes = codec::encode(value).map_err(|e| io_err(AnyError::new(&e)))?;
        self.meta.insert(key, bytes).map_err(|e| io_err(AnyError::new(&e)))?;
        Ok(())
    }

    /// Flushes and fsyncs (see [`Trees::flush_durably`]).
    async fn flush(&self, subject: ErrorSubject<u64>) -> Result<(), StorageError> {
        self.trees
            .flush_durably()
            .await
            .map_err(|e| StorageIOError::new(subject, ErrorVerb::Write, AnyError::new(&e)))?;
        Ok(())
    }

    /// Writes the entries; not yet durable. Atomic within a segment, and written segment by
    /// segment in index order, so a crash leaves a prefix of them (see
    /// [`Segments::write_rows`]).
    fn write_entries(
        &self,
        entries: impl Iterator<Item = Entry>,
    ) -> Result<(u64, Option<LogId>), StorageError> {
        let mut written = Vec::new();
        let mut rows = Vec::new();
        for entry in entries {
            let bytes =
                codec::encode(&entry).map_err(|e| StorageIOError::write_log_entry(entry.log_id, &e))?;
            let index = entry.log_id.index;
            written.push((entry, bytes.len()));
            rows.push(Ok((index, bytes)));
        }
        let count = written.len() as u64;
        let last = written.last().map(|(entry, _)| entry.log_id);
        self.segments.write_rows(rows)?;
        self.tail.appended(written);
        Ok((count, last))
    }

    /// Deletes every entry at or above `from`: the segments wholly above it are dropped, the
    /// one it falls into loses its entries from `from` on. Returns how many segments it dropped.
    fn remove_from(&self, from: u64) -> Result<usize, StorageError> {
        let dropped = self.segments.drop_from(from)?;
        if let Some(tree) = self.segments.covering(from, from).pop() {
            remove_indexes(&tree, from, u64::MAX)?;
        }
        Ok(dropped)
    }
}

/// Entries removed per sled batch.
const REMOVE_BATCH: u64 = 256;

/// Deletes the entries of one segment tree with an index in `from..=to`, in batches; returns
/// how many keys it named. The keys are computed, not listed: the indexes between the first
/// and the last entry are contiguous, and listing them would read every value (large ones from
/// sled's blob files).
fn remove_indexes(log: &sled::Tree, from: u64, to: u64) -> Result<u64, StorageError> {
    let edge = |row: sled::Result<Option<(sled::IVec, sled::IVec)>>| -> Result<Option<u64>, StorageError> {
        row.map_err(delete_logs)?.map(|(key, _)| key_index(&key)).transpose()
    };
    let (Some(first), Some(last)) = (edge(log.first())?, edge(log.last())?) else {
        return Ok(0);
    };
    let (from, to) = (from.max(first), to.min(last));
    if from > to {
        return Ok(0);
    }
    let mut start = from;
    loop {
        let end = start.saturating_add(REMOVE_BATCH - 1).min(to);
        let mut batch = sled::Batch::default();
        for index in start..=end {
            batch.remove(&layout::log_key(index));
        }
        log.apply_batch(batch).map_err(delete_logs)?;
        if end == to {
            return Ok(to - from + 1);
        }
        start = end + 1;
    }
}

/// Decodes a log row, checking that the key is a valid index and matches the entry.
fn decode_entry(key: &[u8], value: &[u8]) -> Result<Entry, StorageError> {
    let index = key_index(key)?;
    let entry: Entry = codec::decode(value).map_err(|e| {
        tracing::error!(index, error = %e, "corrupt raft log entry");
        StorageIOError::read_log_at_index(index, &e)
    })?;
    if entry.log_id.index != index {
        tracing::error!(index, entry = %entry.log_id, "raft log entry stored under the wrong key");
        return Err(StorageIOError::read_log_at_index(
            index,
            AnyError::error(format!("entry {} is stored under index {index}", entry.log_id)),
        )
        .into());
    }
    Ok(entry)
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        self.entries(range)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        self.log_state()
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        self.write_meta(VOTE_KEY, vote, ErrorSubject::Vote)?;
        self.flush(ErrorSubject::Vote).await?;
        tracing::debug!(%vote, "saved vote");
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        self.vote()
    }

    /// Not flushed on its own: losing the latest committed id in a crash only means re-applying
    /// from an earlier point, which openraft handles. It becomes durable with the next flush.
    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        match committed {
            Some(log_id) => self.write_meta(COMMITTED_KEY, &log_id, ErrorSubject::Logs),
            None => {
                self.meta.remove(COMMITTED_KEY).map_err(|e| StorageIOError::write_logs(&e))?;
                Ok(())
            }
        }
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        self.committed()
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        match self.write_entries(entries.into_iter()) {
            Ok((count, last)) => {
                tracing::trace!(count, last = ?last, "appended raft log entries; flush queued");
                self.commit.submit(self.trees.clone(), callback).await;
                Ok(())
            }
            Err(e) => {
                tracing::error!(error = %e, "appending raft log entries failed");
                callback.log_io_completed(Err(io::Error::other(e.to_string())));
                Err(e)
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.commit.barrier().await.map_err(|e| StorageIOError::write_logs(AnyError::new(&e)))?;
        self.tail.truncated(log_id.index);
        let dropped = self.remove_from(log_id.index)?;
        self.flush(ErrorSubject::Logs).await?;
        tracing::debug!(since = %log_id, segments_dropped = dropped, "truncated raft log");
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        if let Some(current) = self.last_purged()?
            && current >= log_id
        {
            return Ok(());
        }
        // Record the purge point first: a crash before the deletion leaves surplus entries that
        // the next open deletes, never a log whose start is unaccounted for.
        self.write_meta(LAST_PURGED_KEY, &log_id, ErrorSubject::Logs)?;
        self.first_readable.fetch_max(log_id.index.saturating_add(1), Ordering::AcqRel);
        self.tail.purged(log_id.index);
        // Neither deleted nor flushed here: openraft's core waits for this call, and dropping
        // segment trees (or a flush freeing their blob files) would hold up its heartbeats. The
        // purger drops them on a blocking thread; the next append's flush makes the purge
        // durable. Until then a crash only keeps entries behind a durable snapshot, which the
        // next purge or open deletes.
        let (segments, upto) = (self.segments.clone(), log_id.index);
        self.purger.delete_through(upto, move || segments.drop_through(upto).map(|n| n as u64));
        tracing::debug!(upto = %log_id, "purged raft log");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use openraft::CommittedLeaderId;
    use openraft::storage::RaftLogStorageExt;

    use super::*;
    use crate::layout::SEGMENT_LEN;

    fn blank(index: u64) -> Entry {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: openraft::EntryPayload::Blank,
        }
    }

    /// Corruption appearing while the store is open is reported by reads, not only at open.
    #[tokio::test]
    async fn corrupt_records_while_running_are_read_errors() {
        let dir = tempfile::TempDir::new().unwrap();
        let (mut log, _sm) = crate::open(dir.path()).unwrap();
        log.blocking_append((1..=3).map(blank)).await.unwrap();
        log.save_vote(&Vote::new(1, 1)).await.unwrap();

        // As after a restart: every read below goes to sled, not to the tail of recent entries.
        log.tail.clear();
        log.meta.insert(VOTE_KEY, b"{\"leader_id\":".to_vec()).unwrap();
        let err = log.read_vote().await.unwrap_err();
        assert!(err.to_string().contains("Vote"), "{err}");

        log.meta.insert(COMMITTED_KEY, b"-".to_vec()).unwrap();
        assert!(log.read_committed().await.is_err());

        log.segments.tree_for(3).unwrap().insert(layout::log_key(3), b"garbage".to_vec()).unwrap();
        assert!(log.get_log_state().await.is_err(), "the last entry decides the log state");
        assert!(log.try_get_log_entries(3..).await.is_err());
        assert_eq!(log.try_get_log_entries(1..3).await.unwrap().len(), 2);

        log.segments.tree_for(3).unwrap().insert(layout::log_key(3), encode_blank(3)).unwrap();
        // Sorts after every 8-byte key starting with three zero bytes and a zero: within a read.
        log.segments.tree_for(0).unwrap().insert([0u8, 0, 0, 1], encode_blank(0)).unwrap();
        assert!(log.try_get_log_entries(..).await.is_err(), "a 4-byte key is not an index");
    }

    fn encode_blank(index: u64) -> Vec<u8> {
        codec::encode(&blank(index)).unwrap()
    }

    /// Purges and truncations remove exactly the entries in their range, also when the log no
    /// longer starts at 1, when a purge point lies beyond the last entry (after a snapshot was
    /// installed), and when an entry is too large to be stored inline.
    #[tokio::test]
    async fn purge_and_truncate_remove_exactly_their_range() {
        let dir = tempfile::TempDir::new().unwrap();
        let (mut log, _sm) = crate::open(dir.path()).unwrap();
        let big = |index: u64| Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: openraft::EntryPayload::Normal(cairn_raft::model::Command::RegisterJob {
                job: cairn_raft::model::JobId::new("j").unwrap(),
                name: "x".repeat(256 * 1024),
                spec: Default::default(),
            }),
        };
        log.blocking_append((1..=4).map(blank)).await.unwrap();
        log.blocking_append((5..=6).map(big)).await.unwrap();
        log.blocking_append((7..=10).map(blank)).await.unwrap();
        let indexes = |entries: Vec<Entry>| entries.iter().map(|e| e.log_id.index).collect::<Vec<_>>();

        log.purge(LogId::new(CommittedLeaderId::new(1, 1), 5)).await.unwrap();
        log.purged_entries_deleted(5).await;
        assert_eq!(indexes(log.try_get_log_entries(..).await.unwrap()), (6..=10).collect::<Vec<_>>());
        log.truncate(LogId::new(CommittedLeaderId::new(1, 1), 9)).await.unwrap();
        assert_eq!(indexes(log.try_get_log_entries(..).await.unwrap()), (6..=8).collect::<Vec<_>>());
        // Again up to the same point: nothing more goes.
        log.purge(LogId::new(CommittedLeaderId::new(1, 1), 5)).await.unwrap();
        log.purged_entries_deleted(5).await;
        assert_eq!(log.entry_count(), 3);

        let beyond = LogId::new(CommittedLeaderId::new(1, 1), 1_000_000);
        log.purge(beyond).await.unwrap();
        log.purged_entries_deleted(beyond.index).await;
        assert_eq!(log.entry_count(), 0);
        let state = log.get_log_state().await.unwrap();
        assert_eq!((state.last_purged_log_id, state.last_log_id), (Some(beyond), Some(beyond)));
    }

    /// openraft's core awaits `purge` before its next heartbeat: the call records the purge
    /// point and returns without waiting for the entries' deletion, which follows on its own.
    /// The deletion drops the segments wholly behind the purge point; the purged entries of the
    /// segment the purge point falls into stay on disk, unread.
    #[tokio::test]
    #[allow(clippy::await_holding_lock)] // on purpose: the deletion must wait while purge runs
    async fn purge_returns_before_its_entries_are_deleted() {
        let dir = tempfile::TempDir::new().unwrap();
        let (mut log, _sm) = crate::open(dir.path()).unwrap();
        let last = 3 * SEGMENT_LEN - 24;
        log.blocking_append((1..=last).map(blank)).await.unwrap();
        // Within the third segment: the first two go.
        let upto = LogId::new(CommittedLeaderId::new(1, 1), 2 * SEGMENT_LEN + 100);
        {
            let purger = log.purger.clone();
            let _deletions_held = purger.hold();
            tokio::time::timeout(std::time::Duration::from_secs(10), log.purge(upto))
                .await
                .expect("purge returned while the deletion could not run")
                .unwrap();
            let state = log.get_log_state().await.unwrap();
            assert_eq!(state.last_purged_log_id, Some(upto));
            assert_eq!(log.stored_entry_count() as u64, last, "nothing deleted yet");
            assert_eq!(log.entry_count() as u64, last - upto.index, "but nothing purged is readable");
            // Entries past the purge point are untouched and readable meanwhile.
            assert_eq!(log.try_get_log_entries(upto.index + 1..=upto.index + 3).await.unwrap().len(), 3);
        }
        log.purged_entries_deleted(upto.index).await;
        assert_eq!(log.entry_count() as u64, last - upto.index);
        assert_eq!(log.stored_entry_count() as u64, last - 2 * SEGMENT_LEN + 1, "two segments dropped");
        let first = log.try_get_log_entries(..).await.unwrap().first().map(|e| e.log_id.index);
        assert_eq!(first, Some(upto.index + 1));
        let first = log.try_get_log_entries(..=upto.index + 1).await.unwrap();
        assert_eq!(first.len(), 1, "a read reaching below the purge point starts after it");
    }

    /// A log spread over several segments reads, truncates and reopens like one: a truncation
    /// inside a segment drops the segments above it, appends after it recreate them, and an
    /// append that crosses a segment boundary is read back whole.
    #[tokio::test]
    async fn segments_join_into_one_log() {
        let dir = tempfile::TempDir::new().unwrap();
        let indexes = |entries: Vec<Entry>| entries.iter().map(|e| e.log_id.index).collect::<Vec<_>>();
        let at = |term: u64, index: u64| Entry {
            log_id: LogId::new(CommittedLeaderId::new(term, 1), index),
            payload: openraft::EntryPayload::Blank,
        };
        {
            let (mut log, _sm) = crate::open(dir.path()).unwrap();
            // One append across three segments.
            let last = 2 * SEGMENT_LEN + 10;
            log.blocking_append((1..=last).map(|i| at(1, i))).await.unwrap();
            assert_eq!(log.segments.newest_first().len(), 3);
            log.tail.clear();
            assert_eq!(indexes(log.try_get_log_entries(..).await.unwrap()), (1..=last).collect::<Vec<_>>());
            let across = indexes(log.try_get_log_entries(SEGMENT_LEN - 2..SEGMENT_LEN + 2).await.unwrap());
            assert_eq!(across, (SEGMENT_LEN - 2..SEGMENT_LEN + 2).collect::<Vec<_>>());
            // Truncated inside the second segment: the third is dropped.
            let cut = SEGMENT_LEN + 5;
            log.truncate(LogId::new(CommittedLeaderId::new(1, 1), cut)).await.unwrap();
            assert_eq!(log.segments.newest_first().len(), 2);
            let state = log.get_log_state().await.unwrap();
            assert_eq!(state.last_log_id.map(|l| l.index), Some(cut - 1));
            // A new leader's entries fill the second segment again and reopen the third.
            log.blocking_append((cut..=2 * SEGMENT_LEN + 1).map(|i| at(2, i))).await.unwrap();
            assert_eq!(log.segments.newest_first().len(), 3);
        }
        let (mut log, _sm) = crate::open(dir.path()).unwrap();
        let all = log.try_get_log_entries(..).await.unwrap();
        assert_eq!(indexes(all.clone()), (1..=2 * SEGMENT_LEN + 1).collect::<Vec<_>>());
        let terms: Vec<u64> = all.iter().map(|e| e.log_id.leader_id.term).collect();
        let cut = (SEGMENT_LEN + 5) as usize;
        assert!(terms[..cut - 1].iter().all(|t| *t == 1) && terms[cut - 1..].iter().all(|t| *t == 2));
        let state = log.get_log_state().await.unwrap();
        assert_eq!(state.last_log_id, Some(LogId::new(CommittedLeaderId::new(2, 1), 2 * SEGMENT_LEN + 1)));
        // Truncated at a segment's first index: that segment goes whole.
        log.truncate(LogId::new(CommittedLeaderId::new(2, 1), 2 * SEGMENT_LEN)).await.unwrap();
        assert_eq!(log.segments.newest_first().len(), 2);
        assert_eq!(log.entry_count() as u64, 2 * SEGMENT_LEN - 1);
    }

    /// Reads answered from the tail of recent entries are exactly what sled holds, through
    /// appends, a truncation that a new leader's entries overwrite, and a purge.
    #[tokio::test]
    async fn reads_from_the_tail_match_the_log_on_disk() {
        let dir = tempfile::TempDir::new().unwrap();
        let (mut log, _sm) = crate::open(dir.path()).unwrap();
        let at = |term: u64, index: u64| Entry {
            log_id: LogId::new(CommittedLeaderId::new(term, 1), index),
            payload: openraft::EntryPayload::Blank,
        };
        let check = |log: &LogStore| {
            for (from, to) in [(1, 3), (2, 12), (5, 9), (9, 9), (12, 40), (0, 100)] {
                let on_disk = log.entries_on_disk(from..=to).unwrap();
                assert_eq!(log.entries(from..=to).unwrap(), on_disk, "{from}..={to}");
                assert_eq!(log.entries(from..).unwrap(), log.entries_on_disk(from..).unwrap(), "{from}..");
            }
        };
        log.blocking_append((1..=10).map(|i| at(1, i))).await.unwrap();
        assert!(log.tail.read(&(1..=10)).is_some(), "the appended entries are in the tail");
        check(&log);
        log.truncate(LogId::new(CommittedLeaderId::new(1, 1), 8)).await.unwrap();
        check(&log);
        log.blocking_append((8..=12).map(|i| at(2, i))).await.unwrap();
        check(&log);
        let read = log.entries(7..=9).unwrap();
        assert_eq!(read.iter().map(|e| e.log_id.leader_id.term).collect::<Vec<_>>(), vec![1, 2, 2]);
        log.purge(LogId::new(CommittedLeaderId::new(1, 1), 4)).await.unwrap();
        log.purged_entries_deleted(4).await;
        check(&log);
        assert_eq!(log.tail.bounds(), Some((5, 12)));
    }

    #[tokio::test]
    async fn empty_and_reversed_ranges_read_nothing() {
        let dir = tempfile::TempDir::new().unwrap();
        let (mut log, _sm) = crate::open(dir.path()).unwrap();
        log.blocking_append((1..=5).map(blank)).await.unwrap();
        assert!(log.try_get_log_entries(3..3).await.unwrap().is_empty());
        #[allow(clippy::reversed_empty_ranges)]
        let reversed = log.try_get_log_entries(4..2).await.unwrap();
        assert!(reversed.is_empty());
        assert_eq!(log.try_get_log_entries(2..=4).await.unwrap().len(), 3);
        assert_eq!(log.try_get_log_entries(4..u64::MAX).await.unwrap().len(), 2);
    }
}
