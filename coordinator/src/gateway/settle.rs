//! Where a worker should attach, once leadership has settled.
//!
//! During an election, and in the moment between winning one and this replica's runtime coming
//! up, a replica knows of no leader to name. Answering "no leader known" then would send the
//! worker round the replicas with pauses in between; instead the gateway waits for the outcome,
//! bounded by [`bound`], and answers with it, so the worker goes straight to the new leader. The
//! same wait names the new leader at the end of a stream whose term ended (a handover, or a lost
//! leadership).

use std::time::Duration;

use tokio::time::{Instant, sleep_until};

use crate::leader::{LeaderHandle, TermHandle};
use crate::replica::ReplicaContext;

/// Longest wait, whatever the election timeout: stays below a worker's default connect timeout
/// (2 s), which bounds its `Attach` call.
const MAX_WAIT: Duration = Duration::from_secs(1);

/// What the wait found.
pub(crate) enum Settled {
    /// This replica leads and its runtime for the term is up.
    Here(TermHandle),
    /// The Raft metrics name another replica as the leader.
    Elsewhere,
    /// Neither within the bound (no quorum, or an election still running), or this replica is
    /// stopping.
    Unknown,
}

/// How long to wait for an election's outcome: two maximal election timeouts (one to notice a
/// lost leader, one for a split vote's second round), at most [`MAX_WAIT`].
fn bound(ctx: &ReplicaContext) -> Duration {
    Duration::from_millis(ctx.raft.config().election_timeout_max.saturating_mul(2)).min(MAX_WAIT)
}

/// Waits until this replica's runtime is up, or the metrics name another leader, for at most
/// [`bound`]. Answers at once when either already holds.
pub(crate) async fn settle(ctx: &ReplicaContext, leader: &LeaderHandle) -> Settled {
    let deadline = Instant::now() + bound(ctx);
    let mut metrics = ctx.raft.metrics();
    let mut current = leader.subscribe();
    loop {
        if let Some(term) = current.borrow_and_update().clone().filter(|t| !t.is_closed()) {
            return Settled::Here(term);
        }
        if names_another_leader(&metrics.borrow_and_update(), ctx.id) {
            return Settled::Elsewhere;
        }
        tokio::select! {
            changed = metrics.changed() => if changed.is_err() { return Settled::Unknown },
            changed = current.changed() => if changed.is_err() { return Settled::Unknown },
            _ = sleep_until(deadline) => return Settled::Unknown,
        }
    }
}

/// Whether the metrics name a leader a worker should go to instead of this replica.
fn names_another_leader(m: &cairn_raft::types::RaftMetrics, me: cairn_raft::types::NodeId) -> bool {
    m.current_leader.is_some_and(|l| l != me)
}
