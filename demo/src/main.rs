//! `cairn-demo`: Cairn's main job on the embedded default, in one process.
//!
//! Starts a local three-replica Raft cluster (127.0.0.1:7401-7403 by default, data under
//! `cairn-data/demo/`), a worker, and the demo job (sequence source → keyed counter →
//! two-phase-commit file sink) checkpointing every second, then prints each checkpoint as it
//! completes, with the leader and term that committed it. Ctrl-C (or `--duration`) stops the
//! worker and the replicas cleanly and runs the exactly-once verifier over the committed output.
//!
//! Run it again with the same data directory and the job resumes from its latest checkpoint.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use cairn_client::{ClientConfig, ClientError, LeaderClient};
use cairn_coordinator::auth::AdminToken;
use cairn_coordinator::config::{NodeConfig, Peer, ensure_secret_file, read_token_file, write_private};
use cairn_coordinator::node::Replica;
use cairn_process::shutdown::ShutdownSignals;
use cairn_taskrt::demo::DemoJob;
use cairn_taskrt::demo::source::SourceConfig;
use cairn_taskrt::demo::verify::{Expectation, verify_output};
use cairn_taskrt::worker::{Worker, WorkerConfig};
use clap::Parser;
use tonic::Code;
use tracing_subscriber::EnvFilter;

/// mimalloc instead of glibc's malloc: see the workspace manifest.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Parser)]
#[command(
    name = "cairn-demo",
    version,
    about = "Run a local 3-replica Cairn cluster, a worker and the demo job"
)]
struct Args {
    /// Where the replicas, the checkpoints and the job's output live.
    #[arg(long, default_value = "cairn-data/demo")]
    data_dir: PathBuf,
    /// Replica i listens on base_port + i (i = 1, 2, 3).
    #[arg(long, default_value_t = 7400)]
    base_port: u16,
    /// Replica i serves the web console on console_base_port + i (i = 1, 2, 3).
    #[arg(long, default_value_t = 7480)]
    console_base_port: u16,
    /// Checkpoint interval of the demo job.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    interval: Duration,
    /// Records per second emitted by each source subtask.
    #[arg(long, default_value_t = 1000)]
    rate: u64,
    /// Stop by itself after this long (default: run until Ctrl-C).
    #[arg(long, value_parser = humantime::parse_duration)]
    duration: Option<Duration>,
    /// Log filter for the cluster's own logs (printed to stderr).
    #[arg(long, default_value = "warn")]
    log: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let filter = EnvFilter::try_new(&args.log)
        .with_context(|| format!("--log {:?} is not a valid filter", args.log))?;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colours only on a terminal: a log file or a collector gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();

    // Handlers first: Ctrl-C during start-up still stops everything cleanly.
    let mut signals = ShutdownSignals::install().context("installing the SIGTERM/SIGINT handlers")?;
    let root = std::path::absolute(&args.data_dir)?;
    std::fs::create_dir_all(&root).with_context(|| format!("cannot create {}", root.display()))?;
    let checkpoints = root.join("checkpoints");
    let output = root.join("output");
    // One admin token for the three replicas, kept with the demo's data (mode 0600).
    let token_file = root.join("admin-token");
    if !token_file.exists() {
        write_private(&token_file, AdminToken::generate().expose())
            .with_context(|| format!("cannot write {}", token_file.display()))?;
    }
    let token = read_token_file(&token_file)?;
    // The replicas authenticate each other with a cluster secret and the worker with a worker
    // token, both kept beside it.
    let cluster_secret_file = root.join("cluster-secret");
    ensure_secret_file(&cluster_secret_file, "the cluster secret").map_err(anyhow::Error::msg)?;
    let worker_token_file = root.join("worker-token");
    ensure_secret_file(&worker_token_file, "the worker token").map_err(anyhow::Error::msg)?;
    let peers: Vec<Peer> =
        (1..=3u64).map(|id| Peer { id, addr: format!("127.0.0.1:{}", args.base_port as u64 + id) }).collect();
    let mut replicas = Vec::new();
    for p in &peers {
        let listener = tokio::net::TcpListener::bind(&p.addr).await.with_context(|| {
            format!("cannot listen on {} (another demo running? pick other ports with --base-port)", p.addr)
        })?;
        let config = NodeConfig {
            node_id: p.id,
            listen: p.addr.clone(),
            data_dir: Some(root.join(format!("node-{}", p.id))),
            peers: peers.clone(),
            checkpoint_dir: Some(checkpoints.clone()),
            admin_token_file: Some(token_file.clone()),
            cluster_secret_file: Some(cluster_secret_file.clone()),
            worker_token_file: Some(worker_token_file.clone()),
            ..NodeConfig::default()
        };
        replicas.push(Replica::start(config, listener).await?);
    }
    // Every replica serves the console; a follower's reads and actions go through the leader.
    let mut consoles = Vec::new();
    for p in &peers {
        let addr = format!("127.0.0.1:{}", args.console_base_port as u64 + p.id);
        let listener =
            cairn_console::bind(&addr).await.context("pick other ports with --console-base-port")?;
        let config = cairn_console::ConsoleConfig {
            source: cairn_console::SourceConfig {
                endpoints: vec![p.addr.clone()],
                token: token.expose().to_owned(),
                tls: None,
            },
            views_need_token: false,
            refresh: cairn_console::DEFAULT_REFRESH,
        };
        consoles.push(cairn_console::Console::start(listener, config)?);
    }
    let endpoints: Vec<String> = peers.iter().map(|p| p.addr.clone()).collect();
    println!("cairn-demo: 3 replicas on {} (data in {})", endpoints.join(", "), root.display());
    println!(
        "cairn-demo: operate it with: cairnctl --endpoints {} --token-file {}",
        endpoints.join(","),
        token_file.display()
    );
    let urls: Vec<String> = consoles.iter().map(|c| c.url()).collect();
    if let Some((first, others)) = urls.split_first() {
        println!(
            "cairn-demo: web console: {first} (also served by the other replicas: {}; log in with the token in {})",
            others.join(", "),
            token_file.display()
        );
    }

