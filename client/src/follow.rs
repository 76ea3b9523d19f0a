//! Where to look for the leader next: the known replica endpoints and the jittered exponential
//! backoff between rounds of failed attempts. Pure bookkeeping, no I/O: the
//! [`LeaderClient`](crate::LeaderClient) drives it for unary calls, and the worker's connection
//! loop for its gateway stream.
//!
//! A *round* is a run of consecutive failed attempts as long as the endpoint list. Following a
//! leader hint is immediate, but it counts as an attempt, so two replicas that point at each
//! other (e.g. during an election) cannot make the worker spin: after a round it pauses.

use std::time::Duration;

use cairn_proto::addr::normalize as normalize_endpoint;

/// The replicas the worker knows of, and which one it tries next.
///
/// Two positions: `current`, the endpoint tried next, and `cursor`, the position in the
/// round-robin order. A hint moves `current` only, so when the hinted replica fails too the
/// search resumes after the replica that gave the hint (a stale hint cannot trap the worker
/// between the hinting replica and a dead one).
///
/// The list starts with the configured endpoints; a hint may add replicas the client was not
/// told about (a member added later), but only a hint from a configured endpoint, and at most
/// [`MAX_LEARNED_ENDPOINTS`] of them (the oldest learned one makes room). So the client sends
/// its credentials only to configured replicas and to members they reported, and a replica
/// that lies cannot grow the list or lead the client away along a chain of hints.
#[derive(Debug, Clone)]
pub struct Endpoints {
    list: Vec<String>,
    /// How many entries at the head of `list` were configured.
    configured: usize,
    current: usize,
    cursor: usize,
    /// Failed attempts since the last success or the last pause.
    failures_in_round: usize,
}

/// Endpoints learned from leader hints, at most (beyond the configured ones).
pub const MAX_LEARNED_ENDPOINTS: usize = 16;

/// What to do after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Try the (new) current endpoint right away.
    Now,
    /// Every known endpoint failed in this round: pause first.
    Pause,
}

impl Endpoints {
    /// `list` must not be empty (the config validation guarantees it).
    pub fn new(list: Vec<String>) -> Self {
        let mut deduped: Vec<String> = Vec::with_capacity(list.len());
        for e in list.into_iter().map(|e| normalize_endpoint(&e)) {
            if !deduped.contains(&e) {
                deduped.push(e);
            }
        }
        let configured = deduped.len();
        Self { list: deduped, configured, current: 0, cursor: 0, failures_in_round: 0 }
    }

    pub fn current(&self) -> Option<&str> {
        self.list.get(self.current).map(String::as_str)
    }

    pub fn all(&self) -> &[String] {
        &self.list
    }

    /// A session was established: start the next search from this endpoint, without pause.
    pub fn succeeded(&mut self) {
        self.failures_in_round = 0;
        self.cursor = self.current;
    }

    /// The current endpoint failed or refused without a usable hint: move to the next one.
    pub fn failed(&mut self) -> Next {
        if !self.list.is_empty() {
            self.cursor = (self.cursor + 1) % self.list.len();
            self.current = self.cursor;
        }
        self.count_failure()
    }

    /// The current endpoint is not the leader and named `leader`: go there (remembering it if
    /// it is new). A hint pointing at the endpoint that gave it is treated as no hint.
    pub fn redirect(&mut self, leader: &str) -> Next {
        let leader = normalize_endpoint(leader);
        if self.current() == Some(leader.as_str()) {
            return self.failed();
        }
        match self.list.iter().position(|e| *e == leader) {
            Some(i) => self.current = i,
            // A leader we were not told about (e.g. a replica added later), named by a configured
            // replica: remember it, within bounds.
            None if self.current < self.configured => {
                if self.list.len() - self.configured >= MAX_LEARNED_ENDPOINTS {
                    self.list.remove(self.configured);
                    if self.cursor >= self.list.len() {
                        self.cursor = 0;
                    }
                }
                self.list.push(leader);
                self.current = self.list.len() - 1;
            }
            // Only configured replicas may introduce new ones.
            None => return self.failed(),
        }
        self.count_failure()
    }

    fn count_failure(&mut self) -> Next {
        self.failures_in_round += 1;
        if self.failures_in_round >= self.list.len().max(1) {
            self.failures_in_round = 0;
            Next::Pause
        } else {
            Next::Now
        }
    }
}

/// Jittered exponential backoff: each pause is drawn from `[d/2, d]`, and `d` doubles up to the
/// maximum. During a *quick search* (after losing a leader that was there a moment ago) the
/// pause stays at the minimum: a new leader is usually elected within a second, and a client
/// that waited out a grown backoff would find it late.
#[derive(Debug, Clone)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
    quick_until: Option<tokio::time::Instant>,
}

/// How long after losing its leader a client searches at the minimum pause.
pub const QUICK_SEARCH: Duration = Duration::from_secs(2);

impl Backoff {
    pub fn new(min: Duration, max: Duration) -> Self {
        Self { min, max: max.max(min), next: min, quick_until: None }
    }

