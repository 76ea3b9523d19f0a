//! Power-loss trials of Cairn on crashfs (see `docs/POWER-LOSS.md`): real replicas and a
//! worker lose power on one replica, a majority or everything, at seeded random points; then
//! everything restarts and the invariants are checked.
//!
//! ```text
//! cargo build --release --workspace --bins
//! cargo run --release -p cairn-tests --bin cairn-powerloss -- --trials 100 --seed 42 [--scenario one|majority|all] [--torn] [--parallel 2]
//! cargo run --release -p cairn-tests --bin cairn-powerloss -- --scenario all --trial-seed 0x1f2e...   # replay one trial
//! ```
//!
//! Needs /dev/fuse, `fusermount3` (Debian package fuse3) and root. Exit status: 0 when every
//! trial passed, 1 when a trial found a violation, 2 when trials could not be made.

#[path = "../powerloss/mod.rs"]
mod powerloss;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Parser;
use powerloss::report::{Outcome, RunSummary};
use powerloss::schedule::{Scenario, Schedule, trial_seed};
use powerloss::trial::{TrialConfig, run_trial};

#[derive(Parser, Debug)]
#[command(about = "Power-loss trials of Cairn's replicas, worker and storage on crashfs")]
struct Args {
    /// Trials per scenario.
    #[arg(long, default_value_t = 10)]
    trials: u64,
    /// Seed of the run (random when not given; printed first). The same seed replays the same
    /// schedules.
    #[arg(long, value_parser = parse_seed)]
    seed: Option<u64>,
    /// Scenarios to run (repeat or comma-separate): one, majority, all. Default: all three,
    /// interleaved.
    #[arg(long, value_delimiter = ',')]
    scenario: Vec<Scenario>,
    /// Replay a single trial by its own seed (as printed for a failed trial); needs exactly
    /// one --scenario.
    #[arg(long, value_parser = parse_seed)]
    trial_seed: Option<u64>,
    /// Torn writes: each unsynced 512-byte sector survives the power loss with a seeded
    /// probability instead of being dropped whole.
    #[arg(long)]
    torn: bool,
    /// Where the logs and disks of failed trials are copied.
    #[arg(long, default_value = "target/powerloss")]
    artifacts: PathBuf,
    /// Bound on the recovery after the power loss.
    #[arg(long, default_value = "90s", value_parser = humantime::parse_duration)]
    recovery_timeout: Duration,
    /// Stop at the first trial with a violation.
    #[arg(long)]
    stop_on_violation: bool,
    /// Print the summary table every this many trials (0: only at the end).
    #[arg(long, default_value_t = 30)]
    summary_every: u64,
    /// Trials run at the same time (each with its own mounts, processes and ports). A trial
    /// spends most of its time waiting for a cut or a recovery, so 2 roughly doubles the trials
    /// per hour on 2 cores; the schedules and verdicts do not depend on it.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=8))]
    parallel: u64,
}

fn parse_seed(s: &str) -> Result<u64, String> {
    let parsed = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.parse(),
    };
    parsed.map_err(|e| format!("invalid seed {s:?}: {e}"))
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,openraft=error,fuser=error")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("cairn-powerloss: cannot start the runtime: {error}");
            return std::process::ExitCode::from(2);
        }
    };
    let code = runtime.block_on(run(args));
    std::process::ExitCode::from(code)
}

