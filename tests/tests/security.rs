//! Security through real processes: three `cairn` replicas (plaintext, with the admin token, the
//! cluster secret and per-worker tokens) and a `cairn-worker` running the demo job, probed by a
//! plain gRPC client that is not who it claims to be. Every probe must be refused with the
//! precise status (`UNAUTHENTICATED` without valid credentials, `PERMISSION_DENIED` for valid
//! credentials acting beyond what they grant, `INVALID_ARGUMENT` for bytes that are not a
//! message) and change nothing: the leader, its term, the job's attempts and status, and the
//! registered jobs stay as they were. The test prints one line per probe and a table per port.
//!
//! The TLS probes (a worker's or operator's certificate of the cluster CA calling Raft, a
//! non-member replica's certificate) are in `tls.rs`.

use std::collections::BTreeMap;
use std::time::Duration;

use cairn_client::LeaderClient;
use cairn_proto::auth::{CLUSTER_SECRET_KEY, NODE_ID_KEY};
use cairn_proto::v1::raft_client::RaftClient;
use cairn_proto::v1::task_gateway_client::TaskGatewayClient;
use cairn_proto::v1::{
    LeaderMessage, RaftPayload, RegisterWorker, Report, TriggerElectionRequest, WorkerMessage,
    leader_message, worker_message,
};
use cairn_protocol::checkpoint::{SubtaskState, TaskCheckpointMetrics};
use cairn_protocol::messages::{TaskAttemptId, TaskId, TaskMessage};
use cairn_raft::types::TypeConfig;
use cairn_tests::ctl::demo_graph;
use cairn_tests::procs::{ProcCluster, ProcOptions};
use cairn_tests::scripted::{RawCodec, bearer};
use cairn_tests::{init_test_logging, wait};
use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};
use openraft::{CommittedLeaderId, LogId, SnapshotMeta, StoredMembership, Vote};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::AsciiMetadataValue;
use tonic::transport::Channel;
use tonic::{Code, Request, Status, Streaming};

const T: Duration = Duration::from_secs(60);

/// What the cluster looks like from outside; a refused probe must leave it unchanged.
#[derive(Debug, PartialEq, Eq)]
struct Observed {
    leader: u64,
    term: u64,
    attempts: u32,
    status: String,
    intruder_job: bool,
}

async fn observe(client: &mut LeaderClient) -> anyhow::Result<Observed> {
    let status = client.status().await?;
    let job = client.get_job("demo").await?;
    let intruder_job = client.get_job("intruder").await.is_ok();
    Ok(Observed {
        leader: status.leader_id,
        term: status.term,
        attempts: job.attempts,
        status: job.status,
        intruder_job,
    })
}

/// One probe: the port (service) it went to, what it tried, and the status it got.
struct Probe {
    port: &'static str,
    what: String,
    want: Code,
    got: Status,
}

#[derive(Default)]
struct Probes(Vec<Probe>);

impl Probes {
    fn record(&mut self, port: &'static str, what: &str, want: Code, got: Result<(), Status>) {
        let got = got.err().unwrap_or_else(|| Status::ok("accepted"));
        println!("probe {port:<12} {what:<64} -> {:?}: {}", got.code(), got.message());
        self.0.push(Probe { port, what: what.to_owned(), want, got });
    }

    fn check(&self) -> anyhow::Result<()> {
        let mut table: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
        for p in &self.0 {
            let row = table.entry(p.port).or_default();
            row.0 += 1;
            if p.got.code() == p.want {
                row.1 += 1;
            }
        }
        println!("{:<12} {:>6} {:>8}", "port", "probes", "refused");
        for (port, (n, refused)) in &table {
            println!("{port:<12} {n:>6} {refused:>8}");
        }
        let wrong: Vec<String> = self
            .0
            .iter()
            .filter(|p| p.got.code() != p.want)
            .map(|p| {
                format!(
                    "{} {}: want {:?}, got {:?} ({})",
                    p.port,
                    p.what,
                    p.want,
                    p.got.code(),
                    p.got.message()
                )
            })
            .collect();
        anyhow::ensure!(wrong.is_empty(), "probes not refused as they should be:\n{}", wrong.join("\n"));
        Ok(())
    }
}

