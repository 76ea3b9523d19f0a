//! `cairn-tests`: harnesses for testing Cairn as a whole.
//!
//! - [`cdp`]: headless Chromium over the DevTools protocol (the console's browser suite).
//! - [`chaos`]: the container chaos suite behind `cairn-chaos` (schedule, nemesis, history,
//!   invariants, report).
//! - [`ctl`]: the real `cairnctl` binary, run as an operator would.
//! - [`http`]: a minimal HTTP/1.1 client for the web console's tests and benchmark.
//! - [`output`]: waiting for the demo job's committed output to be exactly once.
//! - [`wait`]: bounded polling for a condition (tests never sleep to assert).
//! - [`inproc`]: several replicas in one process, each on its own port-0 listener and temp dir,
//!   stoppable and restartable from their data directories.
//! - [`procs`]: real `cairn` processes, killed with SIGKILL and restarted.
//! - [`scripted`]: a worker that speaks the task gateway protocol message by message.
//! - [`simfleet`]: simulated workers (real gateway streams, tasks that do no work) for the scale
//!   benchmark.
//!
//! The test suites live in `tests/tests/`; the benchmarks in `tests/src/bin/`.

pub mod cdp;
pub mod chaos;
pub mod ctl;
pub mod etcd;
pub mod http;
pub mod inproc;
pub mod output;
pub mod procs;
pub mod scripted;
pub mod simfleet;
pub mod wait;

/// A channel straight to one replica at `addr` (no leader following) carrying the admin token,
/// for tests that must talk to a particular replica (e.g. to see a follower's refusal).
pub async fn direct_channel(addr: &str, token: &str) -> anyhow::Result<cairn_client::AuthChannel> {
    use cairn_client::{AuthChannel, BearerAuth};
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?.connect().await?;
    Ok(AuthChannel::new(channel, BearerAuth::new(Some(token))?))
}

/// Installs a test log subscriber once (honours `RUST_LOG`; quiet by default).
pub fn init_test_logging() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,openraft=error")),
        )
        .with_test_writer()
        .try_init();
}
