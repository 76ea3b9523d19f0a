//! TLS end to end: three replicas serving TLS only, with Raft between them over mutual TLS, the
//! leader-following client and a worker connecting with the cluster CA, and everything else
//! refused: plaintext, Raft calls without a client certificate, certificates of another CA.
//! The certificates are made at test time (rcgen) in the test's temp directory.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use cairn_client::{ClientConfig, ClientError, LeaderClient};
use cairn_coordinator::auth::AdminToken;
use cairn_coordinator::config::{NodeConfig, Peer};
use cairn_coordinator::node::Replica;
use cairn_proto::tls::{ClientTls, TlsFiles};
use cairn_proto::v1::RaftPayload;
use cairn_proto::v1::raft_client::RaftClient;
use cairn_raft::service::CLIENT_CERT_REQUIRED;
use cairn_taskrt::demo::DemoJob;
use cairn_taskrt::demo::source::SourceConfig;
use cairn_taskrt::worker::{Worker, WorkerConfig};
use cairn_tests::inproc::{test_timing, test_worker_timing};
use cairn_tests::procs::binary;
use cairn_tests::{init_test_logging, wait};
use openraft::ServerState;
use rcgen::{
    BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};
use tempfile::TempDir;
use tokio::net::TcpListener;
use tonic::Code;

const T: Duration = Duration::from_secs(60);

fn path(p: &Path) -> &str {
    p.to_str().unwrap_or_default()
}

/// A certificate authority that issues certificates into a directory.
struct Ca {
    issuer: Issuer<'static, KeyPair>,
    cert_file: PathBuf,
}

impl Ca {
    fn new(dir: &Path, name: &str) -> anyhow::Result<Self> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(rcgen::DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let cert = params.self_signed(&key)?;
        let cert_file = dir.join(format!("{name}.pem"));
        std::fs::write(&cert_file, cert.pem())?;
        Ok(Self { issuer: Issuer::new(params, key), cert_file })
    }

    /// A leaf for `names` (DNS names or IP addresses), usable as server and client: (cert, key).
    fn issue(&self, dir: &Path, file: &str, names: &[&str]) -> anyhow::Result<(PathBuf, PathBuf)> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())?;
        params.distinguished_name.push(rcgen::DnType::CommonName, file);
        params.extended_key_usages =
            vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params.signed_by(&key, &self.issuer)?;
        let (cert_file, key_file) = (dir.join(format!("{file}.crt")), dir.join(format!("{file}.key")));
        std::fs::write(&cert_file, cert.pem())?;
        std::fs::write(&key_file, key.serialize_pem())?;
        Ok((cert_file, key_file))
    }

    fn files(&self, identity: Option<(PathBuf, PathBuf)>) -> TlsFiles {
        let (cert_file, key_file) = identity.unzip();
        TlsFiles { cert_file, key_file, ca_file: Some(self.cert_file.clone()) }
    }
}

/// Three replicas in this process, each with its own certificate of the cluster CA.
struct TlsCluster {
    root: TempDir,
    ca: Ca,
    addrs: BTreeMap<u64, SocketAddr>,
    replicas: BTreeMap<u64, Replica>,
    token: AdminToken,
}

impl TlsCluster {
    async fn start() -> anyhow::Result<Self> {
        let root = tempfile::tempdir()?;
        let ca = Ca::new(root.path(), "cluster-ca")?;
        let mut listeners = BTreeMap::new();
        for id in 1..=3u64 {
            listeners.insert(id, TcpListener::bind("127.0.0.1:0").await?);
        }
        let addrs: BTreeMap<u64, SocketAddr> =
            listeners.iter().map(|(id, l)| Ok((*id, l.local_addr()?))).collect::<std::io::Result<_>>()?;
        let peers: Vec<Peer> = addrs.iter().map(|(id, a)| Peer { id: *id, addr: a.to_string() }).collect();
        let token = AdminToken::generate();
        let mut replicas = BTreeMap::new();
        for (id, listener) in listeners {
            // The certificate names the replica (CN `cairn-node-<id>`): peers accept its Raft calls.
            let identity = ca.issue(root.path(), &format!("cairn-node-{id}"), &["127.0.0.1", "localhost"])?;
            let config = NodeConfig {
                node_id: id,
                listen: addrs[&id].to_string(),
                data_dir: Some(root.path().join(format!("node-{id}"))),
                peers: peers.clone(),
                checkpoint_dir: Some(root.path().join("checkpoints")),
                raft: test_timing(),
                workers: test_worker_timing(),
                tls: Some(ca.files(Some(identity))),
                admin_token: Some(token.clone()),
                ..NodeConfig::default()
            };
            replicas.insert(id, Replica::start(config, listener).await?);
        }
        Ok(Self { root, ca, addrs, replicas, token })
    }

    fn endpoints(&self) -> Vec<String> {
        self.addrs.values().map(|a| a.to_string()).collect()
    }

