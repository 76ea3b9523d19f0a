//! The leader history: each Raft term that had a leader, its node and the index of the blank
//! entry it appended first (every new openraft leader does). The state machine records it when
//! it applies that entry, so every replica holds the same history; it is persisted with the
//! applied state, carried in snapshots and bounded to the newest [`LEADER_HISTORY_LEN`] terms.
//! No wall-clock time is recorded: apply must be deterministic, and the blank entry carries none.

use std::collections::VecDeque;

use cairn_raft::types::{LogId, NodeId};
use serde::{Deserialize, Serialize};

/// Terms kept (newest kept).
pub const LEADER_HISTORY_LEN: usize = 64;

/// One term with a leader.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaderTerm {
    pub term: u64,
    pub leader_id: NodeId,
    /// Index of the blank entry the leader appended when its term began.
    pub first_index: u64,
}

/// Terms in increasing order, at most [`LEADER_HISTORY_LEN`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct LeaderHistory(VecDeque<LeaderTerm>);

impl LeaderHistory {
    /// Records the blank entry at `log_id`; returns whether the history changed. An entry of a
    /// term already recorded (re-applied after a restart) or older changes nothing.
    pub fn record(&mut self, log_id: &LogId) -> bool {
        let term = LeaderTerm {
            term: log_id.leader_id.term,
            leader_id: log_id.leader_id.node_id,
            first_index: log_id.index,
        };
        if self.0.back().is_some_and(|last| last.term >= term.term) {
            return false;
        }
        self.0.push_back(term);
        while self.0.len() > LEADER_HISTORY_LEN {
            self.0.pop_front();
        }
        true
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn newest_first(&self) -> Vec<LeaderTerm> {
        self.0.iter().rev().copied().collect()
    }

    /// Whether a history read from disk or a peer's snapshot is one this store could have built.
    pub fn check(&self) -> Result<(), String> {
        if self.0.len() > LEADER_HISTORY_LEN {
            return Err(format!(
                "the leader history holds {} terms, more than {LEADER_HISTORY_LEN}",
                self.0.len()
            ));
        }
        if let Some(w) = self.0.iter().zip(self.0.iter().skip(1)).find(|(a, b)| a.term >= b.term) {
            return Err(format!("the leader history has term {} before term {}", w.0.term, w.1.term));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use openraft::CommittedLeaderId;

    use super::*;

    fn blank(term: u64, node: u64, index: u64) -> LogId {
        LogId::new(CommittedLeaderId::new(term, node), index)
    }

    #[test]
    fn one_row_per_term_newest_first_and_bounded() {
        let mut h = LeaderHistory::default();
        assert!(h.record(&blank(1, 1, 1)));
        assert!(h.record(&blank(2, 3, 7)));
        assert!(!h.record(&blank(2, 3, 7)), "a re-applied blank entry");
        assert!(!h.record(&blank(1, 2, 9)), "an older term");
        assert_eq!(
            h.newest_first(),
            [
                LeaderTerm { term: 2, leader_id: 3, first_index: 7 },
                LeaderTerm { term: 1, leader_id: 1, first_index: 1 }
            ]
        );
        for t in 3..200 {
            h.record(&blank(t, t % 3 + 1, t * 10));
        }
        assert_eq!(h.newest_first().len(), LEADER_HISTORY_LEN);
        assert_eq!(h.newest_first()[0].term, 199);
        assert_eq!(h.check(), Ok(()));
    }

    #[test]
    fn a_history_out_of_order_or_too_long_is_refused() {
        let unordered: LeaderHistory = serde_json::from_str(
            r#"[{"term":5,"leader_id":1,"first_index":9},{"term":5,"leader_id":2,"first_index":10}]"#,
        )
        .unwrap_or_default();
        assert_eq!(unordered.check(), Err("the leader history has term 5 before term 5".into()));
        let rows: Vec<String> =
            (1..=65).map(|t| format!(r#"{{"term":{t},"leader_id":1,"first_index":{t}}}"#)).collect();
        let long: LeaderHistory = serde_json::from_str(&format!("[{}]", rows.join(","))).unwrap_or_default();
        assert!(long.check().is_err_and(|e| e.contains("65 terms")));
    }
}
