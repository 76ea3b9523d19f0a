//! What every part of a replica shares: the [`ReplicaContext`] (its Raft handle, the applied
//! state, its metrics, how it dials peers) and the two ways to act on the replicated state,
//! [`propose`] and [`linearizable`]. A leaf: it depends on no other module of this crate but
//! `error`, `metrics`, `proposer` and `read_barrier`, so services, the gateway and the leader runtime can all use it
//! without depending on each other or on the node that wires them.

use std::sync::Arc;

use cairn_raft::model::{Command, Outcome};
use cairn_raft::types::{LogId, NodeId, Raft, RaftMetrics};
use cairn_storage::StateReader;

use crate::error::NodeError;
use crate::metrics::ReplicaMetrics;
use crate::proposer::Proposer;
use crate::read_barrier::ReadBarrier;

/// What the services of one replica share. Cheap to clone.
#[derive(Clone)]
pub struct ReplicaContext {
    pub id: NodeId,
    pub raft: Raft,
    /// Read access to the applied replicated state (serve reads after `ensure_linearizable`).
    pub reader: StateReader,
    pub advertise: Arc<str>,
    /// This replica's Prometheus metrics (served on `/metrics` by the binary when configured).
    pub telemetry: ReplicaMetrics,
    /// TLS for calls to other replicas (mutual: presents this replica's certificate); `None`
    /// when the cluster runs plaintext. Dial peers with `cairn_proto::tls::endpoint`.
    pub peer_tls: Option<cairn_proto::tls::ClientTls>,
    /// This replica's id and the cluster secret, for calls to other replicas without TLS.
    pub peer_credentials: Option<cairn_proto::auth::ClusterCredentials>,
    /// Whether other replicas can authenticate to this one (TLS or a cluster secret); without,
    /// it runs alone and refuses to add members.
    pub accepts_peers: bool,
    /// The restart strategy of jobs whose spec names none (the `restart_strategy` setting);
    /// `None`: Flink's rule (`JobSpec::effective_restart_strategy`).
    pub default_restart_strategy: Option<Arc<cairn_protocol::restart::RestartStrategy>>,
    /// Submits this replica's commands, packing concurrent ones into one entry.
    pub proposer: Proposer,
    /// Confirms leadership for linearizable reads, one round for all concurrent readers.
    pub reads: ReadBarrier,
}

impl ReplicaContext {
    pub fn metrics(&self) -> RaftMetrics {
        self.raft.metrics().borrow().clone()
    }
}

/// The address of the leader the metrics name, from the membership.
pub fn leader_addr(m: &RaftMetrics) -> Option<String> {
    m.current_leader.and_then(|l| m.membership_config.membership().get_node(&l).map(|n| n.addr.clone()))
}

/// Proposes `cmd` through Raft and waits for it to be applied. Returns the outcome and the log id
/// it was committed at; a rejected command comes back as [`NodeError::Command`].
pub async fn propose(ctx: &ReplicaContext, cmd: Command) -> Result<(Outcome, LogId), NodeError> {
    let name = cmd.name();
    let started = tokio::time::Instant::now();
    let result = ctx.proposer.propose(cmd).await;
    ctx.telemetry.observe_proposal(started.elapsed());
    if let Ok((_, log_id)) = &result {
        tracing::debug!(command = name, %log_id, "command applied");
    }
    result
}

/// Confirms leadership with a quorum and waits until the local state machine has applied
/// everything committed before the call: reads after this are linearizable. Concurrent callers
/// share one confirmation round ([`ReadBarrier`]).
pub async fn linearizable(ctx: &ReplicaContext) -> Result<(), NodeError> {
    ctx.reads.wait().await?;
    Ok(())
}
