//! Rate limit of `Attach` attempts per source address: a token bucket per IP, so that a host
//! that opens streams in a loop (a misconfigured worker, or someone guessing tokens) is refused
//! with `RESOURCE_EXHAUSTED` before it costs the leader anything, while workers that reconnect
//! with their backoff never notice it.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;
use tonic::Status;

/// Attempts a source may make in a burst.
pub const ATTACH_BURST: u32 = 50;
/// Attempts per second a source regains.
pub const ATTACH_PER_SEC: u32 = 10;
/// Sources tracked at most; beyond, idle ones are forgotten and new ones refused.
const MAX_SOURCES: usize = 16_384;

/// Token buckets by source IP.
pub struct AttachLimiter {
    burst: f64,
    per_sec: f64,
    /// A std mutex: held only to update one bucket, never across an await.
    buckets: Mutex<HashMap<IpAddr, Bucket>>,
}

#[derive(Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Default for AttachLimiter {
    fn default() -> Self {
        Self::new(ATTACH_BURST, ATTACH_PER_SEC)
    }
}

impl AttachLimiter {
    pub fn new(burst: u32, per_sec: u32) -> Self {
        Self { burst: f64::from(burst), per_sec: f64::from(per_sec), buckets: Mutex::new(HashMap::new()) }
    }

    /// Takes one attempt for `source` (unknown sources share one bucket).
    pub fn admit(&self, source: Option<IpAddr>) -> Result<(), Status> {
        let source = source.unwrap_or(IpAddr::from([0, 0, 0, 0]));
        let now = Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if buckets.len() >= MAX_SOURCES && !buckets.contains_key(&source) {
            let (burst, per_sec) = (self.burst, self.per_sec);
            buckets.retain(|_, b| refill(*b, now, burst, per_sec) < burst);
            if buckets.len() >= MAX_SOURCES {
                return Err(Status::resource_exhausted(
                    "too many sources are attaching at once; retry later",
                ));
            }
        }
        let bucket = buckets.entry(source).or_insert(Bucket { tokens: self.burst, at: now });
        let tokens = refill(*bucket, now, self.burst, self.per_sec);
        if tokens < 1.0 {
            let wait = Duration::from_secs_f64((1.0 - tokens) / self.per_sec);
            return Err(Status::resource_exhausted(format!(
                "too many attach attempts from {source}: at most {} per second; retry in {} ms",
                self.per_sec,
                wait.as_millis().max(1)
            )));
        }
        *bucket = Bucket { tokens: tokens - 1.0, at: now };
        Ok(())
    }
}

fn refill(b: Bucket, now: Instant, burst: f64, per_sec: f64) -> f64 {
    (b.tokens + now.saturating_duration_since(b.at).as_secs_f64() * per_sec).min(burst)
}

#[cfg(test)]
mod tests {
    use tonic::Code;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_source_gets_its_burst_then_its_rate() {
        let limiter = AttachLimiter::new(3, 2);
        let a = Some(IpAddr::from([10, 0, 0, 1]));
        let b = Some(IpAddr::from([10, 0, 0, 2]));
        for _ in 0..3 {
            limiter.admit(a).unwrap();
        }
        let refused = limiter.admit(a).unwrap_err();
        assert_eq!(refused.code(), Code::ResourceExhausted);
        assert!(refused.message().contains("from 10.0.0.1") && refused.message().contains("retry in 500 ms"));
        // Another source is not affected.
        limiter.admit(b).unwrap();
        // Half a second later one attempt is back, not two.
        tokio::time::advance(Duration::from_millis(500)).await;
        limiter.admit(a).unwrap();
        assert!(limiter.admit(a).is_err());
        // An idle source regains its whole burst, not more.
        tokio::time::advance(Duration::from_secs(60)).await;
        for _ in 0..3 {
            limiter.admit(a).unwrap();
        }
        assert!(limiter.admit(a).is_err());
    }
}
