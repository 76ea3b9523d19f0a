//! Rate limit of failed `Attach` attempts per source address: a token bucket per IP, charged
//! for every attempt that fails authentication or is refused after it (a bad or missing
//! `register`, an identity that may not register as that worker). A host that keeps failing (a
//! misconfigured worker, or someone guessing tokens) is refused with `RESOURCE_EXHAUSTED` before
//! it costs the leader anything. Attempts that attach, or are answered with the leader's address,
//! cost nothing: a whole fleet behind one address (simulated workers, NAT) re-attaching after a
//! failover never waits for the bucket.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;
use tonic::Status;

/// Failed attempts a source may make in a burst.
pub const ATTACH_BURST: u32 = 50;
/// Failed attempts per second a source regains.
pub const ATTACH_PER_SEC: u32 = 10;
/// Sources tracked at most; beyond, idle ones are forgotten and new ones refused.
const MAX_SOURCES: usize = 16_384;

/// Token buckets by source IP, for the sources that failed lately.
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

    /// Lets an attempt from `source` in unless its failures used up its bucket (unknown
    /// sources share one bucket). Takes nothing: [`charge`](Self::charge) does, on failure.
    pub fn admit(&self, source: Option<IpAddr>) -> Result<(), Status> {
        let source = source.unwrap_or(IpAddr::from([0, 0, 0, 0]));
        let now = Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let Some(bucket) = buckets.get(&source) else {
            return if self.has_room(&mut buckets, now) {
                Ok(())
            } else {
                Err(Status::resource_exhausted("too many sources are failing to attach at once; retry later"))
            };
        };
        let tokens = refill(*bucket, now, self.burst, self.per_sec);
        if tokens < 1.0 {
            let wait = Duration::from_secs_f64((1.0 - tokens) / self.per_sec);
            return Err(Status::resource_exhausted(format!(
                "too many failed attach attempts from {source}: at most {} per second; retry in {} ms",
                self.per_sec,
                wait.as_millis().max(1)
            )));
        }
        Ok(())
    }

    /// Charges one failed attempt to `source`. Failures that got in together may take its
    /// bucket below zero (down to minus a burst), so they are paid for with a longer wait.
    pub fn charge(&self, source: Option<IpAddr>) {
        let source = source.unwrap_or(IpAddr::from([0, 0, 0, 0]));
        let now = Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if !buckets.contains_key(&source) && !self.has_room(&mut buckets, now) {
            // Every tracked source is failing: `admit` refuses new ones until some recover.
            return;
        }
        let bucket = buckets.entry(source).or_insert(Bucket { tokens: self.burst, at: now });
        let tokens = refill(*bucket, now, self.burst, self.per_sec);
        *bucket = Bucket { tokens: (tokens - 1.0).max(-self.burst), at: now };
    }

    /// Whether another source can be tracked, forgetting those whose bucket refilled.
    fn has_room(&self, buckets: &mut HashMap<IpAddr, Bucket>, now: Instant) -> bool {
        if buckets.len() >= MAX_SOURCES {
            let (burst, per_sec) = (self.burst, self.per_sec);
            buckets.retain(|_, b| refill(*b, now, burst, per_sec) < burst);
        }
        buckets.len() < MAX_SOURCES
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
    async fn a_source_gets_a_burst_of_failures_then_their_rate() {
        let limiter = AttachLimiter::new(3, 2);
        let a = Some(IpAddr::from([10, 0, 0, 1]));
        let b = Some(IpAddr::from([10, 0, 0, 2]));
        for _ in 0..3 {
            limiter.admit(a).unwrap();
            limiter.charge(a);
        }
        let refused = limiter.admit(a).unwrap_err();
        assert_eq!(refused.code(), Code::ResourceExhausted);
        assert!(refused.message().contains("from 10.0.0.1") && refused.message().contains("retry in 500 ms"));
        // Another source is not affected.
        limiter.admit(b).unwrap();
        // Half a second later one attempt is back, not two.
        tokio::time::advance(Duration::from_millis(500)).await;
        limiter.admit(a).unwrap();
        limiter.charge(a);
        assert!(limiter.admit(a).is_err());
        // An idle source regains its whole burst, not more.
        tokio::time::advance(Duration::from_secs(60)).await;
        for _ in 0..3 {
            limiter.admit(a).unwrap();
            limiter.charge(a);
        }
        assert!(limiter.admit(a).is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn attempts_that_do_not_fail_cost_nothing() {
        let limiter = AttachLimiter::new(3, 2);
        let a = Some(IpAddr::from([10, 0, 0, 1]));
        for _ in 0..1000 {
            limiter.admit(a).unwrap();
        }
        // Nothing was tracked for it: its failures still get the whole burst.
        for _ in 0..3 {
            limiter.admit(a).unwrap();
            limiter.charge(a);
        }
        assert!(limiter.admit(a).is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn failures_that_got_in_together_are_paid_for_with_a_longer_wait() {
        let limiter = AttachLimiter::new(3, 2);
        let a = Some(IpAddr::from([10, 0, 0, 1]));
        // Five attempts passed `admit` before any of them failed.
        for _ in 0..5 {
            limiter.admit(a).unwrap();
        }
        for _ in 0..5 {
            limiter.charge(a);
        }
        // -2 tokens: three half-seconds until one is back.
        tokio::time::advance(Duration::from_millis(1400)).await;
        assert!(limiter.admit(a).is_err());
        tokio::time::advance(Duration::from_millis(100)).await;
        limiter.admit(a).unwrap();
    }
}
