//! openraft's network over tonic gRPC.
//!
//! [`GrpcNetwork`] is the factory openraft asks for a client per replication target. It keeps one
//! lazily-connected tonic `Channel` per peer address, so every replication stream to a peer
//! multiplexes over one HTTP/2 connection and a new RPC never pays for a new connection. Each
//! RPC carries openraft's hard deadline; an unreachable peer makes openraft back off (jittered
//! exponential, capped) instead of spinning, and since every target has its own replication
//! task and its own channel, a dead peer never stalls replication to the others. With TLS
//! configured, every channel is mutual TLS: the peer's certificate is checked against the
//! cluster CA and this replica presents its own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cairn_proto::auth::ClusterCredentials;
use cairn_proto::v1::RaftPayload;
use cairn_proto::v1::raft_client::RaftClient;
use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Timeout, Unreachable,
};
use openraft::network::{Backoff, RPCOption, RPCTypes, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tonic::transport::Channel;

use crate::codec;
use crate::types::{Node, NodeId, TypeConfig};

/// Transport tuning shared by every peer connection.
#[derive(Debug, Clone)]
pub struct TransportConfig {
    /// TCP connect timeout for a peer.
    pub connect_timeout: Duration,
    /// First delay after a peer was found unreachable.
    pub backoff_min: Duration,
    /// Cap of the exponential backoff.
    pub backoff_max: Duration,
    /// Largest gRPC message accepted or sent (snapshot chunks and entry batches stay below).
    pub max_message_bytes: usize,
    /// TLS towards peers (the cluster CA, and this replica's certificate as its client
    /// identity: peers refuse Raft calls without one); `None` dials plaintext.
    pub tls: Option<cairn_proto::tls::ClientTls>,
    /// This replica's id and the cluster secret, sent with every call (peers without TLS refuse
    /// calls without the secret).
    pub credentials: Option<ClusterCredentials>,
}

impl Default for TransportConfig {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_millis(500),
            backoff_min: Duration::from_millis(50),
            backoff_max: Duration::from_secs(1),
            max_message_bytes: 64 * 1024 * 1024,
            tls: None,
            credentials: None,
        }
    }
}

/// Factory of per-peer Raft clients with a channel cache.
#[derive(Clone)]
pub struct GrpcNetwork {
    /// The node that owns this network (for timeout errors).
    local: NodeId,
    config: TransportConfig,
    /// Cached channels by peer id; replaced when the peer's address changes.
    /// A std mutex: held only to look up or insert, never across an await.
    channels: Arc<Mutex<HashMap<NodeId, (String, Channel)>>>,
}

impl GrpcNetwork {
    pub fn new(local: NodeId, config: TransportConfig) -> Self {
        Self { local, config, channels: Arc::new(Mutex::new(HashMap::new())) }
    }

    fn channel(&self, target: NodeId, addr: &str) -> Result<Channel, tonic::transport::Error> {
        let mut map = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((cached_addr, ch)) = map.get(&target)
            && cached_addr == addr
        {
            return Ok(ch.clone());
        }
        let ch = cairn_proto::tls::endpoint(addr, self.config.tls.as_ref())?
            .connect_timeout(self.config.connect_timeout)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(5))
            .connect_lazy();
        map.insert(target, (addr.to_owned(), ch.clone()));
        Ok(ch)
    }
}

impl RaftNetworkFactory<TypeConfig> for GrpcNetwork {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &Node) -> PeerClient {
        let client = match self.channel(target, &node.addr) {
            Ok(ch) => Ok(RaftClient::new(ch)
                .max_decoding_message_size(self.config.max_message_bytes)
                .max_encoding_message_size(self.config.max_message_bytes)),
            Err(e) => Err(format!("invalid address {:?} for node {target}: {e}", node.addr)),
        };
        PeerClient {
            local: self.local,
            target,
            node: node.clone(),
            client,
            config: self.config.clone(),
            refusal_logged: false,
        }
    }
}

