//! An in-process cluster of replicas for tests and benchmarks.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use cairn_client::{AuthChannel, ClientConfig, LeaderClient};
use cairn_coordinator::auth::AdminToken;
use cairn_coordinator::config::{NodeConfig, Peer, RaftTiming, WorkerTiming};
use cairn_coordinator::node::Replica;
use cairn_proto::auth::Secret;
use cairn_raft::types::NodeId;
use openraft::ServerState;
use tempfile::TempDir;
use tokio::net::TcpListener;

use crate::wait;

/// Raft timing for tests: fast failover, with enough slack (8 heartbeats per election timeout) that
/// a loaded 2-core machine running many clusters at once does not see spurious elections.
pub fn test_timing() -> RaftTiming {
    RaftTiming {
        heartbeat_interval: Duration::from_millis(100),
        election_timeout_min: Duration::from_millis(800),
        election_timeout_max: Duration::from_millis(1600),
        ..RaftTiming::default()
    }
}

/// Worker timing for tests: quick loss detection and re-attach.
pub fn test_worker_timing() -> WorkerTiming {
    WorkerTiming {
        heartbeat_interval: Duration::from_millis(200),
        heartbeat_timeout: Duration::from_secs(2),
        reattach_grace: Duration::from_secs(8),
    }
}

/// Replicas in this process, each with its own listener and data directory.
pub struct InProcCluster {
    _root: TempDir,
    dirs: BTreeMap<NodeId, PathBuf>,
    pub addrs: BTreeMap<NodeId, SocketAddr>,
    peers: Vec<Peer>,
    timing: RaftTiming,
    running: BTreeMap<NodeId, Replica>,
    /// The admin token every replica of this cluster accepts.
    token: AdminToken,
    /// The secret the replicas authenticate each other's Raft calls with.
    cluster_secret: Secret,
    /// The token workers of this cluster attach with.
    worker_token: Secret,
}

impl InProcCluster {
    /// Starts `n` replicas (ids 1..=n) forming one cluster.
    pub async fn start(n: u64, timing: RaftTiming) -> anyhow::Result<Self> {
        let root = tempfile::tempdir()?;
        let mut listeners = BTreeMap::new();
        for id in 1..=n {
            let l = TcpListener::bind("127.0.0.1:0").await?;
            listeners.insert(id, l);
        }
        let addrs: BTreeMap<NodeId, SocketAddr> =
            listeners.iter().map(|(id, l)| Ok((*id, l.local_addr()?))).collect::<std::io::Result<_>>()?;
        let peers: Vec<Peer> = addrs.iter().map(|(id, a)| Peer { id: *id, addr: a.to_string() }).collect();
        let dirs = (1..=n).map(|id| (id, root.path().join(format!("node-{id}")))).collect();
        let mut cluster = Self {
            _root: root,
            dirs,
            addrs,
            peers,
            timing,
            running: BTreeMap::new(),
            token: AdminToken::generate(),
            cluster_secret: Secret::generate(),
            worker_token: Secret::generate(),
        };
        for (id, listener) in listeners {
            cluster.start_node(id, listener).await?;
        }
        Ok(cluster)
    }

    fn config(&self, id: NodeId) -> anyhow::Result<NodeConfig> {
        let addr = self.addrs.get(&id).ok_or_else(|| anyhow::anyhow!("no node {id}"))?;
        Ok(NodeConfig {
            node_id: id,
            listen: addr.to_string(),
            advertise: None,
            data_dir: self.dirs.get(&id).cloned(),
            peers: self.peers.clone(),
            checkpoint_dir: Some(self.checkpoint_dir()),
            incremental_checkpoints: false,
            metrics_listen: None,
            console_listen: None,
            console_views_need_token: false,
            raft: self.timing.clone(),
            workers: test_worker_timing(),
            restart_strategy: None,
            tls: None,
            admin_token_file: None,
            admin_token: Some(self.token.clone()),
            cluster_secret_file: None,
            cluster_secret: Some(self.cluster_secret.clone()),
            worker_token_file: None,
            worker_token: Some(self.worker_token.clone()),
        })
    }

    /// The token workers attach to this cluster with.
    pub fn worker_token(&self) -> Secret {
        self.worker_token.clone()
    }

    /// A worker configuration for this cluster: its endpoints and worker token.
    pub fn worker_config(&self, worker_id: &str) -> cairn_taskrt::worker::WorkerConfig {
        cairn_taskrt::worker::WorkerConfig {
            worker_id: Some(worker_id.to_owned()),
            token: Some(self.worker_token.clone()),
            ..cairn_taskrt::worker::WorkerConfig::new(self.addrs.values().map(|a| a.to_string()))
        }
    }

