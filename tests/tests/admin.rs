//! The operator API `cairn.admin.v1.Admin` over real gRPC against in-process clusters: bearer
//! token authentication, every call through its real interface with a real worker running the
//! demo job, precise refusals of bad input, idempotent request ids (also across a leader change)
//! and leadership transfer.

use std::future::Future;
use std::time::Duration;

use cairn_client::{AuthChannel, ClientConfig, ClientError, LeaderClient};
use cairn_proto::admin::admin_client::AdminClient;
use cairn_proto::admin::*;
use cairn_taskrt::demo::DemoJob;
use cairn_taskrt::demo::source::SourceConfig;
use cairn_taskrt::worker::Worker;
use cairn_tests::inproc::{InProcCluster, test_timing};
use cairn_tests::{init_test_logging, wait};
use tonic::{Code, Status};

const T: Duration = Duration::from_secs(60);

/// Runs one Admin call through the leader-following client.
async fn admin<T, F, Fut>(c: &mut LeaderClient, mut f: F) -> Result<T, ClientError>
where
    F: FnMut(AdminClient<AuthChannel>) -> Fut,
    Fut: Future<Output = Result<tonic::Response<T>, Status>>,
{
    c.call("admin call", move |ch| {
        let fut = f(AdminClient::new(ch));
        async move { fut.await.map(tonic::Response::into_inner) }
    })
    .await
}

fn graph(output: &std::path::Path) -> String {
    let graph = DemoJob {
        source: SourceConfig {
            keys: 4,
            records_per_key: None,
            rate_per_sec: Some(500),
            batch: 16,
            idle_after_limit: false,
        },
        output_dir: output.display().to_string(),
        source_parallelism: 1,
        parallelism: 1,
        max_parallelism: 8,
    }
    .graph();
    serde_json::to_string(&graph).unwrap_or_default()
}

fn submit(job: &str, graph_json: &str, request_id: &str) -> SubmitJobRequest {
    SubmitJobRequest {
        job_id: job.into(),
        graph_json: graph_json.into(),
        checkpoint_json: r#"{"interval": "300ms", "timeout": "30s", "retained": 2}"#.into(),
        request_id: request_id.into(),
        ..Default::default()
    }
}

fn job_req(job: &str) -> JobRequest {
    JobRequest { job_id: job.into() }
}

fn code(r: &Result<impl std::fmt::Debug, ClientError>) -> Option<Code> {
    r.as_ref().err().and_then(ClientError::code)
}

async fn job_status(c: &mut LeaderClient, job: &str) -> Option<String> {
    let jobs = admin(c, |mut a| async move { a.list_jobs(ListJobsRequest {}).await }).await.ok()?;
    jobs.jobs.into_iter().find(|j| j.job_id == job).map(|j| j.status)
}

