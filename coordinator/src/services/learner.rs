//! Adding a learner and waiting until it caught up, shared by `cairn.v1.Cluster` and
//! `cairn.admin.v1.Admin`.
//!
//! Why not openraft's `add_learner(.., blocking = true)`: it counts a learner as caught up when
//! it is within `replication_lag_threshold` (5,000) entries of the leader, which a small log
//! always is, even when nothing listens at the address; and it never gives up. Here the learner
//! has caught up when the leader knows it holds the log up to the membership entry that added
//! it, and the wait is bounded by the call's deadline (`grpc-timeout`, else
//! [`DEFAULT_CATCH_UP`]).
//!
//! When the learner does not catch up in time:
//! - it never acknowledged anything (nothing listens, or something that is not this cluster's
//!   replica): a learner this call added is removed again, so nothing changed, and the call fails
//!   with `FAILED_PRECONDITION` naming the address and what the connection attempt said;
//! - it acknowledged part of the log (it is alive, still catching up, e.g. installing a
//!   snapshot): it stays a learner and the call fails with `DEADLINE_EXCEEDED`; calling again
//!   waits again.
//!
//! A learner that was already configured before the call is never removed by it. The work runs in
//! a task of its own, so a caller that disconnects does not interrupt the removal.

use std::collections::BTreeSet;
use std::time::Duration;

use cairn_raft::types::{Node, RaftMetrics};
use openraft::ChangeMembers;
use tokio::time::Instant;

use crate::error::NodeError;
use crate::replica::ReplicaContext;

/// A node id as membership changes take it: Raft node ids start at 1.
pub(crate) fn check_node_id(id: u64) -> Result<(), NodeError> {
    if id == 0 { Err(NodeError::InvalidArgument("node_id must be at least 1".into())) } else { Ok(()) }
}

/// How long a call without a deadline waits for a learner to catch up.
pub const DEFAULT_CATCH_UP: Duration = Duration::from_secs(30);

/// The part of a call's deadline kept for removing an unreachable learner again and answering.
const ANSWER_MARGIN_MAX: Duration = Duration::from_secs(2);

/// When a call carrying `metadata` must have answered by: its `grpc-timeout` less a margin for
/// the answer, else [`DEFAULT_CATCH_UP`] from now.
pub fn catch_up_deadline(metadata: &tonic::metadata::MetadataMap) -> Instant {
    let budget = metadata
        .get("grpc-timeout")
        .and_then(|v| v.to_str().ok())
        .and_then(parse_grpc_timeout)
        .map_or(DEFAULT_CATCH_UP, |t| t.saturating_sub((t / 5).min(ANSWER_MARGIN_MAX)));
    Instant::now() + budget
}

/// Parses a `grpc-timeout` value: up to 8 digits and a unit (`H M S m u n`).
fn parse_grpc_timeout(v: &str) -> Option<Duration> {
    if v.len() < 2 || v.len() > 9 {
        return None;
    }
    let (digits, unit) = v.split_at(v.len() - 1);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.checked_mul(3600)?),
        "M" => Duration::from_secs(n.checked_mul(60)?),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// Adds `node_id` at `addr` as a learner and waits until it caught up (see the module docs);
/// returns the log index of the membership entry. Runs as its own task, so a caller that goes
/// away does not leave an unreachable learner behind.
pub(crate) async fn add_learner(
    ctx: &ReplicaContext,
    node_id: u64,
    addr: &str,
    deadline: Instant,
) -> Result<u64, NodeError> {
    if !ctx.accepts_peers {
        return Err(NodeError::FailedPrecondition(
            "this replica runs alone without TLS or a cluster secret, so no other replica could \
             authenticate to it: restart it (and start the new replica) with the same \
             --cluster-secret-file, or with TLS, before adding members"
                .into(),
        ));
    }
    let (ctx, addr) = (ctx.clone(), addr.to_owned());
    tokio::spawn(async move { add_and_wait(&ctx, node_id, &addr, deadline).await })
        .await
        .map_err(|e| NodeError::Internal(format!("adding learner {node_id} failed: {e}")))?
}

async fn add_and_wait(
    ctx: &ReplicaContext,
    node_id: u64,
    addr: &str,
    deadline: Instant,
) -> Result<u64, NodeError> {
    check_node_id(node_id)?;
    if !crate::config::is_host_port(addr) {
        return Err(NodeError::InvalidArgument(format!("addr {addr:?} is not a host:port address")));
    }
    let m = ctx.metrics();
    let membership = m.membership_config.membership();
    if membership.voter_ids().any(|v| v == node_id) {
        return Err(NodeError::FailedPrecondition(format!("node {node_id} is already a voter")));
    }
    let existed = match membership.get_node(&node_id) {
        Some(n) if n.addr != addr => {
            return Err(NodeError::FailedPrecondition(format!(
                "node {node_id} is already a learner at {}; remove it first to add it at {addr}",
                n.addr
            )));
        }
        Some(_) => true,
        None => false,
    };
    let resp = ctx.raft.add_learner(node_id, Node { addr: addr.to_owned() }, false).await?;
    let index = resp.log_id.index;
    tracing::info!(node_id, addr = %addr, log_index = index, "learner added; waiting for it to catch up");
    match wait_caught_up(ctx, node_id, index, deadline).await? {
        CatchUp::Done => {
            tracing::info!(node_id, addr = %addr, "learner caught up");
            Ok(index)
        }
        CatchUp::Behind { matched } => Err(NodeError::DeadlineExceeded(format!(
            "node {node_id} at {addr} is still catching up (it holds the log up to index {matched}, the \
             membership entry is {index}); it stays a learner: run add-learner again to keep waiting, \
             or remove it"
        ))),
        CatchUp::Silent => {
            let why = probe(ctx, addr).await;
            let kept = if existed {
                "it was a learner before this call and stays one".to_owned()
            } else {
                remove_again(ctx, node_id).await
            };
            tracing::warn!(node_id, addr = %addr, reason = %why, "learner unreachable");
            Err(NodeError::FailedPrecondition(format!(
                "node {node_id} at {addr} did not accept the log before the deadline ({why}); {kept}. \
                 Start a replica with --node-id {node_id} reachable at {addr} (its --peers must not \
                 list it), then add it again"
            )))
        }
    }
}

