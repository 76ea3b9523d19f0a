//! Bounded jobs with real processes (three `cairn` replicas, `cairn-worker`s): the demo source
//! with `records_per_key` runs out, every task waits for a checkpoint taken after its end of
//! data, the sink commits on its completion, and the job ends `finished` with every record
//! committed exactly once, also when its worker dies after one source subtask finished, and
//! without a restart when the leader dies then.

use std::path::Path;
use std::time::Duration;

use cairn_client::LeaderClient;
use cairn_taskrt::demo::DemoJob;
use cairn_taskrt::demo::source::SourceConfig;
use cairn_taskrt::demo::verify::{Expectation, verify_output};
use cairn_tests::procs::ProcCluster;
use cairn_tests::{init_test_logging, wait};

const T: Duration = Duration::from_secs(90);

/// Three keys over two source subtasks: subtask 0 owns keys 0 and 2, subtask 1 key 1, so
/// subtask 1 runs out (and finishes) first.
const KEYS: u64 = 3;

fn spec(output: &Path, records_per_key: u64, rate_per_sec: u64) -> String {
    let graph = DemoJob {
        source: SourceConfig {
            keys: KEYS,
            records_per_key: Some(records_per_key),
            rate_per_sec: Some(rate_per_sec),
            batch: 16,
            idle_after_limit: false,
        },
        output_dir: output.display().to_string(),
        source_parallelism: 2,
        parallelism: 2,
        max_parallelism: 16,
    }
    .graph();
    serde_json::json!({ "graph": graph, "checkpoint": { "interval": "200ms" } }).to_string()
}

async fn wait_finished(client: &LeaderClient, job: &str) -> anyhow::Result<()> {
    wait::until(&format!("job {job} to finish"), T, || {
        let mut c = client.clone();
        async move {
            let record = c.get_job(job).await.ok()?;
            assert!(record.status != "failed", "the job failed: {record:?}");
            (record.status == "finished").then_some(())
        }
    })
    .await
}

/// The committed output, checked the moment the job finished: no wait, since a task finishes
/// only after the final checkpoint's completion let the sink commit.
fn committed_exactly_once(output: &Path, records_per_key: u64) -> anyhow::Result<()> {
    let expect = Expectation { keys: Some(KEYS), records_per_key: Some(records_per_key), counts: None };
    let verdict = verify_output(output, &expect)?;
    anyhow::ensure!(verdict.is_exactly_once(), "not every record committed exactly once: {verdict}");
    anyhow::ensure!(verdict.records == KEYS * records_per_key, "{verdict}");
    Ok(())
}

/// Three replicas and worker `w1` (default settings) running the bounded demo job `bounded`.
async fn start(records_per_key: u64) -> anyhow::Result<(ProcCluster, std::path::PathBuf, LeaderClient)> {
    init_test_logging();
    let mut cluster = ProcCluster::start(3, &[])?;
    let output = cluster.scratch("out")?;
    cluster.launch_worker("w1", 8)?;
    let mut client = cluster.client()?;
    client.register_job("bounded", &spec(&output, records_per_key, 400)).await?;
    Ok((cluster, output, client))
}

/// Waits until source subtask 1 (one key: it runs out first) finished on worker `w1`.
async fn source_1_finished(cluster: &ProcCluster) -> anyhow::Result<()> {
    wait::until("source subtask 1 to finish", T, || {
        let done = cluster
            .worker_log_text("w1")
            .lines()
            .any(|l| l.contains("task state") && l.contains("source#1") && l.contains("finished"));
        async move { done.then_some(()) }
    })
    .await
}

fn with_logs(cluster: &ProcCluster, r: anyhow::Result<()>) -> anyhow::Result<()> {
    if r.is_err() {
        eprintln!("{}", cluster.logs(200));
    }
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bounded_job_finishes_with_all_its_output_committed() -> anyhow::Result<()> {
    let (cluster, output, mut client) = start(400).await?;
    let result: anyhow::Result<()> = async {
        wait_finished(&client, "bounded").await?;
        committed_exactly_once(&output, 400)?;
        let job = client.get_job("bounded").await?;
        assert_eq!(job.attempts, 1, "finishing needed no restart");
        assert!(job.num_completed >= 1, "the final checkpoint completed");
        let log = cluster.worker_log_text("w1");
        for task in ["source#0", "source#1", "count#0", "count#1", "sink#0", "sink#1"] {
            assert!(
                log.lines().any(|l| l.contains("final checkpoint complete") && l.contains(task)),
                "{task} finished without hearing of a final checkpoint"
            );
        }
        Ok(())
    }
    .await;
    with_logs(&cluster, result)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bounded_job_whose_worker_dies_after_a_source_finished_ends_exactly_once() -> anyhow::Result<()> {
    // Subtask 1 emits 1,000 records in about 2.5 s, subtask 0 twice as many.
    let (mut cluster, output, mut client) = start(1000).await?;
    let result: anyhow::Result<()> = async {
        source_1_finished(&cluster).await?;
        let job = client.get_job("bounded").await?;
        assert_ne!(
            job.status, "finished",
            "the job ended before the worker could be killed; slow the source"
        );
        cluster.launch_worker("w2", 8)?;
        cluster.workers.get_mut("w1").ok_or_else(|| anyhow::anyhow!("no worker w1"))?.kill9()?;
        wait_finished(&client, "bounded").await?;
        committed_exactly_once(&output, 1000)?;
        let job = client.get_job("bounded").await?;
        assert!(job.attempts >= 2, "the job was restored on w2 (attempts {})", job.attempts);
        Ok(())
    }
    .await;
    with_logs(&cluster, result)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_killed_while_a_bounded_job_finishes_costs_no_restart() -> anyhow::Result<()> {
    let (mut cluster, output, mut client) = start(1000).await?;
    let result: anyhow::Result<()> = async {
        source_1_finished(&cluster).await?;
        let leader = client.status().await?.leader_id;
        cluster.nodes.get_mut(&leader).ok_or_else(|| anyhow::anyhow!("no leader process"))?.kill9()?;
        wait_finished(&client, "bounded").await?;
        committed_exactly_once(&output, 1000)?;
        let job = client.get_job("bounded").await?;
        assert_eq!(job.attempts, 1, "the finished and finishing tasks re-attached: no restart");
        Ok(())
    }
    .await;
    with_logs(&cluster, result)
}