    /// The next pause (jittered), and doubles the following one (except in a quick search).
    pub fn next_delay(&mut self) -> Duration {
        let d = self.next;
        let quick = self.quick_until.is_some_and(|until| tokio::time::Instant::now() < until);
        if !quick {
            self.quick_until = None;
            self.next = (self.next * 2).min(self.max);
        }
        d.mul_f64(0.5 + rand::random::<f64>() / 2.0)
    }

    pub fn reset(&mut self) {
        self.next = self.min;
    }

    /// The leader was just lost: pause only the minimum for the next [`QUICK_SEARCH`].
    pub fn search_quickly(&mut self) {
        self.reset();
        self.quick_until = Some(tokio::time::Instant::now() + QUICK_SEARCH);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eps(list: &[&str]) -> Endpoints {
        Endpoints::new(list.iter().map(|s| s.to_string()).collect())
    }

    #[tokio::test(start_paused = true)]
    async fn a_quick_search_keeps_the_minimum_pause_then_backs_off() {
        let (min, max) = (Duration::from_millis(50), Duration::from_secs(2));
        let mut b = Backoff::new(min, max);
        b.search_quickly();
        let mut waited = Duration::ZERO;
        while waited < QUICK_SEARCH {
            let d = b.next_delay();
            assert!(d >= min / 2 && d <= min, "{d:?} during the quick search");
            tokio::time::advance(d).await;
            waited += d;
        }
        let grown: Vec<Duration> = (0..8).map(|_| b.next_delay()).collect();
        assert!(grown[7] >= max / 2, "the backoff grows again after the quick search: {grown:?}");
        b.reset();
        assert!(b.next_delay() <= min);
    }

    #[test]
    fn failures_rotate_and_pause_after_a_round() {
        let mut e = eps(&["a:1", "b:2", "http://a:1/"]);
        assert_eq!(e.all().len(), 2);
        assert_eq!(e.failed(), Next::Now);
        assert_eq!(e.current(), Some("b:2"));
        assert_eq!(e.failed(), Next::Pause);
        assert_eq!(e.current(), Some("a:1"));
    }

    #[test]
    fn hints_redirect_and_learn_new_endpoints() {
        let mut e = eps(&["a:1", "b:2"]);
        assert_eq!(e.redirect("c:3"), Next::Now);
        assert_eq!(e.current(), Some("c:3"));
        assert_eq!(e.all().len(), 3);
        // A ping-pong of hints still pauses after a round.
        assert_eq!(e.redirect("a:1"), Next::Now);
        assert_eq!(e.redirect("c:3"), Next::Pause);
        e.succeeded();
        // A self-hint is no hint: move on.
        assert_eq!(e.redirect("c:3"), Next::Now);
        assert_eq!(e.current(), Some("a:1"));
    }

    #[test]
    fn only_configured_replicas_introduce_new_ones_and_learned_ones_stay_bounded() {
        let mut e = eps(&["a:1", "b:1"]);
        // A configured replica names a new one: learned.
        assert_eq!(e.redirect("c:1"), Next::Now);
        assert_eq!(e.current(), Some("c:1"));
        // The learned one names another stranger: not followed, the search moves on.
        e.redirect("evil:1");
        assert!(!e.all().iter().any(|x| x == "evil:1"), "{:?}", e.all());
        // Hints from configured replicas learn at most MAX_LEARNED_ENDPOINTS, oldest dropped.
        for i in 0..100 {
            let mut from_configured = e.clone();
            while from_configured.current().is_some_and(|c| !["a:1", "b:1"].contains(&c)) {
                from_configured.failed();
            }
            e = from_configured;
            e.redirect(&format!("n{i}:1"));
        }
        assert_eq!(e.all().len(), 2 + MAX_LEARNED_ENDPOINTS);
        assert_eq!(&e.all()[..2], ["a:1", "b:1"]);
        assert!(e.all().iter().any(|x| x == "n99:1") && !e.all().iter().any(|x| x == "n0:1"));
    }

    #[test]
    fn a_dead_hinted_leader_does_not_trap_the_search() {
        let mut e = eps(&["a:1", "b:2"]);
        // a hints at d (down): after d fails, the search goes on with b, not back to a.
        assert_eq!(e.redirect("d:4"), Next::Now);
        assert_eq!(e.failed(), Next::Now);
        assert_eq!(e.current(), Some("b:2"));
    }

    #[test]
    fn backoff_doubles_with_jitter_up_to_the_max() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(300));
        let d1 = b.next_delay();
        assert!(d1 >= Duration::from_millis(50) && d1 <= Duration::from_millis(100), "{d1:?}");
        let d2 = b.next_delay();
        assert!(d2 >= Duration::from_millis(100) && d2 <= Duration::from_millis(200), "{d2:?}");
        for _ in 0..5 {
            assert!(b.next_delay() <= Duration::from_millis(300));
        }
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(100));
    }
}
