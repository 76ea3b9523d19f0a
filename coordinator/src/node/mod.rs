//! A running replica: opens the sled stores, starts Raft, serves gRPC (Raft transport, cluster
//! status and membership, the replicated store API) and bootstraps the cluster when it is one of
//! the initial members.
//!
//! The listener and the shutdown signal are parameters ([`Replica::start`] takes a bound
//! `TcpListener`), so tests run many replicas in one process on port 0.

mod bootstrap;
mod raft_runtime;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use cairn_raft::network::{GrpcNetwork, TransportConfig};
use cairn_raft::service::RaftService;
use cairn_raft::types::{NodeId, Raft};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::TcpListenerStream;

use cairn_proto::auth::ClusterCredentials;
use cairn_raft::service::PeerAuth;

use crate::auth::{AdminAuth, WorkerAuth};
use crate::config::NodeConfig;
use crate::error::NodeError;
use crate::gateway::GatewayService;
use crate::leader::{LeaderHandle, LeaderOptions, LeaderSupervisor};
use crate::metrics::ReplicaMetrics;
use crate::replica::ReplicaContext;
use crate::services::admin::AdminService;
use crate::services::{ClusterService, StoreService};
use tonic::service::interceptor::InterceptedService;

/// Why a replica could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error("cannot open the data directory {path}: {source}")]
    Storage { path: std::path::PathBuf, source: cairn_storage::OpenError },
    #[error("cannot start raft: {0}")]
    Raft(String),
    #[error("cannot use the listener: {0}")]
    Listener(std::io::Error),
    #[error("cannot resolve the checkpoint directory: {0}")]
    CheckpointDir(std::io::Error),
    #[error("cannot configure TLS on the listener: {0}")]
    Tls(tonic::transport::Error),
}

/// A started replica. Dropping it stops the gRPC server (the stop sender goes away); call
/// [`Replica::shutdown`] to also stop Raft and wait until the data directory is released.
pub struct Replica {
    ctx: ReplicaContext,
    addr: SocketAddr,
    stop: watch::Sender<bool>,
    server: JoinHandle<Result<(), tonic::transport::Error>>,
    bootstrap: JoinHandle<()>,
    supervisor: LeaderSupervisor,
    leader: LeaderHandle,
    /// Reports NOT_SERVING while shutting down.
    health: tonic_health::server::HealthReporter,
    /// Follows Raft's metrics into the Raft gauges.
    raft_gauges: JoinHandle<()>,
    /// Where Raft runs; dropped (stopped) last.
    raft_runtime: raft_runtime::RaftRuntime,
}

/// Largest gRPC message a replica accepts (Raft batches and snapshot chunks stay well below).
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;
/// Concurrent HTTP/2 streams one connection may open (a worker needs one, a replica's Raft
/// client a few, an operator tool a handful).
pub const MAX_STREAMS_PER_CONNECTION: u32 = 256;
/// Calls one connection may have in progress at once; more wait.
pub const MAX_CALLS_PER_CONNECTION: u32 = 128;
/// Largest header block a call may send (credentials, deadlines, request ids fit easily).
pub const MAX_HEADER_LIST_BYTES: u32 = 64 * 1024;

