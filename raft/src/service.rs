//! Server side of the Raft transport: authenticates the calling replica, decodes its RPC, hands
//! it to the local Raft, and returns openraft's `Result` encoded, so a remote `RaftError` reaches
//! the caller intact.
//!
//! Who may call ([`PeerAuth`]): only replicas, and only as themselves. With TLS the client
//! certificate must name a node (`cairn://node/<id>` or CN `cairn-node-<id>`, see
//! [`cairn_proto::identity`]); without TLS every call carries the cluster secret and its node id.
//! The node must be a member of the cluster (voter or learner) once this replica knows the
//! membership, and it must be the node the RPC speaks for (the candidate of a vote, the leader
//! of an append or a snapshot, the leader handing over in an election trigger). A refused call
//! never reaches Raft: `UNAUTHENTICATED` without valid credentials, `PERMISSION_DENIED` for a
//! caller that is not a member or speaks for another node.
//!
//! A payload that does not decode is answered `INVALID_ARGUMENT` and never reaches Raft. Snapshots
//! are assembled here ([`crate::snapshot_inbox`]): chunks must be contiguous and the whole stays
//! under a bound, and the assembled snapshot is checked before Raft sees it, so a peer cannot make
//! this replica allocate without limit or fail its storage (which would stop Raft).

use std::sync::Arc;

use cairn_proto::auth::{CLUSTER_SECRET_KEY, NODE_ID_KEY, Secret};
use cairn_proto::identity::{PeerIdentity, identity_of};
use cairn_proto::v1::raft_server::{Raft as RaftRpc, RaftServer};
use cairn_proto::v1::{RaftPayload, TriggerElectionReply, TriggerElectionRequest};
use openraft::error::{InstallSnapshotError, RaftError};
use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest};
use serde::Serialize;
use tonic::{Request, Response, Status};

use crate::codec;
use crate::snapshot_inbox::{SnapshotCheck, SnapshotInbox};
use crate::types::{NodeId, Raft, TypeConfig};

/// How callers of the Raft service prove that they are replicas of this cluster.
#[derive(Clone, Debug)]
pub enum PeerAuth {
    /// Nobody may call: a single replica without TLS and without a cluster secret has no peers.
    Closed,
    /// Mutual TLS: the client certificate (verified against the cluster CA by the TLS layer)
    /// must name the calling node.
    Certificates,
    /// Plaintext: every call carries the cluster secret and the calling node's id.
    Secret(Secret),
}

/// The refusal of a Raft call made without a client certificate.
pub const CLIENT_CERT_REQUIRED: &str = "raft calls require a client certificate signed by the cluster CA";
/// The refusal of any Raft call on a replica that has no peers to accept calls from.
pub const RAFT_CLOSED: &str = "this replica runs alone without TLS or a cluster secret and accepts no raft calls; \
     give every replica the same cluster secret (--cluster-secret-file) or TLS certificates to form a cluster";

/// The tonic service that serves Raft RPCs for one local Raft instance.
#[derive(Clone)]
pub struct RaftService {
    raft: Raft,
    auth: PeerAuth,
    snapshots: Arc<SnapshotInbox>,
    /// Where calls are decoded and handed to Raft (the replica's Raft runtime), so that they
    /// are not queued behind the rest of the replica's work; `None`: the server's own runtime.
    runtime: Option<tokio::runtime::Handle>,
}

impl RaftService {
    /// A service that admits callers by `auth` and checks assembled snapshots with `check`.
    pub fn new(raft: Raft, auth: PeerAuth, check: SnapshotCheck) -> Self {
        Self { raft, auth, snapshots: Arc::new(SnapshotInbox::new(check)), runtime: None }
    }

    /// Decodes and handles every call on `runtime` (the server still accepts them on its own).
    pub fn on_runtime(mut self, runtime: tokio::runtime::Handle) -> Self {
        self.runtime = Some(runtime);
        self
    }

    /// Runs `work` on the service's runtime (inline without one).
    async fn run<F>(&self, work: F) -> Result<Response<RaftPayload>, Status>
    where
        F: std::future::Future<Output = Result<Response<RaftPayload>, Status>> + Send + 'static,
    {
        match &self.runtime {
            None => work.await,
            Some(rt) => rt
                .spawn(work)
                .await
                .map_err(|e| Status::unavailable(format!("raft call not handled: {e}")))?,
        }
    }

    /// The service wrapped for a tonic router, with the message size limit applied both ways.
    pub fn into_server(self, max_message_bytes: usize) -> RaftServer<Self> {
        RaftServer::new(self)
            .max_decoding_message_size(max_message_bytes)
            .max_encoding_message_size(max_message_bytes)
    }