async fn run(args: Args) -> u8 {
    for name in ["cairn", "cairn-worker"] {
        if let Err(error) = cairn_tests::procs::binary(name) {
            eprintln!("cairn-powerloss: {error}");
            return 2;
        }
    }
    if let Err(error) = preflight() {
        eprintln!("cairn-powerloss: cannot mount crashfs: {error:#}");
        return 2;
    }
    let scenarios = if args.scenario.is_empty() { Scenario::ALL.to_vec() } else { args.scenario.clone() };
    let config =
        TrialConfig { artifacts: Some(args.artifacts.clone()), recovery_timeout: args.recovery_timeout };

    // The trials: (scenario, trial seed), interleaved so that a partial run covers every scenario.
    let mut plan = Vec::new();
    let run_seed;
    if let Some(seed) = args.trial_seed {
        let [scenario] = scenarios.as_slice() else {
            eprintln!("cairn-powerloss: --trial-seed replays one trial: give exactly one --scenario");
            return 2;
        };
        run_seed = None;
        plan.push((*scenario, seed));
    } else {
        let seed = args.seed.unwrap_or_else(rand::random);
        run_seed = Some(seed);
        for index in 0..args.trials {
            for scenario in &scenarios {
                plan.push((*scenario, trial_seed(seed, *scenario, index)));
            }
        }
    }
    match run_seed {
        Some(seed) => println!(
            "cairn-powerloss: seed {seed}, {} trials per scenario ({}), torn writes {}; replay the run with --seed {seed}",
            args.trials,
            scenarios.iter().map(|s| s.name()).collect::<Vec<_>>().join(", "),
            if args.torn { "on" } else { "off" }
        ),
        None => println!("cairn-powerloss: replaying one trial"),
    }

    let started = Instant::now();
    let mut summary = RunSummary::default();
    let total = plan.len();
    let mut pending = plan.into_iter();
    let mut running = tokio::task::JoinSet::new();
    let mut done = 0usize;
    let mut stopping = false;
    loop {
        while !stopping && running.len() < args.parallel as usize {
            let Some((scenario, seed)) = pending.next() else { break };
            let schedule = Schedule::from_seed(seed, scenario, args.torn);
            let config = config.clone();
            running.spawn(async move {
                let trial_started = Instant::now();
                let outcome = match run_trial(&schedule, &config).await {
                    Ok(report) => Outcome::Ran(Box::new(report)),
                    Err(error) => Outcome::NotRun {
                        seed,
                        reason: format!("{error:#}"),
                        elapsed: trial_started.elapsed(),
                    },
                };
                (schedule, outcome)
            });
        }
        let Some(joined) = running.join_next().await else { break };
        let (schedule, outcome) = match joined {
            Ok(finished) => finished,
            Err(error) => {
                eprintln!("cairn-powerloss: a trial's task failed: {error}");
                return 2;
            }
        };
        done += 1;
        print_trial(done, total, &schedule, &outcome, args.torn);
        summary.add(schedule.scenario, &outcome);
        let violated = matches!(&outcome, Outcome::Ran(r) if !r.violations.is_empty());
        if args.summary_every > 0 && (done as u64).is_multiple_of(args.summary_every) && done < total {
            println!("--- after {done} trials ({:.0} s):\n{summary}", started.elapsed().as_secs_f64());
        }
        if violated && args.stop_on_violation && !stopping {
            println!("stopping at the first violation (--stop-on-violation; trials already running finish)");
            stopping = true;
        }
    }
    println!("--- summary ({:.0} s in all)\n{summary}", started.elapsed().as_secs_f64());
    if let Ok(load) = std::fs::read_to_string("/proc/loadavg") {
        println!("load average at the end: {}", load.trim());
    }
    if summary.any_violation() {
        1
    } else if summary.clean() {
        0
    } else {
        2
    }
}

fn print_trial(n: usize, total: usize, schedule: &Schedule, outcome: &Outcome, torn: bool) {
    let replay = format!(
        "--scenario {} --trial-seed {:#018x}{}",
        schedule.scenario,
        schedule.seed,
        if torn { " --torn" } else { "" }
    );
    match outcome {
        Outcome::Ran(report) => {
            let verdict = if report.violations.is_empty() {
                "ok".to_owned()
            } else {
                format!("{} VIOLATION(S)", report.violations.len())
            };
            let cuts: Vec<String> = report
                .cuts
                .iter()
                .map(|cut| {
                    format!(
                        "replicas {:?}{} (leader {})",
                        cut.victims,
                        if schedule.scenario == Scenario::All { " + worker, storage, output" } else { "" },
                        cut.leader.map_or_else(|| "unknown".to_owned(), |l| l.to_string())
                    )
                })
                .collect();
            println!(
                "[{n}/{total}] {} {:#018x}: {verdict} in {:.1} s; lost power: {}; {} bytes and {} names dropped; \
                 {} allocations, {} savepoints, {} checkpoints",
                schedule.scenario,
                schedule.seed,
                report.elapsed.as_secs_f64(),
                cuts.join(", then "),
                report.bytes_dropped,
                report.names_lost,
                report.allocations,
                report.savepoints,
                report.checkpoints,
            );
            if !report.violations.is_empty() {
                println!("    schedule: {schedule}");
                for violation in &report.violations {
                    println!("    - {violation}");
                }
                if let Some(dir) = &report.artifacts {
                    println!("    logs and disks: {}", dir.display());
                }
                println!("    replay: cairn-powerloss {replay}");
            }
        }
        Outcome::NotRun { reason, elapsed, .. } => {
            println!(
                "[{n}/{total}] {} {:#018x}: NOT RUN after {:.1} s: {reason}\n    replay: cairn-powerloss {replay}",
                schedule.scenario,
                schedule.seed,
                elapsed.as_secs_f64()
            );
        }
    }
}

/// Mounts and unmounts one crashfs, to fail early and clearly when FUSE is missing.
fn preflight() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let fs = cairn_crashfs::CrashFs::mount(dir.path(), cairn_crashfs::MountOptions::default())?;
    fs.unmount()?;
    Ok(())
}
