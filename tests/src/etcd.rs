//! etcd as a side-by-side peer for the store benchmark: a 3- or 1-member etcd cluster started
//! from the `etcd` binary on the `PATH` (Debian `etcd-server`), on free loopback ports and a
//! temporary directory, with etcd's defaults (100 ms heartbeat, 1 s election, fsync on); and a
//! minimal client for `etcdserverpb.KV/Put` over Cairn's own tonic (a put returns a
//! cluster-wide, strictly increasing revision: the same service as a replicated checkpoint-id
//! counter). Members are stopped by PID when the cluster is dropped.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::Context;
use tempfile::TempDir;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::{Channel, Endpoint};

use crate::procs::free_port;

/// `etcdserverpb.PutRequest` (the fields used here).
#[derive(Clone, PartialEq, prost::Message)]
pub struct PutRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
}

/// `etcdserverpb.ResponseHeader`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ResponseHeader {
    #[prost(uint64, tag = "1")]
    pub cluster_id: u64,
    #[prost(uint64, tag = "2")]
    pub member_id: u64,
    #[prost(int64, tag = "3")]
    pub revision: i64,
    #[prost(uint64, tag = "4")]
    pub raft_term: u64,
}

/// `etcdserverpb.PutResponse` (the header only).
#[derive(Clone, PartialEq, prost::Message)]
pub struct PutResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
}

/// A put client on one connection.
#[derive(Clone)]
pub struct EtcdClient {
    grpc: tonic::client::Grpc<Channel>,
}

impl EtcdClient {
    pub async fn connect(addr: &str) -> anyhow::Result<Self> {
        let channel = Endpoint::from_shared(format!("http://{addr}"))?
            .connect_timeout(Duration::from_secs(2))
            .tcp_nodelay(true)
            .connect()
            .await
            .with_context(|| format!("connecting to etcd at {addr}"))?;
        Ok(Self { grpc: tonic::client::Grpc::new(channel) })
    }

    /// Puts `value` under `key`; returns the revision the put created.
    pub async fn put(&mut self, key: &[u8], value: &[u8]) -> anyhow::Result<i64> {
        self.grpc.ready().await.context("etcd connection not ready")?;
        let request = PutRequest { key: key.to_vec(), value: value.to_vec() };
        let codec = tonic_prost::ProstCodec::<PutRequest, PutResponse>::default();
        let reply = self
            .grpc
            .unary(tonic::Request::new(request), PathAndQuery::from_static("/etcdserverpb.KV/Put"), codec)
            .await
            .context("etcd put")?;
        reply.into_inner().header.map(|h| h.revision).context("etcd put reply without a header")
    }
}

/// A local etcd cluster; members are killed when it is dropped.
pub struct EtcdCluster {
    members: Vec<Child>,
    /// Client addresses, `127.0.0.1:<port>`.
    pub client_addrs: Vec<String>,
    _dir: TempDir,
}

/// The `etcd` binary on the `PATH`, if installed.
pub fn etcd_binary() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join("etcd")).find(|p| p.is_file())
}

impl EtcdCluster {
    /// Starts `n` members and waits until a put succeeds.
    pub async fn start(n: usize) -> anyhow::Result<Self> {
        let binary = etcd_binary().context("no `etcd` on the PATH (Debian: apt-get install etcd-server)")?;
        let dir = tempfile::Builder::new().prefix("cairn-etcd-").tempdir()?;
        let ports: Vec<(u16, u16)> =
            (0..n).map(|_| Ok((free_port()?, free_port()?))).collect::<anyhow::Result<_>>()?;
        let initial = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("m{i}=http://127.0.0.1:{peer}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = Self { members: Vec::new(), client_addrs: Vec::new(), _dir: dir };
        for (i, (client, peer)) in ports.iter().enumerate() {
            let data = cluster._dir.path().join(format!("m{i}"));
            let child = Command::new(&binary)
                .arg(format!("--name=m{i}"))
                .arg(format!("--data-dir={}", data.display()))
                .arg(format!("--listen-client-urls=http://127.0.0.1:{client}"))
                .arg(format!("--advertise-client-urls=http://127.0.0.1:{client}"))
                .arg(format!("--listen-peer-urls=http://127.0.0.1:{peer}"))
                .arg(format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer}"))
                .arg(format!("--initial-cluster={initial}"))
                .arg("--initial-cluster-token=cairn-bench")
                .arg("--initial-cluster-state=new")
                .arg(format!("--log-outputs={}", cluster._dir.path().join(format!("m{i}.log")).display()))
                .arg("--logger=zap")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .with_context(|| format!("starting {}", binary.display()))?;
            cluster.members.push(child);
            cluster.client_addrs.push(format!("127.0.0.1:{client}"));
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let attempt = async {
                let mut c = EtcdClient::connect(&cluster.client_addrs[0]).await?;
                c.put(b"bench/ready", b"1").await
            };
            match attempt.await {
                Ok(_) => return Ok(cluster),
                Err(e) if tokio::time::Instant::now() >= deadline => {
                    return Err(e.context("etcd cluster did not accept a put within 30 s"));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for child in &mut self.members {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
