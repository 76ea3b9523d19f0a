//! The log's most recent entries, kept decoded in memory.
//!
//! openraft reads back every entry it appends: each replication stream reads it to send it to
//! its follower, and the core reads it to hand it to the state machine. Reading it from sled
//! means decoding its JSON once per reader, which on a leader replicating to two followers was
//! a twentieth of its CPU at 1,000 jobs (docs/SCALING.md, round 9), and the core's read for the
//! state machine runs inside the core. Those readers almost always want entries appended a
//! moment ago, so the log store keeps a copy of its tail: a read that the tail covers is
//! answered from it (a clone of each entry); any other read goes to sled as before.
//!
//! The tail is always a contiguous run of the log's last entries, or empty: appends extend it,
//! a truncation cuts it, a purge trims its front, and anything that would leave a gap empties
//! it. It holds at most [`MAX_ENTRIES`] entries and [`MAX_BYTES`] of their encoded size.

use std::collections::VecDeque;
use std::ops::{Bound, RangeBounds};
use std::sync::{Arc, Mutex, MutexGuard};

use cairn_raft::types::Entry;

/// Most entries kept.
pub(crate) const MAX_ENTRIES: usize = 1024;
/// Most bytes kept, counted as the entries' encoded size.
pub(crate) const MAX_BYTES: usize = 32 << 20;

/// Shared by every clone of the log store (the core's and the replication streams' readers).
#[derive(Clone, Default)]
pub(crate) struct Tail {
    inner: Arc<Mutex<Entries>>,
}

#[derive(Default)]
struct Entries {
    /// Contiguous by index, oldest first.
    entries: VecDeque<(Entry, usize)>,
    bytes: usize,
}

impl Entries {
    fn first_index(&self) -> Option<u64> {
        self.entries.front().map(|(e, _)| e.log_id.index)
    }

    fn last_index(&self) -> Option<u64> {
        self.entries.back().map(|(e, _)| e.log_id.index)
    }

    fn pop_front(&mut self) {
        if let Some((_, size)) = self.entries.pop_front() {
            self.bytes -= size;
        }
    }

    /// Drops the entries from `index` on.
    fn cut_from(&mut self, index: u64) {
        while self.last_index().is_some_and(|last| last >= index) {
            if let Some((_, size)) = self.entries.pop_back() {
                self.bytes -= size;
            }
        }
    }

    fn clear(&mut self) {
        self.entries.clear();
        self.bytes = 0;
    }
}

impl Tail {
    fn lock(&self) -> MutexGuard<'_, Entries> {
        // Every critical section leaves the run contiguous, so a poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records entries just written to the log, with their encoded sizes, in index order.
    pub(crate) fn appended(&self, appended: Vec<(Entry, usize)>) {
        let mut tail = self.lock();
        for (entry, size) in appended {
            let index = entry.log_id.index;
            // An append at or below the last index replaces what follows (openraft truncates
            // first, but the tail must never hold two entries for one index); one beyond the
            // next index would leave a gap.
            tail.cut_from(index);
            if tail.last_index().is_some_and(|last| last + 1 != index) {
                tail.clear();
            }
            tail.entries.push_back((entry, size));
            tail.bytes += size;
        }
        while tail.entries.len() > MAX_ENTRIES || (tail.bytes > MAX_BYTES && tail.entries.len() > 1) {
            tail.pop_front();
        }
    }

    /// The log was truncated: entries from `index` on are gone.
    pub(crate) fn truncated(&self, index: u64) {
        self.lock().cut_from(index);
    }

    /// The log was purged: entries up to `index` are gone.
    pub(crate) fn purged(&self, index: u64) {
        let mut tail = self.lock();
        while tail.first_index().is_some_and(|first| first <= index) {
            tail.pop_front();
        }
    }

    /// The entries with an index in `range`, when the tail holds every entry of the log in
    /// that range; `None` sends the read to sled.
    pub(crate) fn read(&self, range: &impl RangeBounds<u64>) -> Option<Vec<Entry>> {
        let tail = self.lock();
        let (first, last) = (tail.first_index()?, tail.last_index()?);
        let start = match range.start_bound() {
            Bound::Included(&s) => s,
            Bound::Excluded(&s) => s.checked_add(1)?,
            Bound::Unbounded => 0,
        };
        // Entries before the tail's first are in sled (or purged): not ours to answer.
        if start < first {
            return None;
        }
        let end = match range.end_bound() {
            Bound::Included(&e) => e.min(last),
            Bound::Excluded(&e) => match e.checked_sub(1) {
                Some(e) => e.min(last),
                None => return Some(Vec::new()),
            },
            // The tail ends where the log ends.
            Bound::Unbounded => last,
        };
        if start > end {
            return Some(Vec::new());
        }
        let (from, to) = ((start - first) as usize, (end - first) as usize);
        Some(tail.entries.range(from..=to).map(|(e, _)| e.clone()).collect())
    }