    async fn start_node(&mut self, id: NodeId, listener: TcpListener) -> anyhow::Result<()> {
        let replica = Replica::start(self.config(id)?, listener).await?;
        self.running.insert(id, replica);
        Ok(())
    }

    /// Adds a replica that is not an initial member (it waits to be added as a learner).
    pub async fn spawn_extra(&mut self, id: NodeId) -> anyhow::Result<SocketAddr> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        self.addrs.insert(id, addr);
        self.dirs.insert(id, self._root.path().join(format!("node-{id}")));
        self.start_node(id, listener).await?;
        Ok(addr)
    }

    /// The checkpoint storage root shared by the replicas (and the workers of a test).
    pub fn checkpoint_dir(&self) -> PathBuf {
        self._root.path().join("checkpoints")
    }

    /// The data directory of replica `id`.
    pub fn data_dir(&self, id: NodeId) -> Option<PathBuf> {
        self.dirs.get(&id).cloned()
    }

    pub fn replica(&self, id: NodeId) -> Option<&Replica> {
        self.running.get(&id)
    }

    pub fn running_ids(&self) -> Vec<NodeId> {
        self.running.keys().copied().collect()
    }

    /// Stops a replica cleanly, releasing its data directory.
    pub async fn stop(&mut self, id: NodeId) {
        if let Some(r) = self.running.remove(&id) {
            r.shutdown().await;
        }
    }

    /// Restarts a stopped replica on its old address from its data directory.
    pub async fn restart(&mut self, id: NodeId) -> anyhow::Result<()> {
        let addr = *self.addrs.get(&id).ok_or_else(|| anyhow::anyhow!("no node {id}"))?;
        let listener = wait::until("the old port to be free", Duration::from_secs(10), || async {
            TcpListener::bind(addr).await.ok()
        })
        .await?;
        self.start_node(id, listener).await
    }

    /// Waits until a running replica leads and every running voter agrees on it.
    pub async fn wait_leader(&self, timeout: Duration) -> anyhow::Result<NodeId> {
        wait::until("a leader all running replicas agree on", timeout, || async {
            let mut leader = None;
            for r in self.running.values() {
                let m = r.raft().metrics().borrow().clone();
                if m.state == ServerState::Leader {
                    leader = Some(m.id);
                }
            }
            let leader = leader?;
            let agree = self.running.values().all(|r| {
                let m = r.raft().metrics().borrow().clone();
                m.state == ServerState::Learner || m.current_leader == Some(leader)
            });
            agree.then_some(leader)
        })
        .await
    }

    /// Waits until replica `id` has applied at least `index`.
    pub async fn wait_applied(&self, id: NodeId, index: u64, timeout: Duration) -> anyhow::Result<()> {
        let r = self.replica(id).ok_or_else(|| anyhow::anyhow!("node {id} is not running"))?;
        let mut rx = r.raft().metrics();
        let result =
            tokio::time::timeout(timeout, rx.wait_for(|m| m.last_applied.is_some_and(|l| l.index >= index)))
                .await;
        match result {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) => anyhow::bail!("node {id} stopped before applying index {index}"),
            Err(_) => anyhow::bail!("node {id} did not apply index {index} within {timeout:?}"),
        }
    }

    /// A leader-following client over every replica's address, carrying the admin token.
    pub fn client(&self) -> anyhow::Result<LeaderClient> {
        Ok(LeaderClient::new(self.addrs.values().map(|a| a.to_string()), self.client_config())?)
    }

    /// Client settings with this cluster's admin token.
    pub fn client_config(&self) -> ClientConfig {
        ClientConfig { token: Some(self.token.expose().to_owned()), ..ClientConfig::default() }
    }

    /// A channel straight to one replica (no leader following) that carries the admin token.
    pub async fn direct(&self, id: NodeId) -> anyhow::Result<AuthChannel> {
        let addr = self.addrs.get(&id).ok_or_else(|| anyhow::anyhow!("no node {id}"))?;
        crate::direct_channel(&addr.to_string(), self.admin_token()).await
    }

    /// The admin token the replicas accept.
    pub fn admin_token(&self) -> &str {
        self.token.expose()
    }

    pub async fn shutdown(mut self) {
        let ids: Vec<NodeId> = self.running.keys().copied().collect();
        for id in ids {
            self.stop(id).await;
        }
    }
}
