//! Checkpoint latency of a typical keyed job, with real processes: three `cairn` replicas (default
//! settings) and one `cairn-worker` running source → hash → keyed count → two-phase-commit sink,
//! 10,000 records/s in total over 10,000 keys, a checkpoint every second. For each parallelism
//! (a fresh cluster each), after a warm-up it follows the next N completed checkpoints and
//! prints their end-to-end duration (p50/p90/p99/max) and the per-subtask breakdown Flink's web
//! UI shows: synchronous part, asynchronous part, alignment, start delay (per vertex, over every
//! subtask of every checkpoint), plus state size, and how often the leader changed meanwhile
//! (`--parallelism 16 --checkpoints 600` is a 10-minute run at full load). The same job shape runs on Flink 2.3 with
//! `../shared/peers/flink/` (`scripts/measure_standalone.py`); compare the two in one run.
//! Figures are printed, never asserted.
//!
//! ```text
//! cargo build --release --bins
//! cargo run --release -p cairn-tests --bin cairn-bench-shape -- [--parallelism 1,4,16] [--checkpoints 100]
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use cairn_client::LeaderClient;
use cairn_proto::admin::admin_client::AdminClient;
use cairn_proto::admin::{CheckpointDetails, CheckpointOverview, DescribeCheckpointRequest, JobRequest};
use cairn_taskrt::demo::DemoJob;
use cairn_taskrt::demo::source::SourceConfig;
use cairn_tests::procs::ProcCluster;
use clap::Parser;
use hdrhistogram::Histogram;

#[derive(Parser)]
struct Args {
    /// Parallelism of every vertex, one run (and cluster) each.
    #[arg(long, value_delimiter = ',', default_values_t = [1u32, 4, 16])]
    parallelism: Vec<u32>,
    /// Completed checkpoints measured per parallelism, after the warm-up.
    #[arg(long, default_value_t = 100)]
    checkpoints: usize,
    /// Completed checkpoints not measured first (JIT-free, but files, caches and connections warm).
    #[arg(long, default_value_t = 10)]
    warmup: u64,
    /// Records per second over all source subtasks.
    #[arg(long, default_value_t = 10_000)]
    rate: u64,
    /// Distinct keys.
    #[arg(long, default_value_t = 10_000)]
    keys: u64,
    /// Checkpoint interval.
    #[arg(long, default_value = "1s")]
    interval: String,
}

const JOB: &str = "shape";
const LIMIT: Duration = Duration::from_secs(120);

/// Per-vertex histograms of the subtask figures, in ms (state size in bytes).
#[derive(Default)]
struct Breakdown {
    per_vertex: BTreeMap<String, [Histogram<u64>; 5]>,
}

impl Breakdown {
    fn add(&mut self, details: &CheckpointDetails) -> anyhow::Result<()> {
        for s in &details.subtasks {
            let h = match self.per_vertex.get_mut(&s.vertex) {
                Some(h) => h,
                None => {
                    let new = [
                        Histogram::new(3)?,
                        Histogram::new(3)?,
                        Histogram::new(3)?,
                        Histogram::new(3)?,
                        Histogram::new(3)?,
                    ];
                    self.per_vertex.entry(s.vertex.clone()).or_insert(new)
                }
            };
            h[0].record(s.sync_duration_ms)?;
            h[1].record(s.async_duration_ms)?;
            h[2].record(s.alignment_duration_ms)?;
            h[3].record(s.start_delay_ms)?;
            h[4].record(s.state_size)?;
        }
        Ok(())
    }

    fn print(&self) {
        for (vertex, h) in &self.per_vertex {
            let q = |h: &Histogram<u64>| {
                format!("{}/{}/{}", h.value_at_quantile(0.5), h.value_at_quantile(0.99), h.max())
            };
            println!(
                "  {vertex:<8} sync {:>12}  async {:>12}  alignment {:>12}  start delay {:>12}  state p50 {:>8} B  (ms p50/p99/max, n={})",
                q(&h[0]),
                q(&h[1]),
                q(&h[2]),
                q(&h[3]),
                h[4].value_at_quantile(0.5),
                h[0].len()
            );
        }
    }
}

async fn overview(c: &mut LeaderClient) -> anyhow::Result<CheckpointOverview> {
    let req = JobRequest { job_id: JOB.into() };
    Ok(c.call("list checkpoints", |ch| {
        let req = req.clone();
        async move { Ok(AdminClient::new(ch).list_checkpoints(req).await?.into_inner()) }
    })
    .await?)
}

