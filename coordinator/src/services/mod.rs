//! Client-facing gRPC services of a replica. Each handler validates its input, calls Raft, and
//! maps errors through [`crate::error::NodeError`] exactly once.

pub mod admin;
mod cluster;
mod learner;
mod store;

pub use cluster::ClusterService;
pub use learner::{DEFAULT_CATCH_UP, catch_up_deadline};
pub use store::StoreService;

use cairn_raft::model::{Command, Outcome};
use cairn_raft::types::LogId;

use crate::error::NodeError;
use crate::node::ReplicaContext;

/// Proposes `cmd` through Raft and waits for it to be applied. Returns the outcome and the log id
/// it was committed at; a rejected command comes back as [`NodeError::Command`].
pub async fn propose(ctx: &ReplicaContext, cmd: Command) -> Result<(Outcome, LogId), NodeError> {
    let name = cmd.name();
    let started = tokio::time::Instant::now();
    let resp = ctx.raft.client_write(cmd).await?;
    ctx.telemetry.observe_proposal(started.elapsed());
    tracing::debug!(command = name, log_id = %resp.log_id, "command applied");
    let outcome = resp.data.0?;
    Ok((outcome, resp.log_id))
}

/// Confirms leadership with a quorum and waits until the local state machine has applied
/// everything committed before the call: reads after this are linearizable.
pub async fn linearizable(ctx: &ReplicaContext) -> Result<(), NodeError> {
    ctx.raft.ensure_linearizable().await?;
    Ok(())
}

/// The leader runtime of the current term, after confirming leadership with a quorum: calls
/// that act through the job drivers (triggers, runtime views) start here.
pub async fn leader_runtime(
    ctx: &ReplicaContext,
    leader: &crate::leader::LeaderHandle,
) -> Result<crate::leader::TermHandle, NodeError> {
    linearizable(ctx).await?;
    // Leading but the runtime for the term is not up yet (or just went down): retry.
    let not_up =
        NodeError::NotLeader(cairn_proto::leader_hint::LeaderHint { leader_id: None, leader_addr: None });
    leader.current().ok_or(not_up)
}
