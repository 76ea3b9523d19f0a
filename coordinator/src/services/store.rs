//! The `cairn.v1.Store` service: job registry and checkpoint ID allocation.

use cairn_proto::v1::store_server::{Store, StoreServer};
use cairn_proto::v1::{
    AllocateCheckpointIdReply, AllocateCheckpointIdRequest, GetJobRequest, JobRecord as JobRecordMsg,
    RegisterJobReply, RegisterJobRequest, TriggerCheckpointReply, TriggerCheckpointRequest,
    TriggerKind as TriggerKindMsg,
};
use cairn_raft::model::{Command, JobId, JobRecord, JobSpec, Outcome};

use crate::checkpoint::TriggerKind;
use tonic::{Request, Response, Status};

use super::leader_runtime;
use crate::error::NodeError;
use crate::replica::ReplicaContext;
use crate::replica::{linearizable, propose};

/// Longest accepted job name and spec, to keep Raft entries small.
pub(crate) const MAX_NAME_LEN: usize = 256;
pub(crate) const MAX_SPEC_BYTES: usize = 1024 * 1024;

#[derive(Clone)]
pub struct StoreService {
    ctx: ReplicaContext,
    leader: crate::leader::LeaderHandle,
}

impl StoreService {
    pub fn new(ctx: ReplicaContext, leader: crate::leader::LeaderHandle) -> Self {
        Self { ctx, leader }
    }

    pub fn into_server(self) -> StoreServer<Self> {
        StoreServer::new(self)
    }
}

pub(crate) fn parse_job_id(raw: &str) -> Result<JobId, NodeError> {
    JobId::new(raw).map_err(|e| NodeError::InvalidArgument(format!("job_id: {e}")))
}

pub(crate) fn parse_spec(raw: &str) -> Result<JobSpec, NodeError> {
    if raw.len() > MAX_SPEC_BYTES {
        return Err(NodeError::InvalidArgument(format!(
            "spec_json is {} bytes; at most {MAX_SPEC_BYTES} are accepted",
            raw.len()
        )));
    }
    if raw.trim().is_empty() {
        return Ok(JobSpec::default());
    }
    let spec: JobSpec =
        serde_json::from_str(raw).map_err(|e| NodeError::InvalidArgument(format!("spec_json: {e}")))?;
    check_spec(&spec, "spec_json.")?;
    Ok(spec)
}

/// Validates a job spec before it is proposed: the checkpoint configuration, the graph against
/// the operator catalog, the restore point's `_metadata`, and the restore flags. Error messages
/// name the field as `<prefix><field>`.
pub(crate) fn check_spec(spec: &JobSpec, prefix: &str) -> Result<(), NodeError> {
    spec.checkpoint.validate().map_err(|e| NodeError::InvalidArgument(format!("{prefix}checkpoint: {e}")))?;
    if !spec.graph.is_null() {
        let graph: cairn_protocol::graph::JobGraph = serde_json::from_value(spec.graph.clone())
            .map_err(|e| NodeError::InvalidArgument(format!("{prefix}graph: {e}")))?;
        graph
            .validate(&cairn_protocol::operators::OperatorCatalog::builtin())
            .map_err(|e| NodeError::InvalidArgument(format!("{prefix}graph: {e}")))?;
    }
    if let Some(dir) = &spec.restore_from {
        let path = std::path::Path::new(dir).join(cairn_protocol::checkpoint::layout::METADATA_FILE);
        cairn_protocol::checkpoint::read_metadata_unverified(&path)
            .map_err(|e| NodeError::InvalidArgument(format!("{prefix}restore_from: {e}")))?;
    }
    if spec.allow_non_restored_state && spec.restore_from.is_none() {
        return Err(NodeError::InvalidArgument(format!(
            "{prefix}allow_non_restored_state only applies together with restore_from"
        )));
    }
    if !spec.restore_mode.is_default() && spec.restore_from.is_none() {
        return Err(NodeError::InvalidArgument(format!(
            "{prefix}restore_mode only applies together with restore_from"
        )));
    }
    if let Some(strategy) = &spec.restart_strategy {
        strategy
            .validate()
            .map_err(|e| NodeError::InvalidArgument(format!("{prefix}restart_strategy: {e}")))?;
    }
    Ok(())
}

fn record_to_msg(job: &JobRecord) -> JobRecordMsg {
    JobRecordMsg {
        job_id: job.id.to_string(),
        name: job.name.clone(),
        status: job.status.to_string(),
        next_checkpoint_id: job.next_checkpoint_id,
        completed_checkpoint_ids: job.completed.iter().map(|c| c.id).collect(),
        savepoint_ids: job.savepoints.iter().map(|s| s.checkpoint.id).collect(),
        spec_json: serde_json::to_string(&job.spec).unwrap_or_default(),
        attempts: job.attempts,
        num_completed: job.num_completed,
        stats_json: job.stats.as_ref().map_or_else(|| "{}".to_owned(), |s| s.to_string()),
    }
}

