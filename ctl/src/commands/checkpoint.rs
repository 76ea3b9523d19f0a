//! `cairnctl checkpoint ...`: trigger (and wait for) a checkpoint, list and describe them.

use std::time::Duration;

use cairn_proto::admin::admin_client::AdminClient;
use cairn_proto::admin::{
    CheckpointOutcome, DescribeCheckpointRequest, JobRequest, TriggerCheckpointRequest, WaitCheckpointRequest,
};

use super::Ctx;
use crate::cli::CheckpointCmd;
use crate::client::Wait;
use crate::errors::CtlError;
use crate::output;

/// How much earlier than this command the server is asked to give up waiting, so that its
/// `in_progress` answer arrives before the command's own deadline.
const WAIT_MARGIN: Duration = Duration::from_millis(500);

pub async fn run(ctx: &mut Ctx<'_>, cmd: CheckpointCmd) -> Result<(), CtlError> {
    match cmd {
        CheckpointCmd::Trigger { job, wait } => trigger(ctx, job, wait).await,
        CheckpointCmd::List { job } => {
            let req = JobRequest { job_id: job };
            let reply = ctx
                .session
                .call("list checkpoints", Wait::Quick, |ch| {
                    let req = req.clone();
                    async move { Ok(AdminClient::new(ch).list_checkpoints(req).await?.into_inner()) }
                })
                .await?;
            ctx.emit(&reply, output::overview)
        }
        CheckpointCmd::Describe { job, id } => {
            let req = DescribeCheckpointRequest { job_id: job, checkpoint_id: id };
            let reply = ctx
                .session
                .call("describe checkpoint", Wait::Quick, |ch| {
                    let req = req.clone();
                    async move { Ok(AdminClient::new(ch).describe_checkpoint(req).await?.into_inner()) }
                })
                .await?;
            ctx.emit(&reply, output::checkpoint_details)
        }
    }
}

async fn trigger(ctx: &mut Ctx<'_>, job: String, wait: bool) -> Result<(), CtlError> {
    let req = TriggerCheckpointRequest { job_id: job.clone(), request_id: ctx.request_id.clone() };
    let reply = ctx
        .session
        .call("trigger checkpoint", Wait::Quick, |ch| {
            let req = req.clone();
            async move { Ok(AdminClient::new(ch).trigger_checkpoint(req).await?.into_inner()) }
        })
        .await?;
    if !wait {
        return ctx.emit(&reply, |r| format!("checkpoint {} triggered for job {job}\n", r.checkpoint_id));
    }
    let id = reply.checkpoint_id;
    let outcome = loop {
        let outcome = wait_once(ctx, &job, id).await?;
        // The server may bound its wait below ours: ask again while time is left.
        if outcome.status != "in_progress" || ctx.session.remaining() <= WAIT_MARGIN * 2 {
            break outcome;
        }
    };
    ctx.emit(&outcome, |o| output::outcome(&job, o))?;
    judge(&job, &outcome, ctx.session.timeout())
}

async fn wait_once(ctx: &Ctx<'_>, job: &str, id: u64) -> Result<CheckpointOutcome, CtlError> {
    // `timeout_ms: 0` would mean the server's default; never send it.
    let timeout_ms = (ctx.session.remaining().saturating_sub(WAIT_MARGIN).as_millis() as u64).max(1);
    let req = WaitCheckpointRequest { job_id: job.to_owned(), checkpoint_id: id, timeout_ms };
    ctx.session
        .call("wait for checkpoint", Wait::Long, |ch| {
            let req = req.clone();
            async move { Ok(AdminClient::new(ch).wait_checkpoint(req).await?.into_inner()) }
        })
        .await
}

/// Turns a final outcome into the command's result: only `completed` succeeds.
pub fn judge(job: &str, o: &CheckpointOutcome, waited: Duration) -> Result<(), CtlError> {
    let kind = if o.kind.is_empty() { "checkpoint".to_owned() } else { o.kind.clone() };
    match o.status.as_str() {
        "completed" => Ok(()),
        "in_progress" => {
            Err(CtlError::WaitTimedOut { kind, job: job.to_owned(), id: o.checkpoint_id, waited })
        }
        "failed" => Err(CtlError::SnapshotFailed {
            kind,
            job: job.to_owned(),
            id: o.checkpoint_id,
            status: "failed".into(),
            reason: format!("{} {}", o.failure_reason, o.failure_detail).trim().to_owned(),
        }),
        other => Err(CtlError::SnapshotFailed {
            kind,
            job: job.to_owned(),
            id: o.checkpoint_id,
            status: format!("ended {other}"),
            reason: "it was aborted before an outcome was recorded (e.g. by a leader change); trigger \
                     another one"
                .into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::errors::Exit;

    #[test]
    fn only_a_completed_outcome_succeeds() {
        let o = |status: &str| CheckpointOutcome {
            checkpoint_id: 4,
            status: status.into(),
            kind: "checkpoint".into(),
            failure_reason: "CHECKPOINT_DECLINED".into(),
            ..Default::default()
        };
        let t = Duration::from_secs(60);
        assert!(judge("j", &o("completed"), t).is_ok());
        assert_eq!(judge("j", &o("failed"), t).unwrap_err().exit(), Exit::SnapshotFailed);
        assert!(judge("j", &o("failed"), t).unwrap_err().to_string().contains("CHECKPOINT_DECLINED"));
        assert_eq!(judge("j", &o("unknown"), t).unwrap_err().exit(), Exit::SnapshotFailed);
        assert_eq!(judge("j", &o("in_progress"), t).unwrap_err().exit(), Exit::Unavailable);
    }
}
