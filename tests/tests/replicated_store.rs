//! The replicated store on a 3-node in-process cluster: ID allocation under concurrency and
//! leader loss, restart from disk and catch-up, leader discovery, membership changes, and bad
//! input.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cairn_proto::leader_hint::parse_not_leader;
use cairn_proto::v1::store_client::StoreClient;
use cairn_proto::v1::{AllocateCheckpointIdRequest, RegisterJobRequest};
use cairn_tests::inproc::{InProcCluster, test_timing};
use cairn_tests::{init_test_logging, wait};
use tokio::time::Instant;
use tonic::Code;

const ELECTION: Duration = Duration::from_secs(20);

/// One allocation as a client saw it.
#[derive(Debug, Clone)]
struct Allocation {
    job: usize,
    client: usize,
    id: u64,
    started: Instant,
    finished: Instant,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_ids_survive_leader_stop_and_restart() -> anyhow::Result<()> {
    init_test_logging();
    const TOTAL: usize = 10_000;
    const CLIENTS: usize = 16;
    const JOBS: usize = 2;
    let mut cluster = InProcCluster::start(3, test_timing()).await?;
    cluster.wait_leader(ELECTION).await?;
    let mut admin = cluster.client()?;
    for j in 0..JOBS {
        admin.register_job(&format!("job-{j}"), "").await?;
    }

    let log: Arc<Mutex<Vec<Allocation>>> = Arc::new(Mutex::new(Vec::with_capacity(TOTAL)));
    let issued = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..CLIENTS {
        let mut client = cluster.client()?;
        let (log, issued) = (log.clone(), issued.clone());
        tasks.spawn(async move {
            loop {
                let n = issued.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if n >= TOTAL {
                    return anyhow::Ok(());
                }
                let job = n % JOBS;
                let started = Instant::now();
                let reply = client.allocate_checkpoint_id(&format!("job-{job}")).await?;
                let a =
                    Allocation { job, client: c, id: reply.checkpoint_id, started, finished: Instant::now() };
                log.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.push(a);
            }
        });
    }

    // Mid-stream: once half the IDs are out, stop the leader.
    wait::until("half of the allocations", Duration::from_secs(120), || async {
        (log.lock().ok()?.len() >= TOTAL / 2).then_some(())
    })
    .await?;
    let old_leader = cluster.wait_leader(ELECTION).await?;
    let stop_at = Instant::now();
    cluster.stop(old_leader).await;
    let new_leader = cluster.wait_leader(ELECTION).await?;
    let new_leader_at = Instant::now();
    assert_ne!(new_leader, old_leader);

    while let Some(r) = tasks.join_next().await {
        r??;
    }
    let log = log.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.clone();
    assert_eq!(log.len(), TOTAL);

    for job in 0..JOBS {
        let mine: Vec<&Allocation> = log.iter().filter(|a| a.job == job).collect();
        let unique: BTreeSet<u64> = mine.iter().map(|a| a.id).collect();
        assert_eq!(unique.len(), mine.len(), "job-{job}: an ID was handed out twice");
        for c in 0..CLIENTS {
            let seq: Vec<u64> = mine.iter().filter(|a| a.client == c).map(|a| a.id).collect();
            assert!(seq.windows(2).all(|w| w[0] < w[1]), "job-{job} client {c}: not increasing: {seq:?}");
        }
        let before = mine.iter().filter(|a| a.finished <= stop_at).map(|a| a.id).max().unwrap_or(0);
        let after: Vec<u64> = mine.iter().filter(|a| a.started >= new_leader_at).map(|a| a.id).collect();
        assert!(!after.is_empty(), "job-{job}: nothing allocated under the new leader");
        assert!(
            after.iter().all(|id| *id > before),
            "job-{job}: an ID allocated under the new leader is not above {before}, the highest handed out before"
        );
    }

    // The stopped node restarts from its sled directory and catches up.
    cluster.restart(old_leader).await?;
    let leader = cluster.wait_leader(ELECTION).await?;
    let leader_applied =
        cluster.replica(leader).and_then(|r| r.raft().metrics().borrow().last_applied).map_or(0, |l| l.index);
    cluster.wait_applied(old_leader, leader_applied, Duration::from_secs(30)).await?;
    let restarted = cluster.replica(old_leader).ok_or_else(|| anyhow::anyhow!("gone"))?;
    let lead = cluster.replica(leader).ok_or_else(|| anyhow::anyhow!("gone"))?;
    for job in 0..JOBS {
        let id = cairn_raft::model::JobId::new(format!("job-{job}"))?;
        let a = restarted.context().reader.job(&id).map(|j| j.next_checkpoint_id);
        let b = lead.context().reader.job(&id).map(|j| j.next_checkpoint_id);
        assert_eq!(a, b, "restarted node disagrees on the counter of job-{job}");
        let max_seen = log.iter().filter(|x| x.job == job).map(|x| x.id).max().unwrap_or(0);
        assert!(a.unwrap_or(0) > max_seen);
    }
    // And allocation continues above everything handed out.
    let max_all = log.iter().filter(|a| a.job == 0).map(|a| a.id).max().unwrap_or(0);
    let next = admin.allocate_checkpoint_id("job-0").await?;
    assert!(next.checkpoint_id > max_all);
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follower_refuses_with_leader_hint_in_metadata() -> anyhow::Result<()> {
    init_test_logging();
    let cluster = InProcCluster::start(3, test_timing()).await?;
    let leader = cluster.wait_leader(ELECTION).await?;
    let follower =
        *cluster.addrs.keys().find(|id| **id != leader).ok_or_else(|| anyhow::anyhow!("no follower"))?;
    let mut client = cluster.client()?;
    client.register_job("j", "").await?;

    let mut direct = StoreClient::new(cluster.direct(follower).await?);
    let status = direct
        .allocate_checkpoint_id(AllocateCheckpointIdRequest { job_id: "j".into() })
        .await
        .expect_err("a follower must refuse");
    assert_eq!(status.code(), Code::Unavailable);
    let hint = parse_not_leader(&status).expect("not-leader metadata");
    assert_eq!(hint.leader_id, Some(leader));
    assert_eq!(hint.leader_addr, Some(cluster.addrs[&leader].to_string()));

    // Linearizable reads are refused on followers too.
    let mut cc = cairn_proto::v1::cluster_client::ClusterClient::new(cluster.direct(follower).await?);
    let status = cc.status(cairn_proto::v1::StatusRequest {}).await.expect_err("follower status");
    assert_eq!(parse_not_leader(&status).and_then(|h| h.leader_id), Some(leader));

    // Through the leader-following client, the status names the leader and all members.
    let st = client.status().await?;
    assert_eq!(st.leader_id, leader);
    assert_eq!(st.node_id, leader);
    assert_eq!(st.members.len(), 3);
    assert!(st.commit_index >= 1 && st.applied_index >= st.commit_index.min(st.applied_index));
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_precise_errors_and_changes_nothing() -> anyhow::Result<()> {
    init_test_logging();
    let cluster = InProcCluster::start(1, test_timing()).await?;
    let leader = cluster.wait_leader(ELECTION).await?;
    let mut client = cluster.client()?;
    client.register_job("j", "").await?;
    client.allocate_checkpoint_id("j").await?;
    let before = cluster.replica(leader).map(|r| r.context().reader.data());

    let mut direct = StoreClient::new(cluster.direct(leader).await?);
    let cases: Vec<(RegisterJobRequest, Code, &str)> = vec![
        (RegisterJobRequest { job_id: "../x".into(), ..Default::default() }, Code::InvalidArgument, "job_id"),
        (RegisterJobRequest { job_id: "".into(), ..Default::default() }, Code::InvalidArgument, "empty"),
        (
            RegisterJobRequest {
                job_id: "k".into(),
                spec_json: "{\"checkpoint\":{\"retained\":0}}".into(),
                ..Default::default()
            },
            Code::InvalidArgument,
            "retained",
        ),
        (
            RegisterJobRequest {
                job_id: "k".into(),
                spec_json: "{\"nonsense\":1}".into(),
                ..Default::default()
            },
            Code::InvalidArgument,
            "unknown field",
        ),
        (
            RegisterJobRequest { job_id: "k".into(), spec_json: "{".into(), ..Default::default() },
            Code::InvalidArgument,
            "spec_json",
        ),
        (
            RegisterJobRequest { job_id: "j".into(), ..Default::default() },
            Code::AlreadyExists,
            "already registered",
        ),
    ];
    for (req, code, needle) in cases {
        let st = direct.register_job(req.clone()).await.expect_err("must be rejected");
        assert_eq!(st.code(), code, "{req:?}: {st}");
        assert!(st.message().contains(needle), "{req:?}: message {:?} lacks {needle:?}", st.message());
    }
    let st = direct
        .allocate_checkpoint_id(AllocateCheckpointIdRequest { job_id: "nope".into() })
        .await
        .expect_err("unknown job");
    assert_eq!(st.code(), Code::NotFound);
    assert!(st.message().contains("unknown job `nope`"), "{}", st.message());

    let after = cluster.replica(leader).map(|r| r.context().reader.data());
    assert_eq!(before, after, "rejected calls changed the replicated state");
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_added_as_learner_promoted_and_removed() -> anyhow::Result<()> {
    init_test_logging();
    let mut cluster = InProcCluster::start(3, test_timing()).await?;
    cluster.wait_leader(ELECTION).await?;
    let mut client = cluster.client()?;
    client.register_job("j", "").await?;
    for _ in 0..20 {
        client.allocate_checkpoint_id("j").await?;
    }

    let addr = cluster.spawn_extra(4).await?;
    let reply = client.add_learner(4, &addr.to_string()).await?;
    let roles: BTreeMap<u64, i32> = reply.members.iter().map(|m| (m.id, m.role)).collect();
    assert_eq!(roles.get(&4), Some(&(cairn_proto::v1::Role::Learner as i32)));
    // The learner has the data.
    let id = cairn_raft::model::JobId::new("j")?;
    wait::until("learner to catch up", Duration::from_secs(20), || async {
        (cluster.replica(4)?.context().reader.job(&id)?.next_checkpoint_id == 21).then_some(())
    })
    .await?;

    // Promoting a non-learner is refused with a precise reason.
    let err = client.promote_learner(9).await.expect_err("9 is no learner");
    assert_eq!(err.code(), Some(Code::FailedPrecondition));

    let reply = client.promote_learner(4).await?;
    assert!(reply.members.iter().any(|m| m.id == 4 && m.role == cairn_proto::v1::Role::Voter as i32));

    // Remove an original voter that is not the leader; the cluster keeps serving.
    let leader = cluster.wait_leader(ELECTION).await?;
    let victim = [1u64, 2, 3].into_iter().find(|i| *i != leader).ok_or_else(|| anyhow::anyhow!("none"))?;
    let reply = client.remove_node(victim).await?;
    assert!(reply.members.iter().all(|m| m.id != victim));
    assert_eq!(reply.members.len(), 3);
    let next = client.allocate_checkpoint_id("j").await?;
    assert_eq!(next.checkpoint_id, 21);
    let st = client.status().await?;
    assert_eq!(st.members.len(), 3);
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standard_health_and_reflection_services_answer() -> anyhow::Result<()> {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

    init_test_logging();
    let cluster = InProcCluster::start(1, test_timing()).await?;
    cluster.wait_leader(ELECTION).await?;
    let url = format!("http://{}", cluster.addrs[&1]);
    let channel = tonic::transport::Endpoint::from_shared(url)?.connect().await?;

    let mut health = HealthClient::new(channel.clone());
    let reply = health.check(tonic_health::pb::HealthCheckRequest { service: String::new() }).await?;
    assert_eq!(reply.into_inner().status, ServingStatus::Serving as i32);

    let mut reflection = ServerReflectionClient::new(channel);
    let req = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut replies = reflection.server_reflection_info(tokio_stream::iter([req])).await?.into_inner();
    let reply = replies.message().await?.ok_or_else(|| anyhow::anyhow!("no reflection reply"))?;
    let Some(MessageResponse::ListServicesResponse(list)) = reply.message_response else {
        anyhow::bail!("unexpected reflection reply");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for expected in ["cairn.v1.Cluster", "cairn.v1.Store", "cairn.v1.TaskGateway", "grpc.health.v1.Health"] {
        assert!(names.iter().any(|n| n == expected), "{expected} missing from {names:?}");
    }
    cluster.shutdown().await;
    Ok(())
}
