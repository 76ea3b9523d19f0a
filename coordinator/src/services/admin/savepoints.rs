//! Savepoint calls: trigger (to `target_dir` or the job's default), stop-with-savepoint, list,
//! dispose (the directory is deleted only after the commit).

use std::time::Duration;

use cairn_proto::admin as pb;
use cairn_raft::model::{Command, JobId, Outcome};

use super::dedup::{RequestKey, first, wrap};
use super::{AdminService, convert};
use crate::checkpoint::TriggerKind;
use crate::error::NodeError;
use crate::replica::{linearizable, propose};
use crate::services::store::parse_job_id;

/// Bound on waiting for a savepoint beyond the job's checkpoint timeout.
const SAVEPOINT_SLACK: Duration = Duration::from_secs(10);

fn target_dir(raw: &str) -> Result<Option<String>, NodeError> {
    if raw.trim().is_empty() {
        return Ok(None);
    }
    // Absolute (every replica and worker resolves it) and without `..` (it names the directory
    // it says, nothing outside it).
    cairn_protocol::operators::check_absolute_path(raw)
        .map_err(|why| NodeError::InvalidArgument(format!("target_dir {why}")))?;
    Ok(Some(raw.to_owned()))
}

impl AdminService {
    /// Triggers (or, for a repeated request id, finds) a savepoint and waits for its outcome.
    async fn savepoint(
        &self,
        call: &str,
        job_id: &str,
        target: &str,
        sync: bool,
        drain: bool,
        request_id: &str,
    ) -> Result<pb::SavepointReply, NodeError> {
        let job = parse_job_id(job_id)?;
        let target_dir = target_dir(target)?;
        let flags = [u8::from(sync), u8::from(drain)];
        let key = RequestKey::parse(request_id, call, &[job.as_str().as_bytes(), target.as_bytes(), &flags])?;
        linearizable(&self.ctx).await?;
        let record = self.record(&job)?;
        let known = key.as_ref().and_then(|k| match record.requests.outcome(&k.id) {
            Some(Outcome::CheckpointId { id }) => Some(*id),
            _ => None,
        });
        if known.is_none() && target_dir.is_none() && record.spec.checkpoint.savepoint_dir.is_none() {
            return Err(NodeError::FailedPrecondition(format!(
                "job `{job}` has no default savepoint directory (checkpoint.savepoint_dir); pass target_dir \
                 or set it with UpdateCheckpointConfig"
            )));
        }
        let id = self
            .start_trigger(&job, TriggerKind::Savepoint { target_dir, sync, drain }, key.as_ref())
            .await?;
        let timeout = record.spec.checkpoint.timeout + SAVEPOINT_SLACK;
        let o = self.wait_outcome(&job, id, timeout).await?;
        match o.status.as_str() {
            "completed" => Ok(pb::SavepointReply { checkpoint_id: id, path: o.location }),
            "failed" => Err(NodeError::FailedPrecondition(format!(
                "savepoint {id} of job `{job}` failed: {} ({})",
                o.failure_reason, o.failure_detail
            ))),
            "in_progress" => Err(NodeError::DeadlineExceeded(format!(
                "savepoint {id} of job `{job}` is still in progress after {timeout:?}; follow it with WaitCheckpoint"
            ))),
            _ => Err(NodeError::FailedPrecondition(format!(
                "savepoint {id} of job `{job}` was aborted by a leader change; trigger a new one with a new request id"
            ))),
        }
    }

    pub(super) async fn trigger_savepoint(
        &self,
        req: pb::TriggerSavepointRequest,
    ) -> Result<pb::SavepointReply, NodeError> {
        self.savepoint("TriggerSavepoint", &req.job_id, &req.target_dir, false, false, &req.request_id).await
    }

    pub(super) async fn stop_with_savepoint(
        &self,
        req: pb::StopWithSavepointRequest,
    ) -> Result<pb::SavepointReply, NodeError> {
        self.savepoint("StopWithSavepoint", &req.job_id, &req.target_dir, true, req.drain, &req.request_id)
            .await
    }

    pub(super) async fn list_savepoints(
        &self,
        req: pb::JobRequest,
    ) -> Result<pb::ListSavepointsReply, NodeError> {
        let job = parse_job_id(&req.job_id)?;
        linearizable(&self.ctx).await?;
        let record = self.record(&job)?;
        Ok(pb::ListSavepointsReply {
            savepoints: record
                .savepoints
                .iter()
                .map(|s| pb::SavepointInfo {
                    checkpoint_id: s.checkpoint.id,
                    path: s.path.clone(),
                    kind: convert::kind_name(s.checkpoint.kind).to_owned(),
                    trigger_time_ms: s.checkpoint.trigger_time_ms,
                    completion_time_ms: s.checkpoint.completion_time_ms,
                    state_size: s.checkpoint.state_size,
                })
                .collect(),
        })
    }

    /// Forgets the savepoint through Raft, then deletes its directory (a repeat deletes again:
    /// deletion is idempotent).
    pub(super) async fn dispose_savepoint(
        &self,
        req: pb::DisposeSavepointRequest,
    ) -> Result<pb::DisposeSavepointReply, NodeError> {
        let job: JobId = parse_job_id(&req.job_id)?;
        let id = req.checkpoint_id;
        let key = RequestKey::parse(
            &req.request_id,
            "DisposeSavepoint",
            &[job.as_str().as_bytes(), &id.to_le_bytes()],
        )?;
        let cmd = wrap(key.as_ref(), Command::DisposeSavepoint { job: job.clone(), checkpoint_id: id });
        let (outcome, _) = propose(&self.ctx, cmd).await?;
        let Outcome::SavepointDisposed { savepoint } = first(outcome).0 else {
            return Err(NodeError::Internal("unexpected outcome of DisposeSavepoint".into()));
        };
        let path = savepoint.path.clone();
        let dir = std::path::PathBuf::from(&path);
        let removed = tokio::task::spawn_blocking(move || match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        })
        .await
        .map_err(|e| NodeError::Internal(e.to_string()))?;
        if let Err(e) = removed {
            return Err(NodeError::Internal(format!(
                "savepoint {id} is forgotten but its directory {path} could not be deleted ({e}); delete it by hand"
            )));
        }
        tracing::info!(job = %job, savepoint = id, path = %path, "savepoint disposed");
        Ok(pb::DisposeSavepointReply { path })
    }
}