enum CatchUp {
    Done,
    /// Alive but behind: `matched` is the highest index it acknowledged.
    Behind {
        matched: u64,
    },
    /// It acknowledged nothing.
    Silent,
}

async fn wait_caught_up(
    ctx: &ReplicaContext,
    id: u64,
    index: u64,
    deadline: Instant,
) -> Result<CatchUp, NodeError> {
    let mut rx = ctx.raft.metrics();
    loop {
        let judged = judge(&rx.borrow_and_update(), id, index);
        let last = match judged {
            Judged::Done => return Ok(CatchUp::Done),
            Judged::Progress(p) => p,
            Judged::Fail(e) => return Err(e),
        };
        match tokio::time::timeout_at(deadline, rx.changed()).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return Err(NodeError::Stopped("raft stopped".into())),
            Err(_) => return Ok(last),
        }
    }
}

enum Judged {
    Done,
    Progress(CatchUp),
    Fail(NodeError),
}

fn judge(m: &RaftMetrics, id: u64, index: u64) -> Judged {
    let Some(replication) = &m.replication else {
        // No longer leading: the new leader replicates to the learner; the client retries there
        // and the call waits again.
        let leader_addr = m
            .current_leader
            .and_then(|l| m.membership_config.membership().get_node(&l).map(|n| n.addr.clone()));
        return Judged::Fail(NodeError::NotLeader(cairn_proto::leader_hint::LeaderHint {
            leader_id: m.current_leader.filter(|l| *l != m.id),
            leader_addr: leader_addr.filter(|_| m.current_leader != Some(m.id)),
        }));
    };
    if m.membership_config.log_id().map_or(0, |l| l.index) >= index
        && m.membership_config.membership().get_node(&id).is_none()
    {
        return Judged::Fail(NodeError::FailedPrecondition(format!(
            "node {id} was removed while this call waited for it to catch up"
        )));
    }
    match replication.get(&id) {
        Some(Some(matched)) if matched.index >= index => Judged::Done,
        Some(Some(matched)) => Judged::Progress(CatchUp::Behind { matched: matched.index }),
        _ => Judged::Progress(CatchUp::Silent),
    }
}

/// What a connection attempt to `addr` says, for the error message.
async fn probe(ctx: &ReplicaContext, addr: &str) -> String {
    let endpoint = match cairn_proto::tls::endpoint(addr, ctx.peer_tls.as_ref()) {
        Ok(e) => e.connect_timeout(Duration::from_secs(1)),
        Err(e) => return format!("not a valid endpoint: {e}"),
    };
    match tokio::time::timeout(Duration::from_secs(2), endpoint.connect()).await {
        Ok(Ok(_)) => "it accepts connections but acknowledged no log entry: is it a Cairn replica \
                      started with that node id and waiting to be added? see its log"
            .to_owned(),
        Ok(Err(e)) => format!("cannot connect: {}", error_chain(&e)),
        Err(_) => "connecting timed out".to_owned(),
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    let mut previous = text.clone();
    while let Some(s) = source {
        // Layers often repeat their cause's words; say each once.
        let part = s.to_string();
        if part != previous && !previous.ends_with(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        previous = part;
        source = s.source();
    }
    text
}

/// Removes a learner this call added; says what became of it.
async fn remove_again(ctx: &ReplicaContext, id: u64) -> String {
    match ctx.raft.change_membership(ChangeMembers::RemoveNodes(BTreeSet::from([id])), false).await {
        Ok(_) => {
            tracing::info!(node_id = id, "unreachable learner removed again");
            "it was removed from the membership again".to_owned()
        }
        Err(e) => format!(
            "removing it again failed ({e}), so it may still be listed as an unreachable learner: \
             remove it with RemoveNode (cairnctl cluster remove {id})"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_parse_per_the_spec() {
        assert_eq!(parse_grpc_timeout("5S"), Some(Duration::from_secs(5)));
        assert_eq!(parse_grpc_timeout("1500m"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_grpc_timeout("2M"), Some(Duration::from_secs(120)));
        assert_eq!(parse_grpc_timeout("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_grpc_timeout("7u"), Some(Duration::from_micros(7)));
        assert_eq!(parse_grpc_timeout("9n"), Some(Duration::from_nanos(9)));
        for bad in ["", "S", "5", "5s", "-5S", "123456789S", "x5S"] {
            assert_eq!(parse_grpc_timeout(bad), None, "{bad:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_deadline_keeps_a_margin_for_the_answer() {
        let mut md = tonic::metadata::MetadataMap::new();
        let now = Instant::now();
        md.insert("grpc-timeout", "5S".parse().unwrap());
        assert_eq!(catch_up_deadline(&md) - now, Duration::from_secs(4));
        md.insert("grpc-timeout", "60S".parse().unwrap());
        assert_eq!(catch_up_deadline(&md) - now, Duration::from_secs(58));
        md.insert("grpc-timeout", "bogus".parse().unwrap());
        assert_eq!(catch_up_deadline(&md) - now, DEFAULT_CATCH_UP);
        assert_eq!(catch_up_deadline(&tonic::metadata::MetadataMap::new()) - now, DEFAULT_CATCH_UP);
    }
}
