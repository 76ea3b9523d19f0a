//! A job whose subtasks span several worker processes: three `cairn` replicas, three
//! `cairn-worker`s, the demo job at parallelism 4 spread over them (its hash exchange crossing
//! the workers' data links), a worker SIGKILLed, then the leader. The job restarts once, for the
//! lost worker, never for the leader, and its committed output is exactly once.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use cairn_client::LeaderClient;
use cairn_proto::admin::ListWorkersRequest;
use cairn_proto::admin::admin_client::AdminClient;
use cairn_taskrt::demo::DemoJob;
use cairn_taskrt::demo::source::SourceConfig;
use cairn_taskrt::demo::verify::Expectation;
use cairn_tests::output::until_exactly_once;
use cairn_tests::procs::{ProcCluster, failover_args};
use cairn_tests::{init_test_logging, wait};

const KEYS: u64 = 8;
const RECORDS_PER_KEY: u64 = 1500;
const T: Duration = Duration::from_secs(60);

fn spread_spec(output: &Path) -> String {
    let graph = DemoJob {
        source: SourceConfig {
            keys: KEYS,
            records_per_key: Some(RECORDS_PER_KEY),
            rate_per_sec: Some(800),
            batch: 16,
            idle_after_limit: true,
        },
        output_dir: output.display().to_string(),
        source_parallelism: 2,
        parallelism: 4,
        max_parallelism: 16,
    }
    .graph();
    serde_json::json!({
        "graph": graph,
        "checkpoint": { "interval": "200ms", "timeout": "10s" },
        "placement": "spread",
    })
    .to_string()
}

/// The workers the demo job's current attempt runs on, once it runs.
async fn workers_of(client: &LeaderClient) -> anyhow::Result<BTreeSet<String>> {
    wait::until("the job to run", T, || {
        let mut c = client.clone();
        async move {
            let r = c.job_runtimes().await.ok()?;
            let job = r.jobs.into_iter().find(|j| j.job_id == "demo" && j.phase == "running")?;
            Some(job.worker.split(',').map(str::to_owned).collect::<BTreeSet<_>>())
        }
    })
    .await
}

/// Waits for `n` more completed checkpoints than `from`.
async fn completions(client: &LeaderClient, from: u64, n: u64) -> anyhow::Result<u64> {
    wait::until(&format!("{n} more completed checkpoints"), T, || {
        let mut c = client.clone();
        async move {
            let job = c.get_job("demo").await.ok()?;
            (job.num_completed >= from + n).then_some(job.num_completed)
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_spread_over_three_workers_survives_a_worker_kill_and_a_leader_kill_exactly_once()
-> anyhow::Result<()> {
    init_test_logging();
    let args = failover_args("8s");
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut cluster = ProcCluster::start(3, &refs)?;
    let output = cluster.scratch("out")?;
    cluster.launch_worker("w1", 8)?;
    cluster.launch_worker("w2", 8)?;
    // As a Kubernetes pod runs it: a wildcard listener, and a bare IP that takes its port.
    cluster.launch_worker_with_args(
        "w3",
        8,
        &["--data-listen", "0.0.0.0:0", "--data-advertise", "127.0.0.1"],
    )?;
    let mut client = cluster.client()?;
    let result: anyhow::Result<()> = async {
        // Every worker attached before the job is placed, so the spread sees all three.
        let workers = wait::until("three workers attached", T, || {
            let mut c = client.clone();
            async move {
                let r = c
                    .call("list workers", |ch| async move {
                        AdminClient::new(ch)
                            .list_workers(ListWorkersRequest {})
                            .await
                            .map(tonic::Response::into_inner)
                    })
                    .await
                    .ok()?;
                (r.workers.len() == 3).then_some(r)
            }
        })
        .await?;
        let dialable =
            |a: &str| a.parse::<std::net::SocketAddr>().is_ok_and(|a| a.ip().is_loopback() && a.port() != 0);
        assert!(workers.workers.iter().all(|w| dialable(&w.data_addr)), "{workers:?}");
        client.register_job("demo", &spread_spec(&output)).await?;
        let placed = workers_of(&client).await?;
        assert_eq!(placed.len(), 3, "the 4 slot-sharing groups spread over every worker: {placed:?}");
        let count = completions(&client, 0, 3).await?;

        // A worker of the job dies: the job restarts once on the other two.
        let victim = placed.iter().next().cloned().ok_or_else(|| anyhow::anyhow!("no worker"))?;
        cluster.workers.get_mut(&victim).ok_or_else(|| anyhow::anyhow!("no {victim}"))?.kill9()?;
        let count = completions(&client, count, 3).await?;
        let job = client.get_job("demo").await?;
        assert_eq!(job.attempts, 2, "one restart for the lost worker");
        let now = workers_of(&client).await?;
        assert!(!now.contains(&victim) && now.len() == 2, "redeployed on the survivors: {now:?}");

        // The leader dies: the tasks on both workers re-attach and the job continues unrestarted.
        let leader = client.status().await?.leader_id;
        cluster.nodes.get_mut(&leader).ok_or_else(|| anyhow::anyhow!("no leader process"))?.kill9()?;
        completions(&client, count, 3).await?;
        let job = client.get_job("demo").await?;
        assert_eq!(job.attempts, 2, "the leader change restarted the job");

        let expect = Expectation { keys: Some(KEYS), records_per_key: Some(RECORDS_PER_KEY), counts: None };
        until_exactly_once(&output, &expect, Duration::from_secs(120)).await.map(|_| ())
    }
    .await;
    if result.is_err() {
        eprintln!("{}", cluster.logs(150));
    }
    result
}