async fn wait_running(c: &LeaderClient, job: &str) -> anyhow::Result<JobDetails> {
    wait::until(&format!("job {job} running with every task running"), T, || {
        let mut c = c.clone();
        let job = job.to_owned();
        async move {
            let d = admin(&mut c, |mut a| {
                let r = job_req(&job);
                async move { a.describe_job(r).await }
            })
            .await
            .ok()?;
            (d.phase == "running" && !d.tasks.is_empty() && d.tasks.iter().all(|t| t.status == "running"))
                .then_some(d)
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_without_the_admin_token_are_refused_and_change_nothing() -> anyhow::Result<()> {
    init_test_logging();
    let cluster = InProcCluster::start(1, test_timing()).await?;
    cluster.wait_leader(T).await?;
    let addr = format!("http://{}", cluster.addrs.values().next().map(|a| a.to_string()).unwrap_or_default());

    // No authorization metadata at all (a plain tonic client).
    let mut raw = AdminClient::connect(addr.clone()).await?;
    let st = raw.submit_job(submit("a", "", "")).await.expect_err("must be refused");
    assert_eq!(st.code(), Code::Unauthenticated);
    assert!(
        st.message().starts_with("missing authorization metadata; pass the cluster's admin token"),
        "{st:?}"
    );
    // The existing operator services are guarded too.
    let mut store = cairn_proto::v1::store_client::StoreClient::connect(addr.clone()).await?;
    let st = store
        .register_job(cairn_proto::v1::RegisterJobRequest { job_id: "a".into(), ..Default::default() })
        .await
        .expect_err("must be refused");
    assert_eq!(st.code(), Code::Unauthenticated);
    let mut clu = cairn_proto::v1::cluster_client::ClusterClient::connect(addr.clone()).await?;
    assert_eq!(
        clu.status(cairn_proto::v1::StatusRequest {}).await.expect_err("refused").code(),
        Code::Unauthenticated
    );
    let mut raw_admin = AdminClient::connect(addr.clone()).await?;
    let st = raw_admin.list_workers(ListWorkersRequest {}).await.expect_err("must be refused");
    assert_eq!(st.code(), Code::Unauthenticated, "{st:?}");
    // Health checks need no token.
    let channel = tonic::transport::Endpoint::from_shared(addr)?.connect().await?;
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    health.check(tonic_health::pb::HealthCheckRequest { service: String::new() }).await?;

    // A wrong token.
    let wrong = ClientConfig { token: Some("not-the-cluster-token".into()), ..ClientConfig::default() };
    let mut bad = LeaderClient::new(cluster.addrs.values().map(|a| a.to_string()), wrong)?;
    let r = admin(&mut bad, |mut a| async move { a.submit_job(submit("a", "", "")).await }).await;
    match &r {
        Err(ClientError::Rejected { status, .. }) => {
            assert_eq!((status.code(), status.message()), (Code::Unauthenticated, "wrong admin token"))
        }
        other => panic!("expected UNAUTHENTICATED, got {other:?}"),
    }

    // Nothing was registered.
    let mut c = cluster.client()?;
    let jobs = admin(&mut c, |mut a| async move { a.list_jobs(ListJobsRequest {}).await }).await?;
    assert!(jobs.jobs.is_empty(), "{:?}", jobs.jobs);
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_checkpoints_and_savepoints_through_the_admin_api() -> anyhow::Result<()> {
    init_test_logging();
    let cluster = InProcCluster::start(3, test_timing()).await?;
    cluster.wait_leader(T).await?;
    let worker = Worker::start(cluster.worker_config("w1"))?;
    let dir = tempfile::tempdir()?;
    let g = graph(&dir.path().join("out"));
    let mut c = cluster.client()?;

    // Bad input: precise refusals.
    let r = admin(&mut c, |mut a| async move { a.submit_job(submit("a", "{not json", "")).await }).await;
    assert_eq!(code(&r), Some(Code::InvalidArgument));
    assert!(format!("{r:?}").contains("graph_json"), "{r:?}");
    let r = admin(&mut c, |mut a| async move { a.submit_job(submit("a/b", "", "")).await }).await;
    assert_eq!(code(&r), Some(Code::InvalidArgument));
    let r = admin(&mut c, |mut a| async move { a.submit_job(submit("a", "", "bad id!")).await }).await;
    assert_eq!(code(&r), Some(Code::InvalidArgument));
    assert!(format!("{r:?}").contains("request_id"), "{r:?}");
    let bad_placement = SubmitJobRequest { placement: "everywhere".into(), ..submit("a", &g, "") };
    let r = admin(&mut c, |mut a| {
        let req = bad_placement.clone();
        async move { a.submit_job(req).await }
    })
    .await;
    assert_eq!(code(&r), Some(Code::InvalidArgument));
    assert!(format!("{r:?}").contains("use pack (the default) or spread"), "{r:?}");
    let r = admin(&mut c, |mut a| async move { a.describe_job(job_req("nope")).await }).await;
    assert_eq!(code(&r), Some(Code::NotFound));

    // Submit twice with one request id: one job; the same id with other arguments: refused.
    let first = admin(&mut c, |mut a| {
        let r = submit("a", &g, "submit-a");
        async move { a.submit_job(r).await }
    })
    .await?;
    let again = admin(&mut c, |mut a| {
        let r = submit("a", &g, "submit-a");
        async move { a.submit_job(r).await }
    })
    .await?;
    assert_eq!(first.job_id, again.job_id);
    let r = admin(&mut c, |mut a| {
        let r = SubmitJobRequest { name: "other".into(), ..submit("a", &g, "submit-a") };
        async move { a.submit_job(r).await }
    })
    .await;
    assert_eq!(code(&r), Some(Code::AlreadyExists), "{r:?}");
    let jobs = admin(&mut c, |mut a| async move { a.list_jobs(ListJobsRequest {}).await }).await?;
    assert_eq!(jobs.jobs.len(), 1);
    assert_eq!(jobs.jobs[0].job_id, "a");

    let d = wait_running(&c, "a").await?;
    assert_eq!(d.workers.len(), 1);
    assert_eq!(d.workers[0].worker_id, "w1");
    assert!(d.tasks.iter().all(|t| t.worker == "w1"));
    assert_eq!(d.checkpoint_config.as_ref().map(|c| c.interval_ms), Some(300));

    // The leader's workers: w1 runs job a; an idle w2 joins, then leaves.
    let idle = Worker::start(cluster.worker_config("w2"))?;
    let list = wait::until("w2 attached", T, || {
        let mut c = c.clone();
        async move {
            let r = admin(&mut c, |mut a| async move { a.list_workers(ListWorkersRequest {}).await })
                .await
                .ok()?;
            r.workers.iter().any(|w| w.worker_id == "w2" && w.state == "attached").then_some(r)
        }
    })
    .await?;
    let ids: Vec<&str> = list.workers.iter().map(|w| w.worker_id.as_str()).collect();
    assert_eq!(ids, ["w1", "w2"], "{list:?}");
    let (w1, w2) = (&list.workers[0], &list.workers[1]);
    assert_eq!((w1.state.as_str(), w1.jobs.as_slice()), ("attached", ["a".to_owned()].as_slice()), "{w1:?}");
    assert_eq!(w1.slots_used, d.workers[0].slots_used, "{w1:?}");
    assert!(w1.slots_used >= 1 && w1.slots_used <= w1.slots, "{w1:?}");
    assert_eq!((w2.slots_used, w2.jobs.len()), (0, 0), "{w2:?}");
    assert!(w2.slots > 0, "{w2:?}");
    assert!(list.workers.iter().all(|w| w.authenticated_by == "shared token"), "{list:?}");
    idle.shutdown().await;
    // Kept as disconnected until its heartbeat timeout, then gone; w1 and its job stay.
    let list = wait::until("w2 forgotten after its heartbeat timeout", T, || {
        let mut c = c.clone();
        async move {
            let r = admin(&mut c, |mut a| async move { a.list_workers(ListWorkersRequest {}).await })
                .await
                .ok()?;
            (r.workers.len() == 1).then_some(r)
        }
    })
    .await?;
    assert_eq!((list.workers[0].worker_id.as_str(), list.workers[0].state.as_str()), ("w1", "attached"));

    // Trigger a checkpoint: the id comes back at once; a retry returns the same id.
    let trig = |rid: &'static str| TriggerCheckpointRequest { job_id: "a".into(), request_id: rid.into() };
    let id =
        admin(&mut c, |mut a| async move { a.trigger_checkpoint(trig("t1")).await }).await?.checkpoint_id;
    let id2 =
        admin(&mut c, |mut a| async move { a.trigger_checkpoint(trig("t1")).await }).await?.checkpoint_id;
    assert_eq!(id, id2);
    let wait_req =
        |id: u64| WaitCheckpointRequest { job_id: "a".into(), checkpoint_id: id, timeout_ms: 30_000 };
    let o = admin(&mut c, |mut a| async move { a.wait_checkpoint(wait_req(id)).await }).await?;
    assert_eq!((o.status.as_str(), o.kind.as_str()), ("completed", "checkpoint"), "{o:?}");
    assert!(o.location.ends_with(&format!("chk-{id}")), "{o:?}");
    let r = admin(&mut c, |mut a| async move { a.wait_checkpoint(wait_req(1_000_000)).await }).await;
    assert_eq!(code(&r), Some(Code::NotFound));
    assert!(format!("{r:?}").contains("never allocated"), "{r:?}");

    // Listed with statistics; described with per-subtask figures.
    let ov = admin(&mut c, |mut a| async move { a.list_checkpoints(job_req("a")).await }).await?;
    assert!(ov.counts.as_ref().is_some_and(|n| n.completed >= 1), "{ov:?}");
    assert!(ov.history.iter().any(|h| h.id == id && h.status == "completed"), "{:?}", ov.history);
    assert!(
        ov.end_to_end_duration_ms.as_ref().is_some_and(|s| s.count >= 1 && s.min <= s.avg && s.avg <= s.max)
    );
    let details = admin(&mut c, |mut a| async move {
        a.describe_checkpoint(DescribeCheckpointRequest { job_id: "a".into(), checkpoint_id: id }).await
    })
    .await?;
    assert_eq!(details.summary.as_ref().map(|s| s.id), Some(id));
    assert_eq!(details.subtasks.len(), d.tasks.len(), "{details:?}");

    // Savepoints: a directory is needed; a relative one is refused.
    let sp = |dir: &str, rid: &str| TriggerSavepointRequest {
        job_id: "a".into(),
        target_dir: dir.into(),
        request_id: rid.into(),
    };
    let r = admin(&mut c, |mut a| async move { a.trigger_savepoint(sp("", "")).await }).await;
    assert_eq!(code(&r), Some(Code::FailedPrecondition));
    assert!(format!("{r:?}").contains("savepoint_dir"), "{r:?}");
    let r = admin(&mut c, |mut a| async move { a.trigger_savepoint(sp("relative", "")).await }).await;
    assert_eq!(code(&r), Some(Code::InvalidArgument));
    let sp_root = dir.path().join("savepoints").display().to_string();
    let s1 = admin(&mut c, |mut a| {
        let r = sp(&sp_root, "sp-1");
        async move { a.trigger_savepoint(r).await }
    })
    .await?;
    assert!(std::path::Path::new(&s1.path).join("_metadata").exists(), "{s1:?}");
    let s1b = admin(&mut c, |mut a| {
        let r = sp(&sp_root, "sp-1");
        async move { a.trigger_savepoint(r).await }
    })
    .await?;
    assert_eq!(
        (s1b.checkpoint_id, &s1b.path),
        (s1.checkpoint_id, &s1.path),
        "one savepoint for one request id"
    );
    let list = admin(&mut c, |mut a| async move { a.list_savepoints(job_req("a")).await }).await?;
    assert_eq!(list.savepoints.len(), 1, "{list:?}");

    // Update the checkpoint configuration: the running driver applies it at once.
    let upd = |json: &str| UpdateCheckpointConfigRequest {
        job_id: "a".into(),
        checkpoint_json: json.into(),
        request_id: String::new(),
    };
    let r =
        admin(&mut c, |mut a| async move { a.update_checkpoint_config(upd(r#"{"intervall": "1s"}"#)).await })
            .await;
    assert_eq!(code(&r), Some(Code::InvalidArgument));
    assert!(format!("{r:?}").contains("unknown field"), "{r:?}");
    let reply =
        admin(
            &mut c,
            |mut a| async move { a.update_checkpoint_config(upd(r#"{"interval": "150ms"}"#)).await },
        )
        .await?;
    assert_eq!(reply.checkpoint_config.as_ref().map(|c| (c.interval_ms, c.retained)), Some((150, 2)));
    wait::until("the driver to use the new interval", T, || async {
        let leader = cluster.wait_leader(T).await.ok()?;
        let term = cluster.replica(leader)?.leader().current()?;
        let view = term.job(cairn_raft::model::JobId::new("a").ok()?).await.ok()??;
        (view.checkpoint?.interval == Some(Duration::from_millis(150))).then_some(())
    })
    .await?;

    // Dispose: forgotten, directory gone; a second dispose finds nothing.
    let disp = |rid: &str| DisposeSavepointRequest {
        job_id: "a".into(),
        checkpoint_id: s1.checkpoint_id,
        request_id: rid.into(),
    };
    let gone = admin(&mut c, |mut a| async move { a.dispose_savepoint(disp("d-1")).await }).await?;
    assert_eq!(gone.path, s1.path);
    assert!(!std::path::Path::new(&s1.path).exists());
    // The retry with the same request id is answered with the first result.
    let gone2 = admin(&mut c, |mut a| async move { a.dispose_savepoint(disp("d-1")).await }).await?;
    assert_eq!(gone2.path, s1.path);
    let r = admin(&mut c, |mut a| async move { a.dispose_savepoint(disp("")).await }).await;
    assert_eq!(code(&r), Some(Code::NotFound), "{r:?}");
    let list = admin(&mut c, |mut a| async move { a.list_savepoints(job_req("a")).await }).await?;
    assert!(list.savepoints.is_empty());

    // Stop with a savepoint: it completes, then the job finishes.
    let stopped = admin(&mut c, |mut a| {
        let r = StopWithSavepointRequest {
            job_id: "a".into(),
            target_dir: sp_root.clone(),
            drain: false,
            request_id: "stop-1".into(),
        };
        async move { a.stop_with_savepoint(r).await }
    })
    .await?;
    assert!(std::path::Path::new(&stopped.path).join("_metadata").exists());
    wait::until("job a to finish", T, || {
        let mut c = c.clone();
        async move { (job_status(&mut c, "a").await? == "finished").then_some(()) }
    })
    .await?;
    let r = admin(&mut c, |mut a| async move { a.trigger_checkpoint(trig("")).await }).await;
    assert_eq!(code(&r), Some(Code::FailedPrecondition), "{r:?}");

    // Cancel a second job: its tasks stop and it ends `canceled`; a retry answers the same.
    admin(&mut c, |mut a| {
        let r = submit("b", &graph(&dir.path().join("out-b")), "");
        async move { a.submit_job(r).await }
    })
    .await?;
    wait_running(&c, "b").await?;
    let cancel = || CancelJobRequest { job_id: "b".into(), request_id: "cancel-b".into() };
    let r = admin(&mut c, |mut a| async move { a.cancel_job(cancel()).await }).await?;
    assert_eq!(r.status, "canceled");
    let r = admin(&mut c, |mut a| async move { a.cancel_job(cancel()).await }).await?;
    assert_eq!(r.status, "canceled");
    assert_eq!(job_status(&mut c, "b").await.as_deref(), Some("canceled"));
    wait::until("job b's driver to stop", T, || {
        let mut c = c.clone();
        async move {
            let d = admin(&mut c, |mut a| async move { a.describe_job(job_req("b")).await }).await.ok()?;
            d.phase.is_empty().then_some(())
        }
    })
    .await?;
    let r = admin(&mut c, |mut a| async move {
        a.update_checkpoint_config(UpdateCheckpointConfigRequest {
            job_id: "b".into(),
            checkpoint_json: r#"{"interval": "1s"}"#.into(),
            request_id: String::new(),
        })
        .await
    })
    .await;
    assert_eq!(code(&r), Some(Code::FailedPrecondition), "{r:?}");

    worker.shutdown().await;
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_on_a_new_leader_is_recognised() -> anyhow::Result<()> {
    init_test_logging();
    let mut cluster = InProcCluster::start(3, test_timing()).await?;
    let old = cluster.wait_leader(T).await?;
    let mut c = cluster.client()?;
    // A registry-only job (no graph): the request ids live in its replicated record.
    let req = || SubmitJobRequest { job_id: "r".into(), request_id: "submit-r".into(), ..Default::default() };
    admin(&mut c, |mut a| async move { a.submit_job(req()).await }).await?;
    let cancel = || CancelJobRequest { job_id: "r".into(), request_id: "cancel-r".into() };
    admin(&mut c, |mut a| async move { a.cancel_job(cancel()).await }).await?;

    cluster.stop(old).await;
    let new = cluster.wait_leader(T).await?;
    assert_ne!(new, old);
    let addrs: Vec<String> =
        cluster.addrs.iter().filter(|(id, _)| **id != old).map(|(_, a)| a.to_string()).collect();
    let mut c = LeaderClient::new(&addrs, cluster.client_config())?;
    // The retries are answered with the first results; nothing acts twice.
    admin(&mut c, |mut a| async move { a.submit_job(req()).await }).await?;
    let r = admin(&mut c, |mut a| async move { a.cancel_job(cancel()).await }).await?;
    assert_eq!(r.status, "canceled");
    let jobs = admin(&mut c, |mut a| async move { a.list_jobs(ListJobsRequest {}).await }).await?;
    assert_eq!(jobs.jobs.len(), 1);
    // The same id with other arguments is refused on the new leader too.
    let r = admin(&mut c, |mut a| async move {
        a.submit_job(SubmitJobRequest { name: "renamed".into(), ..req() }).await
    })
    .await;
    assert_eq!(code(&r), Some(Code::AlreadyExists), "{r:?}");
    assert!(format!("{r:?}").contains("submit-r"), "{r:?}");
    cluster.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_status_and_leadership_transfer() -> anyhow::Result<()> {
    init_test_logging();
    let cluster = InProcCluster::start(3, test_timing()).await?;
    let leader = cluster.wait_leader(T).await?;
    let mut c = cluster.client()?;
    let st = wait::until("every node replicated", T, || {
        let mut c = c.clone();
        async move {
            let st = admin(&mut c, |mut a| async move { a.cluster_status(ClusterStatusRequest {}).await })
                .await
                .ok()?;
            st.nodes.iter().all(|n| n.health == "healthy").then_some(st)
        }
    })
    .await?;
    assert_eq!(st.leader_id, leader);
    assert_eq!(st.nodes.len(), 3);
    assert_eq!(st.nodes.iter().filter(|n| n.is_leader).count(), 1);
    assert!(st.nodes.iter().all(|n| n.role == "voter" && n.lag.is_some()));

    let r = admin(&mut c, |mut a| async move {
        a.transfer_leadership(TransferLeadershipRequest { to_node_id: 9, timeout_ms: 0 }).await
    })
    .await;
    assert_eq!(code(&r), Some(Code::FailedPrecondition), "{r:?}");
    assert!(format!("{r:?}").contains("not a voter"), "{r:?}");

    let target = (1..=3).find(|id| *id != leader).unwrap_or(1);
    // A transfer may take several election attempts (followers honour the old leader's lease):
    // give one attempt the call's whole time, as cairnctl does.
    let mut long = LeaderClient::new(
        cluster.addrs.values().map(|a| a.to_string()),
        ClientConfig {
            attempt_timeout: Duration::from_secs(40),
            deadline: Duration::from_secs(60),
            ..cluster.client_config()
        },
    )?;
    let reply = admin(&mut long, |mut a| async move {
        a.transfer_leadership(TransferLeadershipRequest { to_node_id: target, timeout_ms: 30_000 }).await
    })
    .await?;
    assert_eq!(reply.leader_id, target);
    assert!(reply.term > st.term);
    assert_eq!(cluster.wait_leader(T).await?, target);

    // The leader history, replicated: the new term first, the old leader's term after it.
    let history = |st: &ClusterStatusReply| -> Vec<(u64, u64)> {
        st.leader_history.iter().map(|t| (t.term, t.leader_id)).collect()
    };
    let now = wait::until("the new term in the leader history", T, || {
        let mut c = c.clone();
        async move {
            let st = admin(&mut c, |mut a| async move { a.cluster_status(ClusterStatusRequest {}).await })
                .await
                .ok()?;
            (st.leader_history.first().map(|t| t.term) == Some(reply.term)).then_some(st)
        }
    })
    .await?;
    let h = history(&now);
    assert_eq!(&h[..2], [(reply.term, target), (st.term, leader)], "{now:?}");
    assert!(
        now.leader_history
            .windows(2)
            .all(|w| w[0].term > w[1].term && w[0].first_log_index > w[1].first_log_index)
    );
    cluster.shutdown().await;
    Ok(())
}
