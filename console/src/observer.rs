//! The console's one owner of cluster figures over time: a task that reads the cluster status
//! once per interval, notes when it first saw each leader's term, and publishes the latest view
//! on a `watch` channel. The leader history itself is replicated (it comes with the status);
//! this console adds the times it saw. The cluster page reads that view, so any number of
//! browsers polling it cost one admin call per interval.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::model::{ClusterView, LeaderChange};
use crate::source::Source;

/// Terms whose first sighting is remembered (newest kept).
pub const HISTORY_LEN: usize = 64;

pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// When this console first saw each term with a leader, and who led it.
#[derive(Debug, Default)]
pub struct Sightings {
    seen: VecDeque<LeaderChange>,
}

impl Sightings {
    pub fn observe(&mut self, at_ms: u64, leader_id: u64, term: u64) {
        if leader_id == 0 || self.seen.iter().any(|c| c.term == term) {
            return;
        }
        self.seen.push_back(LeaderChange {
            term,
            leader_id,
            first_log_index: None,
            observed_at_ms: Some(at_ms),
        });
        while self.seen.len() > HISTORY_LEN {
            self.seen.pop_front();
        }
    }

    /// The replicated `history` (newest first) with the times this console saw each term; a
    /// term seen here but not yet in the history (the replica read has not applied its first
    /// entry) comes first.
    pub fn annotate(&self, history: &[LeaderChange]) -> Vec<LeaderChange> {
        let mut out: Vec<LeaderChange> = self
            .seen
            .iter()
            .filter(|c| history.first().is_none_or(|newest| c.term > newest.term))
            .rev()
            .cloned()
            .collect();
        out.extend(history.iter().map(|c| LeaderChange {
            observed_at_ms: self.seen.iter().find(|s| s.term == c.term).and_then(|s| s.observed_at_ms),
            ..c.clone()
        }));
        out
    }
}

/// Starts the observer; the receiver always holds the latest view.
pub fn spawn(source: Source, every: Duration) -> (watch::Receiver<Arc<ClusterView>>, JoinHandle<()>) {
    let (tx, rx) = watch::channel(Arc::new(ClusterView::unknown(None)));
    let task = tokio::spawn(async move {
        let mut sightings = Sightings::default();
        let mut last_good: Option<ClusterView> = None;
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let view = match source.cluster_status().await {
                Ok(status) => {
                    let at = now_ms();
                    sightings.observe(at, status.leader_id, status.term);
                    let mut view = ClusterView::from_status(&status);
                    view.observed_at_ms = Some(at);
                    view.leader_history = sightings.annotate(&view.leader_history);
                    last_good = Some(view.clone());
                    view
                }
                Err(e) => {
                    tracing::debug!(error = %e, "console: cluster status unavailable");
                    // Keep showing the last figures, marked stale by the error.
                    let mut view = last_good.clone().unwrap_or_else(|| ClusterView::unknown(None));
                    view.error = Some(e.to_string());
                    view
                }
            };
            if tx.send(Arc::new(view)).is_err() {
                return;
            }
        }
    });
    (rx, task)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replicated_terms_get_the_times_this_console_saw_them() {
        let replicated = |term, leader_id, index| LeaderChange {
            term,
            leader_id,
            first_log_index: Some(index),
            observed_at_ms: None,
        };
        let mut s = Sightings::default();
        s.observe(100, 1, 2);
        s.observe(200, 1, 2);
        s.observe(300, 0, 3);
        // Term 3 is newer than the replica's history: listed first, without an index.
        s.observe(400, 2, 3);
        let history = [replicated(2, 1, 7), replicated(1, 1, 1)];
        let v = s.annotate(&history);
        assert_eq!(
            v,
            [
                LeaderChange { term: 3, leader_id: 2, first_log_index: None, observed_at_ms: Some(400) },
                LeaderChange { term: 2, leader_id: 1, first_log_index: Some(7), observed_at_ms: Some(100) },
                replicated(1, 1, 1),
            ]
        );
        // Once replicated, term 3 appears once, with its index and this console's time.
        let history = [replicated(3, 2, 12), replicated(2, 1, 7)];
        let v = s.annotate(&history);
        assert_eq!(v.len(), 2);
        assert_eq!((v[0].first_log_index, v[0].observed_at_ms), (Some(12), Some(400)));
        for t in 0..200 {
            s.observe(1_000 + t, 1, 10 + t);
        }
        assert_eq!(s.seen.len(), HISTORY_LEN);
    }
}
