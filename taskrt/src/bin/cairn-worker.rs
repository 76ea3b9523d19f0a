//! `cairn-worker`: the task runtime process.
//!
//! Today it offers `verify`, the exactly-once verifier of the demo pipeline's committed output.
//! Running tasks against a coordinator (`run`) needs the coordinator's task gateway, which this
//! build does not contain; the subcommand says so and exits with an error.

use std::path::PathBuf;
use std::process::ExitCode;

use cairn_taskrt::demo::verify::{Expectation, verify_output};
use clap::{Parser, Subcommand};

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
    /// Run tasks for a coordinator (not available in this build).
    Run {
        /// Address of any coordinator replica.
        #[arg(long)]
        coordinator: Option<String>,
    },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Verify { output, keys, records_per_key } => {
            let expect = Expectation { keys, records_per_key, counts: None };
            match verify_output(&output, &expect) {
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
        Command::Run { .. } => {
            eprintln!(
                "error: `cairn-worker run` is not available in this build: the coordinator's task gateway \
                 client has not been integrated yet"
            );
            ExitCode::from(2)
        }
    }
}