impl Replica {
    /// Opens storage, starts Raft and serves on `listener`.
    pub async fn start(config: NodeConfig, listener: TcpListener) -> Result<Self, StartError> {
        config.validate()?;
        let raft_config = Arc::new(config.openraft_config()?);
        // With TLS, the listener serves TLS only and peers are dialed with mutual TLS.
        let tls = config.server_tls()?;
        let addr = listener.local_addr().map_err(StartError::Listener)?;
        let data_dir = config.data_dir();
        let raft_runtime = raft_runtime::RaftRuntime::start(config.node_id)
            .map_err(|e| StartError::Raft(format!("cannot start raft's runtime: {e}")))?;
        let raft_handle =
            raft_runtime.handle().ok_or_else(|| StartError::Raft("raft's runtime is gone".into()))?;
        let on_raft = |e: tokio::task::JoinError| StartError::Raft(format!("raft's runtime failed: {e}"));
        // Opened on Raft's runtime: the log's group commit task lives there.
        let dir = data_dir.clone();
        let (log_store, sm_store) = raft_handle
            .spawn(async move { cairn_storage::open(&dir) })
            .await
            .map_err(on_raft)?
            .map_err(|source| StartError::Storage { path: data_dir.clone(), source })?;
        let reader = sm_store.reader();
        // After opening storage: generated single-node tokens live in the data directory.
        let admin_token = config.resolve_admin_token()?;
        let peer_auth = config.resolve_peer_auth(&admin_token)?;
        let worker_auth =
            WorkerAuth::new(config.resolve_worker_tokens(&admin_token, &peer_auth)?, tls.is_some());
        let auth = AdminAuth::new(admin_token);
        let peer_tls = tls.as_ref().map(|t| t.peer_client());
        let peer_credentials = match &peer_auth {
            PeerAuth::Secret(s) => Some(ClusterCredentials::new(config.node_id, s)),
            PeerAuth::Certificates | PeerAuth::Closed => None,
        };
        let transport = TransportConfig {
            tls: peer_tls.clone(),
            credentials: peer_credentials.clone(),
            ..TransportConfig::default()
        };
        let network = GrpcNetwork::new(config.node_id, transport);
        let node_id = config.node_id;
        let raft = raft_handle
            .spawn(async move { Raft::new(node_id, raft_config, network, log_store, sm_store).await })
            .await
            .map_err(on_raft)?
            .map_err(|e| StartError::Raft(e.to_string()))?;
        let ctx = ReplicaContext {
            id: config.node_id,
            raft: raft.clone(),
            reader,
            advertise: Arc::from(config.advertise_addr()),
            telemetry: ReplicaMetrics::new(),
            peer_tls,
            peer_credentials,
            accepts_peers: !matches!(peer_auth, PeerAuth::Closed),
            default_restart_strategy: config.restart_strategy.clone().map(Arc::new),
            proposer: crate::proposer::Proposer::start(raft.clone()),
            reads: crate::read_barrier::ReadBarrier::start(raft.clone()),
        };
        let raft_gauges =
            tokio::spawn(crate::metrics::raft::follow_raft(raft.clone(), ctx.telemetry.raft.clone()));
        // `_metadata` paths are stored in Raft and read by every replica and worker: make the
        // root absolute so it does not depend on the working directory of whoever reads it.
        let checkpoint_dir =
            std::path::absolute(config.checkpoint_dir()).map_err(StartError::CheckpointDir)?;
        let options = LeaderOptions {
            checkpoint_dir,
            workers: config.workers.clone(),
            incremental: config.incremental_checkpoints,
        };
        let (supervisor, leader) = LeaderSupervisor::spawn(ctx.clone(), options);
        // Standard services, so grpcurl and grpc-health-probe work against a replica.
        let (health, health_service) = tonic_health::server::health_reporter();
        health.set_service_status("", tonic_health::ServingStatus::Serving).await;
        let reflection = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(cairn_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1()
            .map_err(|e| StartError::Raft(format!("cannot build the reflection service: {e}")))?;
        let (stop, mut stopped) = watch::channel(false);
        // Bounds per connection, so that one peer cannot hold unbounded work on this replica.
        let mut builder = tonic::transport::Server::builder()
            .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION)
            .concurrency_limit_per_connection(MAX_CALLS_PER_CONNECTION as usize)
            .http2_max_header_list_size(MAX_HEADER_LIST_BYTES);
        if let Some(tls) = &tls {
            builder = builder.tls_config(tls.server_config()).map_err(StartError::Tls)?;
        }
        let router = builder
            .add_service(health_service)
            .add_service(reflection)
            .add_service(
                RaftService::new(raft.clone(), peer_auth, Arc::new(cairn_storage::check_snapshot))
                    .on_runtime(raft_handle)
                    .into_server(MAX_MESSAGE_BYTES),
            )
            .add_service(GatewayService::new(ctx.clone(), leader.clone(), worker_auth).into_server())
            // Operator services: every call must carry the admin token.
            .add_service(InterceptedService::new(
                ClusterService::new(ctx.clone(), leader.clone()).into_server(),
                auth.clone(),
            ))
            .add_service(InterceptedService::new(
                StoreService::new(ctx.clone(), leader.clone()).into_server(),
                auth.clone(),
            ))
            .add_service(InterceptedService::new(
                AdminService::new(ctx.clone(), leader.clone()).into_server(),
                auth,
            ));
        // Nagle off on every accepted connection (tonic's `tcp_nodelay` covers only listeners it
        // binds itself): a response written as several small frames otherwise waits for the
        // caller's delayed ACK, ~40 ms per call, and a barrier to a worker can wait behind one.
        let incoming = TcpListenerStream::new(listener).map(|conn| {
            if let Ok(stream) = &conn
                && let Err(e) = stream.set_nodelay(true)
            {
                tracing::debug!(error = %e, "cannot turn Nagle's algorithm off on a connection");
            }
            conn
        });
        let server = tokio::spawn(router.serve_with_incoming_shutdown(incoming, async move {
            let _ = stopped.wait_for(|s| *s).await;
        }));
        let bootstrap = tokio::spawn(bootstrap::run(config.clone(), raft.clone()));
        tracing::info!(node_id = config.node_id, %addr, data_dir = %data_dir.display(), "replica started");
        Ok(Self { ctx, addr, stop, server, bootstrap, supervisor, leader, health, raft_gauges, raft_runtime })
    }