async fn channel(addr: &str) -> anyhow::Result<Channel> {
    Ok(Channel::from_shared(format!("http://{addr}"))?.connect().await?)
}

fn header(value: &str) -> AsciiMetadataValue {
    value.parse().unwrap_or_else(|_| AsciiMetadataValue::from_static("invalid"))
}

/// A Raft request with the given credentials.
fn raft_request<T>(msg: T, secret: Option<&str>, node: Option<u64>) -> Request<T> {
    let mut r = Request::new(msg);
    if let Some(s) = secret {
        r.metadata_mut().insert(CLUSTER_SECRET_KEY, header(s));
    }
    if let Some(n) = node {
        r.metadata_mut().insert(NODE_ID_KEY, header(&n.to_string()));
    }
    r
}

fn payload<T: serde::Serialize>(msg: &T) -> anyhow::Result<RaftPayload> {
    Ok(RaftPayload { data: cairn_raft::codec::encode("probe", msg)? })
}

fn snapshot_chunk(
    term: u64,
    leader: u64,
    offset: u64,
    data: &[u8],
    done: bool,
) -> InstallSnapshotRequest<TypeConfig> {
    InstallSnapshotRequest {
        vote: Vote::new_committed(term, leader),
        meta: SnapshotMeta {
            last_log_id: Some(LogId::new(CommittedLeaderId::new(term, leader), 1 << 40)),
            last_membership: StoredMembership::default(),
            snapshot_id: "forged".into(),
        },
        offset,
        data: data.to_vec(),
        done,
    }
}

/// Opens `Attach` with `token` and registers as `worker_id`; returns the stream once the leader
/// answered `registered`, or the refusal.
async fn attach(
    addr: &str,
    token: Option<&str>,
    worker_id: &str,
) -> anyhow::Result<Result<(mpsc::Sender<WorkerMessage>, Streaming<LeaderMessage>), Status>> {
    let (tx, rx) = mpsc::channel(16);
    let register = RegisterWorker { worker_id: worker_id.into(), slots: 1000, ..Default::default() };
    tx.send(WorkerMessage { body: Some(worker_message::Body::Register(register)) }).await?;
    let req = match token {
        Some(t) => bearer(ReceiverStream::new(rx), t),
        None => Request::new(ReceiverStream::new(rx)),
    };
    let mut inbound = match TaskGatewayClient::new(channel(addr).await?).attach(req).await {
        Ok(r) => r.into_inner(),
        Err(status) => return Ok(Err(status)),
    };
    loop {
        match inbound.message().await {
            Ok(Some(LeaderMessage { body: Some(leader_message::Body::Registered(_)), .. })) => {
                return Ok(Ok((tx, inbound)));
            }
            Ok(Some(_)) => continue,
            Ok(None) => return Ok(Err(Status::unavailable("the stream ended before `registered`"))),
            Err(status) => return Ok(Err(status)),
        }
    }
}

async fn raw_unary(
    addr: &str,
    path: &'static str,
    body: &[u8],
    token: Option<&str>,
) -> anyhow::Result<Result<(), Status>> {
    let mut grpc = tonic::client::Grpc::new(channel(addr).await?);
    grpc.ready().await?;
    let req = match token {
        Some(t) => bearer(body.to_vec(), t),
        None => Request::new(body.to_vec()),
    };
    let path = http::uri::PathAndQuery::from_static(path);
    Ok(grpc.unary(req, path, RawCodec).await.map(|_| ()))
}

/// The status a client error carries, for the probe table.
fn refusal_of(e: cairn_client::ClientError) -> Status {
    Status::new(e.code().unwrap_or(Code::Unknown), e.to_string())
}

