//! The console's one owner of cluster figures over time: a task that reads the cluster status
//! once per interval, remembers each leadership it sees (the leader history), and publishes the
//! latest view on a `watch` channel. The cluster page reads that view, so any number of browsers
//! polling it cost one admin call per interval.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::model::{ClusterView, LeaderChange};
use crate::source::Source;

/// Leaderships remembered (newest kept).
pub const HISTORY_LEN: usize = 50;

pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Leader history: appends a change when the leader or the term differs from the last one.
#[derive(Debug, Default)]
pub struct History {
    changes: VecDeque<LeaderChange>,
}

impl History {
    pub fn observe(&mut self, at_ms: u64, leader_id: u64, term: u64) {
        if leader_id == 0 {
            return;
        }
        let same = self.changes.back().is_some_and(|c| c.leader_id == leader_id && c.term == term);
        if !same {
            self.changes.push_back(LeaderChange { observed_at_ms: at_ms, leader_id, term });
            while self.changes.len() > HISTORY_LEN {
                self.changes.pop_front();
            }
        }
    }

    /// Newest first.
    pub fn newest_first(&self) -> Vec<LeaderChange> {
        self.changes.iter().rev().cloned().collect()
    }
}

/// Starts the observer; the receiver always holds the latest view.
pub fn spawn(source: Source, every: Duration) -> (watch::Receiver<Arc<ClusterView>>, JoinHandle<()>) {
    let (tx, rx) = watch::channel(Arc::new(ClusterView::unknown(None)));
    let task = tokio::spawn(async move {
        let mut history = History::default();
        let mut last_good: Option<ClusterView> = None;
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let view = match source.cluster_status().await {
                Ok(status) => {
                    let at = now_ms();
                    history.observe(at, status.leader_id, status.term);
                    let mut view = ClusterView::from_status(&status);
                    view.observed_at_ms = Some(at);
                    view.leader_history = history.newest_first();
                    last_good = Some(view.clone());
                    view
                }
                Err(e) => {
                    tracing::debug!(error = %e, "console: cluster status unavailable");
                    // Keep showing the last figures, marked stale by the error.
                    let mut view = last_good.clone().unwrap_or_else(|| ClusterView::unknown(None));
                    view.error = Some(e.to_string());
                    view.leader_history = history.newest_first();
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
    fn history_records_changes_only_and_stays_bounded() {
        let mut h = History::default();
        h.observe(1, 1, 1);
        h.observe(2, 1, 1);
        h.observe(3, 0, 2);
        h.observe(4, 2, 2);
        assert_eq!(
            h.newest_first(),
            vec![
                LeaderChange { observed_at_ms: 4, leader_id: 2, term: 2 },
                LeaderChange { observed_at_ms: 1, leader_id: 1, term: 1 },
            ]
        );
        for t in 0..200 {
            h.observe(10 + t, 1 + t % 3, 3 + t);
        }
        assert_eq!(h.newest_first().len(), HISTORY_LEN);
    }
}
