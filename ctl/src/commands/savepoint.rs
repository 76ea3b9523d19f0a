//! `cairnctl savepoint ...`: take, list and dispose savepoints.

use cairn_proto::admin::admin_client::AdminClient;
use cairn_proto::admin::{DisposeSavepointRequest, JobRequest, TriggerSavepointRequest};

use super::Ctx;
use crate::cli::SavepointCmd;
use crate::client::Wait;
use crate::errors::CtlError;
use crate::output;

pub async fn run(ctx: &mut Ctx<'_>, cmd: SavepointCmd) -> Result<(), CtlError> {
    match cmd {
        SavepointCmd::Trigger { job, dir } => {
            let req = TriggerSavepointRequest {
                job_id: job.clone(),
                target_dir: dir.unwrap_or_default(),
                request_id: ctx.request_id.clone(),
            };
            let reply = ctx
                .session
                .call("trigger savepoint", Wait::Long, |ch| {
                    let req = req.clone();
                    async move { Ok(AdminClient::new(ch).trigger_savepoint(req).await?.into_inner()) }
                })
                .await?;
            ctx.emit(&reply, |r| format!("savepoint {} of job {job}: {}\n", r.checkpoint_id, r.path))
        }
        SavepointCmd::List { job } => {
            let req = JobRequest { job_id: job };
            let reply = ctx
                .session
                .call("list savepoints", Wait::Quick, |ch| {
                    let req = req.clone();
                    async move { Ok(AdminClient::new(ch).list_savepoints(req).await?.into_inner()) }
                })
                .await?;
            ctx.emit(&reply, output::savepoints)
        }
        SavepointCmd::Dispose { job, id } => {
            let req = DisposeSavepointRequest {
                job_id: job.clone(),
                checkpoint_id: id,
                request_id: ctx.request_id.clone(),
            };
            let reply = ctx
                .session
                .call("dispose savepoint", Wait::Quick, |ch| {
                    let req = req.clone();
                    async move { Ok(AdminClient::new(ch).dispose_savepoint(req).await?.into_inner()) }
                })
                .await?;
            ctx.emit(&reply, |r| format!("savepoint {id} of job {job} disposed; deleted {}\n", r.path))
        }
    }
}
