//! Cluster calls: status with per-node replication health, membership changes (the logic is
//! shared with `cairn.v1.Cluster`), and leadership transfer.

use std::collections::BTreeSet;
use std::time::Duration;

use cairn_proto::admin as pb;
use cairn_raft::types::{NodeId, RaftMetrics};

use super::{AdminService, convert};
use crate::error::NodeError;
use crate::replica::linearizable;
use crate::services::cluster as shared;

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
            leader_history: self
                .ctx
                .reader
                .leader_history()
                .into_iter()
                .map(|t| pb::LeaderTerm {
                    term: t.term,
                    leader_id: t.leader_id,
                    first_log_index: t.first_index,
                })
                .collect(),
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
        let deadline = tokio::time::Instant::now() + timeout;
        let (leader_id, term) = crate::handoff::transfer(&self.ctx, &self.leader, to, deadline).await?;
        Ok(pb::TransferLeadershipReply { leader_id, term })
    }

    /// The leader's workers: attached, or awaited until their heartbeat timeout.
    pub(super) async fn workers(&self) -> Result<pb::ListWorkersReply, NodeError> {
        let term = crate::services::leader_runtime(&self.ctx, &self.leader).await?;
        // The term ended between the two calls: the caller retries and finds the new leader.
        let workers = term.workers().await.map_err(|_| NodeError::leader_unknown())?;
        Ok(pb::ListWorkersReply { workers: workers.into_iter().map(convert::worker_status).collect() })
    }
}

pub(super) fn check_request_id(id: &str) -> Result<(), NodeError> {
    if id.is_empty() {
        return Ok(());
    }
    cairn_raft::model::request::validate_request_id(id).map_err(|e| NodeError::InvalidArgument(e.to_string()))
}
