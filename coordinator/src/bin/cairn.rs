//! `cairn`: one Cairn coordinator replica.
//!
//! With no arguments it runs a single-node cluster listening on 127.0.0.1:7400 with its data in
//! `./cairn-data/node-1`: the embedded default. See the README for the configuration reference.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use cairn_coordinator::config::{NodeConfig, parse_peers};
use cairn_coordinator::node::Replica;
use cairn_process::shutdown::ShutdownSignals;
use cairn_proto::auth::secret_from_env;
use clap::Parser;
use tracing_subscriber::EnvFilter;

/// mimalloc instead of glibc's malloc: see the workspace manifest.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Command-line flags. Each one overrides the config file; each has a `CAIRN_*` environment
/// variable that does the same (flags win over the environment).
#[derive(Debug, Parser)]
#[command(
    name = "cairn",
    version,
    about = "Cairn coordinator replica (Raft member + checkpoint coordinator)"
)]
struct Cli {
    /// TOML config file.
    #[arg(long, short = 'c', env = "CAIRN_CONFIG")]
    config: Option<PathBuf>,
    /// Raft node id of this replica (default 1).
    #[arg(long, env = "CAIRN_NODE_ID")]
    node_id: Option<u64>,
    /// gRPC listen address, ip:port (default 127.0.0.1:7400).
    #[arg(long, env = "CAIRN_LISTEN")]
    listen: Option<String>,
    /// Address others reach this replica at (default: the listen address).
    #[arg(long, env = "CAIRN_ADVERTISE")]
    advertise: Option<String>,
    /// Data directory (default cairn-data/node-<id>).
    #[arg(long, env = "CAIRN_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Initial cluster members: `1=host:port,2=host:port,3=host:port`.
    #[arg(long, env = "CAIRN_PEERS")]
    peers: Option<String>,
    /// Leader heartbeat interval, e.g. `100ms`.
    #[arg(long, env = "CAIRN_HEARTBEAT_INTERVAL", value_parser = humantime::parse_duration)]
    heartbeat_interval: Option<Duration>,
    /// Lower bound of the randomized election timeout.
    #[arg(long, env = "CAIRN_ELECTION_TIMEOUT_MIN", value_parser = humantime::parse_duration)]
    election_timeout_min: Option<Duration>,
    /// Upper bound of the randomized election timeout.
    #[arg(long, env = "CAIRN_ELECTION_TIMEOUT_MAX", value_parser = humantime::parse_duration)]
    election_timeout_max: Option<Duration>,
    /// Build a snapshot after this many log entries.
    #[arg(long, env = "CAIRN_SNAPSHOT_AFTER_LOGS")]
    snapshot_after_logs: Option<u64>,
    /// Default checkpoint storage root, shared with the workers (default cairn-data/checkpoints).
    #[arg(long, env = "CAIRN_CHECKPOINT_DIR")]
    checkpoint_dir: Option<PathBuf>,
    /// Deploy jobs with incremental keyed-state checkpoints.
    #[arg(long, env = "CAIRN_INCREMENTAL_CHECKPOINTS")]
    incremental_checkpoints: bool,
    /// Serve Prometheus metrics on GET /metrics at this host:port (default: off).
    #[arg(long, env = "CAIRN_METRICS_LISTEN")]
    metrics_listen: Option<String>,
    /// Serve the web console at this host:port (default: off).
    #[arg(long, env = "CAIRN_CONSOLE_LISTEN")]
    console_listen: Option<String>,
    /// The console's read-only views need the admin token too (its actions always do).
    #[arg(long, env = "CAIRN_CONSOLE_VIEWS_NEED_TOKEN")]
    console_views_need_token: bool,
    /// Heartbeat interval on the task gateway, e.g. `500ms`.
    #[arg(long, env = "CAIRN_WORKER_HEARTBEAT_INTERVAL", value_parser = humantime::parse_duration)]
    worker_heartbeat_interval: Option<Duration>,
    /// A worker silent for this long is lost and its jobs restart elsewhere.
    #[arg(long, env = "CAIRN_WORKER_HEARTBEAT_TIMEOUT", value_parser = humantime::parse_duration)]
    worker_heartbeat_timeout: Option<Duration>,
    /// After a leader change, how long to wait for running tasks to re-attach.
    #[arg(long, env = "CAIRN_REATTACH_GRACE", value_parser = humantime::parse_duration)]
    reattach_grace: Option<Duration>,
    /// Restart strategy of jobs that name none, with Flink's defaults for its parameters (set
    /// them in the configuration file's `[restart_strategy]`).
    #[arg(long, env = "CAIRN_RESTART_STRATEGY", value_parser = parse_restart_strategy)]
    restart_strategy: Option<cairn_protocol::restart::RestartStrategy>,
    /// This replica's TLS certificate (PEM); with --tls-key-file and --tls-ca-file the replica
    /// serves TLS only and talks Raft to its peers over mutual TLS.
    #[arg(long, env = "CAIRN_TLS_CERT_FILE")]
    tls_cert_file: Option<PathBuf>,
    /// The private key of --tls-cert-file (PEM).
    #[arg(long, env = "CAIRN_TLS_KEY_FILE")]
    tls_key_file: Option<PathBuf>,
    /// The cluster CA (PEM) that signed every replica's certificate.
    #[arg(long, env = "CAIRN_TLS_CA_FILE")]
    tls_ca_file: Option<PathBuf>,
    /// File holding the cluster's admin token (at least 16 printable characters, no whitespace);
    /// the token itself may instead come from the CAIRN_ADMIN_TOKEN environment variable.
    #[arg(long, env = "CAIRN_ADMIN_TOKEN_FILE")]
    admin_token_file: Option<PathBuf>,
    /// File holding the cluster secret that authenticates Raft calls between replicas without
    /// TLS (the same on every replica, not the admin token); the secret itself may instead come
    /// from the CAIRN_CLUSTER_SECRET environment variable.
    #[arg(long, env = "CAIRN_CLUSTER_SECRET_FILE")]
    cluster_secret_file: Option<PathBuf>,
    /// File holding the worker tokens: one token shared by every worker, or `<worker-id> <token>`
    /// lines; one shared token may instead come from the CAIRN_WORKER_TOKEN environment variable.
    #[arg(long, env = "CAIRN_WORKER_TOKEN_FILE")]
    worker_token_file: Option<PathBuf>,
    /// Log filter (tracing EnvFilter syntax), e.g. `info` or `cairn=debug,openraft=info`.
    #[arg(long, env = "CAIRN_LOG", default_value = "info,openraft=warn")]
    log: String,
    /// Log format.
    #[arg(long, env = "CAIRN_LOG_FORMAT", value_enum, default_value = "text")]
    log_format: LogFormat,
    /// Print the effective configuration as TOML and exit.
    #[arg(long)]
    print_config: bool,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

fn build_config(cli: &Cli) -> anyhow::Result<NodeConfig> {
    let mut c = match &cli.config {
        Some(path) => NodeConfig::from_file(path)?,
        None => NodeConfig::default(),
    };
    if let Some(v) = cli.node_id {
        c.node_id = v;
    }
    if let Some(v) = &cli.listen {
        c.listen = v.clone();
    }
    if let Some(v) = &cli.advertise {
        c.advertise = Some(v.clone());
    }
    if let Some(v) = &cli.data_dir {
        c.data_dir = Some(v.clone());
    }
    if let Some(v) = &cli.peers {
        c.peers = parse_peers(v).map_err(|e| anyhow::anyhow!("--peers: {e}"))?;
    }
    if let Some(v) = cli.heartbeat_interval {
        c.raft.heartbeat_interval = v;
    }
    if let Some(v) = cli.election_timeout_min {
        c.raft.election_timeout_min = v;
    }
    if let Some(v) = cli.election_timeout_max {
        c.raft.election_timeout_max = v;
    }
    if let Some(v) = cli.snapshot_after_logs {
        c.raft.snapshot_after_logs = v;
    }
    if let Some(v) = &cli.checkpoint_dir {
        c.checkpoint_dir = Some(v.clone());
    }
    if cli.incremental_checkpoints {
        c.incremental_checkpoints = true;
    }
    if let Some(v) = &cli.metrics_listen {
        c.metrics_listen = Some(v.trim().to_owned());
    }
    if let Some(v) = &cli.console_listen {
        c.console_listen = Some(v.trim().to_owned());
    }
    if cli.console_views_need_token {
        c.console_views_need_token = true;
    }
    if let Some(v) = cli.worker_heartbeat_interval {
        c.workers.heartbeat_interval = v;
    }
    if let Some(v) = cli.worker_heartbeat_timeout {
        c.workers.heartbeat_timeout = v;
    }
    if let Some(v) = cli.reattach_grace {
        c.workers.reattach_grace = v;
    }
    if let Some(v) = &cli.restart_strategy {
        c.restart_strategy = Some(v.clone());
    }
    c.tls = cairn_proto::tls::TlsFiles::overlay(
        c.tls.take(),
        cli.tls_cert_file.as_deref(),
        cli.tls_key_file.as_deref(),
        cli.tls_ca_file.as_deref(),
    );
    if let Some(v) = &cli.admin_token_file {
        c.admin_token_file = Some(v.clone());
    }
    // The value only from the environment: a flag would show it in `ps`.
    if let Some(t) = secret_from_env("CAIRN_ADMIN_TOKEN", "the admin token").map_err(anyhow::Error::msg)? {
        c.admin_token = Some(t.into());
    }
    if let Some(v) = &cli.cluster_secret_file {
        c.cluster_secret_file = Some(v.clone());
    }
    if let Some(s) =
        secret_from_env("CAIRN_CLUSTER_SECRET", "the cluster secret").map_err(anyhow::Error::msg)?
    {
        c.cluster_secret = Some(s);
    }
    if let Some(v) = &cli.worker_token_file {
        c.worker_token_file = Some(v.clone());
    }
    if let Some(t) = secret_from_env("CAIRN_WORKER_TOKEN", "the worker token").map_err(anyhow::Error::msg)? {
        c.worker_token = Some(t);
    }
    c.validate()
        .context("invalid configuration (see `cairn --help` and the README's configuration reference)")?;
    Ok(c)
}

/// What the console needs from the replica's configuration; the admin token is read by
/// [`PendingConsole::resolve`] once the replica has started.
struct PendingConsole {
    config: NodeConfig,
    tls: Option<cairn_proto::tls::ClientTls>,
}

impl PendingConsole {
    fn resolve(self) -> anyhow::Result<cairn_console::ConsoleConfig> {
        let token = self.config.resolve_admin_token()?;
        Ok(cairn_console::ConsoleConfig {
            // The replica's own address: a follower answers with the leader's, which is followed.
            source: cairn_console::SourceConfig {
                endpoints: vec![self.config.advertise_addr().to_owned()],
                token: token.expose().to_owned(),
                tls: self.tls,
            },
            views_need_token: self.config.console_views_need_token,
            refresh: cairn_console::DEFAULT_REFRESH,
        })
    }
}

fn console_config(config: &NodeConfig) -> anyhow::Result<PendingConsole> {
    // With TLS the console reaches the admin API as the replica does its peers.
    let tls = match &config.tls {
        Some(files) if config.console_listen.is_some() => {
            Some(files.load_client().context("console: loading the TLS client identity")?)
        }
        _ => None,
    };
    Ok(PendingConsole { config: config.clone(), tls })
}

/// `none`, `fixed-delay`, `failure-rate` or `exponential-delay`, with Flink's defaults.
fn parse_restart_strategy(s: &str) -> Result<cairn_protocol::restart::RestartStrategy, String> {
    serde_json::from_value(serde_json::json!({ "type": s.trim() })).map_err(|_| {
        format!("{s:?} is not a restart strategy; use none, fixed-delay, failure-rate or exponential-delay")
    })
}

fn init_logging(cli: &Cli) -> anyhow::Result<()> {
    let filter =
        EnvFilter::try_new(&cli.log).with_context(|| format!("--log {:?} is not a valid filter", cli.log))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colours only on a terminal: a log file or a collector gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match cli.log_format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
    Ok(())
}

/// How long a stopping leader may spend handing its leadership over (normally a few
/// milliseconds: the most caught-up voter is asked to start an election it wins).
const HANDOFF_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let config = build_config(&cli)?;
    if cli.print_config {
        print!("{}", toml::to_string_pretty(&config)?);
        return Ok(());
    }
    init_logging(&cli)?;
    let mut signals = ShutdownSignals::install().context("installing the SIGTERM/SIGINT handlers")?;
    let listener = tokio::net::TcpListener::bind(&config.listen)
        .await
        .with_context(|| format!("cannot listen on {} (is another replica running there?)", config.listen))?;
    let metrics_listener = cairn_process::metrics::bind(config.metrics_listen.as_deref()).await?;
    let console_listener = match config.console_listen.as_deref() {
        Some(addr) => Some(cairn_console::bind(addr).await?),
        None => None,
    };
    let console_config = console_config(&config)?;
    let replica = Replica::start(config, listener).await?;
    let console = match console_listener {
        // The token is resolved after the replica started: a generated one lives in its data dir.
        Some(listener) => Some(cairn_console::Console::start(listener, console_config.resolve()?)?),
        None => None,
    };
    if let Some(c) = &console {
        tracing::info!(url = %c.url(), "web console");
    }
    let (stop_metrics, metrics_stopped) = tokio::sync::oneshot::channel::<()>();
    let metrics_server = metrics_listener.map(|listener| {
        tokio::spawn(cairn_process::metrics::serve(listener, replica.metrics_registry(), async move {
            let _ = metrics_stopped.await;
        }))
    });
    let signal = signals.next().await;
    tracing::info!(signal, "shutting down");
    // A leader hands over first, so the others need not wait out an election timeout and jobs
    // keep checkpointing through a rolling restart. A second signal skips it.
    tokio::select! {
        handed = replica.hand_off_leadership(HANDOFF_TIMEOUT) => match handed {
            Ok(Some((leader, term))) => tracing::info!(leader, term, "leadership handed over"),
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "could not hand leadership over; stopping anyway"),
        },
        signal = signals.next() => tracing::warn!(signal, "stopping without handing leadership over"),
    }
    let _ = stop_metrics.send(());
    if let Some(c) = console {
        c.shutdown().await;
    }
    replica.shutdown().await;
    if let Some(server) = metrics_server
        && let Err(e) = server.await
    {
        tracing::warn!(error = %e, "the metrics endpoint failed");
    }
    Ok(())
}
