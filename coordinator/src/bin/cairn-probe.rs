//! `cairn-probe`: a dependency-free check for container images that have no shell.
//!
//! - `cairn-probe health <host:port>`: calls the standard `grpc.health.v1.Health/Check` of one
//!   replica; exits 0 when it answers `SERVING`, 1 otherwise. It is the image's `HEALTHCHECK`.
//! - `cairn-probe checkpoints --job <id> --min <n> <host:port>...`: follows the leader, reads the
//!   job from the replicated store and exits 0 once at least `n` of its checkpoints completed
//!   (printing the count either way), 1 otherwise. Smoke tests poll it after a rollout.
//!
//! Exit status 1 means "not (yet) healthy"; clap's usage errors exit 2.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use cairn_client::{ClientConfig, LeaderClient};
use cairn_proto::addr::is_host_port;
use clap::{Parser, Subcommand};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

#[derive(Debug, Parser)]
#[command(name = "cairn-probe", version, about = "Health and progress checks of a Cairn cluster")]
struct Cli {
    /// Bound on the whole check (connection, leader discovery and the call).
    #[arg(long, global = true, default_value = "3s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Exit 0 if the replica's gRPC health service answers SERVING.
    Health {
        /// The replica's gRPC address, host:port (e.g. 127.0.0.1:7400).
        addr: String,
        /// Health service name to ask about; empty means the whole server.
        #[arg(long, default_value = "")]
        service: String,
    },
    /// Exit 0 if the job has completed at least `--min` checkpoints.
    Checkpoints {
        /// Job id.
        #[arg(long)]
        job: String,
        /// Completed checkpoints required.
        #[arg(long, default_value_t = 1)]
        min: u64,
        /// The cluster's admin token (needed when the replicas require one).
        #[arg(long, env = "CAIRN_ADMIN_TOKEN", hide_env_values = true)]
        token: Option<String>,
        /// Replica addresses, host:port; the leader is found from any of them.
        #[arg(required = true)]
        addrs: Vec<String>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cairn-probe: cannot start the tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let timeout = cli.timeout;
    let outcome = runtime.block_on(async move {
        tokio::time::timeout(timeout, run(cli.command, timeout)).await.unwrap_or_else(|_| {
            Err(anyhow::anyhow!("no answer within {}", humantime::format_duration(timeout)))
        })
    });
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cairn-probe: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(command: Command, timeout: Duration) -> anyhow::Result<()> {
    match command {
        Command::Health { addr, service } => health(&addr, service).await,
        Command::Checkpoints { job, min, token, addrs } => {
            checkpoints(&job, min, token, &addrs, timeout).await
        }
    }
}

fn check_addr(addr: &str) -> anyhow::Result<()> {
    if is_host_port(addr) {
        Ok(())
    } else {
        anyhow::bail!("{addr:?} is not a host:port address (e.g. 127.0.0.1:7400, without http://)")
    }
}

async fn health(addr: &str, service: String) -> anyhow::Result<()> {
    check_addr(addr)?;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .with_context(|| format!("{addr:?} is not a valid address"))?
        .connect()
        .await
        .with_context(|| format!("cannot connect to {addr}"))?;
    let reply = HealthClient::new(channel)
        .check(HealthCheckRequest { service: service.clone() })
        .await
        .with_context(|| format!("health check of {addr} failed"))?
        .into_inner();
    let status = ServingStatus::try_from(reply.status).unwrap_or(ServingStatus::Unknown);
    if status == ServingStatus::Serving {
        println!("{addr}: SERVING");
        Ok(())
    } else {
        anyhow::bail!("{addr}: {}", status.as_str_name())
    }
}

async fn checkpoints(
    job: &str,
    min: u64,
    token: Option<String>,
    addrs: &[String],
    timeout: Duration,
) -> anyhow::Result<()> {
    if job.trim().is_empty() {
        anyhow::bail!("--job must name a job id");
    }
    for addr in addrs {
        check_addr(addr)?;
    }
    let token = token.filter(|t| !t.is_empty());
    let config = ClientConfig {
        // Inside the probe's own bound, so the client's error (which names the last failure)
        // is the one reported.
        deadline: timeout.mul_f64(0.9),
        attempt_timeout: timeout.min(Duration::from_secs(2)),
        token,
        ..ClientConfig::default()
    };
    let mut client = LeaderClient::new(addrs, config)?;
    let record = client.get_job(job).await?;
    let latest = record.completed_checkpoint_ids.last().copied().unwrap_or(0);
    let line = format!(
        "job {job}: {} checkpoints completed (latest {latest}, status {}, attempt {})",
        record.num_completed, record.status, record.attempts
    );
    if record.num_completed >= min {
        println!("{line}");
        Ok(())
    } else {
        anyhow::bail!("{line}; waiting for at least {min}")
    }
}
