//! `cairnctl cluster ...`: status, membership changes, leadership transfer, workers.

use cairn_proto::admin::admin_client::AdminClient;
use cairn_proto::admin::{
    AddLearnerRequest, ClusterStatusRequest, ListWorkersRequest, NodeRequest, TransferLeadershipRequest,
};

use super::Ctx;
use crate::cli::ClusterCmd;
use crate::client::Wait;
use crate::errors::CtlError;
use crate::output;

pub async fn run(ctx: &mut Ctx<'_>, cmd: ClusterCmd) -> Result<(), CtlError> {
    let request_id = ctx.request_id.clone();
    match cmd {
        ClusterCmd::Status => {
            let reply = ctx
                .session
                .call("cluster status", Wait::Quick, |ch| async move {
                    Ok(AdminClient::new(ch).cluster_status(ClusterStatusRequest {}).await?.into_inner())
                })
                .await?;
            ctx.emit(&reply, output::cluster_status)
        }
        ClusterCmd::AddLearner { id: node_id, addr } => {
            let req = AddLearnerRequest { node_id, addr: addr.clone(), request_id };
            let session = &ctx.session;
            let reply = session
                .call("add learner", Wait::Long, |ch| {
                    // The server waits for the learner until this deadline (less a margin for
                    // its answer), then says why it did not catch up.
                    let mut call = tonic::Request::new(req.clone());
                    call.set_timeout(session.remaining());
                    async move { Ok(AdminClient::new(ch).add_learner(call).await?.into_inner()) }
                })
                .await?;
            ctx.emit(&reply, |r| {
                output::membership(&format!("node {node_id} ({addr}) added as a learner"), r)
            })
        }
        ClusterCmd::Promote { id } => {
            let req = NodeRequest { node_id: id, request_id };
            let reply = ctx
                .session
                .call("promote learner", Wait::Long, |ch| {
                    let req = req.clone();
                    async move { Ok(AdminClient::new(ch).promote_learner(req).await?.into_inner()) }
                })
                .await?;
            ctx.emit(&reply, |r| output::membership(&format!("node {id} is a voter"), r))
        }
        ClusterCmd::Remove { id } => {
            let req = NodeRequest { node_id: id, request_id };
            let reply = ctx
                .session
                .call("remove node", Wait::Long, |ch| {
                    let req = req.clone();
                    async move { Ok(AdminClient::new(ch).remove_node(req).await?.into_inner()) }
                })
                .await?;
            ctx.emit(&reply, |r| output::membership(&format!("node {id} removed"), r))
        }
        ClusterCmd::TransferLeader { id } => {
            // Let the server give up a little before this command does, so its answer arrives.
            let timeout_ms = (ctx.session.remaining().as_millis() as u64).saturating_sub(500).max(1);
            let req = TransferLeadershipRequest { to_node_id: id, timeout_ms };
            let reply = ctx
                .session
                .call("transfer leadership", Wait::Long, |ch| async move {
                    Ok(AdminClient::new(ch).transfer_leadership(req).await?.into_inner())
                })
                .await?;
            ctx.emit(&reply, |r| format!("node {} leads (term {})\n", r.leader_id, r.term))
        }
        ClusterCmd::Workers => {
            let reply = ctx
                .session
                .call("cluster workers", Wait::Quick, |ch| async move {
                    Ok(AdminClient::new(ch).list_workers(ListWorkersRequest {}).await?.into_inner())
                })
                .await?;
            ctx.emit(&reply, output::workers)
        }
    }
}