    /// A leader-following client with `tls`, giving up after `deadline`.
    fn client(&self, tls: Option<ClientTls>, deadline: Duration) -> anyhow::Result<LeaderClient> {
        let token = Some(self.token.expose().to_owned());
        let config = ClientConfig { tls, deadline, token, ..ClientConfig::default() };
        Ok(LeaderClient::new(self.endpoints(), config)?)
    }

    /// Runs the `cairnctl` binary against this cluster with the admin token and `args`.
    async fn cairnctl(&self, args: &[&str]) -> anyhow::Result<std::process::Output> {
        let mut cmd = tokio::process::Command::new(binary("cairnctl")?);
        for (var, _) in std::env::vars().filter(|(k, _)| k.starts_with("CAIRN_")) {
            cmd.env_remove(var);
        }
        cmd.args(["--endpoints", &self.endpoints().join(","), "--token", self.token.expose()]);
        Ok(cmd.args(args).kill_on_drop(true).output().await?)
    }

    /// Client material trusting the cluster CA, with an identity of the cluster CA when asked.
    fn client_tls(&self, with_identity: bool) -> anyhow::Result<ClientTls> {
        let identity = with_identity
            .then(|| self.ca.issue(self.root.path(), "admin-client", &["cairn-admin"]))
            .transpose()?;
        Ok(self.ca.files(identity).load_client()?)
    }

    /// Waits until a replica leads and all agree on it: Raft works between the replicas.
    async fn wait_leader(&self) -> anyhow::Result<u64> {
        wait::until("a leader all replicas agree on", T, || async {
            let metrics: Vec<_> =
                self.replicas.values().map(|r| r.raft().metrics().borrow().clone()).collect();
            let leader = metrics.iter().find(|m| m.state == ServerState::Leader)?.id;
            metrics.iter().all(|m| m.current_leader == Some(leader)).then_some(leader)
        })
        .await
    }

