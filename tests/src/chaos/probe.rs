//! Direct gRPC access to each replica by its container address, with the cluster's admin
//! token. The chaos run asks every replica itself rather than following leader hints, because
//! the hints carry compose service names the host cannot resolve.

use std::time::Duration;

use cairn_client::{AuthChannel, BearerAuth};
use cairn_proto::v1::cluster_client::ClusterClient;
use cairn_proto::v1::store_client::StoreClient;
use cairn_proto::v1::{
    ClusterStatus, GetJobRequest, JobRecord, StatusRequest, TriggerCheckpointReply, TriggerCheckpointRequest,
};
use tonic::transport::{Channel, Endpoint};

use super::cluster::Topology;
use super::history::now_ms;
use super::nemesis;

/// Bound on one read of one replica: a paused or partitioned replica costs at most this.
const READ_TIMEOUT: Duration = Duration::from_millis(400);

#[derive(Clone)]
struct Conn {
    container: String,
    node_id: u64,
    port: u16,
    ip: Option<String>,
    channel: Option<Channel>,
}

/// A successful status answer with the times it was asked and answered.
#[derive(Debug, Clone)]
pub struct Timed<T> {
    pub sent_ms: u64,
    pub at_ms: u64,
    pub value: T,
}

/// Channels to every replica of the project.
#[derive(Clone)]
pub struct Probe {
    network: String,
    conns: Vec<Conn>,
    auth: BearerAuth,
    /// Index of the replica that answered as leader last.
    leader: Option<usize>,
}

impl Probe {
    pub fn new(topology: &Topology, token: &str) -> anyhow::Result<Self> {
        let conns = topology
            .replicas
            .iter()
            .map(|r| Conn {
                container: r.container.name.clone(),
                node_id: r.node_id,
                port: r.port,
                ip: None,
                channel: None,
            })
            .collect();
        Ok(Self {
            network: topology.network.clone(),
            conns,
            auth: BearerAuth::new(Some(token))?,
            leader: None,
        })
    }

    pub fn len(&self) -> usize {
        self.conns.len()
    }

    pub fn is_empty(&self) -> bool {
        self.conns.is_empty()
    }

    pub fn container(&self, i: usize) -> &str {
        &self.conns[i].container
    }

    pub fn node_id(&self, i: usize) -> u64 {
        self.conns[i].node_id
    }

    /// Re-reads every replica's address (a reconnected container may get a new one).
    pub async fn refresh_addresses(&mut self) {
        for c in &mut self.conns {
            let ip = nemesis::inspect(&c.container, &self.network).await.ok().and_then(|s| s.ip);
            if ip.is_some() && ip != c.ip {
                c.channel = None;
                c.ip = ip;
            }
        }
    }

    fn channel(&mut self, i: usize) -> Option<AuthChannel> {
        let c = &mut self.conns[i];
        if c.channel.is_none() {
            let ip = c.ip.as_ref()?;
            let ep = Endpoint::from_shared(format!("http://{ip}:{}", c.port)).ok()?;
            c.channel = Some(ep.connect_timeout(READ_TIMEOUT).tcp_nodelay(true).connect_lazy());
        }
        Some(AuthChannel::new(c.channel.clone()?, self.auth.clone()))
    }

    /// `Cluster.Status` of replica `i` (answered only by a leader that confirmed its
    /// leadership with a quorum).
    pub async fn status(&mut self, i: usize) -> Option<Timed<ClusterStatus>> {
        let ch = self.channel(i)?;
        let sent_ms = now_ms();
        let reply = tokio::time::timeout(READ_TIMEOUT, ClusterClient::new(ch).status(StatusRequest {})).await;
        match reply {
            Ok(Ok(r)) => Some(Timed { sent_ms, at_ms: now_ms(), value: r.into_inner() }),
            _ => None,
        }
    }

