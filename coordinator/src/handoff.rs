//! Leadership transfer: the leader waits until a voter has its whole log, then asks it to start an
//! election (`cairn.v1.Raft/TriggerElection`); the voter's term is higher and its log up to date,
//! so it wins. Used by the operator's `TransferLeadership` call and by a leader that is asked to
//! stop ([`hand_off`]), so a rolling restart does not wait out an election timeout.

use std::time::Duration;

use cairn_proto::v1::TriggerElectionRequest;
use cairn_proto::v1::raft_client::RaftClient;
use cairn_raft::types::{NodeId, Raft, RaftMetrics};
use tokio::time::Instant;

use crate::error::NodeError;
use crate::leader::LeaderHandle;
use crate::replica::{ReplicaContext, leader_addr};

/// How long one election attempt of a leadership transfer may take before it is tried again:
/// more than a follower's leader lease plus an election.
const TRANSFER_ATTEMPT: Duration = Duration::from_secs(5);

/// Waited beyond a leader's lease before its successor campaigns (timer granularity).
const LEASE_MARGIN: Duration = Duration::from_millis(10);

/// Hands this replica's leadership to the voter that has the most of its log, if it leads and
/// another voter exists. Answers the new leader and its term, or `None` when there was nothing
/// to hand over. Bounded by `deadline`; on error the leadership stays where it is (or went).
pub async fn hand_off(
    ctx: &ReplicaContext,
    leader: &LeaderHandle,
    deadline: Instant,
) -> Result<Option<(NodeId, u64)>, NodeError> {
    let m = ctx.metrics();
    if m.current_leader != Some(ctx.id) {
        return Ok(None);
    }
    // Without a quorum that answered lately (the other voters stopped or unreachable) nobody
    // could win an election: stop at once rather than wait out the deadline.
    let lease = Duration::from_millis(ctx.raft.config().election_timeout_max);
    if m.millis_since_quorum_ack.is_none_or(|ms| Duration::from_millis(ms) > lease) {
        return Ok(None);
    }
    // The most caught-up voter first; one that cannot be reached (it stopped too, its matched
    // index is what it had then) or does not catch up in its share of the time gives way to
    // the next.
    let mut candidates = Vec::new();
    for to in voters_by_progress(&m) {
        if reachable(ctx, &m, to, deadline).await {
            candidates.push(to);
        }
    }
    if candidates.is_empty() {
        tracing::info!("no other voter reachable: nobody to hand leadership over to");
        return Ok(None);
    }
    let mut last_error = None;
    for (i, to) in candidates.iter().enumerate() {
        let left = deadline.saturating_duration_since(Instant::now());
        let share = left / u32::try_from(candidates.len() - i).unwrap_or(1);
        match transfer(ctx, leader, *to, Instant::now() + share).await {
            Ok(done) => return Ok(Some(done)),
            Err(e @ (NodeError::NotLeader(_) | NodeError::Stopped(_))) => return Err(e),
            Err(e) => {
                tracing::debug!(to, error = %e, "handover: trying the next voter");
                last_error = Some(e);
            }
        }
    }
    last_error.map_or(Ok(None), Err)
}

/// The voters other than the leader, the most replicated log first (the lowest id among
/// equals), from the leader's metrics.
pub fn voters_by_progress(m: &RaftMetrics) -> Vec<NodeId> {
    let Some(replication) = m.replication.as_ref() else {
        return Vec::new();
    };
    let mut voters: Vec<(Option<u64>, NodeId)> = m
        .membership_config
        .membership()
        .voter_ids()
        .filter(|v| *v != m.id)
        .map(|v| (replication.get(&v).and_then(|l| l.as_ref().map(|l| l.index)), v))
        .collect();
    voters.sort_by(|(ia, a), (ib, b)| ib.cmp(ia).then(a.cmp(b)));
    voters.into_iter().map(|(_, v)| v).collect()
}

