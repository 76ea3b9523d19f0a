//! Benchmark of the replicated store: checkpoint-ID allocation through Raft with durable
//! (fsynced) writes, on in-process clusters of 1 and 3 replicas over loopback gRPC.
//!
//! Prints, per cluster size: sequential allocation latency (p50, p99, max) and throughput with
//! 1, 16 and 64 concurrent clients; then the sled directory size after N allocations with
//! snapshots and log purging on. Figures are printed, never asserted.
//!
//! ```text
//! cargo run --release -p cairn-tests --bin cairn-bench-store -- [--ops 5000] [--size-allocations 1000000]
//! ```

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use cairn_tests::inproc::{InProcCluster, test_timing};
use clap::Parser;
use hdrhistogram::Histogram;

#[derive(Parser)]
struct Args {
    /// Allocations per throughput scenario.
    #[arg(long, default_value_t = 5000)]
    ops: usize,
    /// Sequential allocations for the latency scenario.
    #[arg(long, default_value_t = 2000)]
    latency_ops: usize,
    /// Allocations before measuring the data directory size (0 skips the scenario).
    #[arg(long, default_value_t = 1_000_000)]
    size_allocations: usize,
    /// Cluster sizes to measure.
    #[arg(long, value_delimiter = ',', default_value = "1,3")]
    nodes: Vec<u64>,
    /// Concurrency levels to measure.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
    clients: Vec<usize>,
}

fn dir_size(p: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(p) else { return 0 };
    rd.flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_size(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

async fn throughput(
    cluster: &InProcCluster,
    clients: usize,
    ops: usize,
) -> anyhow::Result<(f64, Histogram<u64>)> {
    let issued = Arc::new(AtomicUsize::new(0));
    let mut set = tokio::task::JoinSet::new();
    let start = Instant::now();
    for _ in 0..clients {
        let mut client = cluster.client()?;
        let issued = issued.clone();
        set.spawn(async move {
            let mut h = Histogram::<u64>::new(3)?;
            while issued.fetch_add(1, Ordering::Relaxed) < ops {
                let t = Instant::now();
                client.allocate_checkpoint_id("bench").await?;
                h.record(t.elapsed().as_micros() as u64)?;
            }
            anyhow::Ok(h)
        });
    }
    let mut total = Histogram::<u64>::new(3)?;
    while let Some(h) = set.join_next().await {
        total.add(h??)?;
    }
    Ok((ops as f64 / start.elapsed().as_secs_f64(), total))
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    println!("cairn-bench-store: durable ID allocation through Raft (sled, fsync per batch), loopback gRPC");
    for &n in &args.nodes {
        let cluster = InProcCluster::start(n, test_timing()).await?;
        cluster.wait_leader(Duration::from_secs(30)).await?;
        let mut client = cluster.client()?;
        client.register_job("bench", "").await?;
        // Warm up connections.
        for _ in 0..50 {
            client.allocate_checkpoint_id("bench").await?;
        }
        let (_, lat) = throughput(&cluster, 1, args.latency_ops).await?;
        println!(
            "nodes={n} sequential latency: p50={:.2}ms p99={:.2}ms max={:.2}ms ({} ops)",
            ms(lat.value_at_quantile(0.5)),
            ms(lat.value_at_quantile(0.99)),
            ms(lat.max()),
            args.latency_ops
        );
        for &c in &args.clients {
            let (rate, h) = throughput(&cluster, c, args.ops).await?;
            println!(
                "nodes={n} clients={c:>2}: {rate:>8.0} allocations/s  p50={:.2}ms p99={:.2}ms ({} ops)",
                ms(h.value_at_quantile(0.5)),
                ms(h.value_at_quantile(0.99)),
                args.ops
            );
        }
        cluster.shutdown().await;
    }
    if args.size_allocations > 0 {
        let cluster = InProcCluster::start(1, test_timing()).await?;
        cluster.wait_leader(Duration::from_secs(30)).await?;
        cluster.client()?.register_job("bench", "").await?;
        let start = Instant::now();
        let (rate, _) = throughput(&cluster, 64, args.size_allocations).await?;
        let r = cluster.replica(1).ok_or_else(|| anyhow::anyhow!("node 1 gone"))?;
        let m = r.raft().metrics().borrow().clone();
        let data_dir = cluster_data_dir(&cluster)?;
        println!(
            "size: {} allocations in {:.1}s ({rate:.0}/s): data dir {:.1} MiB, last log {:?}, snapshot {:?}, purged {:?}",
            args.size_allocations,
            start.elapsed().as_secs_f64(),
            dir_size(&data_dir) as f64 / (1024.0 * 1024.0),
            m.last_log_index,
            m.snapshot.map(|l| l.index),
            m.purged.map(|l| l.index),
        );
        cluster.shutdown().await;
    }
    Ok(())
}

fn cluster_data_dir(cluster: &InProcCluster) -> anyhow::Result<std::path::PathBuf> {
    cluster.data_dir(1).ok_or_else(|| anyhow::anyhow!("no data dir for node 1"))
}
