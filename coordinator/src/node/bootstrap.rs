//! Idempotent cluster initialisation.
//!
//! Every initial member may initialise the cluster with the same membership; openraft refuses
//! (`NotAllowed`) once a node has a vote or a log, which is what a restarted replica has, so
//! initialising is safe to repeat. To avoid needless elections, the member with the lowest id
//! initialises at once; the others first give it a few election timeouts to reach them and only
//! initialise themselves if nothing arrived (so the cluster still forms if that member is down).

use std::collections::BTreeMap;

use cairn_raft::types::{Node, Raft};
use openraft::error::{InitializeError, RaftError};

use crate::config::NodeConfig;

pub(super) async fn run(config: NodeConfig, raft: Raft) {
    if !config.bootstraps() {
        tracing::info!(node_id = config.node_id, "not an initial member; waiting to be added as a learner");
        return;
    }
    let members: BTreeMap<u64, Node> =
        config.initial_members().into_iter().map(|(id, addr)| (id, Node { addr })).collect();
    let lowest = members.keys().next().copied() == Some(config.node_id);
    if !lowest {
        tokio::time::sleep(config.raft.election_timeout_max * 3).await;
    }
    match raft.is_initialized().await {
        Ok(true) => {
            tracing::info!(node_id = config.node_id, "cluster state found; not initialising");
            return;
        }
        Ok(false) => {}
        Err(e) => {
            tracing::warn!(node_id = config.node_id, error = %e, "raft stopped before bootstrap");
            return;
        }
    }
    match raft.initialize(members.clone()).await {
        Ok(()) => {
            tracing::info!(node_id = config.node_id, members = ?members.keys().collect::<Vec<_>>(), "cluster initialised")
        }
        Err(RaftError::APIError(InitializeError::NotAllowed(e))) => {
            tracing::info!(node_id = config.node_id, reason = %e, "cluster already initialised")
        }
        Err(e) => tracing::error!(node_id = config.node_id, error = %e, "cluster initialisation failed"),
    }
}
