//! Cluster calls: status with per-node replication health, membership changes (the logic is
//! shared with `cairn.v1.Cluster`), and leadership transfer.

use std::collections::BTreeSet;
use std::time::Duration;

use cairn_proto::admin as pb;
use cairn_raft::types::{NodeId, RaftMetrics};

use super::AdminService;
use crate::error::NodeError;
use crate::replica::linearizable;
use crate::services::cluster as shared;

/// How long one election attempt of a leadership transfer may take before it is tried again:
/// more than a follower's leader lease plus an election.
const TRANSFER_ATTEMPT: Duration = Duration::from_secs(5);

/// A node this many entries behind the leader (or fewer) counts as caught up.
const HEALTHY_LAG: u64 = 10;

/// Every member with its role and, on the leader, its replication progress and health.
pub(super) fn nodes(m: &RaftMetrics) -> Vec<pb::NodeStatus> {
    let membership = m.membership_config.membership();
    let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
    let last = m.last_log_index.unwrap_or(0);
    membership
        .nodes()
        .map(|(id, node)| {
            let is_leader = m.current_leader == Some(*id);
            let matched = if is_leader && *id == m.id {
                m.last_log_index
            } else {
                m.replication.as_ref().and_then(|r| r.get(id)).map(|l| l.as_ref().map_or(0, |l| l.index))
            };
            let lag = matched.map(|i| last.saturating_sub(i));
            let health = match lag {
                _ if is_leader => "healthy",
                None => "unreachable",
                Some(l) if l <= HEALTHY_LAG => "healthy",
                Some(_) => "lagging",
            };
            pb::NodeStatus {
                id: *id,
                addr: node.addr.clone(),
                role: if voters.contains(id) { "voter" } else { "learner" }.to_owned(),
                is_leader,
                matched_index: matched,
                lag,
                health: health.to_owned(),
            }
        })
        .collect()
}

impl AdminService {
    pub(super) async fn cluster_status(&self) -> Result<pb::ClusterStatusReply, NodeError> {
        let shared::RaftStatus { metrics: m, committed, leader_addr } =
            shared::raft_status(&self.ctx).await?;
        Ok(pb::ClusterStatusReply {
            node_id: self.ctx.id,
            leader_id: m.current_leader.unwrap_or(0),
            leader_addr: leader_addr.unwrap_or_default(),
            term: m.current_term,
            last_log_index: m.last_log_index.unwrap_or(0),
            commit_index: committed.unwrap_or(0),
            applied_index: m.last_applied.map_or(0, |l| l.index),
            snapshot_index: m.snapshot.map_or(0, |l| l.index),
            nodes: nodes(&m),
            millis_since_quorum_ack: m.millis_since_quorum_ack,
        })
    }

    fn membership_reply(&self, log_index: u64) -> pb::MembershipReply {
        pb::MembershipReply { log_index, nodes: nodes(&self.ctx.metrics()) }
    }

    /// Membership calls are retried safely by checking the target state: with a request id, a
    /// node already in the requested state is a success (the change happened before).
    pub(super) async fn add_learner(
        &self,
        req: pb::AddLearnerRequest,
        deadline: tokio::time::Instant,
    ) -> Result<pb::MembershipReply, NodeError> {
        check_request_id(&req.request_id)?;
        let index = shared::add_learner(&self.ctx, req.node_id, &req.addr, deadline).await?;
        Ok(self.membership_reply(index))
    }

    pub(super) async fn promote_learner(
        &self,
        req: pb::NodeRequest,
    ) -> Result<pb::MembershipReply, NodeError> {
        check_request_id(&req.request_id)?;
        shared::check_node_id(req.node_id)?;
        if !req.request_id.is_empty() {
            linearizable(&self.ctx).await?;
            let m = self.ctx.metrics();
            if m.membership_config.membership().voter_ids().any(|v| v == req.node_id) {
                let index = m.membership_config.log_id().map_or(0, |l| l.index);
                return Ok(self.membership_reply(index));
            }
        }
        let index = shared::promote_learner(&self.ctx, req.node_id).await?;
        Ok(self.membership_reply(index))
    }