/// Makes `to` the leader: waits until it has every entry this leader has, asks it to start an
/// election, and answers once the metrics show it leading (its id and term). Must run on the
/// leader.
pub async fn transfer(
    ctx: &ReplicaContext,
    leader: &LeaderHandle,
    to: NodeId,
    deadline: Instant,
) -> Result<(NodeId, u64), NodeError> {
    let m = ctx.metrics();
    if m.current_leader == Some(to) {
        return Ok((to, m.current_term));
    }
    let membership = m.membership_config.membership();
    if !membership.voter_ids().any(|v| v == to) {
        return Err(NodeError::FailedPrecondition(format!(
            "node {to} is not a voter; only a voter can lead (promote it first)"
        )));
    }
    let addr = membership
        .get_node(&to)
        .map(|n| n.addr.clone())
        .ok_or_else(|| NodeError::FailedPrecondition(format!("node {to} has no address")))?;
    let expired = || {
        NodeError::DeadlineExceeded(format!(
            "node {to} did not take over leadership in time; the current leader stays"
        ))
    };
    // openraft 0.9 has no transfer primitive, and a follower refuses votes while it still
    // holds the leader's lease, so one election request may lose: the target's campaign can
    // end with this replica or a third one leading again. Repeat until the target leads;
    // when a third replica took over, answer not-leader so the client continues there.
    // Meanwhile this replica does not campaign itself once it steps down, so the elections
    // that follow are between the target (which starts them) and at most one other.
    let _no_campaign = NoCampaign::new(&ctx.raft);
    // The target catches up only with a log that stops growing: this replica's commands wait
    // (they reach the new leader afterwards, or fail with a hint to it).
    let _hold = tokio::time::timeout_at(deadline, ctx.proposer.hold()).await.map_err(|_| expired())??;
    // The target needs this replica's vote (the third replica's lease is fresh from the last
    // heartbeat), and a leader refuses votes for a lease after its own election. A campaign
    // refused by both makes this replica step down and leaves the cluster without a leader
    // until an election timeout, so wait out this leader's lease first (nothing to wait for
    // once it has led longer than that, the usual case).
    if let Some(term) = leader.current().filter(|h| h.term == m.current_term) {
        let lease = Duration::from_millis(ctx.raft.config().election_timeout_max);
        tokio::time::sleep_until((term.since + lease + LEASE_MARGIN).min(deadline)).await;
    }
    loop {
        let m = ctx.metrics();
        if m.current_leader == Some(to) {
            tracing::info!(from = ctx.id, to, term = m.current_term, "leadership transferred");
            return Ok((to, m.current_term));
        }
        if m.current_leader != Some(ctx.id) {
            return Err(NodeError::NotLeader(cairn_proto::leader_hint::LeaderHint {
                leader_id: m.current_leader,
                leader_addr: leader_addr(&m),
            }));
        }
        if Instant::now() >= deadline {
            return Err(expired());
        }
        // 1. The target has every entry the leader has.
        let mut rx = ctx.raft.metrics();
        let caught_up = tokio::time::timeout_at(deadline, async {
            rx.wait_for(|m| {
                let last = m.last_log_index;
                let matched =
                    m.replication.as_ref().and_then(|r| r.get(&to)).and_then(|l| l.map(|l| l.index));
                last.is_some() && matched == last
            })
            .await
            .map(|m| m.current_term)
        })
        .await;
        let term = match caught_up {
            Ok(Ok(term)) => term,
            Ok(Err(_)) => return Err(NodeError::Stopped("raft stopped".into())),
            Err(_) => return Err(expired()),
        };
        // 2. The target starts an election.
        ask_to_elect(ctx, &addr, term, deadline).await?;
        // 3. Someone leads in a later term (or the attempt's time is up): check who.
        let attempt_end = deadline.min(Instant::now() + TRANSFER_ATTEMPT);
        let mut rx = ctx.raft.metrics();
        let settled = tokio::time::timeout_at(attempt_end, async {
            rx.wait_for(|m| m.current_term > term && m.current_leader.is_some()).await.map(|_| ())
        })
        .await;
        if let Ok(Err(_)) = settled {
            return Err(NodeError::Stopped("raft stopped".into()));
        }
    }
}