    pub async fn get_job(&mut self, i: usize, job: &str) -> Option<Timed<JobRecord>> {
        let ch = self.channel(i)?;
        let sent_ms = now_ms();
        let req = GetJobRequest { job_id: job.to_owned() };
        match tokio::time::timeout(READ_TIMEOUT, StoreClient::new(ch).get_job(req)).await {
            Ok(Ok(r)) => Some(Timed { sent_ms, at_ms: now_ms(), value: r.into_inner() }),
            _ => None,
        }
    }

    /// The leader's status and the job's record, trying the last leader first.
    pub async fn leader_read(
        &mut self,
        job: &str,
    ) -> Option<(usize, Timed<ClusterStatus>, Timed<JobRecord>)> {
        let order: Vec<usize> = self
            .leader
            .into_iter()
            .chain((0..self.conns.len()).filter(|i| Some(*i) != self.leader))
            .collect();
        for i in order {
            let Some(st) = self.status(i).await else { continue };
            if let Some(rec) = self.get_job(i, job).await {
                self.leader = Some(i);
                return Some((i, st, rec));
            }
        }
        None
    }

    /// The worker the leader runs `job` on (`None` when no leader answers or it runs nowhere).
    pub async fn job_worker(&mut self, job: &str) -> Option<String> {
        for i in self.leader.into_iter().chain(0..self.conns.len()) {
            let Some(ch) = self.channel(i) else { continue };
            let req = cairn_proto::v1::JobRuntimesRequest {};
            if let Ok(Ok(r)) =
                tokio::time::timeout(READ_TIMEOUT, ClusterClient::new(ch).job_runtimes(req)).await
            {
                return r
                    .into_inner()
                    .jobs
                    .into_iter()
                    .find(|j| j.job_id == job)
                    .map(|j| j.worker)
                    .filter(|w| !w.is_empty());
            }
        }
        None
    }

    /// Remembers which replica answered as leader.
    pub fn set_leader(&mut self, i: usize) {
        self.leader = Some(i);
    }

    /// Sets the job's checkpoint timeout through the admin API of the leader.
    pub async fn set_checkpoint_timeout(&mut self, job: &str, timeout: Duration) -> Result<(), String> {
        use cairn_proto::admin::UpdateCheckpointConfigRequest;
        use cairn_proto::admin::admin_client::AdminClient;
        let patch = serde_json::json!({ "timeout": humantime::format_duration(timeout).to_string() });
        let req = UpdateCheckpointConfigRequest {
            job_id: job.to_owned(),
            checkpoint_json: patch.to_string(),
            request_id: String::new(),
        };
        let mut last = "no replica answered as leader".to_owned();
        for i in 0..self.conns.len() {
            if self.status(i).await.is_none() {
                continue;
            }
            let Some(ch) = self.channel(i) else { continue };
            match tokio::time::timeout(
                Duration::from_secs(10),
                AdminClient::new(ch).update_checkpoint_config(req.clone()),
            )
            .await
            {
                Ok(Ok(_)) => return Ok(()),
                Ok(Err(status)) => last = format!("{}: {status}", self.conns[i].container),
                Err(_) => last = format!("{}: no answer", self.conns[i].container),
            }
        }
        Err(last)
    }

    /// `Store.TriggerCheckpoint` on the leader (stop-with-savepoint at the end of the run),
    /// waiting up to `timeout` for the snapshot to complete.
    pub async fn trigger(
        &mut self,
        req: TriggerCheckpointRequest,
        timeout: Duration,
    ) -> Result<TriggerCheckpointReply, String> {
        let mut last = "no replica answered as leader".to_owned();
        for i in 0..self.conns.len() {
            if self.status(i).await.is_none() {
                continue;
            }
            let Some(ch) = self.channel(i) else { continue };
            match tokio::time::timeout(timeout, StoreClient::new(ch).trigger_checkpoint(req.clone())).await {
                Ok(Ok(r)) => return Ok(r.into_inner()),
                Ok(Err(status)) => last = format!("{}: {status}", self.conns[i].container),
                Err(_) => last = format!("{}: no answer within {timeout:?}", self.conns[i].container),
            }
        }
        Err(last)
    }
}