    async fn shutdown(self) {
        for (_, r) in self.replicas {
            r.shutdown().await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_elect_and_replicate_over_mutual_tls_and_clients_need_the_ca() -> anyhow::Result<()> {
    init_test_logging();
    let cluster = TlsCluster::start().await?;
    let leader = cluster.wait_leader().await?;

    // A client that trusts the cluster CA (server authentication only) reads and writes.
    let mut client = cluster.client(Some(cluster.client_tls(false)?), T)?;
    let status = client.status().await?;
    assert_eq!(status.members.len(), 3, "{status:?}");
    client.register_job("registry-only", "").await?;
    // The registration reached every replica: Raft replicates over mutual TLS.
    wait::until("every replica to apply the registration", T, || async {
        cluster.replicas.values().all(|r| r.context().reader.job_count() == 1).then_some(())
    })
    .await?;

    // Plaintext is refused: the listener speaks TLS only.
    let mut plain = cluster.client(None, Duration::from_secs(2))?;
    // (The TLS listener's answer does not parse as HTTP/2: the client sees a protocol error.)
    let err = plain.status().await.expect_err("a plaintext client must not be served");
    assert!(!matches!(err, ClientError::BadEndpoint { .. } | ClientError::NoEndpoints), "{err}");

    // A client trusting another CA refuses the replicas' certificates, and says so.
    let other = Ca::new(cluster.root.path(), "other-ca")?;
    let mut stranger = cluster.client(Some(other.files(None).load_client()?), Duration::from_secs(2))?;
    let err = stranger.status().await.expect_err("a certificate of an unknown CA must not be trusted");
    assert!(matches!(err, ClientError::NoLeader { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("invalid peer certificate: UnknownIssuer"),
        "the error should name the cause: {text}"
    );

    // cairnctl: --ca-file of the cluster reads the status; another CA fails, naming the cause.
    let out = cluster.cairnctl(&["--ca-file", path(&cluster.ca.cert_file), "cluster", "status"]).await?;
    assert!(out.status.success(), "cairnctl with the cluster CA failed: {out:?}");
    // A leadership transfer: the leader asks the target to elect itself, a replica-to-replica call.
    let target = if leader == 1 { 2 } else { 1 };
    let ca = path(&cluster.ca.cert_file);
    let out = cluster.cairnctl(&["--ca-file", ca, "cluster", "transfer-leader", &target.to_string()]).await?;
    assert!(out.status.success(), "transfer-leader over TLS failed: {out:?}");
    wait::until("the transfer target to lead", T, || async {
        (cluster.wait_leader().await.ok()? == target).then_some(())
    })
    .await?;
    let out = cluster
        .cairnctl(&["--timeout", "2s", "--ca-file", path(&other.cert_file), "cluster", "status"])
        .await?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("UnknownIssuer"), "{out:?}");

    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raft_calls_need_a_client_certificate_of_the_cluster_ca() -> anyhow::Result<()> {
    init_test_logging();
    let cluster = TlsCluster::start().await?;
    let addr = cluster.addrs[&1].to_string();
    let raft = |tls: ClientTls| {
        let addr = addr.clone();
        async move {
            let channel = cairn_proto::tls::endpoint(&addr, Some(&tls))?.connect().await?;
            // Not a valid vote: a caller that passes the certificate check gets INVALID_ARGUMENT.
            let reply = RaftClient::new(channel).vote(RaftPayload { data: b"{}".to_vec() }).await;
            anyhow::Ok(reply.expect_err("a garbage vote must not be accepted"))
        }
    };

    // Server authentication only: the TLS connection is accepted, the Raft call is not.
    let status = raft(cluster.client_tls(false)?).await?;
    assert_eq!(status.code(), Code::Unauthenticated, "{status}");
    assert_eq!(status.message(), CLIENT_CERT_REQUIRED);

    // A certificate of the cluster CA that names no replica (an operator's, a worker's) is
    // refused: the CA vouches for the holder, the certificate says what it may do.
    let status = raft(cluster.client_tls(true)?).await?;
    assert_eq!(status.code(), Code::PermissionDenied, "{status}");
    assert!(status.message().contains("names no replica"), "{status}");
    let worker = cluster.ca.issue(cluster.root.path(), "cairn-worker-w1", &["w1"])?;
    let status = raft(cluster.ca.files(Some(worker)).load_client()?).await?;
    assert_eq!(status.code(), Code::PermissionDenied, "{status}");
    assert!(status.message().contains("names worker `w1`"), "{status}");
    // A replica's certificate of a node that is not a member is refused too.
    let stranger = cluster.ca.issue(cluster.root.path(), "cairn-node-9", &["127.0.0.1"])?;
    let status = raft(cluster.ca.files(Some(stranger)).load_client()?).await?;
    assert_eq!(status.code(), Code::PermissionDenied, "{status}");
    assert!(status.message().contains("node 9 is not a member"), "{status}");

    // With a member's certificate the call reaches Raft (and its payload is judged).
    let member = cluster.ca.issue(cluster.root.path(), "cairn-node-2", &["127.0.0.1"])?;
    let status = raft(cluster.ca.files(Some(member)).load_client()?).await?;
    assert_eq!(status.code(), Code::InvalidArgument, "{status}");

    // A client certificate of another CA does not get through the handshake.
    let other = Ca::new(cluster.root.path(), "other-ca")?;
    let foreign = other.issue(cluster.root.path(), "foreign-client", &["intruder"])?;
    let tls = TlsFiles { ca_file: Some(cluster.ca.cert_file.clone()), ..other.files(Some(foreign)) };
    let refused = async {
        let channel = cairn_proto::tls::endpoint(&addr, Some(&tls.load_client()?))?.connect().await?;
        RaftClient::new(channel).vote(RaftPayload { data: b"{}".to_vec() }).await?;
        anyhow::Ok(())
    }
    .await;
    assert!(refused.is_err(), "a client certificate of another CA must be refused");

    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_with_the_cluster_ca_runs_the_demo_job_to_a_checkpoint() -> anyhow::Result<()> {
    init_test_logging();
    let cluster = TlsCluster::start().await?;
    cluster.wait_leader().await?;
    // Without a token: the worker's certificate (CN `cairn-worker-<id>`) authenticates it.
    let identity = cluster.ca.issue(cluster.root.path(), "cairn-worker-tls-worker", &["tls-worker"])?;
    let worker = Worker::start(WorkerConfig {
        worker_id: Some("tls-worker".into()),
        tls: Some(cluster.ca.files(Some(identity))),
        ..WorkerConfig::new(cluster.endpoints())
    })?;
    let output = cluster.root.path().join("out");
    let graph = DemoJob {
        source: SourceConfig {
            keys: 4,
            records_per_key: None,
            rate_per_sec: Some(1000),
            batch: 16,
            idle_after_limit: false,
        },
        output_dir: output.display().to_string(),
        source_parallelism: 1,
        parallelism: 2,
        max_parallelism: 16,
    }
    .graph();
    let spec = serde_json::json!({ "graph": graph, "checkpoint": { "interval": "200ms" } }).to_string();
    let mut client = cluster.client(Some(cluster.client_tls(true)?), T)?;
    client.register_job("demo", &spec).await?;
    wait::until("a completed checkpoint of the demo job", T, || {
        let mut c = client.clone();
        async move { (c.get_job("demo").await.ok()?.num_completed >= 1).then_some(()) }
    })
    .await?;
    assert!(worker.status().borrow().leader.is_some(), "the worker should be attached to the leader");
    worker.shutdown().await;
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn a_replica_with_unusable_tls_files_does_not_start_and_names_the_file() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let ca = Ca::new(dir.path(), "ca")?;
    let (cert, _) = ca.issue(dir.path(), "replica", &["127.0.0.1"])?;
    let missing = dir.path().join("replica-missing.key");
    let config = NodeConfig {
        data_dir: Some(dir.path().join("node-1")),
        tls: Some(ca.files(Some((cert, missing.clone())))),
        ..NodeConfig::default()
    };
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let err = Replica::start(config, listener).await.err().expect("a missing key file must stop the start");
    assert!(err.to_string().contains(&format!("key file {} does not exist", missing.display())), "{err}");
    Ok(())
}
