//! `cairn-worker`: the task runtime process.
//!
//! - `run`: attach to the coordinator leader over the task gateway (following it across leader
//!   changes) and run the jobs it deploys here, until SIGTERM or SIGINT (then cancel every task
//!   and exit 0). See `cairn-worker run --help`; every flag has a `CAIRN_WORKER_*` variable.
//! - `verify`: the exactly-once verifier of the demo pipeline's committed output.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use cairn_process::metrics as exporter;
use cairn_process::shutdown::ShutdownSignals;
use cairn_taskrt::demo::verify::{Expectation, verify_output};
use cairn_taskrt::exporter::TaskMetrics;
use cairn_taskrt::registry::OperatorRegistry;
use cairn_taskrt::worker::{LogFormat, RunArgs, Worker, WorkerConfig};
use clap::{Parser, Subcommand};
use tokio::sync::oneshot;
use tracing_subscriber::EnvFilter;

/// mimalloc instead of glibc's malloc: see the workspace manifest.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Parser)]
#[command(name = "cairn-worker", version, about = "Cairn task runtime")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Check that the demo pipeline's committed output is exactly once.
    Verify {
        /// The sink's output directory (the one holding `committed/`).
        #[arg(long)]
        output: PathBuf,
        /// Keys the source emits (`0..keys`); every one must be present, no other.
        #[arg(long)]
        keys: Option<u64>,
        /// Every key must have exactly this many committed records.
        #[arg(long)]
        records_per_key: Option<u64>,
    },
    /// Run tasks for the coordinator leader: attach to any replica, follow the leader, run the
    /// jobs it deploys here. Flags override the config file; each has a CAIRN_WORKER_*
    /// environment variable (flags win over the environment).
    Run(Box<RunArgs>),
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Verify { output, keys, records_per_key } => verify(&output, keys, records_per_key),
        Command::Run(args) => match run(*args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::from(2)
            }
        },
    }
}

fn verify(output: &std::path::Path, keys: Option<u64>, records_per_key: Option<u64>) -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let expect = Expectation { keys, records_per_key, counts: None };
    match verify_output(output, &expect) {
        Ok(verdict) => {
            println!("{verdict}");
            if verdict.is_exactly_once() { ExitCode::SUCCESS } else { ExitCode::from(1) }
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

fn run(args: RunArgs) -> anyhow::Result<()> {
    let config = args.to_config().context("invalid configuration (see `cairn-worker run --help`)")?;
    if args.print_config {
        print!("{}", toml::to_string_pretty(&config)?);
        return Ok(());
    }
    init_logging(&config.log, config.log_format)?;
    let runtime = tokio::runtime::Runtime::new().context("starting the tokio runtime")?;
    runtime.block_on(serve(config))
}

async fn serve(config: WorkerConfig) -> anyhow::Result<()> {
    // Handlers first: a SIGTERM that arrives while the worker starts must still stop it cleanly.
    let mut signals = ShutdownSignals::install().context("installing the SIGTERM/SIGINT handlers")?;
    let metrics_listener = exporter::bind(config.metrics_listen.as_deref()).await?;
    let mut registry = exporter::new_registry();
    let task_metrics = metrics_listener.as_ref().map(|_| TaskMetrics::register(&mut registry));
    let mut worker = Worker::start_instrumented(config, OperatorRegistry::with_builtins(), task_metrics)?;
    let (stop_metrics, metrics_stopped) = oneshot::channel::<()>();
    let metrics_server = metrics_listener.map(|listener| {
        tokio::spawn(exporter::serve(listener, Arc::new(registry), async move {
            let _ = metrics_stopped.await;
        }))
    });
    let stopped_on_its_own = tokio::select! {
        signal = signals.next() => {
            tracing::info!(signal, "shutting down");
            false
        }
        _ = worker.stopped() => true,
    };
    worker.shutdown().await;
    let _ = stop_metrics.send(());
    if let Some(server) = metrics_server
        && let Err(e) = server.await
    {
        tracing::warn!(error = %e, "the metrics endpoint failed");
    }
    if stopped_on_its_own {
        anyhow::bail!("the worker stopped unexpectedly (see the log)");
    }
    Ok(())
}

fn init_logging(filter: &str, format: LogFormat) -> anyhow::Result<()> {
    let filter =
        EnvFilter::try_new(filter).with_context(|| format!("--log {filter:?} is not a valid filter"))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colours only on a terminal: a log file or a collector gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
    Ok(())
}
