//! `cairn-chaos`: the container chaos suite (run it through `deploy/chaos/run.sh`, which brings
//! up the compose project and tears it down).
//!
//! Against a running compose project with the demo job, a nemesis kills, pauses and partitions
//! the leader, partitions the job's worker, restarts a replica and fills the checkpoint volume,
//! on a seeded schedule; an observer records the history; at the end the job is stopped with a
//! savepoint, its output verified, and the design's invariants checked. Prints the seed first,
//! the report last; exits 1 on any failed check, 2 when the run itself could not be made.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use cairn_tests::chaos::runner::{RunConfig, run};
use cairn_tests::chaos::schedule::{Schedule, random_seed};
use clap::Parser;

#[derive(Debug, Parser)]
#[command(name = "cairn-chaos", version, about = "Cairn's container chaos suite")]
struct Args {
    /// The compose project to inject faults into (`docker-compose -p NAME`).
    #[arg(long)]
    project: String,
    /// File holding the cluster's admin token (the compose secret).
    #[arg(long, value_name = "FILE")]
    token_file: PathBuf,
    /// Replay the schedule of this seed (printed by every run).
    #[arg(long)]
    seed: Option<u64>,
    /// Every fault kind exactly once (~2-3 minutes), for CI.
    #[arg(long)]
    quick: bool,
    /// How long to keep injecting faults (ignored with --quick).
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// A fault not followed by a completed checkpoint within this long fails the run.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    recovery_bound: Duration,
    /// The job to watch (the compose project submits `demo`).
    #[arg(long, default_value = "demo")]
    job: String,
    /// Write the recorded history here as JSON.
    #[arg(long, value_name = "FILE")]
    history: Option<PathBuf>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let seed = args.seed.unwrap_or_else(random_seed);
    let mode = if args.quick {
        " --quick".to_owned()
    } else {
        format!(" --duration {}", humantime::format_duration(args.duration))
    };
    println!("cairn-chaos: seed {seed} (replay with --seed {seed}{mode})");
    let result = tokio::runtime::Runtime::new()
        .context("starting the tokio runtime")
        .and_then(|rt| rt.block_on(main_async(args, seed, mode)));
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("cairn-chaos: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

async fn main_async(args: Args, seed: u64, mode: String) -> anyhow::Result<bool> {
    let token = std::fs::read_to_string(&args.token_file)
        .with_context(|| format!("cannot read the admin token file {}", args.token_file.display()))?
        .trim()
        .to_owned();
    if token.is_empty() {
        anyhow::bail!("the admin token file {} is empty", args.token_file.display());
    }
    let cfg = RunConfig {
        project: args.project.clone(),
        job: args.job.clone(),
        token,
        schedule: if args.quick { Schedule::quick(seed) } else { Schedule::long(seed) },
        whole_schedule: args.quick,
        duration: args.duration,
        recovery_bound: args.recovery_bound,
        replay: format!("deploy/chaos/run.sh --seed {seed}{mode}"),
    };
    let outcome = run(&cfg).await?;
    if let Some(path) = &args.history {
        let json = serde_json::to_string_pretty(&outcome.history)?;
        std::fs::write(path, json).with_context(|| format!("writing the history to {}", path.display()))?;
        eprintln!("cairn-chaos: history written to {}", path.display());
    }
    println!("{}", outcome.report);
    Ok(outcome.passed())
}
