//! The command line: clap definitions and the argument parsers that validate values before any
//! call is made.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

const LONG_ABOUT: &str = "\
Operate a Cairn cluster: membership, jobs, checkpoints and savepoints, over the admin API
(cairn.admin.v1.Admin). Any replica may be named in --endpoints; calls follow the leader.

Admin token, first found wins: --token, --token-file, CAIRN_ADMIN_TOKEN, CAIRN_ADMIN_TOKEN_FILE
(a trailing newline in a file is ignored). A single-node cluster writes its token to
<data_dir>/admin-token.

Mutating commands send a request id (random per invocation, or --request-id): re-running a
command with the same --request-id after an unclear failure does not act twice.

Exit codes:
  0  ok
  1  generic or internal error
  2  usage error (bad arguments, unreadable or invalid input files)
  3  unauthenticated (missing or wrong admin token)
  4  not found (job, checkpoint, savepoint, node)
  5  refused: invalid argument or failed precondition; nothing changed
  6  no leader reachable, unavailable, or timed out
  7  the checkpoint or savepoint did not complete (checkpoint trigger --wait)";

/// `cairnctl`: the operator CLI of a Cairn cluster.
#[derive(Debug, Parser)]
#[command(name = "cairnctl", version, about = "Operate a Cairn cluster", long_about = LONG_ABOUT)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: Command,
}

/// Flags every command accepts, before or after the subcommand.
#[derive(Debug, Clone, Args)]
pub struct GlobalArgs {
    /// Replica addresses (host:port, comma-separated); any replica will do, calls follow the leader.
    #[arg(
        long,
        global = true,
        env = "CAIRN_ENDPOINTS",
        value_delimiter = ',',
        default_value = "127.0.0.1:7400",
        value_parser = parse_endpoint
    )]
    pub endpoints: Vec<String>,
    /// The cluster's admin token [env: CAIRN_ADMIN_TOKEN].
    #[arg(long, global = true, conflicts_with = "token_file", value_name = "TOKEN")]
    pub token: Option<String>,
    /// A file holding the admin token [env: CAIRN_ADMIN_TOKEN_FILE].
    #[arg(long, global = true, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// The cluster CA (PEM): connect with TLS and trust the replicas it signed.
    #[arg(long, global = true, env = "CAIRN_TLS_CA_FILE", value_name = "FILE")]
    pub ca_file: Option<PathBuf>,
    /// A client certificate (PEM) to present, with --key-file (optional with TLS).
    #[arg(
        long,
        global = true,
        env = "CAIRN_TLS_CERT_FILE",
        value_name = "FILE",
        requires = "key_file",
        requires = "ca_file"
    )]
    pub cert_file: Option<PathBuf>,
    /// The private key (PEM) of --cert-file.
    #[arg(long, global = true, env = "CAIRN_TLS_KEY_FILE", value_name = "FILE", requires = "cert_file")]
    pub key_file: Option<PathBuf>,
    /// How replies are printed: aligned tables, or the reply message as JSON (for jq).
    #[arg(long, short = 'o', global = true, value_enum, default_value_t = Output::Table)]
    pub output: Output,
    /// Bound on the whole command, retries and waits included (default 30s; 60s for waits and
    /// membership changes; 10m for savepoints).
    #[arg(long, global = true, value_parser = parse_timeout)]
    pub timeout: Option<Duration>,
    /// Request id of a mutating command, to retry it safely (1-128 of [A-Za-z0-9._:-]).
    #[arg(long, global = true, value_parser = parse_request_id)]
    pub request_id: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Cluster membership and leadership.
    #[command(subcommand)]
    Cluster(ClusterCmd),
    /// Submit, inspect, reconfigure, cancel and stop jobs.
    #[command(subcommand)]
    Job(JobCmd),
    /// Trigger and inspect checkpoints.
    #[command(subcommand)]
    Checkpoint(CheckpointCmd),
    /// Take, list and dispose savepoints.
    #[command(subcommand)]
    Savepoint(SavepointCmd),
    /// Print a shell completion script (e.g. `cairnctl completions bash > /etc/bash_completion.d/cairnctl`).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

#[derive(Debug, Subcommand)]
pub enum ClusterCmd {
    /// Members, roles, leader, term, log indexes, replication lag and health.
    Status,
    /// Add a node as a non-voting learner (answers once it caught up).
    AddLearner {
        #[arg(value_parser = node_id())]
        id: u64,
        /// The node's gRPC address, host:port.
        #[arg(value_parser = parse_endpoint)]
        addr: String,
    },
    /// Turn a learner into a voter.
    Promote {
        #[arg(value_parser = node_id())]
        id: u64,
    },
    /// Remove a voter or learner.
    Remove {
        #[arg(value_parser = node_id())]
        id: u64,
    },
    /// Hand leadership to a voter.
    TransferLeader {
        #[arg(value_parser = node_id())]
        id: u64,
    },
    /// The leader's workers: state, slots used and free, the jobs on each, how each authenticated.
    Workers,
}

