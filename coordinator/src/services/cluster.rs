//! The `cairn.v1.Cluster` service: linearizable status and membership changes.

use std::collections::BTreeSet;

use cairn_proto::v1::cluster_server::{Cluster, ClusterServer};
use cairn_proto::v1::{
    AddLearnerRequest, ClusterStatus, JobRuntime, JobRuntimesReply, JobRuntimesRequest, Member,
    MembershipReply, NodeRequest, Role, StatusRequest,
};
use cairn_raft::types::{NodeId, RaftMetrics};
use openraft::ChangeMembers;
use tonic::{Request, Response, Status};

use super::leader_runtime;
use crate::error::NodeError;
use crate::leader::LeaderHandle;
use crate::replica::ReplicaContext;
use crate::replica::linearizable;

#[derive(Clone)]
/// What a status call reports, read after confirming leadership (linearizable).
pub(crate) struct RaftStatus {
    pub metrics: RaftMetrics,
    /// The committed log index (openraft's metrics do not carry it).
    pub committed: Option<u64>,
    pub leader_addr: Option<String>,
}

pub(crate) async fn raft_status(ctx: &ReplicaContext) -> Result<RaftStatus, NodeError> {
    linearizable(ctx).await?;
    let committed = ctx
        .raft
        .with_raft_state(|st| st.committed.map(|l| l.index))
        .await
        .map_err(|e| NodeError::Stopped(e.to_string()))?;
    let metrics = ctx.metrics();
    let leader_addr = leader_addr(&metrics);
    Ok(RaftStatus { metrics, committed, leader_addr })
}

/// The address of the leader `m` knows of, from the membership.
pub(crate) use crate::replica::leader_addr;

pub struct ClusterService {
    ctx: ReplicaContext,
    leader: LeaderHandle,
}

impl ClusterService {
    pub fn new(ctx: ReplicaContext, leader: LeaderHandle) -> Self {
        Self { ctx, leader }
    }

    pub fn into_server(self) -> ClusterServer<Self> {
        ClusterServer::new(self)
    }
}

/// Members with their roles and (on the leader) replication progress.
pub(crate) fn members(m: &RaftMetrics) -> Vec<Member> {
    let membership = m.membership_config.membership();
    let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
    membership
        .nodes()
        .map(|(id, node)| Member {
            id: *id,
            addr: node.addr.clone(),
            role: if voters.contains(id) { Role::Voter } else { Role::Learner } as i32,
            matched_index: m
                .replication
                .as_ref()
                .and_then(|r| r.get(id))
                .map(|l| l.as_ref().map_or(0, |l| l.index)),
        })
        .collect()
}

fn membership_reply(ctx: &ReplicaContext, log_index: u64) -> MembershipReply {
    MembershipReply { log_index, members: members(&ctx.metrics()) }
}

pub(crate) use super::learner::check_node_id;

#[tonic::async_trait]
impl Cluster for ClusterService {
    async fn status(&self, _req: Request<StatusRequest>) -> Result<Response<ClusterStatus>, Status> {
        const WHAT: &str = "Status";
        let run = async {
            let RaftStatus { metrics: m, committed, leader_addr } = raft_status(&self.ctx).await?;
            Ok(ClusterStatus {
                node_id: self.ctx.id,
                leader_id: m.current_leader.unwrap_or(0),
                leader_addr: leader_addr.unwrap_or_default(),
                term: m.current_term,
                last_log_index: m.last_log_index.unwrap_or(0),
                commit_index: committed.unwrap_or(0),
                applied_index: m.last_applied.map_or(0, |l| l.index),
                members: members(&m),
                snapshot_index: m.snapshot.map_or(0, |l| l.index),
            })
        };
        run.await.map(Response::new).map_err(|e: NodeError| e.into_status(WHAT))
    }

