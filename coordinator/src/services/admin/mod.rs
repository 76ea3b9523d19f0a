//! The operator API `cairn.admin.v1.Admin` (contract: `proto/cairn/admin/v1/admin.proto`).
//!
//! Any replica accepts a call; calls that need the leader answer not-leader on a follower
//! through the shared helpers (`propose`, `linearizable`, `leader_runtime`), so clients
//! redirect. Reads are linearizable. Mutating calls take a request id and are applied once per
//! id through the replicated request table ([`dedup`]). Every call is authenticated by the
//! [`crate::auth`] interceptor before it gets here.
//!
//! | module | owns |
//! | --- | --- |
//! | this file | the service and the mapping of every call's error to a status |
//! | `cluster` | status, membership, leadership transfer, the leader's workers |
//! | `jobs` | submit, list, describe, cancel, checkpoint configuration |
//! | `checkpoints` | trigger, wait, statistics overview and details |
//! | `savepoints` | trigger, stop-with-savepoint, list, dispose |
//! | [`dedup`] | request ids and argument fingerprints |
//! | `convert` | model and live view to messages |

mod checkpoints;
mod cluster;
mod convert;
pub mod dedup;
mod jobs;
mod savepoints;

use cairn_proto::admin as pb;
use cairn_proto::admin::admin_server::{Admin, AdminServer};
use tonic::{Request, Response, Status};

use crate::error::NodeError;
use crate::leader::LeaderHandle;
use crate::replica::ReplicaContext;

/// The operator service of one replica.
#[derive(Clone)]
pub struct AdminService {
    ctx: ReplicaContext,
    leader: LeaderHandle,
}

impl AdminService {
    pub fn new(ctx: ReplicaContext, leader: LeaderHandle) -> Self {
        Self { ctx, leader }
    }

    pub fn into_server(self) -> AdminServer<Self> {
        AdminServer::new(self)
    }
}

fn answer<T>(what: &str, r: Result<T, NodeError>) -> Result<Response<T>, Status> {
    r.map(Response::new).map_err(|e| e.into_status(what))
}

#[tonic::async_trait]
impl Admin for AdminService {
    async fn cluster_status(
        &self,
        _req: Request<pb::ClusterStatusRequest>,
    ) -> Result<Response<pb::ClusterStatusReply>, Status> {
        answer("ClusterStatus", self.cluster_status().await)
    }

    async fn add_learner(
        &self,
        req: Request<pb::AddLearnerRequest>,
    ) -> Result<Response<pb::MembershipReply>, Status> {
        let deadline = crate::services::catch_up_deadline(req.metadata());
        answer("AddLearner", self.add_learner(req.into_inner(), deadline).await)
    }

    async fn promote_learner(
        &self,
        req: Request<pb::NodeRequest>,
    ) -> Result<Response<pb::MembershipReply>, Status> {
        answer("PromoteLearner", self.promote_learner(req.into_inner()).await)
    }

    async fn remove_node(
        &self,
        req: Request<pb::NodeRequest>,
    ) -> Result<Response<pb::MembershipReply>, Status> {
        answer("RemoveNode", self.remove_node(req.into_inner()).await)
    }

    async fn transfer_leadership(
        &self,
        req: Request<pb::TransferLeadershipRequest>,
    ) -> Result<Response<pb::TransferLeadershipReply>, Status> {
        answer("TransferLeadership", self.transfer_leadership(req.into_inner()).await)
    }

    async fn list_workers(
        &self,
        _req: Request<pb::ListWorkersRequest>,
    ) -> Result<Response<pb::ListWorkersReply>, Status> {
        answer("ListWorkers", self.workers().await)
    }

    async fn submit_job(
        &self,
        req: Request<pb::SubmitJobRequest>,
    ) -> Result<Response<pb::SubmitJobReply>, Status> {
        answer("SubmitJob", self.submit_job(req.into_inner()).await)
    }

    async fn list_jobs(
        &self,
        _req: Request<pb::ListJobsRequest>,
    ) -> Result<Response<pb::ListJobsReply>, Status> {
        answer("ListJobs", self.list_jobs().await)
    }

    async fn describe_job(&self, req: Request<pb::JobRequest>) -> Result<Response<pb::JobDetails>, Status> {
        answer("DescribeJob", self.describe_job(req.into_inner()).await)
    }

    async fn cancel_job(
        &self,
        req: Request<pb::CancelJobRequest>,
    ) -> Result<Response<pb::CancelJobReply>, Status> {
        answer("CancelJob", self.cancel_job(req.into_inner()).await)
    }

    async fn update_checkpoint_config(
        &self,
        req: Request<pb::UpdateCheckpointConfigRequest>,
    ) -> Result<Response<pb::UpdateCheckpointConfigReply>, Status> {
        answer("UpdateCheckpointConfig", self.update_checkpoint_config(req.into_inner()).await)
    }

    async fn trigger_checkpoint(
        &self,
        req: Request<pb::TriggerCheckpointRequest>,
    ) -> Result<Response<pb::TriggerCheckpointReply>, Status> {
        answer("TriggerCheckpoint", self.trigger_checkpoint(req.into_inner()).await)
    }

    async fn wait_checkpoint(
        &self,
        req: Request<pb::WaitCheckpointRequest>,
    ) -> Result<Response<pb::CheckpointOutcome>, Status> {
        answer("WaitCheckpoint", self.wait_checkpoint(req.into_inner()).await)
    }

    async fn list_checkpoints(
        &self,
        req: Request<pb::JobRequest>,
    ) -> Result<Response<pb::CheckpointOverview>, Status> {
        answer("ListCheckpoints", self.list_checkpoints(req.into_inner()).await)
    }

    async fn describe_checkpoint(
        &self,
        req: Request<pb::DescribeCheckpointRequest>,
    ) -> Result<Response<pb::CheckpointDetails>, Status> {
        answer("DescribeCheckpoint", self.describe_checkpoint(req.into_inner()).await)
    }

    async fn trigger_savepoint(
        &self,
        req: Request<pb::TriggerSavepointRequest>,
    ) -> Result<Response<pb::SavepointReply>, Status> {
        answer("TriggerSavepoint", self.trigger_savepoint(req.into_inner()).await)
    }

    async fn stop_with_savepoint(
        &self,
        req: Request<pb::StopWithSavepointRequest>,
    ) -> Result<Response<pb::SavepointReply>, Status> {
        answer("StopWithSavepoint", self.stop_with_savepoint(req.into_inner()).await)
    }

    async fn list_savepoints(
        &self,
        req: Request<pb::JobRequest>,
    ) -> Result<Response<pb::ListSavepointsReply>, Status> {
        answer("ListSavepoints", self.list_savepoints(req.into_inner()).await)
    }

    async fn dispose_savepoint(
        &self,
        req: Request<pb::DisposeSavepointRequest>,
    ) -> Result<Response<pb::DisposeSavepointReply>, Status> {
        answer("DisposeSavepoint", self.dispose_savepoint(req.into_inner()).await)
    }
}