fn read(path: &std::path::Path) -> anyhow::Result<String> {
    Ok(std::fs::read_to_string(path)?.trim().to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn intruders_are_refused_at_every_port_and_change_nothing() -> anyhow::Result<()> {
    init_test_logging();
    // The timings a user gets: the probes must not disturb a cluster that runs as shipped.
    let options = ProcOptions { worker_ids: vec!["w1".into(), "w2".into()], ..ProcOptions::default() };
    let mut cluster = ProcCluster::start_with_options(3, &[], options)?;
    cluster.launch_worker("w1", 16)?;
    let result = probe_everything(&cluster).await;
    if result.is_err() {
        eprintln!("{}", cluster.logs(120));
        eprintln!("--- worker w1 ---\n{}", cluster.worker_log_text("w1"));
    }
    result
}

async fn probe_everything(cluster: &ProcCluster) -> anyhow::Result<()> {
    let mut client = cluster.client()?;
    let output = cluster.scratch("out")?;
    let spec =
        serde_json::json!({ "graph": demo_graph(&output).graph(), "checkpoint": { "interval": "200ms" } });
    client.register_job("demo", &spec.to_string()).await?;
    wait::until("a completed checkpoint of the demo job", T, || {
        let mut c = client.clone();
        async move { (c.get_job("demo").await.ok()?.num_completed >= 1).then_some(()) }
    })
    .await?;
    let before = observe(&mut client).await?;
    let status = client.status().await?;
    let (leader, term) = (status.leader_id, status.term);
    let leader_addr = status.leader_addr.clone();
    let follower = status.members.iter().find(|m| m.id != leader).map(|m| (m.id, m.addr.clone()));
    let (follower_id, follower_addr) =
        follower.ok_or_else(|| anyhow::anyhow!("no follower in {status:?}"))?;
    let secret = read(cluster.cluster_secret_file())?;
    let admin = cluster.admin_token().to_owned();
    let w2_token = read(&cluster.worker_token_file_of("w2"))?;
    let mut probes = Probes::default();

    // --- Raft: only members, each speaking for itself ---
    let forged_vote = payload(&VoteRequest::<u64>::new(Vote::new(1_000_000, follower_id), None))?;
    let raft = |addr: String| async move { anyhow::Ok(RaftClient::new(channel(&addr).await?)) };
    let got = raft(follower_addr.clone())
        .await?
        .vote(raft_request(forged_vote.clone(), None, Some(follower_id)))
        .await;
    probes.record("raft", "Vote, term 1,000,000, no cluster secret", Code::Unauthenticated, got.map(|_| ()));
    let got = raft(follower_addr.clone())
        .await?
        .vote(raft_request(forged_vote.clone(), Some("0123456789abcdef0123"), Some(follower_id)))
        .await;
    probes.record(
        "raft",
        "Vote, term 1,000,000, a wrong cluster secret",
        Code::Unauthenticated,
        got.map(|_| ()),
    );
    let got =
        raft(leader_addr.clone()).await?.vote(raft_request(forged_vote.clone(), Some(&secret), None)).await;
    probes.record("raft", "Vote with the secret, no node id", Code::Unauthenticated, got.map(|_| ()));
    let other = (1..=3).find(|id| *id != follower_id && *id != leader).unwrap_or(leader);
    let got = raft(leader_addr.clone())
        .await?
        .vote(raft_request(forged_vote.clone(), Some(&secret), Some(other)))
        .await;
    probes.record(
        "raft",
        "Vote with the secret, node id of another member than the candidate",
        Code::PermissionDenied,
        got.map(|_| ()),
    );
    let append = AppendEntriesRequest::<TypeConfig> {
        vote: Vote::new_committed(term + 1, 9),
        prev_log_id: None,
        entries: vec![],
        leader_commit: None,
    };
    let got = raft(follower_addr.clone())
        .await?
        .append_entries(raft_request(payload(&append)?, Some(&secret), Some(9)))
        .await;
    probes.record(
        "raft",
        "AppendEntries with the secret as node 9 (not a member)",
        Code::PermissionDenied,
        got.map(|_| ()),
    );
    let trigger = TriggerElectionRequest { leader_id: leader, term };
    let got = raft(follower_addr.clone()).await?.trigger_election(raft_request(trigger, None, None)).await;
    probes.record(
        "raft",
        "TriggerElection for the current leader and term, no secret",
        Code::Unauthenticated,
        got.map(|_| ()),
    );
    let trigger = TriggerElectionRequest { leader_id: leader, term };
    let got = raft(follower_addr.clone())
        .await?
        .trigger_election(raft_request(trigger, Some(&secret), Some(follower_id)))
        .await;
    probes.record(
        "raft",
        "TriggerElection with the secret, from a member that does not lead",
        Code::PermissionDenied,
        got.map(|_| ()),
    );
    let corrupt = snapshot_chunk(term, leader, 0, b"not a snapshot", true);
    let got = raft(follower_addr.clone())
        .await?
        .install_snapshot(raft_request(payload(&corrupt)?, Some(&secret), Some(leader)))
        .await;
    probes.record(
        "raft",
        "InstallSnapshot with the secret: a corrupt snapshot",
        Code::InvalidArgument,
        got.map(|_| ()),
    );
    let far = snapshot_chunk(term, leader, 1 << 40, b"x", false);
    let got = raft(follower_addr.clone())
        .await?
        .install_snapshot(raft_request(payload(&far)?, Some(&secret), Some(leader)))
        .await;
    probes.record(
        "raft",
        "InstallSnapshot with the secret: a chunk at offset 2^40",
        Code::InvalidArgument,
        got.map(|_| ()),
    );
    let got = raw_unary(&follower_addr, "/cairn.v1.Raft/Vote", &[0xff, 0xff, 0xff, 0x0f], None).await?;
    probes.record("raft", "Vote whose body is not protobuf", Code::InvalidArgument, got);

    // --- Task gateway: workers prove who they are ---
    let got = attach(&leader_addr, None, "intruder").await?;
    probes.record("gateway", "Attach as `intruder`, no credentials", Code::Unauthenticated, got.map(|_| ()));
    let got = attach(&follower_addr, None, "intruder").await?;
    probes.record("gateway", "Attach at a follower, no credentials", Code::Unauthenticated, got.map(|_| ()));
    let got = attach(&leader_addr, Some(&admin), "intruder").await?;
    probes.record(
        "gateway",
        "Attach with the admin token as worker token",
        Code::Unauthenticated,
        got.map(|_| ()),
    );
    let got = attach(&leader_addr, Some(&w2_token), "w1").await?;
    probes.record(
        "gateway",
        "Attach with w2's token claiming live worker w1",
        Code::PermissionDenied,
        got.map(|_| ()),
    );
    // w2 attaches as itself, then acknowledges a checkpoint of a job deployed on w1.
    let (tx, mut inbound) = attach(&leader_addr, Some(&w2_token), "w2")
        .await?
        .map_err(|s| anyhow::anyhow!("w2 with its own token must attach: {s}"))?;
    let job = client.get_job("demo").await?;
    let forged = TaskMessage::Acknowledge {
        task: TaskAttemptId {
            task: TaskId { job: "demo".into(), vertex: "count".into(), subtask: 0 },
            attempt: job.attempts,
        },
        checkpoint_id: job.next_checkpoint_id.saturating_sub(1).max(1),
        state: SubtaskState::default(),
        metrics: TaskCheckpointMetrics::default(),
    };
    let json = serde_json::to_vec(&forged)?;
    tx.send(WorkerMessage { body: Some(worker_message::Body::Report(Report { seq: 1, json })) }).await?;
    let refusal = tokio::time::timeout(T, async {
        loop {
            match inbound.message().await {
                Ok(Some(LeaderMessage { body: Some(leader_message::Body::Error(e)), .. })) => {
                    return Status::new(Code::from_i32(e.code), e.message);
                }
                Ok(Some(_)) => continue,
                Ok(None) => return Status::unavailable("the stream ended without an answer"),
                Err(s) => return s,
            }
        }
    })
    .await?;
    probes.record(
        "gateway",
        "acknowledgement by w2 of a task deployed on w1",
        Code::PermissionDenied,
        Err(refusal),
    );
    drop(tx);

    // --- Operator services: the admin token ---
    let mut no_token = LeaderClient::new(cluster.addrs(), cairn_client::ClientConfig::default())?;
    let got = no_token.register_job("intruder", &spec.to_string()).await.err().map(refusal_of);
    probes.record(
        "store",
        "RegisterJob without the admin token",
        Code::Unauthenticated,
        got.map_or(Ok(()), Err),
    );
    let escape =
        serde_json::json!({ "graph": demo_graph(std::path::Path::new("/tmp/../../escape")).graph() });
    let got = client.register_job("intruder", &escape.to_string()).await.err().map(refusal_of);
    probes.record(
        "store",
        "RegisterJob whose sink writes to /tmp/../../escape",
        Code::InvalidArgument,
        got.map_or(Ok(()), Err),
    );
    let got =
        raw_unary(&leader_addr, "/cairn.v1.Store/RegisterJob", &[0x0a, 0xff, 0xff], Some(&admin)).await?;
    probes.record("store", "RegisterJob whose body is not protobuf", Code::InvalidArgument, got);

    probes.check()?;
    // Nothing changed: same leader and term, the job was not restarted, no job was added. A
    // worker leaving the cluster is not a change to the job (w2 held nothing).
    let after = observe(&mut client).await?;
    assert_eq!(after, before, "a refused probe changed the cluster");
    // The replicas that were sent forged snapshots and votes still replicate.
    let n = client.get_job("demo").await?.num_completed;
    wait::until("the demo job to keep checkpointing", T, || {
        let mut c = client.clone();
        async move { (c.get_job("demo").await.ok()?.num_completed > n).then_some(()) }
    })
    .await?;
    let status = client.status().await?;
    assert!(
        status.members.iter().all(|m| m.matched_index.unwrap_or(0) + 50 >= status.last_log_index),
        "every replica still follows: {status:?}"
    );
    Ok(())
}

#[tokio::test]
async fn a_cluster_without_raft_authentication_refuses_to_start_and_says_how_to_fix_it() -> anyhow::Result<()>
{
    let dir = tempfile::tempdir()?;
    let admin = dir.path().join("admin-token");
    std::fs::write(&admin, "0123456789abcdef0123456789abcdef\n")?;
    let workers = dir.path().join("worker-token");
    std::fs::write(&workers, "fedcba9876543210fedcba9876543210\n")?;
    let port = cairn_tests::procs::free_port()?;
    let peers = format!("1=127.0.0.1:{port},2=127.0.0.1:{}", cairn_tests::procs::free_port()?);
    let run = |extra: Vec<String>| {
        let dir = dir.path().to_owned();
        let admin = admin.clone();
        let peers = peers.clone();
        async move {
            let out = tokio::process::Command::new(cairn_tests::procs::binary("cairn")?)
                .args(["--node-id", "1", "--listen", &format!("127.0.0.1:{port}"), "--peers", &peers])
                .arg("--data-dir")
                .arg(dir.join("node-1"))
                .arg("--admin-token-file")
                .arg(&admin)
                .args(extra)
                .env_remove("CAIRN_CLUSTER_SECRET")
                .env_remove("CAIRN_WORKER_TOKEN")
                .env_remove("CAIRN_CONFIG")
                .kill_on_drop(true)
                .output()
                .await?;
            anyhow::Ok((out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned()))
        }
    };
    let path = |p: &std::path::Path| p.display().to_string();
    let (ok, stderr) = run(vec!["--worker-token-file".into(), path(&workers)]).await?;
    assert!(!ok, "a replica with peers and no cluster secret must not start");
    assert!(stderr.contains("--cluster-secret-file") && stderr.contains("TLS"), "{stderr}");
    // The admin token cannot double as the cluster secret.
    let (ok, stderr) =
        run(vec!["--worker-token-file".into(), path(&workers), "--cluster-secret-file".into(), path(&admin)])
            .await?;
    assert!(!ok && stderr.contains("must differ from the admin token"), "{stderr}");
    // Without worker credentials either: named too.
    let secret = dir.path().join("cluster-secret");
    std::fs::write(&secret, "00112233445566778899aabbccddeeff\n")?;
    let (ok, stderr) = run(vec!["--cluster-secret-file".into(), path(&secret)]).await?;
    assert!(!ok && stderr.contains("--worker-token-file"), "{stderr}");
    Ok(())
}
