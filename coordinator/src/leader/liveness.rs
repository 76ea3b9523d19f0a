//! Judging worker liveness by heartbeats, without blaming workers for the leader's own stalls.
//!
//! A worker is lost when nothing arrived from it for longer than the heartbeat timeout. But the
//! leader's clock keeps running while the leader itself does not (SIGSTOP, a VM pause, a starved
//! process): heartbeats sent meanwhile sit unread in the sockets, and judging the workers by
//! them on the first tick after resuming would cancel healthy tasks. A resumed leader is also
//! likely deposed, and the tasks it would cancel are the ones the new leader expects to
//! re-attach. So each tick measures how late it came; a lateness of more than half the timeout
//! is credited to every worker. A worker that is really gone is declared lost one timeout later
//! than it would have been.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

/// Last-heard times of the attached workers, owned by the term runtime.
#[derive(Debug)]
pub(crate) struct Liveness {
    timeout: Duration,
    tick_every: Duration,
    last_tick: Instant,
    last_seen: BTreeMap<String, Instant>,
}

/// What one tick found.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Verdict {
    /// How much later than its period the tick came, when that was credited to the workers.
    pub stalled: Option<Duration>,
    /// Workers not heard from within the timeout; they are no longer tracked.
    pub lost: Vec<String>,
}

impl Liveness {
    pub(crate) fn new(timeout: Duration, tick_every: Duration, now: Instant) -> Self {
        Self { timeout, tick_every, last_tick: now, last_seen: BTreeMap::new() }
    }

    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The period `tick` is meant to be called at.
    pub(crate) fn tick_every(&self) -> Duration {
        self.tick_every
    }

    /// Something arrived from `worker` (or it attached) at `now`.
    pub(crate) fn seen(&mut self, worker: &str, now: Instant) {
        match self.last_seen.get_mut(worker) {
            Some(t) => *t = now,
            None => {
                self.last_seen.insert(worker.to_owned(), now);
            }
        }
    }

    /// The periodic check: credits a stall of this runtime to every worker, then returns the
    /// workers not heard from within the timeout and stops tracking them.
    pub(crate) fn tick(&mut self, now: Instant) -> Verdict {
        let late = now.saturating_duration_since(self.last_tick).saturating_sub(self.tick_every);
        self.last_tick = now;
        let stalled = (late > self.timeout / 2).then_some(late);
        if let Some(late) = stalled {
            for t in self.last_seen.values_mut() {
                *t = (*t + late).min(now);
            }
        }
        let timeout = self.timeout;
        let lost: Vec<String> = self
            .last_seen
            .iter()
            .filter(|(_, t)| now.saturating_duration_since(**t) > timeout)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &lost {
            self.last_seen.remove(id);
        }
        Verdict { stalled, lost }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUT: Duration = Duration::from_secs(3);
    const TICK: Duration = Duration::from_millis(200);

    /// Ticks every period from `from` up to `until`, collecting every worker declared lost.
    fn tick_until(l: &mut Liveness, from: Instant, until: Instant) -> Vec<String> {
        let mut lost = Vec::new();
        let mut now = from;
        while now < until {
            now += TICK;
            lost.extend(l.tick(now).lost);
        }
        lost
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_worker_is_lost_after_the_timeout_and_a_talking_one_is_not() {
        let t0 = Instant::now();
        let mut l = Liveness::new(TIMEOUT, TICK, t0);
        l.seen("quiet", t0);
        l.seen("chatty", t0);
        let mut now = t0;
        let mut lost = Vec::new();
        while now < t0 + Duration::from_secs(10) {
            now += TICK;
            l.seen("chatty", now);
            let v = l.tick(now);
            assert_eq!(v.stalled, None, "ticks on time are no stall");
            if !v.lost.is_empty() {
                assert!(now - t0 > TIMEOUT && now - t0 <= TIMEOUT + TICK, "lost at {:?}", now - t0);
            }
            lost.extend(v.lost);
        }
        assert_eq!(lost, vec!["quiet".to_owned()], "each lost worker is reported once");
    }

    #[tokio::test(start_paused = true)]
    async fn a_stall_of_the_leader_is_not_counted_against_its_workers() {
        let t0 = Instant::now();
        let mut l = Liveness::new(TIMEOUT, TICK, t0);
        l.seen("w", t0);
        // The process is stopped for 8 s (longer than the timeout); the first tick after it
        // resumes comes 8 s late. The worker's queued heartbeat is read right after.
        let resumed = t0 + TICK + Duration::from_secs(8);
        let v = l.tick(resumed);
        assert_eq!(v.stalled, Some(resumed - t0 - TICK));
        assert!(v.lost.is_empty(), "the worker was blamed for the leader's pause");
        l.seen("w", resumed + Duration::from_millis(1));
        assert!(tick_until(&mut l, resumed, resumed + TIMEOUT).is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_worker_that_is_really_gone_is_still_lost_after_a_stall() {
        let t0 = Instant::now();
        let mut l = Liveness::new(TIMEOUT, TICK, t0);
        l.seen("w", t0);
        let resumed = t0 + TICK + Duration::from_secs(8);
        assert!(l.tick(resumed).lost.is_empty());
        // Nothing ever arrives again: lost one timeout after the resume, not never.
        let lost = tick_until(&mut l, resumed, resumed + TIMEOUT + TICK * 2);
        assert_eq!(lost, vec!["w".to_owned()]);
    }

    #[tokio::test(start_paused = true)]
    async fn short_lateness_is_not_a_stall() {
        let t0 = Instant::now();
        let mut l = Liveness::new(TIMEOUT, TICK, t0);
        l.seen("w", t0);
        // A tick late by less than half the timeout (a busy runtime) credits nothing, so a
        // steadily late tick cannot keep a dead worker alive.
        let mut now = t0;
        let mut lost = Vec::new();
        while lost.is_empty() && now < t0 + Duration::from_secs(30) {
            now += TICK + Duration::from_secs(1);
            let v = l.tick(now);
            assert_eq!(v.stalled, None);
            lost.extend(v.lost);
        }
        assert_eq!(lost, vec!["w".to_owned()]);
        assert!(now - t0 <= TIMEOUT + TICK + Duration::from_secs(1));
    }
}
