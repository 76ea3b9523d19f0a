//! SIGTERM / SIGINT handling shared by Cairn's binaries (`cairn`, `cairn-worker`, `cairn-demo`).
//!
//! Install the handlers before starting anything, so that a signal arriving during start-up
//! still leads to a clean stop instead of the default termination.

use tokio::signal::unix::{Signal, SignalKind, signal};

/// The installed SIGTERM and SIGINT handlers.
pub struct ShutdownSignals {
    term: Signal,
    int: Signal,
}

impl ShutdownSignals {
    pub fn install() -> std::io::Result<Self> {
        Ok(Self { term: signal(SignalKind::terminate())?, int: signal(SignalKind::interrupt())? })
    }

    /// Waits for the next signal; returns its name for the log.
    pub async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}