#[derive(Debug, Subcommand)]
pub enum JobCmd {
    /// Register and start a job.
    Submit(Box<SubmitArgs>),
    /// All jobs with status and latest checkpoint.
    List,
    /// Status, checkpoint configuration, tasks and workers of a job.
    Describe {
        #[arg(value_parser = parse_job_id)]
        job: String,
    },
    /// Cancel a job: its tasks are cancelled and it ends `canceled`.
    Cancel {
        #[arg(value_parser = parse_job_id)]
        job: String,
    },
    /// Change a job's checkpoint configuration; fields not given keep their value.
    Config(ConfigArgs),
    /// Stop a job after a final savepoint.
    Stop(StopArgs),
}

#[derive(Debug, Args)]
pub struct SubmitArgs {
    #[arg(value_parser = parse_job_id)]
    pub job: String,
    /// The job graph as a JSON file.
    #[arg(long, value_name = "FILE")]
    pub graph: PathBuf,
    /// Human name (defaults to the id).
    #[arg(long)]
    pub name: Option<String>,
    #[command(flatten)]
    pub checkpoint: CheckpointFlags,
    /// Restore from this savepoint (or retained checkpoint) directory.
    #[arg(long, value_name = "DIR", value_parser = parse_abs_dir)]
    pub from_savepoint: Option<String>,
    /// Skip savepoint state that no operator of the graph claims.
    #[arg(long, requires = "from_savepoint")]
    pub allow_non_restored_state: bool,
    /// Who owns the files of --from-savepoint: `no_claim` (default; never deleted by this job,
    /// whose first checkpoint is full) or `claim` (deleted once this job's first checkpoint
    /// completed).
    #[arg(long, value_enum, requires = "from_savepoint")]
    pub restore_mode: Option<RestoreModeArg>,
    /// How the leader places the subtasks on workers: `pack` (default; the whole job on one
    /// worker when one has room) or `spread` (over every worker with free slots).
    #[arg(long, value_enum)]
    pub placement: Option<PlacementArg>,
    #[command(flatten)]
    pub restart: RestartFlags,
}

/// How the leader places a job's subtasks on workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PlacementArg {
    Pack,
    Spread,
}

/// Who owns the snapshot a job restores from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RestoreModeArg {
    #[value(name = "no_claim")]
    NoClaim,
    Claim,
}

/// The job's restart strategy: a name (or JSON, inline or `@file`) and flags for its common
/// parameters (flags win). Unset: the cluster's default.
#[derive(Debug, Clone, Default, Args)]
pub struct RestartFlags {
    /// `none`, `fixed-delay`, `failure-rate`, `exponential-delay`, or the strategy as JSON
    /// (inline or `@file`), e.g. '{"type":"fixed-delay","attempts":3,"delay":"10s"}'.
    #[arg(long, value_name = "NAME|JSON|@FILE")]
    pub restart_strategy: Option<String>,
    /// fixed-delay: restarts allowed before the job fails.
    #[arg(long, requires = "restart_strategy")]
    pub restart_attempts: Option<u32>,
    /// fixed-delay and failure-rate: pause before a restart.
    #[arg(long, value_parser = parse_duration, requires = "restart_strategy")]
    pub restart_delay: Option<Duration>,
}

#[derive(Debug, Args)]
pub struct ConfigArgs {
    #[arg(value_parser = parse_job_id)]
    pub job: String,
    #[command(flatten)]
    pub checkpoint: CheckpointFlags,
}

