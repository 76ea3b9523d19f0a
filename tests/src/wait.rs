//! Bounded waits that poll for a condition.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

/// Polls `check` every 20 ms until it returns `Some`, or fails after `timeout` naming `what`.
pub async fn until<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return Ok(v);
        }
        if Instant::now() >= deadline {
            anyhow::bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