    pub(super) async fn remove_node(&self, req: pb::NodeRequest) -> Result<pb::MembershipReply, NodeError> {
        check_request_id(&req.request_id)?;
        shared::check_node_id(req.node_id)?;
        if !req.request_id.is_empty() {
            linearizable(&self.ctx).await?;
            let m = self.ctx.metrics();
            if m.membership_config.membership().get_node(&req.node_id).is_none() {
                let index = m.membership_config.log_id().map_or(0, |l| l.index);
                return Ok(self.membership_reply(index));
            }
        }
        let index = shared::remove_node(&self.ctx, req.node_id).await?;
        Ok(self.membership_reply(index))
    }

    /// Waits until `to` has the whole log, asks it to start an election (its log is up to date
    /// and its term will be higher, so it wins), and answers when the metrics show it leading.
    pub(super) async fn transfer_leadership(
        &self,
        req: pb::TransferLeadershipRequest,
    ) -> Result<pb::TransferLeadershipReply, NodeError> {
        let to = req.to_node_id;
        shared::check_node_id(to)?;
        let timeout =
            if req.timeout_ms == 0 { Duration::from_secs(10) } else { Duration::from_millis(req.timeout_ms) };
        linearizable(&self.ctx).await?;
        let m = self.ctx.metrics();
        if m.current_leader == Some(to) {
            return Ok(pb::TransferLeadershipReply { leader_id: to, term: m.current_term });
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
        let deadline = tokio::time::Instant::now() + timeout;
        let expired = || {
            NodeError::DeadlineExceeded(format!(
                "node {to} did not take over leadership within {timeout:?}; the current leader stays"
            ))
        };
        // openraft 0.9 has no transfer primitive, and a follower refuses votes while it still
        // holds the leader's lease, so one election request may lose: the target's campaign can
        // end with this replica or a third one leading again. Repeat until the target leads;
        // when a third replica took over, answer not-leader so the client continues there.
        // Meanwhile this replica does not campaign itself once it steps down, so the elections
        // that follow are between the target (which starts them) and at most one other.
        let _no_campaign = NoCampaign::new(&self.ctx.raft);
        loop {
            let m = self.ctx.metrics();
            if m.current_leader == Some(to) {
                tracing::info!(from = self.ctx.id, to, term = m.current_term, "leadership transferred");
                return Ok(pb::TransferLeadershipReply { leader_id: to, term: m.current_term });
            }
            if m.current_leader != Some(self.ctx.id) {
                return Err(NodeError::NotLeader(cairn_proto::leader_hint::LeaderHint {
                    leader_id: m.current_leader,
                    leader_addr: shared::leader_addr(&m),
                }));
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(expired());
            }
            // 1. The target has every entry the leader has.
            let mut rx = self.ctx.raft.metrics();
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
            super::transfer::ask_to_elect(
                &addr,
                self.ctx.id,
                term,
                deadline,
                self.ctx.peer_tls.as_ref(),
                self.ctx.peer_credentials.as_ref(),
            )
            .await?;
            // 3. Someone leads in a later term (or the attempt's time is up): check who.
            let attempt_end = deadline.min(tokio::time::Instant::now() + TRANSFER_ATTEMPT);
            let mut rx = self.ctx.raft.metrics();
            let settled = tokio::time::timeout_at(attempt_end, async {
                rx.wait_for(|m| m.current_term > term && m.current_leader.is_some()).await.map(|_| ())
            })
            .await;
            if let Ok(Err(_)) = settled {
                return Err(NodeError::Stopped("raft stopped".into()));
            }
        }
    }
}

/// Keeps this replica's election timer off while it lives.
struct NoCampaign<'a>(&'a cairn_raft::types::Raft);

impl<'a> NoCampaign<'a> {
    fn new(raft: &'a cairn_raft::types::Raft) -> Self {
        raft.runtime_config().elect(false);
        Self(raft)
    }
}

impl Drop for NoCampaign<'_> {
    fn drop(&mut self) {
        self.0.runtime_config().elect(true);
    }
}

pub(super) fn check_request_id(id: &str) -> Result<(), NodeError> {
    if id.is_empty() {
        return Ok(());
    }
    cairn_raft::model::request::validate_request_id(id).map_err(|e| NodeError::InvalidArgument(e.to_string()))
}
