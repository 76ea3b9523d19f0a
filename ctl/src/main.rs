//! `cairnctl`: parses the command line, runs the command, and exits with the documented code
//! (see `cairnctl --help`).

use clap::Parser;

fn main() -> std::process::ExitCode {
    // clap prints usage errors itself and exits with 2 (0 for --help and --version).
    let cli = cairn_ctl::cli::Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cairnctl: cannot start the async runtime: {e}");
            return std::process::ExitCode::from(cairn_ctl::errors::Exit::Internal.code());
        }
    };
    let mut stdout = std::io::stdout().lock();
    match runtime.block_on(cairn_ctl::run(cli, &mut stdout)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cairnctl: {e}");
            std::process::ExitCode::from(e.exit().code())
        }
    }
}