    let worker = Worker::start(WorkerConfig {
        worker_id: Some("demo-worker".into()),
        token_file: Some(worker_token_file.clone()),
        ..WorkerConfig::new(endpoints.clone())
    })?;

    let mut client = LeaderClient::new(
        &endpoints,
        ClientConfig { token: Some(token.expose().to_owned()), ..ClientConfig::default() },
    )?;
    let graph = DemoJob {
        source: SourceConfig {
            keys: 16,
            records_per_key: None,
            rate_per_sec: Some(args.rate),
            batch: 64,
            idle_after_limit: false,
        },
        output_dir: output.display().to_string(),
        source_parallelism: 2,
        parallelism: 2,
        max_parallelism: 128,
    }
    .graph();
    let spec = serde_json::json!({
        "graph": graph,
        "checkpoint": {
            "interval": humantime::format_duration(args.interval).to_string(),
            "retained": 3,
            // Savepoints (cairnctl or the console) go beside the checkpoints by default.
            "savepoint_dir": root.join("savepoints").display().to_string(),
        },
    });
    match client.register_job("demo", &spec.to_string()).await {
        Ok(_) => println!(
            "cairn-demo: job `demo` submitted; checkpoints every {}",
            humantime::format_duration(args.interval)
        ),
        Err(e) if e.code() == Some(Code::AlreadyExists) => {
            println!(
                "cairn-demo: job `demo` found in the replicated store; it resumes from its latest checkpoint"
            )
        }
        Err(e) => return Err(e.into()),
    }

    let stop = async {
        match args.duration {
            Some(d) => tokio::time::sleep(d).await,
            None => {
                signals.next().await;
            }
        }
    };
    tokio::pin!(stop);
    let mut seen = 0u64;
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    loop {
        tokio::select! {
            _ = &mut stop => break,
            _ = tick.tick() => {
                if let Err(e) = report(&mut client, &mut seen).await {
                    eprintln!("cairn-demo: {e}");
                }
            }
        }
    }

    println!("cairn-demo: stopping");
    for c in consoles {
        c.shutdown().await;
    }
    // Replicas first: they suspend the job (nothing is restarted or deleted), then the worker
    // stops its tasks. A later run resumes from the latest checkpoint.
    for r in replicas {
        r.shutdown().await;
    }
    worker.shutdown().await;
    let verdict = verify_output(&output, &Expectation::default())?;
    println!("cairn-demo: verifier: {verdict}");
    if !verdict.is_exactly_once() {
        anyhow::bail!("the committed output is not exactly once");
    }
    Ok(())
}

/// Prints the checkpoints completed since the last call.
async fn report(client: &mut LeaderClient, seen: &mut u64) -> Result<(), ClientError> {
    let job = client.get_job("demo").await?;
    if job.num_completed > *seen {
        let status = client.status().await?;
        let latest = job.completed_checkpoint_ids.last().copied().unwrap_or(0);
        println!(
            "checkpoint {latest:>5} completed  (total {:>5}, leader node {}, term {}, attempt {})",
            job.num_completed, status.leader_id, status.term, job.attempts
        );
        *seen = job.num_completed;
    }
    Ok(())
}
