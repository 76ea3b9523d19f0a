//! Server side of the Raft transport: decodes a peer's RPC, hands it to the local Raft, and
//! returns openraft's `Result` encoded, so a remote `RaftError` reaches the caller intact.
//!
//! A payload that does not decode is answered `INVALID_ARGUMENT` and never reaches Raft.

use cairn_proto::v1::{RaftPayload, TriggerElectionReply, TriggerElectionRequest};
use cairn_proto::v1::raft_server::{Raft as RaftRpc, RaftServer};
use serde::Serialize;
use tonic::{Request, Response, Status};

use crate::codec;
use crate::types::Raft;

/// The tonic service that serves Raft RPCs for one local Raft instance.
#[derive(Clone)]
pub struct RaftService {
    raft: Raft,
}

impl RaftService {
    pub fn new(raft: Raft) -> Self {
        Self { raft }
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
        let rpc = decode("append-entries request", req)?;
        reply(&self.raft.append_entries(rpc).await)
    }

    async fn vote(&self, req: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let rpc = decode("vote request", req)?;
        reply(&self.raft.vote(rpc).await)
    }

    async fn install_snapshot(&self, req: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let rpc = decode("install-snapshot request", req)?;
        reply(&self.raft.install_snapshot(rpc).await)
    }

    async fn trigger_election(
        &self,
        req: Request<TriggerElectionRequest>,
    ) -> Result<Response<TriggerElectionReply>, Status> {
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