/// Checkpoint configuration: a JSON object, and flags for its common fields (flags win).
#[derive(Debug, Clone, Default, Args)]
pub struct CheckpointFlags {
    /// Checkpoint configuration as JSON, inline or `@file` (e.g. '{"interval":"10s","retained":3}').
    #[arg(long = "checkpoint", value_name = "JSON|@FILE")]
    pub json: Option<String>,
    /// Periodic checkpoint interval (e.g. 10s), or `off`.
    #[arg(long, value_parser = parse_interval)]
    pub interval: Option<Interval>,
    /// A checkpoint not completed after this long is expired.
    #[arg(long, value_parser = parse_duration)]
    pub checkpoint_timeout: Option<Duration>,
    /// Minimum pause between one checkpoint's end and the next trigger.
    #[arg(long, value_parser = parse_duration)]
    pub min_pause: Option<Duration>,
    /// Checkpoints in flight at once.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_concurrent: Option<u32>,
    /// Consecutive checkpoint failures tolerated before the job fails.
    #[arg(long)]
    pub tolerable_failures: Option<u32>,
    /// Completed checkpoints retained.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub retained: Option<u32>,
    /// Default savepoint directory (absolute).
    #[arg(long, value_name = "DIR", value_parser = parse_abs_dir)]
    pub savepoint_dir: Option<String>,
    /// Checkpoint storage root (absolute).
    #[arg(long, value_name = "DIR", value_parser = parse_abs_dir)]
    pub checkpoint_dir: Option<String>,
    /// What happens to retained checkpoints when the job ends: `retain_on_cancellation`,
    /// `delete_on_cancellation` (default: a failed job keeps them) or `no_externalized`.
    #[arg(long, value_parser = ["retain_on_cancellation", "delete_on_cancellation", "no_externalized"])]
    pub externalized_retention: Option<String>,
    /// Unaligned checkpoints: `true` lets barriers overtake backpressured data (persisted with
    /// the checkpoint as in-flight data), `false` keeps them aligned. Savepoints stay aligned.
    #[arg(long, value_name = "true|false")]
    pub unaligned: Option<bool>,
    /// With --unaligned true: start aligned, turn unaligned after this long (e.g. 2s; 0: at once).
    #[arg(long, value_parser = parse_duration)]
    pub aligned_checkpoint_timeout: Option<Duration>,
}

/// A checkpoint interval, or periodic checkpoints off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interval {
    Every(Duration),
    Off,
}

#[derive(Debug, Args)]
pub struct StopArgs {
    #[arg(value_parser = parse_job_id)]
    pub job: String,
    /// Take a final savepoint, then let the tasks finish (required; `job cancel` stops without one).
    #[arg(long, required = true)]
    pub savepoint: bool,
    /// Savepoint directory (absolute); defaults to the job's savepoint directory.
    #[arg(long, value_name = "DIR", value_parser = parse_abs_dir)]
    pub dir: Option<String>,
    /// Advance to the end of event time before the savepoint.
    #[arg(long)]
    pub drain: bool,
}

#[derive(Debug, Subcommand)]
pub enum CheckpointCmd {
    /// Start a checkpoint now and print its id; --wait waits until it completed.
    Trigger {
        #[arg(value_parser = parse_job_id)]
        job: String,
        /// Wait for the outcome (bounded by --timeout, default 60s); exit 7 if it failed.
        #[arg(long)]
        wait: bool,
    },
    /// Counts, latest checkpoints, summaries and recent history.
    List {
        #[arg(value_parser = parse_job_id)]
        job: String,
    },
    /// One checkpoint with its per-subtask figures.
    Describe {
        #[arg(value_parser = parse_job_id)]
        job: String,
        #[arg(value_parser = checkpoint_id())]
        id: u64,
    },
}

#[derive(Debug, Subcommand)]
pub enum SavepointCmd {
    /// Take a savepoint and print its path once it completed.
    Trigger {
        #[arg(value_parser = parse_job_id)]
        job: String,
        /// Savepoint directory (absolute); defaults to the job's savepoint directory.
        #[arg(long, value_name = "DIR", value_parser = parse_abs_dir)]
        dir: Option<String>,
    },
    /// The job's savepoints.
    List {
        #[arg(value_parser = parse_job_id)]
        job: String,
    },
    /// Forget a savepoint and delete its directory.
    Dispose {
        #[arg(value_parser = parse_job_id)]
        job: String,
        #[arg(value_parser = checkpoint_id())]
        id: u64,
    },
}

fn node_id() -> clap::builder::RangedU64ValueParser<u64> {
    clap::value_parser!(u64).range(1..)
}

fn checkpoint_id() -> clap::builder::RangedU64ValueParser<u64> {
    clap::value_parser!(u64).range(1..)
}

/// `host:port`, with an optional `http://` in front.
pub fn parse_endpoint(s: &str) -> Result<String, String> {
    let e = cairn_proto::addr::strip_scheme(s);
    if cairn_proto::addr::is_host_port(e) {
        Ok(e.to_owned())
    } else {
        Err(format!("{s:?} is not a host:port address (e.g. 127.0.0.1:7400)"))
    }
}

pub fn parse_job_id(s: &str) -> Result<String, String> {
    cairn_protocol::job::JobId::new(s).map(|id| id.as_str().to_owned()).map_err(|e| e.to_string())
}

pub fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e}; use a duration like 500ms, 10s or 5m"))
}

fn parse_timeout(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d.is_zero() {
        return Err("the timeout must be above zero".into());
    }
    Ok(d)
}

fn parse_interval(s: &str) -> Result<Interval, String> {
    if s.eq_ignore_ascii_case("off") {
        return Ok(Interval::Off);
    }
    parse_duration(s).map(Interval::Every)
}

