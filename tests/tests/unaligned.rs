//! Checkpoints under backpressure, through real processes: one `cairn` replica, two
//! `cairn-worker`s, and two copies of the demo job whose sink takes only 50 records/s per
//! subtask while the source emits 1,000/s, so every channel fills up. Both are spread over the
//! two workers (the hash exchange crosses their data link) and checkpoint every 300 ms with a
//! 2 s timeout. The aligned one's barriers queue behind the backlog and its checkpoints expire;
//! the unaligned one's overtake it, complete, and persist the in-flight records. A worker of the
//! unaligned job is then killed: it restarts from a checkpoint holding in-flight records, and its
//! committed output is still exactly once.

use std::path::Path;
use std::time::Duration;

use cairn_client::LeaderClient;
use cairn_proto::admin::admin_client::AdminClient;
use cairn_proto::admin::{CheckpointOverview, JobRequest, ListWorkersRequest};
use cairn_taskrt::demo::DemoJob;
use cairn_taskrt::demo::source::SourceConfig;
use cairn_taskrt::demo::verify::Expectation;
use cairn_tests::output::until_exactly_once;
use cairn_tests::procs::{ProcCluster, failover_args};
use cairn_tests::{init_test_logging, wait};

const KEYS: u64 = 4;
const RECORDS_PER_KEY: u64 = 400;
const T: Duration = Duration::from_secs(90);

/// The demo job with a slow sink; `unaligned` picks the checkpoint mode, nothing else differs.
fn slow_sink_spec(output: &Path, unaligned: bool) -> anyhow::Result<String> {
    let mut graph = DemoJob {
        source: SourceConfig {
            keys: KEYS,
            records_per_key: Some(RECORDS_PER_KEY),
            rate_per_sec: Some(1000),
            batch: 16,
            idle_after_limit: true,
        },
        output_dir: output.display().to_string(),
        source_parallelism: 1,
        parallelism: 2,
        max_parallelism: 16,
    }
    .graph();
    let sink = graph
        .vertices
        .iter_mut()
        .find(|v| v.id == "sink")
        .ok_or_else(|| anyhow::anyhow!("the demo job has no sink"))?;
    sink.operator.config["max_records_per_sec"] = 50.into();
    Ok(serde_json::json!({
        "graph": graph,
        "checkpoint": {
            "interval": "300ms",
            "timeout": "2s",
            "tolerable_failures": 1000,
            "unaligned": unaligned,
        },
        "placement": "spread",
    })
    .to_string())
}

async fn overview(client: &LeaderClient, job: &str) -> Option<CheckpointOverview> {
    let req = JobRequest { job_id: job.to_owned() };
    client
        .clone()
        .call("list checkpoints", |ch| {
            let req = req.clone();
            async move { AdminClient::new(ch).list_checkpoints(req).await.map(tonic::Response::into_inner) }
        })
        .await
        .ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_backpressure_aligned_checkpoints_expire_and_unaligned_ones_complete_and_restore()
-> anyhow::Result<()> {
    init_test_logging();
    let args = failover_args("8s");
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut cluster = ProcCluster::start(1, &refs)?;
    let aligned_out = cluster.scratch("aligned-out")?;
    let unaligned_out = cluster.scratch("unaligned-out")?;
    // Each job takes 2 slots (one per slot-sharing group); after a worker is lost the other
    // must fit both.
    for w in ["w1", "w2"] {
        cluster.launch_worker(w, 4)?;
    }
    let mut client = cluster.client()?;
    let result: anyhow::Result<()> = async {
        wait::until("two workers attached", T, || {
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
                (r.workers.len() == 2).then_some(())
            }
        })
        .await?;
        client.register_job("aligned", &slow_sink_spec(&aligned_out, false)?).await?;
        client.register_job("unaligned", &slow_sink_spec(&unaligned_out, true)?).await?;

        // Unaligned: checkpoints complete while the backlog drains, with in-flight records.
        let with_channel_state = wait::until("unaligned checkpoints with in-flight data", T, || async {
            let o = overview(&client, "unaligned").await?;
            let counts = o.counts?;
            let persisted =
                o.history.iter().filter(|c| c.status == "completed" && c.persisted_data > 0).count();
            (counts.completed >= 3 && persisted >= 1).then_some(counts)
        })
        .await?;
        // Aligned, same backlog: barriers wait behind it and checkpoints expire.
        let expired = wait::until("aligned checkpoints expiring", T, || async {
            let o = overview(&client, "aligned").await?;
            let failed = o.latest_failed?;
            (o.counts?.failed >= 2 && failed.failure_reason == "CheckpointExpired").then_some(o.counts)
        })
        .await?;
        eprintln!("unaligned: {with_channel_state:?}; aligned: {expired:?}");

        // A worker of the unaligned job dies: it restarts from a checkpoint whose in-flight
        // records are replayed, and the committed output stays exactly once.
        let before = client.get_job("unaligned").await?.num_completed;
        cluster.workers.get_mut("w1").ok_or_else(|| anyhow::anyhow!("no w1"))?.kill9()?;
        wait::until("the unaligned job to restart and checkpoint again", T, || {
            let mut c = client.clone();
            async move {
                let job = c.get_job("unaligned").await.ok()?;
                (job.attempts >= 2 && job.num_completed >= before + 2).then_some(())
            }
        })
        .await?;
        // The restored checkpoint held in-flight records, and the survivor replayed them.
        let replayed = cluster
            .worker_log_text("w2")
            .lines()
            .any(|l| l.contains("replaying in-flight records") && l.contains("job=unaligned"));
        anyhow::ensure!(replayed, "no task of the restarted job replayed in-flight records");
        let expect = Expectation { keys: Some(KEYS), records_per_key: Some(RECORDS_PER_KEY), counts: None };
        until_exactly_once(&unaligned_out, &expect, Duration::from_secs(120)).await.map(|_| ())
    }
    .await;
    if result.is_err() {
        let about = |text: String| -> String {
            text.lines()
                .filter(|l| l.contains("unaligned") && !l.contains("job=aligned"))
                .collect::<Vec<_>>()
                .join("\n")
        };
        eprintln!("--- leader, job unaligned ---\n{}", about(cluster.node_log_text(1)));
        for w in ["w1", "w2"] {
            eprintln!("--- worker {w}, job unaligned ---\n{}", about(cluster.worker_log_text(w)));
        }
    }
    result
}
