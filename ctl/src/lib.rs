//! `cairn-ctl` is `cairnctl`, the operator CLI of a Cairn cluster: a thin client of the admin
//! API (`cairn.admin.v1.Admin`).
//!
//! - [`cli`]: the command line (clap) and the parsers that validate arguments.
//! - [`commands`]: one module per area (cluster, job, checkpoint, savepoint); each validates its
//!   inputs, makes its calls and prints the reply.
//! - [`client`]: the leader-following client of one command, built in one place, and the
//!   command's deadline (`--timeout`) shared by all its calls.
//! - [`token`]: where the admin token comes from, and in which order.
//! - [`output`]: tables for people, JSON for scripts.
//! - [`errors`]: every failure as one line, and the exit code scripts rely on.
//!
//! A call goes to any endpoint and follows the leader (`cairn_client::LeaderClient`).
//! A mutating command carries one request id for all its retries, so the cluster acts once.

pub mod cli;
pub mod client;
pub mod commands;
pub mod errors;
pub mod output;
pub mod token;

use std::io::Write;
use std::time::Duration;

use clap::CommandFactory;

use crate::cli::{CheckpointCmd, Cli, ClusterCmd, Command, JobCmd, SavepointCmd};
use crate::client::{Session, Target};
use crate::commands::Ctx;
use crate::errors::CtlError;
use crate::token::TokenSources;

/// The `--timeout` of a command that does not set one.
pub fn default_timeout(cmd: &Command) -> Duration {
    match cmd {
        Command::Savepoint(SavepointCmd::Trigger { .. }) | Command::Job(JobCmd::Stop(_)) => {
            Duration::from_secs(600)
        }
        Command::Checkpoint(CheckpointCmd::Trigger { wait: true, .. })
        | Command::Cluster(
            ClusterCmd::AddLearner { .. }
            | ClusterCmd::Promote { .. }
            | ClusterCmd::Remove { .. }
            | ClusterCmd::TransferLeader { .. },
        ) => Duration::from_secs(60),
        _ => Duration::from_secs(30),
    }
}

/// Runs a parsed command line, printing replies to `out`.
pub async fn run(cli: Cli, out: &mut dyn Write) -> Result<(), CtlError> {
    let global = cli.global;
    if let Command::Completions { shell } = cli.command {
        // Rendered into memory first: clap_complete panics when its writer fails (e.g. `| head`).
        let mut script = Vec::new();
        clap_complete::generate(shell, &mut Cli::command(), "cairnctl", &mut script);
        out.write_all(&script)?;
        out.flush()?;
        return Ok(());
    }
    let timeout = global.timeout.unwrap_or_else(|| default_timeout(&cli.command));
    let tls = cairn_proto::tls::TlsFiles::overlay(
        None,
        global.cert_file.as_deref(),
        global.key_file.as_deref(),
        global.ca_file.as_deref(),
    )
    .map(|files| files.load_client())
    .transpose()
    .map_err(|e| CtlError::Usage(e.to_string()))?;
    let target = Target {
        endpoints: global.endpoints,
        token: TokenSources::from_flags_and_env(global.token, global.token_file),
        tls,
    };
    let mut ctx = Ctx {
        session: Session::new(target, timeout),
        output: global.output,
        request_id: global.request_id.unwrap_or_else(commands::new_request_id),
        out,
    };
    match cli.command {
        Command::Cluster(cmd) => commands::cluster::run(&mut ctx, cmd).await,
        Command::Job(cmd) => commands::job::run(&mut ctx, cmd).await,
        Command::Checkpoint(cmd) => commands::checkpoint::run(&mut ctx, cmd).await,
        Command::Savepoint(cmd) => commands::savepoint::run(&mut ctx, cmd).await,
        Command::Completions { .. } => Ok(()),
    }
}