/// The Raft client for one peer.
pub struct PeerClient {
    local: NodeId,
    target: NodeId,
    node: Node,
    /// `Err` when the peer's configured address is unusable; every RPC then reports it.
    client: Result<RaftClient<Channel>, String>,
    config: TransportConfig,
    /// Whether this client already logged that the peer refuses its credentials (once is
    /// enough: openraft retries every heartbeat).
    refusal_logged: bool,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct TransportError(String);

impl PeerClient {
    async fn call<Req, Resp, E>(
        &mut self,
        kind: RPCTypes,
        req: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<NodeId, Node, RaftError<NodeId, E>>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let client = match &mut self.client {
            Ok(c) => c,
            Err(msg) => return Err(RPCError::Unreachable(Unreachable::new(&TransportError(msg.clone())))),
        };
        let data =
            codec::encode("raft request", req).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let mut request = tonic::Request::new(RaftPayload { data });
        if let Some(c) = &self.config.credentials {
            c.apply(&mut request);
        }
        let ttl = option.hard_ttl();
        request.set_timeout(ttl);
        let fut = async {
            match kind {
                RPCTypes::AppendEntries => client.append_entries(request).await,
                RPCTypes::Vote => client.vote(request).await,
                RPCTypes::InstallSnapshot => client.install_snapshot(request).await,
            }
        };
        // The gRPC deadline is sent to the server; the local timeout also bounds connecting.
        let reply = match tokio::time::timeout(ttl, fut).await {
            Err(_) => return Err(self.timeout(kind, ttl)),
            Ok(Err(status)) => return Err(self.status_error(kind, ttl, status)),
            Ok(Ok(r)) => r.into_inner(),
        };
        let result: Result<Resp, RaftError<NodeId, E>> =
            codec::decode("raft reply", &reply.data).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        result
            .map_err(|e| RPCError::RemoteError(RemoteError::new_with_node(self.target, self.node.clone(), e)))
    }

    fn timeout<E: std::error::Error>(
        &self,
        kind: RPCTypes,
        ttl: Duration,
    ) -> RPCError<NodeId, Node, RaftError<NodeId, E>> {
        RPCError::Timeout(Timeout { action: kind, id: self.local, target: self.target, timeout: ttl })
    }

    fn status_error<E: std::error::Error>(
        &mut self,
        kind: RPCTypes,
        ttl: Duration,
        status: tonic::Status,
    ) -> RPCError<NodeId, Node, RaftError<NodeId, E>> {
        use tonic::Code;
        let err = TransportError(format!("{kind} to node {} at {}: {status}", self.target, self.node.addr));
        if matches!(status.code(), Code::Unauthenticated | Code::PermissionDenied) && !self.refusal_logged {
            self.refusal_logged = true;
            tracing::warn!(
                target_node = self.target,
                addr = %self.node.addr,
                code = ?status.code(),
                message = status.message(),
                "the peer refuses this replica's raft calls; check the cluster secret or the node certificate"
            );
        }
        match status.code() {
            Code::DeadlineExceeded | Code::Cancelled => self.timeout(kind, ttl),
            // Connection refused, reset, or the peer is shutting down: back off.
            Code::Unavailable | Code::Unknown => RPCError::Unreachable(Unreachable::new(&err)),
            _ => RPCError::Network(NetworkError::new(&err)),
        }
    }
}

impl RaftNetwork<TypeConfig> for PeerClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, Node, RaftError<NodeId>>> {
        self.call(RPCTypes::AppendEntries, &rpc, &option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, Node, RaftError<NodeId, InstallSnapshotError>>,
    > {
        self.call(RPCTypes::InstallSnapshot, &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, Node, RaftError<NodeId>>> {
        self.call(RPCTypes::Vote, &rpc, &option).await
    }

    fn backoff(&self) -> Backoff {
        Backoff::new(backoff_delays(self.config.backoff_min, self.config.backoff_max))
    }
}

/// Exponential backoff with full jitter in `[d/2, d]`, doubling from `min` up to `max`.
pub fn backoff_delays(min: Duration, max: Duration) -> impl Iterator<Item = Duration> + Send + 'static {
    let mut next = min;
    std::iter::repeat_with(move || {
        let cur = next;
        next = (next * 2).min(max);
        let half = cur / 2;
        half + half.mul_f64(rand::random::<f64>())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_is_capped() {
        let delays: Vec<Duration> =
            backoff_delays(Duration::from_millis(50), Duration::from_millis(400)).take(8).collect();
        for (i, d) in delays.iter().enumerate() {
            let nominal = Duration::from_millis(50 * (1 << i.min(3)));
            assert!(*d >= nominal / 2 && *d <= nominal, "delay {i} = {d:?}, nominal {nominal:?}");
        }
    }
}