#[tonic::async_trait]
impl Store for StoreService {
    async fn register_job(
        &self,
        req: Request<RegisterJobRequest>,
    ) -> Result<Response<RegisterJobReply>, Status> {
        const WHAT: &str = "RegisterJob";
        let req = req.into_inner();
        let run = async {
            let job = parse_job_id(&req.job_id)?;
            if req.name.len() > MAX_NAME_LEN {
                return Err(NodeError::InvalidArgument(format!("name: at most {MAX_NAME_LEN} bytes")));
            }
            let spec = parse_spec(&req.spec_json)?;
            let (_, log_id) = propose(&self.ctx, Command::RegisterJob { job, name: req.name, spec }).await?;
            Ok(RegisterJobReply { log_index: log_id.index })
        };
        run.await.map(Response::new).map_err(|e: NodeError| e.into_status(WHAT))
    }

    async fn allocate_checkpoint_id(
        &self,
        req: Request<AllocateCheckpointIdRequest>,
    ) -> Result<Response<AllocateCheckpointIdReply>, Status> {
        const WHAT: &str = "AllocateCheckpointId";
        let run = async {
            let job = parse_job_id(&req.get_ref().job_id)?;
            match propose(&self.ctx, Command::AllocateCheckpointId { job }).await? {
                (Outcome::CheckpointId { id }, log_id) => Ok(AllocateCheckpointIdReply {
                    checkpoint_id: id,
                    term: log_id.leader_id.term,
                    log_index: log_id.index,
                }),
                (other, _) => Err(NodeError::Internal(format!("unexpected outcome {other:?}"))),
            }
        };
        run.await.map(Response::new).map_err(|e: NodeError| e.into_status(WHAT))
    }

    async fn trigger_checkpoint(
        &self,
        req: Request<TriggerCheckpointRequest>,
    ) -> Result<Response<TriggerCheckpointReply>, Status> {
        const WHAT: &str = "TriggerCheckpoint";
        let req = req.into_inner();
        let run = async {
            let job = parse_job_id(&req.job_id)?;
            let kind = TriggerKindMsg::try_from(req.kind).map_err(|_| {
                NodeError::InvalidArgument(format!("kind {} is not a trigger kind", req.kind))
            })?;
            let target_dir = (!req.target_dir.trim().is_empty()).then(|| req.target_dir.clone());
            if target_dir.as_deref().is_some_and(|d| !std::path::Path::new(d).is_absolute()) {
                return Err(NodeError::InvalidArgument(format!(
                    "target_dir {:?} must be an absolute path (every replica and worker resolves it)",
                    req.target_dir
                )));
            }
            let kind = match kind {
                TriggerKindMsg::Checkpoint if target_dir.is_some() || req.drain => {
                    return Err(NodeError::InvalidArgument(
                        "target_dir and drain apply to savepoints only".into(),
                    ));
                }
                TriggerKindMsg::Checkpoint => TriggerKind::Checkpoint,
                TriggerKindMsg::Savepoint => {
                    TriggerKind::Savepoint { target_dir, sync: false, drain: req.drain }
                }
                TriggerKindMsg::StopWithSavepoint => {
                    TriggerKind::Savepoint { target_dir, sync: true, drain: req.drain }
                }
            };
            let term = leader_runtime(&self.ctx, &self.leader).await?;
            let done =
                term.trigger(job, kind).await.map_err(|s| NodeError::Stopped(s.message().to_owned()))?;
            let success = done.map_err(NodeError::FailedPrecondition)?;
            let kind = match success.kind {
                cairn_raft::model::CheckpointKind::Checkpoint => "checkpoint",
                cairn_raft::model::CheckpointKind::Savepoint => "savepoint",
                cairn_raft::model::CheckpointKind::SyncSavepoint => "sync_savepoint",
            };
            Ok(TriggerCheckpointReply {
                checkpoint_id: success.checkpoint_id,
                kind: kind.to_owned(),
                location: success.location.display().to_string(),
            })
        };
        run.await.map(Response::new).map_err(|e: NodeError| e.into_status(WHAT))
    }

    async fn get_job(&self, req: Request<GetJobRequest>) -> Result<Response<JobRecordMsg>, Status> {
        const WHAT: &str = "GetJob";
        let run = async {
            let job = parse_job_id(&req.get_ref().job_id)?;
            linearizable(&self.ctx).await?;
            let record = self
                .ctx
                .reader
                .job(&job)
                .ok_or_else(|| NodeError::Command(cairn_raft::model::CommandError::UnknownJob { job }))?;
            Ok(record_to_msg(&record))
        };
        run.await.map(Response::new).map_err(|e: NodeError| e.into_status(WHAT))
    }
}
