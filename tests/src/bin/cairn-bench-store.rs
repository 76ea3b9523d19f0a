//! Benchmark of the replicated store: checkpoint-ID allocation through Raft with durable
//! (fsynced) writes, on in-process clusters of 1 and 3 replicas (default settings) over loopback
//! gRPC; and, in the same run when an `etcd` binary is on the `PATH` (Debian `etcd-server`),
//! the same scenarios as etcd puts on an etcd cluster of the same size (etcd's defaults), with
//! the ratios.
//!
//! Prints, per cluster size: sequential latency (p50, p99, max) and throughput with 1, 16 and
//! 64 concurrent clients (one connection each; etcd clients spread over the members); then the
//! sled directory size after N allocations with snapshots and log purging on. Figures are
//! printed, never asserted.
//!
//! ```text
//! cargo run --release -p cairn-tests --bin cairn-bench-store -- [--ops 5000] [--size-allocations 1000000] [--no-etcd]
//! ```

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use cairn_client::LeaderClient;
use cairn_coordinator::config::RaftTiming;
use cairn_tests::etcd::{EtcdClient, EtcdCluster, etcd_binary};
use cairn_tests::inproc::InProcCluster;
use clap::Parser;
use hdrhistogram::Histogram;

/// mimalloc instead of glibc's malloc: see the workspace manifest.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
    /// Skip etcd even when it is installed.
    #[arg(long)]
    no_etcd: bool,
}

/// One benchmark client: a Cairn allocation or an etcd put per operation.
enum Target {
    Cairn(LeaderClient),
    Etcd { client: EtcdClient, key: Vec<u8>, value: u64 },
}

impl Target {
    async fn op(&mut self) -> anyhow::Result<()> {
        match self {
            Self::Cairn(client) => {
                client.allocate_checkpoint_id("bench").await?;
            }
            Self::Etcd { client, key, value } => {
                *value += 1;
                client.put(key, &value.to_be_bytes()).await?;
            }
        }
        Ok(())
    }
}

/// Builds the clients of one scenario.
enum System<'a> {
    Cairn(&'a InProcCluster),
    Etcd(&'a EtcdCluster),
}

impl System<'_> {
    async fn clients(&self, n: usize) -> anyhow::Result<Vec<Target>> {
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            out.push(match self {
                Self::Cairn(cluster) => Target::Cairn(cluster.client()?),
                Self::Etcd(cluster) => {
                    let addr = &cluster.client_addrs[i % cluster.client_addrs.len()];
                    Target::Etcd {
                        client: EtcdClient::connect(addr).await?,
                        key: format!("bench/{i}").into_bytes(),
                        value: 0,
                    }
                }
            });
        }
        Ok(out)
    }
}

/// What one scenario measured.
struct Figures {
    rate: f64,
    p50_ms: f64,
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
    system: &System<'_>,
    clients: usize,
    ops: usize,
) -> anyhow::Result<(f64, Histogram<u64>)> {
    let issued = Arc::new(AtomicUsize::new(0));
    let mut set = tokio::task::JoinSet::new();
    let targets = system.clients(clients).await?;
    // Warm up each connection.
    let mut warm = Vec::with_capacity(targets.len());
    for mut t in targets {
        t.op().await?;
        warm.push(t);
    }
    let start = Instant::now();
    for mut target in warm {
        let issued = issued.clone();
        set.spawn(async move {
            let mut h = Histogram::<u64>::new(3)?;
            while issued.fetch_add(1, Ordering::Relaxed) < ops {
                let t = Instant::now();
                target.op().await?;
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

/// The latency and throughput scenarios on one system; prints a line each.
async fn scenarios(name: &str, system: &System<'_>, n: u64, args: &Args) -> anyhow::Result<Vec<Figures>> {
    let (_, lat) = throughput(system, 1, args.latency_ops).await?;
    println!(
        "{name:<5} nodes={n} sequential latency: p50={:.2}ms p99={:.2}ms max={:.2}ms ({} ops)",
        ms(lat.value_at_quantile(0.5)),
        ms(lat.value_at_quantile(0.99)),
        ms(lat.max()),
        args.latency_ops
    );
    let mut figures = vec![Figures { rate: 0.0, p50_ms: ms(lat.value_at_quantile(0.5)) }];
    for &c in &args.clients {
        let (rate, h) = throughput(system, c, args.ops).await?;
        println!(
            "{name:<5} nodes={n} clients={c:>2}: {rate:>8.0} ops/s  p50={:.2}ms p99={:.2}ms ({} ops)",
            ms(h.value_at_quantile(0.5)),
            ms(h.value_at_quantile(0.99)),
            args.ops
        );
        figures.push(Figures { rate, p50_ms: ms(h.value_at_quantile(0.5)) });
    }
    Ok(figures)
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    println!(
        "cairn-bench-store: durable ID allocation through Raft (sled, group commit), loopback gRPC, default settings"
    );
    let etcd = if args.no_etcd { None } else { etcd_binary() };
    match &etcd {
        Some(path) => println!("etcd peer: {} (etcd's defaults), same scenarios as puts", path.display()),
        None => println!("etcd peer: not installed (apt-get install etcd-server), skipped"),
    }
    for &n in &args.nodes {
        let cluster = InProcCluster::start(n, RaftTiming::default()).await?;
        cluster.wait_leader(Duration::from_secs(30)).await?;
        cluster.client()?.register_job("bench", "").await?;
        let cairn = scenarios("cairn", &System::Cairn(&cluster), n, &args).await?;
        cluster.shutdown().await;
        if etcd.is_none() {
            continue;
        }
        let peer = EtcdCluster::start(usize::try_from(n)?).await?;
        let theirs = scenarios("etcd", &System::Etcd(&peer), n, &args).await?;
        drop(peer);
        println!(
            "ratio nodes={n}: sequential p50 cairn/etcd = {:.2}",
            cairn[0].p50_ms / theirs[0].p50_ms.max(f64::MIN_POSITIVE)
        );
        for (i, &c) in args.clients.iter().enumerate() {
            let (ours, peer) = (&cairn[i + 1], &theirs[i + 1]);
            println!(
                "ratio nodes={n} clients={c:>2}: throughput cairn/etcd = {:.2}",
                ours.rate / peer.rate.max(f64::MIN_POSITIVE)
            );
        }
    }
    if args.size_allocations > 0 {
        let cluster = InProcCluster::start(1, RaftTiming::default()).await?;
        cluster.wait_leader(Duration::from_secs(30)).await?;
        cluster.client()?.register_job("bench", "").await?;
        let start = Instant::now();
        let (rate, _) = throughput(&System::Cairn(&cluster), 64, args.size_allocations).await?;
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