    /// The node a call comes from, by its credentials, and that it is a member.
    fn caller<T>(&self, req: &Request<T>) -> Result<NodeId, Status> {
        let node = match &self.auth {
            PeerAuth::Closed => return Err(Status::unauthenticated(RAFT_CLOSED)),
            PeerAuth::Certificates => {
                let certs = req.peer_certs();
                let Some(leaf) = certs.as_deref().and_then(|c| c.first()) else {
                    return Err(Status::unauthenticated(CLIENT_CERT_REQUIRED));
                };
                match identity_of(leaf.as_ref()) {
                    Some(PeerIdentity::Node(id)) => id,
                    Some(PeerIdentity::Worker(w)) => {
                        return Err(Status::permission_denied(format!(
                            "the client certificate names worker `{w}`; raft calls need a replica's \
                             certificate (cairn://node/<id>)"
                        )));
                    }
                    Some(PeerIdentity::Other(subject)) => {
                        return Err(Status::permission_denied(format!(
                            "the client certificate ({subject}) names no replica; raft calls need a \
                             replica's certificate (cairn://node/<id>)"
                        )));
                    }
                    None => return Err(Status::unauthenticated("the client certificate cannot be parsed")),
                }
            }
            PeerAuth::Secret(secret) => {
                let presented = req.metadata().get(CLUSTER_SECRET_KEY).map(|v| v.as_bytes());
                match presented {
                    None => {
                        return Err(Status::unauthenticated(format!(
                            "missing {CLUSTER_SECRET_KEY} metadata: raft calls need the cluster secret"
                        )));
                    }
                    Some(p) if !secret.matches(p) => {
                        return Err(Status::unauthenticated("wrong cluster secret"));
                    }
                    Some(_) => {}
                }
                let id = req.metadata().get(NODE_ID_KEY).and_then(|v| v.to_str().ok());
                match id.and_then(|s| s.parse::<NodeId>().ok()).filter(|id| *id > 0) {
                    Some(id) => id,
                    None => {
                        return Err(Status::unauthenticated(format!(
                            "missing or invalid {NODE_ID_KEY} metadata: raft calls name the calling node"
                        )));
                    }
                }
            }
        };
        // Borrowed, not cloned: this runs for every heartbeat.
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        let membership = metrics.membership_config.membership();
        // A replica that has not joined a cluster yet knows no members: it accepts any replica
        // that proved to be one (the leader adding it as a learner).
        let known = membership.nodes().next().is_some();
        if known && membership.get_node(&node).is_none() {
            return Err(Status::permission_denied(format!("node {node} is not a member of this cluster")));
        }
        Ok(node)
    }
}

/// Refuses an RPC whose sender field names another node than the authenticated caller.
fn speaks_for(caller: NodeId, claimed: NodeId, what: &str) -> Result<(), Status> {
    if caller == claimed {
        Ok(())
    } else {
        Err(Status::permission_denied(format!(
            "node {caller} may not send a {what} on behalf of node {claimed}"
        )))
    }
}

fn reply<T: Serialize>(result: &T) -> Result<Response<RaftPayload>, Status> {
    let data = codec::encode("raft reply", result).map_err(|e| Status::internal(e.to_string()))?;
    Ok(Response::new(RaftPayload { data }))
}

fn decode<T: serde::de::DeserializeOwned>(
    what: &'static str,
    req: Request<RaftPayload>,
) -> Result<T, Status> {
    codec::decode(what, &req.into_inner().data).map_err(|e| Status::invalid_argument(e.to_string()))
}

#[tonic::async_trait]
impl RaftRpc for RaftService {
    async fn append_entries(&self, req: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let caller = self.caller(&req)?;
        let raft = self.raft.clone();
        self.run(async move {
            let rpc: AppendEntriesRequest<TypeConfig> = decode("append-entries request", req)?;
            speaks_for(
                caller,
                rpc.vote.leader_id().voted_for().unwrap_or_default(),
                "append-entries request",
            )?;
            reply(&raft.append_entries(rpc).await)
        })
        .await
    }

    async fn vote(&self, req: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let caller = self.caller(&req)?;
        let raft = self.raft.clone();
        self.run(async move {
            let rpc: VoteRequest<NodeId> = decode("vote request", req)?;
            speaks_for(caller, rpc.vote.leader_id().voted_for().unwrap_or_default(), "vote request")?;
            reply(&raft.vote(rpc).await)
        })
        .await
    }

    async fn install_snapshot(&self, req: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let caller = self.caller(&req)?;
        let rpc: InstallSnapshotRequest<TypeConfig> = decode("install-snapshot request", req)?;
        speaks_for(caller, rpc.vote.leader_id().voted_for().unwrap_or_default(), "snapshot")?;
        let Some(whole) = self.snapshots.receive(rpc)? else {
            // A chunk was taken; Raft answers only for the whole snapshot.
            let vote = self.raft.metrics().borrow().vote;
            let ok: Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>> =
                Ok(InstallSnapshotResponse { vote });
            return reply(&ok);
        };
        reply(&self.raft.install_snapshot(whole).await)
    }

    async fn trigger_election(
        &self,
        req: Request<TriggerElectionRequest>,
    ) -> Result<Response<TriggerElectionReply>, Status> {
        let caller = self.caller(&req)?;
        let req = req.into_inner();
        // Only the leader may hand its leadership over.
        speaks_for(caller, req.leader_id, "leadership transfer")?;
        let m = self.raft.metrics().borrow().clone();
        if m.current_leader != Some(req.leader_id) || m.current_term != req.term {
            return Err(Status::failed_precondition(format!(
                "this replica follows leader {:?} in term {}, not leader {} in term {}",
                m.current_leader, m.current_term, req.leader_id, req.term
            )));
        }
        tracing::info!(leader = req.leader_id, term = req.term, "leadership transfer: starting an election");
        self.raft.trigger().elect().await.map_err(|e| Status::unavailable(e.to_string()))?;
        Ok(Response::new(TriggerElectionReply {}))
    }
}
