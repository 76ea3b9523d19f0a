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
//!
//! openraft waits for an `AppendEntries` call one heartbeat interval (30 ms by default) and then
//! sends the same range again, whatever its size. A follower that fell behind by more than it can
//! decode, append and flush in that time would never catch up, and the leader would keep
//! re-sending it the same range: a livelock that ends only with an election. So a call carries
//! at most [`APPEND_BYTES_BUDGET`] encoded bytes when it holds more than one entry (a larger range
//! is refused locally with openraft's `PayloadTooLarge` hint, which makes the next calls carry
//! fewer entries), and a call with several entries that found no answer in three quarters of its
//! time is reported the same way with half of them, so a slow follower gets smaller steps instead
//! of the same one again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cairn_proto::auth::ClusterCredentials;
use cairn_proto::v1::RaftPayload;
use cairn_proto::v1::raft_client::RaftClient;
use openraft::error::{
    InstallSnapshotError, NetworkError, PayloadTooLarge, RPCError, RaftError, RemoteError, Timeout,
    Unreachable,
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

/// Encoded bytes an `AppendEntries` call with more than one entry may carry (see the module
/// documentation); a single entry is always sent, whatever its size.
pub const APPEND_BYTES_BUDGET: usize = 256 * 1024;

/// How many of `entries` entries (encoded in `bytes`) to send next when the call is over the
/// budget: proportionally fewer, at least one. `None` when the call fits.
pub fn entries_within_budget(entries: usize, bytes: usize, budget: usize) -> Option<u64> {
    if entries <= 1 || bytes <= budget {
        return None;
    }
    let fit = (entries as u128 * budget as u128 / bytes as u128) as u64;
    Some(fit.clamp(1, entries as u64 - 1))
}

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
        let data = encode_request(req)?;
        self.send(kind, data, option.hard_ttl()).await
    }

    /// Sends an encoded request and waits at most `ttl` for its answer.
    async fn send<Resp, E>(
        &mut self,
        kind: RPCTypes,
        data: Vec<u8>,
        ttl: Duration,
    ) -> Result<Resp, RPCError<NodeId, Node, RaftError<NodeId, E>>>
    where
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let client = match &mut self.client {
            Ok(c) => c,
            Err(msg) => return Err(RPCError::Unreachable(Unreachable::new(&TransportError(msg.clone())))),
        };
        let mut request = tonic::Request::new(RaftPayload { data });
        if let Some(c) = &self.config.credentials {
            c.apply(&mut request);
        }
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
        let entries = rpc.entries.len();
        let data = encode_request(&rpc)?;
        if let Some(hint) = entries_within_budget(entries, data.len(), APPEND_BYTES_BUDGET) {
            tracing::debug!(
                target_node = self.target,
                entries,
                bytes = data.len(),
                hint,
                "append range over the byte budget; splitting it"
            );
            return Err(too_large(hint));
        }
        if entries <= 1 {
            return self.send(RPCTypes::AppendEntries, data, option.hard_ttl()).await;
        }
        // Give up before openraft does, so the retry can carry fewer entries.
        match self.send(RPCTypes::AppendEntries, data, option.soft_ttl()).await {
            Err(RPCError::Timeout(t)) => {
                let hint = (entries / 2).max(1) as u64;
                tracing::debug!(target_node = self.target, entries, hint, timeout = ?t.timeout, "append range not answered in time; sending fewer entries");
                Err(too_large(hint))
            }
            other => other,
        }
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

// The error type is openraft's, the same every RPC method returns.
#[allow(clippy::result_large_err)]
fn encode_request<Req: Serialize, E: std::error::Error>(
    req: &Req,
) -> Result<Vec<u8>, RPCError<NodeId, Node, RaftError<NodeId, E>>> {
    codec::encode("raft request", req).map_err(|e| RPCError::Network(NetworkError::new(&e)))
}

fn too_large<E: std::error::Error>(entries: u64) -> RPCError<NodeId, Node, RaftError<NodeId, E>> {
    RPCError::PayloadTooLarge(PayloadTooLarge::new_entries_hint(entries))
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
    fn append_ranges_over_the_budget_are_split_proportionally() {
        // Within the budget, or a single entry: sent as is.
        assert_eq!(entries_within_budget(300, 1000, 4096), None);
        assert_eq!(entries_within_budget(1, 10_000_000, 4096), None);
        assert_eq!(entries_within_budget(0, 10_000_000, 4096), None);
        // Four times the budget: a quarter of the entries.
        assert_eq!(entries_within_budget(300, 4 * 4096, 4096), Some(75));
        // Far over it: one entry at a time, never zero.
        assert_eq!(entries_within_budget(2, usize::MAX, 4096), Some(1));
        // Barely over it: one entry fewer at least.
        assert_eq!(entries_within_budget(300, 4097, 4096), Some(299));
    }

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
