//! `/metrics` of real processes: three `cairn` replicas and a `cairn-worker` running the demo job
//! with 200 ms checkpoints. The leader exports the job's checkpoint counts under Flink's names
//! and says it leads; a follower says it does not and exports no job series; the worker exports
//! the checkpoint figures and the busy, idle and back-pressured time of every subtask of the job.

use std::time::Duration;

use cairn_protocol::graph::JobGraph;
use cairn_taskrt::demo::DemoJob;
use cairn_taskrt::demo::source::SourceConfig;
use cairn_tests::procs::{ProcCluster, failover_args};
use cairn_tests::{init_test_logging, wait};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const T: Duration = Duration::from_secs(60);

/// GET /metrics over plain HTTP/1.1; `None` while the process is not serving yet.
async fn scrape(addr: &str) -> Option<String> {
    let fetch = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        let req = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.ok()?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).await.ok()?;
        let text = String::from_utf8(raw).ok()?;
        let (head, body) = text.split_once("\r\n\r\n")?;
        head.starts_with("HTTP/1.1 200").then(|| body.to_owned())
    };
    tokio::time::timeout(Duration::from_secs(5), fetch).await.ok().flatten()
}

/// The value of the sample `series` (`name` or `name{labels}`) in an exposition.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

fn demo_graph(output: &std::path::Path) -> JobGraph {
    DemoJob {
        source: SourceConfig {
            keys: 8,
            records_per_key: None,
            rate_per_sec: Some(400),
            batch: 16,
            idle_after_limit: false,
        },
        output_dir: output.display().to_string(),
        source_parallelism: 2,
        parallelism: 2,
        max_parallelism: 16,
    }
    .graph()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_follower_and_worker_export_checkpoint_metrics() -> anyhow::Result<()> {
    init_test_logging();
    let args = failover_args("3s");
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut cluster = ProcCluster::start_with_metrics(3, &refs)?;
    let result = run(&mut cluster).await;
    if result.is_err() {
        eprintln!("{}\n--- worker ---\n{}", cluster.logs(60), cluster.worker_log_text("w1"));
    }
    result
}

async fn run(cluster: &mut ProcCluster) -> anyhow::Result<()> {
    let output = cluster.scratch("out")?;
    let worker_metrics = cluster.launch_worker_with_metrics("w1", 8)?;
    let graph = demo_graph(&output);
    let spec = serde_json::json!({ "graph": graph, "checkpoint": { "interval": "200ms", "timeout": "10s" } });
    let mut client = cluster.client()?;
    client.register_job("demo", &spec.to_string()).await?;

    let metrics_of = |id: u64| cluster.nodes.get(&id).and_then(|n| n.metrics_addr.clone());
    // The leader: it says so, and the demo job completed at least two checkpoints.
    let leader = wait::until("the leader's /metrics to show 2 completed checkpoints", T, || {
        let mut client = client.clone();
        async move {
            let leader = client.status().await.ok()?.leader_id;
            let text = scrape(&metrics_of(leader)?).await?;
            let leads = sample(&text, "cairn_raft_is_leader")? == 1.0;
            let completed =
                sample(&text, r#"cairn_job_numberOfCompletedCheckpoints{job_id="demo"}"#).unwrap_or(0.0);
            (leads && completed >= 2.0).then_some((leader, text))
        }
    })
    .await?;
    let (leader_id, text) = leader;
    let last_id = sample(&text, r#"cairn_job_lastCompletedCheckpointId{job_id="demo"}"#);
    assert!(last_id.is_some_and(|id| id >= 2.0), "lastCompletedCheckpointId: {last_id:?}\n{text}");
    assert!(sample(&text, "cairn_raft_term").is_some_and(|t| t >= 1.0), "{text}");
    assert!(sample(&text, "cairn_raft_proposal_duration_seconds_count").is_some_and(|n| n >= 2.0), "{text}");
    assert_eq!(sample(&text, "cairn_workers_registered"), Some(1.0), "{text}");

    // A follower: not leading, Raft figures present, no job series.
    wait::until("a follower's /metrics to say it does not lead", T, || {
        let mut client = client.clone();
        async move {
            let leader = client.status().await.ok()?.leader_id;
            let follower = (1..=3u64).find(|id| *id != leader)?;
            let text = scrape(&metrics_of(follower)?).await?;
            (sample(&text, "cairn_raft_is_leader")? == 0.0
                && sample(&text, "cairn_raft_applied_index").is_some_and(|i| i > 0.0)
                && !text.contains("job_id=\"demo\""))
            .then_some(())
        }
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e} (leader was node {leader_id})"))?;

    // The worker: every subtask of the job acknowledged checkpoints and reports its figures.
    let tasks: Vec<(String, u32)> =
        graph.vertices.iter().flat_map(|v| (0..v.parallelism).map(move |i| (v.id.clone(), i))).collect();
    assert!(!tasks.is_empty());
    let text = wait::until("the worker's /metrics to show every subtask's checkpoints", T, || {
        let addr = worker_metrics.clone();
        let tasks = tasks.clone();
        async move {
            let text = scrape(&addr).await?;
            tasks
                .iter()
                .all(|(v, i)| {
                    let acked = format!(
                        r#"cairn_task_checkpoints_acknowledged_total{{job_id="demo",vertex="{v}",subtask="{i}"}}"#
                    );
                    sample(&text, &acked).is_some_and(|n| n >= 1.0)
                })
                .then_some(text)
        }
    })
    .await?;
    for (v, i) in &tasks {
        let labels = format!(r#"{{job_id="demo",vertex="{v}",subtask="{i}"}}"#);
        for name in [
            "cairn_task_last_checkpoint_alignment_seconds",
            "cairn_task_last_checkpoint_start_delay_seconds",
            "cairn_task_last_checkpoint_sync_seconds",
            "cairn_task_last_checkpoint_async_seconds",
            "cairn_task_last_checkpoint_persisted_bytes",
            "cairn_task_busy_seconds_total",
            "cairn_task_idle_seconds_total",
            "cairn_task_back_pressured_seconds_total",
        ] {
            let value = sample(&text, &format!("{name}{labels}"));
            assert!(value.is_some_and(|x| x >= 0.0), "{name}{labels}: {value:?}\n{text}");
        }
        let id = sample(&text, &format!("cairn_task_last_checkpoint_id{labels}"));
        assert!(id.is_some_and(|x| x >= 1.0), "last checkpoint id of {v}/{i}: {id:?}");
    }
    Ok(())
}