    /// Forgets every entry, as a restart does.
    #[cfg(test)]
    pub(crate) fn clear(&self) {
        self.lock().clear();
    }

    #[cfg(test)]
    pub(crate) fn bounds(&self) -> Option<(u64, u64)> {
        let tail = self.lock();
        Some((tail.first_index()?, tail.last_index()?))
    }
}

#[cfg(test)]
mod tests {
    use openraft::CommittedLeaderId;

    use super::*;
    use cairn_raft::types::LogId;

    fn entry(term: u64, index: u64) -> (Entry, usize) {
        let entry = Entry {
            log_id: LogId::new(CommittedLeaderId::new(term, 1), index),
            payload: openraft::EntryPayload::Blank,
        };
        (entry, 100)
    }

    fn indexes(entries: Option<Vec<Entry>>) -> Option<Vec<(u64, u64)>> {
        entries.map(|es| es.iter().map(|e| (e.log_id.leader_id.term, e.log_id.index)).collect())
    }

    #[test]
    fn reads_within_the_tail_are_answered_and_others_go_to_the_log() {
        let tail = Tail::default();
        assert_eq!(tail.read(&(..)), None, "an empty tail answers nothing");
        tail.appended((5..=9).map(|i| entry(1, i)).collect());
        assert_eq!(indexes(tail.read(&(5..=9))), Some((5..=9).map(|i| (1, i)).collect()));
        assert_eq!(indexes(tail.read(&(7..))), Some(vec![(1, 7), (1, 8), (1, 9)]));
        assert_eq!(indexes(tail.read(&(6..8))), Some(vec![(1, 6), (1, 7)]));
        assert_eq!(indexes(tail.read(&(8..100))), Some(vec![(1, 8), (1, 9)]));
        assert_eq!(indexes(tail.read(&(10..))), Some(vec![]), "nothing beyond the log's end");
        assert_eq!(indexes(tail.read(&(7..7))), Some(vec![]));
        assert_eq!(tail.read(&(4..=6)), None, "entry 4 is only in the log");
        assert_eq!(tail.read(&(..)), None);
    }

    #[test]
    fn truncation_purge_and_overwrites_keep_the_tail_a_suffix_of_the_log() {
        let tail = Tail::default();
        tail.appended((1..=6).map(|i| entry(1, i)).collect());
        tail.truncated(5);
        assert_eq!(tail.bounds(), Some((1, 4)));
        assert_eq!(indexes(tail.read(&(3..))), Some(vec![(1, 3), (1, 4)]));
        // A new leader's entries replace the old ones from their first index on.
        tail.appended(vec![entry(2, 4), entry(2, 5)]);
        assert_eq!(indexes(tail.read(&(3..))), Some(vec![(1, 3), (2, 4), (2, 5)]));
        tail.purged(3);
        assert_eq!(tail.bounds(), Some((4, 5)));
        assert_eq!(tail.read(&(3..)), None);
        // An append that would leave a gap (after a snapshot was installed) starts over.
        tail.appended(vec![entry(3, 20)]);
        assert_eq!(tail.bounds(), Some((20, 20)));
        assert_eq!(tail.read(&(19..)), None);
        tail.purged(25);
        assert_eq!(tail.bounds(), None, "a purge beyond the tail empties it");
    }

    #[test]
    fn the_tail_is_bounded_by_entries_and_bytes() {
        let tail = Tail::default();
        tail.appended((1..=(MAX_ENTRIES as u64 + 10)).map(|i| entry(1, i)).collect());
        assert_eq!(tail.bounds(), Some((11, MAX_ENTRIES as u64 + 10)));
        let big = |i| (entry(1, i).0, MAX_BYTES / 2);
        tail.appended(vec![big(MAX_ENTRIES as u64 + 11), big(MAX_ENTRIES as u64 + 12)]);
        let last = MAX_ENTRIES as u64 + 12;
        assert_eq!(tail.bounds(), Some((last - 1, last)), "the small entries made room for the two halves");
        // One entry above the bound alone is still kept: it is the one readers want next.
        tail.appended(vec![(entry(1, last + 1).0, MAX_BYTES * 2)]);
        assert_eq!(tail.bounds(), Some((last + 1, last + 1)));
    }
}