/// Longest wait for a connection to a voter when looking for a successor (a stopped replica
/// refuses at once; this bounds an unreachable host).
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// Whether a connection to voter `to` can be opened now.
async fn reachable(ctx: &ReplicaContext, m: &RaftMetrics, to: NodeId, deadline: Instant) -> bool {
    let Some(addr) = m.membership_config.membership().get_node(&to).map(|n| n.addr.clone()) else {
        return false;
    };
    let Ok(endpoint) = cairn_proto::tls::endpoint(&addr, ctx.peer_tls.as_ref()) else {
        return false;
    };
    let bound = deadline.min(Instant::now() + PROBE_TIMEOUT);
    matches!(tokio::time::timeout_at(bound, endpoint.connect()).await, Ok(Ok(_)))
}

/// The internal call of a transfer: asks the replica at `addr` to start an election, as the
/// leader of `term` (the target checks that it follows exactly that leader and term).
async fn ask_to_elect(
    ctx: &ReplicaContext,
    addr: &str,
    term: u64,
    deadline: Instant,
) -> Result<(), NodeError> {
    let unreachable = |e: String| NodeError::FailedPrecondition(format!("cannot reach node at {addr}: {e}"));
    let endpoint =
        cairn_proto::tls::endpoint(addr, ctx.peer_tls.as_ref()).map_err(|e| unreachable(e.to_string()))?;
    let call = async {
        let channel = endpoint.connect().await.map_err(|e| unreachable(e.to_string()))?;
        let mut request = tonic::Request::new(TriggerElectionRequest { leader_id: ctx.id, term });
        if let Some(c) = &ctx.peer_credentials {
            c.apply(&mut request);
        }
        RaftClient::new(channel).trigger_election(request).await.map_err(|s| {
            NodeError::FailedPrecondition(format!(
                "node at {addr} refused to start an election: {}",
                s.message()
            ))
        })
    };
    match tokio::time::timeout_at(deadline, call).await {
        Ok(r) => r.map(|_| ()),
        Err(_) => Err(NodeError::DeadlineExceeded(format!("node at {addr} did not answer in time"))),
    }
}

/// Keeps this replica's election timer off while it lives.
struct NoCampaign<'a>(&'a Raft);

impl<'a> NoCampaign<'a> {
    fn new(raft: &'a Raft) -> Self {
        raft.runtime_config().elect(false);
        Self(raft)
    }
}

impl Drop for NoCampaign<'_> {
    fn drop(&mut self) {
        self.0.runtime_config().elect(true);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::sync::Arc;

    use cairn_raft::types::{LogId, StoredMembership};
    use openraft::{CommittedLeaderId, Membership};

    use super::*;

    fn log_id(index: u64) -> LogId {
        LogId::new(CommittedLeaderId::new(1, 1), index)
    }

    fn leader_of(voters: &[u64], learners: &[u64], matched: &[(u64, Option<u64>)]) -> RaftMetrics {
        let mut m = RaftMetrics::new_initial(1);
        let all: BTreeSet<u64> = voters.iter().chain(learners).copied().collect();
        let nodes: BTreeMap<u64, cairn_raft::types::Node> =
            all.iter().map(|id| (*id, cairn_raft::types::Node::new(format!("127.0.0.1:{id}")))).collect();
        let membership = Membership::new(vec![voters.iter().copied().collect()], nodes);
        m.membership_config = Arc::new(StoredMembership::new(Some(log_id(1)), membership));
        m.replication = Some(matched.iter().map(|(id, index)| (*id, index.map(log_id))).collect());
        m
    }

    #[test]
    fn successors_are_voters_most_replicated_first() {
        let m = leader_of(&[1, 2, 3, 4], &[5], &[(2, Some(7)), (3, Some(9)), (4, None), (5, Some(10))]);
        // The learner never leads; the leader is not its own successor; unknown progress last.
        assert_eq!(voters_by_progress(&m), vec![3, 2, 4]);
    }

    #[test]
    fn equally_replicated_voters_go_by_id() {
        let m = leader_of(&[1, 2, 3], &[], &[(3, Some(4)), (2, Some(4))]);
        assert_eq!(voters_by_progress(&m), vec![2, 3]);
    }

    #[test]
    fn a_replica_that_is_not_leading_names_no_successor() {
        let mut m = leader_of(&[1, 2, 3], &[], &[]);
        m.replication = None;
        assert!(voters_by_progress(&m).is_empty());
    }
}
