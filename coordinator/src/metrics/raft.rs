//! Raft health gauges, fed from openraft's metrics channel by one task per replica
//! ([`follow_raft`]).
//!
//! `cairn_raft_commit_index` is what this replica knows to be committed: on the leader, the
//! highest log index matched by a majority of every voter configuration (openraft 0.9 does not
//! publish the commit index itself, but it publishes each replica's matched index to the
//! leader); elsewhere, the last index applied here (everything applied was committed).

use cairn_raft::types::{Raft, RaftMetrics};
use openraft::ServerState;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The Raft gauges of one replica. Written only by [`follow_raft`].
#[derive(Clone, Default)]
pub(crate) struct RaftGauges {
    is_leader: Gauge,
    term: Gauge,
    leader_id: Gauge,
    commit_index: Gauge,
    last_log_index: Gauge,
    applied_index: Gauge,
    leader_changes: Counter,
}

fn gauge_value(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl RaftGauges {
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let g = Self::default();
        let r = registry.sub_registry_with_prefix("raft");
        r.register("is_leader", "1 when this replica is the Raft leader, else 0", g.is_leader.clone());
        r.register("term", "Current Raft term", g.term.clone());
        r.register("leader_id", "Node id of the leader this replica knows of (0: none)", g.leader_id.clone());
        r.register(
            "commit_index",
            "Highest log index known committed: majority-matched on the leader, last applied elsewhere",
            g.commit_index.clone(),
        );
        r.register(
            "last_log_index",
            "Index of the last entry in this replica's log",
            g.last_log_index.clone(),
        );
        r.register(
            "applied_index",
            "Index of the last entry applied to this replica's state machine",
            g.applied_index.clone(),
        );
        r.register(
            "leader_changes",
            "Leaders this replica observed: a new leader id or a new term with a known leader",
            g.leader_changes.clone(),
        );
        g
    }

    /// Updates every gauge from one metrics snapshot; `last_leader` is the (leader, term) seen
    /// before, to count leader changes.
    pub(crate) fn observe(&self, m: &RaftMetrics, last_leader: &mut Option<(u64, u64)>) {
        let leading = m.state == ServerState::Leader;
        self.is_leader.set(i64::from(leading));
        self.term.set(gauge_value(m.current_term));
        self.leader_id.set(gauge_value(m.current_leader.unwrap_or(0)));
        let applied = m.last_applied.map_or(0, |l| l.index);
        self.applied_index.set(gauge_value(applied));
        self.last_log_index.set(gauge_value(m.last_log_index.unwrap_or(0)));
        let committed = if leading { majority_matched(m).max(applied) } else { applied };
        self.commit_index.set(gauge_value(committed));
        if let Some(leader) = m.current_leader
            && *last_leader != Some((leader, m.current_term))
        {
            *last_leader = Some((leader, m.current_term));
            self.leader_changes.inc();
        }
    }
}

/// On the leader: the highest index matched by a majority of each voter configuration (both,
/// during a joint change).
fn majority_matched(m: &RaftMetrics) -> u64 {
    let Some(replication) = &m.replication else { return 0 };
    let matched = |id: &u64| -> u64 {
        if *id == m.id {
            return m.last_log_index.unwrap_or(0);
        }
        replication.get(id).and_then(|l| l.as_ref()).map_or(0, |l| l.index)
    };
    m.membership_config
        .membership()
        .get_joint_config()
        .iter()
        .filter(|voters| !voters.is_empty())
        .map(|voters| {
            let mut indexes: Vec<u64> = voters.iter().map(matched).collect();
            indexes.sort_unstable_by(|a, b| b.cmp(a));
            indexes[voters.len() / 2]
        })
        .min()
        .unwrap_or(0)
}

/// Follows `raft`'s metrics until Raft shuts down.
pub(crate) async fn follow_raft(raft: Raft, gauges: RaftGauges) {
    let mut rx = raft.metrics();
    let mut last_leader = None;
    loop {
        let m = rx.borrow_and_update().clone();
        gauges.observe(&m, &mut last_leader);
        if rx.changed().await.is_err() {
            break;
        }
    }
    gauges.is_leader.set(0);
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::sync::Arc;

    use cairn_process::metrics::{new_registry, render};
    use cairn_raft::types::{LogId, StoredMembership};
    use openraft::{CommittedLeaderId, Membership};

    use super::*;

    fn log_id(term: u64, index: u64) -> LogId {
        LogId::new(CommittedLeaderId::new(term, 1), index)
    }

    fn three_voters(id: u64) -> RaftMetrics {
        let mut m = RaftMetrics::new_initial(id);
        let voters = BTreeSet::from([1, 2, 3]);
        let membership = Membership::new(vec![voters], None);
        m.membership_config = Arc::new(StoredMembership::new(Some(log_id(1, 1)), membership));
        m
    }

    fn value(text: &str, name: &str) -> Option<i64> {
        text.lines().find_map(|l| l.strip_prefix(&format!("{name} "))).and_then(|v| v.parse().ok())
    }

    #[test]
    fn leader_reports_the_majority_matched_index_and_counts_leader_changes() {
        let mut registry = new_registry();
        let g = RaftGauges::register(&mut registry);
        let mut last = None;

        let mut m = three_voters(1);
        m.state = ServerState::Leader;
        m.current_term = 4;
        m.current_leader = Some(1);
        m.last_log_index = Some(20);
        m.last_applied = Some(log_id(4, 15));
        m.replication = Some(BTreeMap::from([(1, Some(log_id(4, 20))), (2, Some(log_id(4, 18))), (3, None)]));
        g.observe(&m, &mut last);
        // The same leader and term again is not a change.
        g.observe(&m, &mut last);
        let text = render(&registry).unwrap();
        assert_eq!(value(&text, "cairn_raft_is_leader"), Some(1), "{text}");
        assert_eq!(value(&text, "cairn_raft_term"), Some(4));
        assert_eq!(value(&text, "cairn_raft_leader_id"), Some(1));
        assert_eq!(value(&text, "cairn_raft_last_log_index"), Some(20));
        assert_eq!(value(&text, "cairn_raft_applied_index"), Some(15));
        // Matched: 20 (self), 18, 0 → a majority has 18.
        assert_eq!(value(&text, "cairn_raft_commit_index"), Some(18));
        assert_eq!(value(&text, "cairn_raft_leader_changes_total"), Some(1));

        // Deposed: another node leads a later term.
        let mut f = three_voters(1);
        f.state = ServerState::Follower;
        f.current_term = 5;
        f.current_leader = Some(2);
        f.last_log_index = Some(21);
        f.last_applied = Some(log_id(5, 21));
        g.observe(&f, &mut last);
        let text = render(&registry).unwrap();
        assert_eq!(value(&text, "cairn_raft_is_leader"), Some(0), "{text}");
        assert_eq!(value(&text, "cairn_raft_commit_index"), Some(21));
        assert_eq!(value(&text, "cairn_raft_leader_id"), Some(2));
        assert_eq!(value(&text, "cairn_raft_leader_changes_total"), Some(2));

        // An election without a known leader yet changes nothing; the winner does.
        f.current_term = 6;
        f.current_leader = None;
        g.observe(&f, &mut last);
        f.current_leader = Some(2);
        g.observe(&f, &mut last);
        let text = render(&registry).unwrap();
        assert_eq!(value(&text, "cairn_raft_leader_changes_total"), Some(3), "{text}");
    }
}