/// Paths name directories as the replicas and workers see them, so they must be absolute.
pub fn parse_abs_dir(s: &str) -> Result<String, String> {
    if s.trim().is_empty() {
        return Err("the directory must not be empty".into());
    }
    if !std::path::Path::new(s).is_absolute() {
        return Err(format!(
            "{s:?} is relative; give an absolute directory (replicas and workers resolve it, not this shell)"
        ));
    }
    cairn_protocol::operators::check_absolute_path(s).map_err(|why| format!("the directory {why}"))?;
    Ok(s.to_owned())
}

pub fn parse_request_id(s: &str) -> Result<String, String> {
    let ok = !s.is_empty()
        && s.len() <= 128
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'));
    if ok { Ok(s.to_owned()) } else { Err("a request id is 1 to 128 characters of [A-Za-z0-9._:-]".into()) }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;
    use clap::error::ErrorKind;

    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("cairnctl").chain(args.iter().copied()))
    }

    #[test]
    fn definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn global_flags_go_before_or_after_the_subcommand() {
        let cli = parse(&["job", "list", "--endpoints", "a:1,b:2", "-o", "json", "--timeout", "5s"]).unwrap();
        assert_eq!(cli.global.endpoints, ["a:1", "b:2"]);
        assert_eq!(cli.global.output, Output::Json);
        assert_eq!(cli.global.timeout, Some(Duration::from_secs(5)));
        let cli = parse(&["--endpoints", "http://h:7401/", "cluster", "status"]).unwrap();
        assert_eq!(cli.global.endpoints, ["h:7401"]);
        assert!(matches!(cli.command, Command::Cluster(ClusterCmd::Status)));
        let cli = parse(&["cluster", "workers", "-o", "json"]).unwrap();
        assert!(matches!(cli.command, Command::Cluster(ClusterCmd::Workers)));
        assert!(parse(&["cluster", "workers", "extra"]).is_err());
    }

    #[test]
    fn submit_takes_graph_checkpoint_flags_and_savepoint() {
        let cli = parse(&[
            "job",
            "submit",
            "demo",
            "--graph",
            "g.json",
            "--interval",
            "10s",
            "--retained",
            "3",
            "--from-savepoint",
            "/sp/savepoint-demo-4",
            "--allow-non-restored-state",
        ])
        .unwrap();
        let Command::Job(JobCmd::Submit(s)) = cli.command else { panic!("not submit") };
        assert_eq!(s.job, "demo");
        assert_eq!(s.checkpoint.interval, Some(Interval::Every(Duration::from_secs(10))));
        assert_eq!(s.checkpoint.retained, Some(3));
        assert_eq!(s.from_savepoint.as_deref(), Some("/sp/savepoint-demo-4"));
        assert!(s.allow_non_restored_state);
    }

    #[test]
    fn bad_values_are_usage_errors_before_any_call() {
        let bad: &[&[&str]] = &[
            &["job", "describe", "bad/id"],
            &["job", "describe", ".hidden"],
            &["job", "submit", "a"],
            &["job", "submit", "a", "--graph", "g", "--interval", "soon"],
            &["job", "submit", "a", "--graph", "g", "--retained", "0"],
            &["job", "submit", "a", "--graph", "g", "--allow-non-restored-state"],
            &["job", "stop", "a"],
            &["job", "stop", "a", "--savepoint", "--dir", "relative"],
            &["checkpoint", "describe", "a", "0"],
            &["cluster", "add-learner", "4", "nohostport"],
            &["--endpoints", "x", "cluster", "status"],
            &["--timeout", "0s", "cluster", "status"],
            &["--request-id", "has space", "job", "cancel", "a"],
            &["--token", "t", "--token-file", "f", "cluster", "status"],
            &["completions", "tcsh"],
        ];
        for args in bad {
            let err = parse(args).expect_err(&format!("{args:?} parsed"));
            assert_eq!(err.exit_code(), 2, "{args:?}: {err}");
        }
    }

    #[test]
    fn stop_requires_savepoint_and_interval_can_be_off() {
        let cli = parse(&["job", "stop", "a", "--savepoint", "--drain", "--dir", "/sp"]).unwrap();
        let Command::Job(JobCmd::Stop(s)) = cli.command else { panic!("not stop") };
        assert!(s.savepoint && s.drain);
        let cli = parse(&["job", "config", "a", "--interval", "off"]).unwrap();
        let Command::Job(JobCmd::Config(c)) = cli.command else { panic!("not config") };
        assert_eq!(c.checkpoint.interval, Some(Interval::Off));
        let err = parse(&["job", "stop", "a"]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::MissingRequiredArgument);
    }

    #[test]
    fn help_documents_exit_codes() {
        let help = Cli::command().render_long_help().to_string();
        for needle in ["Exit codes", "3  unauthenticated", "7  the checkpoint", "CAIRN_ADMIN_TOKEN_FILE"] {
            assert!(help.contains(needle), "help lacks {needle:?}");
        }
    }
}