    pub fn context(&self) -> &ReplicaContext {
        &self.ctx
    }

    /// The leader runtime of the current term, when this replica leads.
    pub fn leader(&self) -> &LeaderHandle {
        &self.leader
    }

    pub fn raft(&self) -> &Raft {
        &self.ctx.raft
    }

    pub fn id(&self) -> NodeId {
        self.ctx.id
    }

    /// This replica's metrics registry, to serve on `/metrics`.
    pub fn metrics_registry(&self) -> Arc<cairn_process::metrics::Registry> {
        self.ctx.telemetry.registry()
    }

    /// The address the gRPC server is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// When this replica leads, hands the leadership to the most caught-up voter (bounded by
    /// `timeout`) before it stops, so the cluster does not wait out an election timeout. Answers
    /// the new leader and its term, or `None` when there was nothing to hand over; on error the
    /// caller stops anyway and the others elect a leader as after a crash.
    pub async fn hand_off_leadership(&self, timeout: Duration) -> Result<Option<(NodeId, u64)>, NodeError> {
        crate::handoff::hand_off(&self.ctx, &self.leader, tokio::time::Instant::now() + timeout).await
    }

    /// Stops serving, stops Raft and releases the data directory. Waits for all of it, so the
    /// same directory can be reopened right after.
    pub async fn shutdown(self) {
        self.health.set_service_status("", tonic_health::ServingStatus::NotServing).await;
        let _ = self.stop.send(true);
        self.bootstrap.abort();
        self.supervisor.stop().await;
        if let Err(e) = self.ctx.raft.shutdown().await {
            tracing::warn!(node_id = self.ctx.id, error = %e, "raft did not stop cleanly");
        }
        match self.server.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(node_id = self.ctx.id, error = %e, "grpc server ended with an error")
            }
            Err(e) => tracing::warn!(node_id = self.ctx.id, error = %e, "grpc server task failed"),
        }
        let _ = self.bootstrap.await;
        self.raft_gauges.abort();
        let _ = self.raft_gauges.await;
        self.raft_runtime.stop(Duration::from_secs(5)).await;
        tracing::info!(node_id = self.ctx.id, "replica stopped");
    }
}