    async fn job_runtimes(
        &self,
        _req: Request<JobRuntimesRequest>,
    ) -> Result<Response<JobRuntimesReply>, Status> {
        const WHAT: &str = "JobRuntimes";
        let run = async {
            let term = leader_runtime(&self.ctx, &self.leader).await?;
            let views = term.jobs().await.map_err(|s| NodeError::Stopped(s.message().to_owned()))?;
            let jobs = views
                .into_iter()
                .map(|v| JobRuntime {
                    job_id: v.job,
                    phase: v.phase,
                    attempt: v.attempt.unwrap_or(0),
                    worker: v.worker.unwrap_or_default(),
                    pending_checkpoints: v.pending_checkpoints,
                    restarts: v.restarts,
                })
                .collect();
            Ok(JobRuntimesReply { term: term.term, jobs })
        };
        run.await.map(Response::new).map_err(|e: NodeError| e.into_status(WHAT))
    }

    async fn add_learner(
        &self,
        req: Request<AddLearnerRequest>,
    ) -> Result<Response<MembershipReply>, Status> {
        let deadline = super::learner::catch_up_deadline(req.metadata());
        let req = req.into_inner();
        add_learner(&self.ctx, req.node_id, &req.addr, deadline)
            .await
            .map(|index| Response::new(membership_reply(&self.ctx, index)))
            .map_err(|e| e.into_status("AddLearner"))
    }

    async fn promote_learner(&self, req: Request<NodeRequest>) -> Result<Response<MembershipReply>, Status> {
        promote_learner(&self.ctx, req.into_inner().node_id)
            .await
            .map(|index| Response::new(membership_reply(&self.ctx, index)))
            .map_err(|e| e.into_status("PromoteLearner"))
    }

    async fn remove_node(&self, req: Request<NodeRequest>) -> Result<Response<MembershipReply>, Status> {
        remove_node(&self.ctx, req.into_inner().node_id)
            .await
            .map(|index| Response::new(membership_reply(&self.ctx, index)))
            .map_err(|e| e.into_status("RemoveNode"))
    }
}

/// Adds a learner and waits until it caught up (bounded by `deadline`); returns the log index of
/// the membership entry. Shared by `cairn.v1.Cluster` and `cairn.admin.v1.Admin`.
pub(crate) async fn add_learner(
    ctx: &ReplicaContext,
    node_id: u64,
    addr: &str,
    deadline: tokio::time::Instant,
) -> Result<u64, NodeError> {
    super::learner::add_learner(ctx, node_id, addr, deadline).await
}

/// Turns a learner into a voter; returns the log index of the membership entry.
pub(crate) async fn promote_learner(ctx: &ReplicaContext, id: u64) -> Result<u64, NodeError> {
    check_node_id(id)?;
    let m = ctx.metrics();
    let membership = m.membership_config.membership();
    if membership.voter_ids().any(|v| v == id) {
        return Err(NodeError::FailedPrecondition(format!("node {id} is already a voter")));
    }
    if !membership.learner_ids().any(|l| l == id) {
        return Err(NodeError::FailedPrecondition(format!(
            "node {id} is not a learner; add it with AddLearner first"
        )));
    }
    let resp = ctx.raft.change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([id])), false).await?;
    tracing::info!(node_id = id, "learner promoted to voter");
    Ok(resp.log_id.index)
}

/// Removes a voter or learner; returns the log index of the membership entry.
pub(crate) async fn remove_node(ctx: &ReplicaContext, id: u64) -> Result<u64, NodeError> {
    check_node_id(id)?;
    let m = ctx.metrics();
    let membership = m.membership_config.membership();
    let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
    let resp = if voters.contains(&id) {
        if voters.len() == 1 {
            return Err(NodeError::FailedPrecondition(format!(
                "node {id} is the only voter; a cluster cannot remove its last voter"
            )));
        }
        // Not retained: the removed voter leaves the cluster entirely.
        ctx.raft.change_membership(ChangeMembers::RemoveVoters(BTreeSet::from([id])), false).await?
    } else if membership.learner_ids().any(|l| l == id) {
        ctx.raft.change_membership(ChangeMembers::RemoveNodes(BTreeSet::from([id])), false).await?
    } else {
        return Err(NodeError::FailedPrecondition(format!("node {id} is not a member of the cluster")));
    };
    tracing::info!(node_id = id, "node removed");
    Ok(resp.log_id.index)
}
