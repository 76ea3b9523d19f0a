//! Server side of the Raft transport: decodes a peer's RPC, hands it to the local Raft, and
//! returns openraft's `Result` encoded, so a remote `RaftError` reaches the caller intact.
//!
//! A payload that does not decode is answered `INVALID_ARGUMENT` and never reaches Raft.
//!
//! When the replica serves TLS, only other replicas may call: a call without a client
//! certificate verified against the cluster CA is answered `UNAUTHENTICATED` (the listener makes
//! client certificates optional, for admin clients and workers, so the check is made here).

use cairn_proto::v1::raft_server::{Raft as RaftRpc, RaftServer};
use cairn_proto::v1::{RaftPayload, TriggerElectionReply, TriggerElectionRequest};
use serde::Serialize;
use tonic::{Request, Response, Status};

use crate::codec;
use crate::types::Raft;

/// The tonic service that serves Raft RPCs for one local Raft instance.
#[derive(Clone)]
pub struct RaftService {
    raft: Raft,
    /// Refuse calls that came without a verified client certificate (mutual TLS between
    /// replicas).
    require_client_cert: bool,
}

/// The refusal of a Raft call made without a client certificate.
pub const CLIENT_CERT_REQUIRED: &str = "raft calls require a client certificate signed by the cluster CA";

impl RaftService {
    pub fn new(raft: Raft) -> Self {
        Self { raft, require_client_cert: false }
    }

    /// Only callers that presented a certificate the TLS layer verified against the cluster CA
    /// may call (set when the replica serves TLS).
    pub fn require_client_certificates(mut self, require: bool) -> Self {
        self.require_client_cert = require;
        self
    }

    fn authorize<T>(&self, req: &Request<T>) -> Result<(), Status> {
        // The TLS layer rejects certificates the cluster CA did not sign; present means verified.
        if self.require_client_cert && req.peer_certs().is_none_or(|certs| certs.is_empty()) {
            return Err(Status::unauthenticated(CLIENT_CERT_REQUIRED));
        }
        Ok(())
    }

    /// The service wrapped for a tonic router, with the message size limit applied both ways.
    pub fn into_server(self, max_message_bytes: usize) -> RaftServer<Self> {
        RaftServer::new(self)
            .max_decoding_message_size(max_message_bytes)
            .max_encoding_message_size(max_message_bytes)
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
        self.authorize(&req)?;
        let rpc = decode("append-entries request", req)?;
        reply(&self.raft.append_entries(rpc).await)
    }

    async fn vote(&self, req: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        self.authorize(&req)?;
        let rpc = decode("vote request", req)?;
        reply(&self.raft.vote(rpc).await)
    }

    async fn install_snapshot(&self, req: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        self.authorize(&req)?;
        let rpc = decode("install-snapshot request", req)?;
        reply(&self.raft.install_snapshot(rpc).await)
    }

    async fn trigger_election(
        &self,
        req: Request<TriggerElectionRequest>,
    ) -> Result<Response<TriggerElectionReply>, Status> {
        self.authorize(&req)?;
        let req = req.into_inner();
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