async fn details(c: &mut LeaderClient, id: u64) -> anyhow::Result<CheckpointDetails> {
    let req = DescribeCheckpointRequest { job_id: JOB.into(), checkpoint_id: id };
    Ok(c.call("describe checkpoint", |ch| {
        let req = req.clone();
        async move { Ok(AdminClient::new(ch).describe_checkpoint(req).await?.into_inner()) }
    })
    .await?)
}

async fn completed(c: &mut LeaderClient) -> anyhow::Result<u64> {
    Ok(c.get_job(JOB).await?.num_completed)
}

async fn run(args: &Args, p: u32) -> anyhow::Result<()> {
    let mut cluster = ProcCluster::start(3, &[])?;
    let output = cluster.scratch("out")?;
    cluster.launch_worker("w1", 3 * p)?;
    let mut c = cluster.client()?;
    let graph = DemoJob {
        source: SourceConfig {
            keys: args.keys,
            records_per_key: None,
            rate_per_sec: Some(args.rate.div_ceil(u64::from(p))),
            batch: 64,
            idle_after_limit: false,
        },
        output_dir: output.display().to_string(),
        source_parallelism: p,
        parallelism: p,
        max_parallelism: 128.max(p),
    }
    .graph();
    let spec =
        serde_json::json!({ "graph": graph, "checkpoint": { "interval": args.interval, "timeout": "60s" } });
    c.register_job(JOB, &spec.to_string()).await?;
    let start = Instant::now();
    while completed(&mut c).await.unwrap_or(0) < args.warmup {
        anyhow::ensure!(start.elapsed() < LIMIT, "no {} checkpoints within {LIMIT:?}", args.warmup);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let first = overview(&mut c).await?.latest_completed.map_or(0, |s| s.id);
    let (mut e2e, mut size, mut breakdown) =
        (Histogram::<u64>::new(3)?, Histogram::<u64>::new(3)?, Breakdown::default());
    let (mut seen, mut failed) = (BTreeSet::new(), 0usize);
    let mut last_progress = Instant::now();
    let measured_from = Instant::now();
    let first_status = c.status().await?;
    let (mut leader, mut leader_changes) = ((first_status.leader_id, first_status.term), 0u64);
    while seen.len() < args.checkpoints {
        anyhow::ensure!(last_progress.elapsed() < LIMIT, "no checkpoint completed for {LIMIT:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
        let status = c.status().await?;
        if (status.leader_id, status.term) != leader {
            leader_changes += 1;
            leader = (status.leader_id, status.term);
        }
        let view = overview(&mut c).await?;
        for s in view.history.iter().filter(|s| s.id > first && s.kind == "checkpoint") {
            if seen.len() >= args.checkpoints || seen.contains(&s.id) {
                continue;
            }
            match s.status.as_str() {
                "completed" => {
                    e2e.record(s.duration_ms)?;
                    size.record(s.state_size)?;
                    breakdown.add(&details(&mut c, s.id).await?)?;
                }
                "failed" => failed += 1,
                _ => continue,
            }
            seen.insert(s.id);
            last_progress = Instant::now();
        }
    }
    let job = c.get_job(JOB).await?;
    println!(
        "p={p:<3} end-to-end ms p50={:>5} p90={:>5} p99={:>5} max={:>5}  state p50 {} B  (n={}, failed {failed}, attempts {})",
        e2e.value_at_quantile(0.5),
        e2e.value_at_quantile(0.9),
        e2e.value_at_quantile(0.99),
        e2e.max(),
        size.value_at_quantile(0.5),
        e2e.len(),
        job.attempts,
    );
    breakdown.print();
    println!(
        "  leader changes while measuring: {leader_changes} in {:.0} s (term {} -> {})",
        measured_from.elapsed().as_secs_f64(),
        first_status.term,
        leader.1
    );
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(
        args.parallelism.iter().all(|p| (1..=128).contains(p)),
        "--parallelism takes values from 1 to 128"
    );
    anyhow::ensure!(args.rate > 0 && args.keys > 0, "--rate and --keys must be above 0");
    println!(
        "cairn-bench-shape: 3 replicas, 1 worker; source {} records/s over {} keys -> hash -> keyed count -> 2PC sink; checkpoint every {}",
        args.rate, args.keys, args.interval
    );
    for &p in &args.parallelism {
        run(&args, p).await?;
    }
    Ok(())
}
