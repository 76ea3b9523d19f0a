//! Client-facing gRPC services of a replica. Each handler validates its input, calls Raft, and
//! maps errors through [`crate::error::NodeError`] exactly once.

pub mod admin;
mod cluster;
mod learner;
mod store;

pub use cluster::ClusterService;
pub use learner::{DEFAULT_CATCH_UP, catch_up_deadline};
pub use store::StoreService;

use crate::error::NodeError;
use crate::replica::{ReplicaContext, linearizable};

/// The leader runtime of the current term, after confirming leadership with a quorum: calls
/// that act through the job drivers (triggers, runtime views) start here.
pub async fn leader_runtime(
    ctx: &ReplicaContext,
    leader: &crate::leader::LeaderHandle,
) -> Result<crate::leader::TermHandle, NodeError> {
    linearizable(ctx).await?;
    // Leading but the runtime for the term is not up yet (or just went down): retry.
    leader.current().ok_or_else(NodeError::leader_unknown)
}
