//! Barrier alignment for exactly-once checkpoints, as a pure state machine (no I/O).
//!
//! The task feeds it barriers, cancel markers and end-of-input per input channel; it answers
//! with [`AlignmentAction`]s and tells which channels are parked. A channel that delivered the
//! barrier of the checkpoint being aligned is parked until every live channel has delivered it;
//! then the checkpoint is triggered and all channels are released. A barrier of a newer
//! checkpoint aborts the older alignment (the older checkpoint is subsumed); a cancel marker
//! aborts the checkpoint it names. Barriers of checkpoints already triggered or aborted are
//! dropped.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use crate::exchange::Barrier;
use cairn_protocol::messages::DeclineReason;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AlignmentAction {
    /// All live channels delivered the barrier: take the checkpoint.
    Trigger { barrier: Barrier, alignment: Duration },
    /// Abort checkpoint `checkpoint_id`: decline it and send a cancel marker downstream.
    Abort { checkpoint_id: u64, reason: DeclineReason },
}

#[derive(Debug)]
struct InProgress {
    barrier: Barrier,
    parked: Vec<bool>,
    started: Instant,
}

#[derive(Debug)]
pub struct BarrierAligner {
    finished: Vec<bool>,
    current: Option<InProgress>,
    /// Highest checkpoint id triggered or aborted; older barriers are stale.
    last_handled: u64,
    /// Checkpoints above `last_handled` already aborted (a late barrier of an older checkpoint
    /// arriving on another channel is declined once, not once per channel).
    aborted: BTreeSet<u64>,
}

impl BarrierAligner {
    pub fn new(channels: usize) -> Self {
        Self { finished: vec![false; channels], current: None, last_handled: 0, aborted: BTreeSet::new() }
    }

    pub fn is_parked(&self, channel: usize) -> bool {
        self.current.as_ref().is_some_and(|c| c.parked.get(channel).copied().unwrap_or(false))
    }

    /// Id of the checkpoint being aligned, if any.
    pub fn aligning(&self) -> Option<u64> {
        self.current.as_ref().map(|c| c.barrier.checkpoint_id)
    }

    fn complete_if_aligned(&mut self) -> Option<AlignmentAction> {
        let cur = self.current.as_ref()?;
        let aligned = cur.parked.iter().zip(&self.finished).all(|(p, f)| *p || *f);
        if !aligned {
            return None;
        }
        let cur = self.current.take()?;
        self.last_handled = cur.barrier.checkpoint_id;
        self.aborted.retain(|id| *id > cur.barrier.checkpoint_id);
        Some(AlignmentAction::Trigger { barrier: cur.barrier, alignment: cur.started.elapsed() })
    }

    pub fn on_barrier(&mut self, channel: usize, barrier: Barrier) -> Vec<AlignmentAction> {
        let id = barrier.checkpoint_id;
        let mut actions = Vec::new();
        if id <= self.last_handled {
            tracing::debug!(checkpoint_id = id, channel, "dropping barrier of a handled checkpoint");
            return actions;
        }
        match self.current.as_mut() {
            Some(cur) if cur.barrier.checkpoint_id == id => {
                if let Some(p) = cur.parked.get_mut(channel) {
                    *p = true;
                }
            }
            Some(cur) if cur.barrier.checkpoint_id > id => {
                // Another channel already delivered a newer barrier: this checkpoint cannot be
                // taken any more. Decline it (once) so the coordinator need not wait for it.
                let newer = cur.barrier.checkpoint_id;
                if self.aborted.insert(id) {
                    tracing::info!(checkpoint_id = id, newer, "late barrier of a subsumed checkpoint");
                    actions.push(AlignmentAction::Abort {
                        checkpoint_id: id,
                        reason: DeclineReason::Subsumed { newer },
                    });
                }
                return actions;
            }
            _ => {
                if let Some(old) = self.current.take() {
                    let old_id = old.barrier.checkpoint_id;
                    self.aborted.insert(old_id);
                    tracing::info!(checkpoint_id = old_id, newer = id, "newer barrier aborts alignment");
                    actions.push(AlignmentAction::Abort {
                        checkpoint_id: old_id,
                        reason: DeclineReason::Subsumed { newer: id },
                    });
                }
                let mut parked = vec![false; self.finished.len()];
                if let Some(p) = parked.get_mut(channel) {
                    *p = true;
                }
                self.current = Some(InProgress { barrier, parked, started: Instant::now() });
            }
        }
        actions.extend(self.complete_if_aligned());
        actions
    }

    /// A cancel marker (or a coordinator abort) for `checkpoint_id`.
    pub fn on_cancel(&mut self, checkpoint_id: u64, reason: DeclineReason) -> Vec<AlignmentAction> {
        if checkpoint_id <= self.last_handled {
            return Vec::new();
        }
        let mut actions = Vec::new();
        match self.current.as_ref().map(|c| c.barrier.checkpoint_id) {
            Some(cur) if cur > checkpoint_id => return actions,
            Some(cur) if cur < checkpoint_id => {
                // A newer checkpoint is canceled before its barrier arrived: the older one is
                // subsumed as well.
                actions.push(AlignmentAction::Abort {
                    checkpoint_id: cur,
                    reason: DeclineReason::Subsumed { newer: checkpoint_id },
                });
            }
            _ => {}
        }
        self.current = None;
        self.last_handled = checkpoint_id;
        self.aborted.retain(|id| *id > checkpoint_id);
        actions.push(AlignmentAction::Abort { checkpoint_id, reason });
        actions
    }

    /// A channel ended: it will deliver no more barriers.
    pub fn on_end_of_input(&mut self, channel: usize) -> Vec<AlignmentAction> {
        if let Some(f) = self.finished.get_mut(channel) {
            *f = true;
        }
        self.complete_if_aligned().into_iter().collect()
    }

    /// For a task without inputs (a source): the checkpoint is triggered directly.
    pub fn note_triggered(&mut self, checkpoint_id: u64) {
        self.last_handled = self.last_handled.max(checkpoint_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_protocol::messages::CheckpointOptions;

    fn barrier(id: u64) -> Barrier {
        Barrier { checkpoint_id: id, timestamp_ms: 0, options: CheckpointOptions::checkpoint() }
    }

    fn triggered(actions: &[AlignmentAction]) -> Option<u64> {
        actions.iter().find_map(|a| match a {
            AlignmentAction::Trigger { barrier, .. } => Some(barrier.checkpoint_id),
            _ => None,
        })
    }

    #[test]
    fn three_inputs_align_and_interleaved_newer_barrier_subsumes() {
        let mut a = BarrierAligner::new(3);
        assert!(a.on_barrier(0, barrier(1)).is_empty());
        assert!(a.is_parked(0) && !a.is_parked(1));
        assert!(a.on_barrier(2, barrier(1)).is_empty());
        assert_eq!(triggered(&a.on_barrier(1, barrier(1))), Some(1));
        assert!(!a.is_parked(0) && !a.is_parked(2));

        assert!(a.on_barrier(1, barrier(2)).is_empty());
        let actions = a.on_barrier(0, barrier(3));
        assert_eq!(
            actions,
            vec![AlignmentAction::Abort { checkpoint_id: 2, reason: DeclineReason::Subsumed { newer: 3 } }]
        );
        assert!(a.is_parked(0) && !a.is_parked(1));
        assert!(a.on_barrier(2, barrier(2)).is_empty(), "already declined: dropped");
        assert!(a.on_barrier(1, barrier(3)).is_empty());
        assert_eq!(triggered(&a.on_barrier(2, barrier(3))), Some(3));
    }

    #[test]
    fn late_older_barrier_after_a_newer_one_is_declined_once() {
        let mut a = BarrierAligner::new(3);
        assert!(a.on_barrier(1, barrier(3)).is_empty());
        let expected =
            vec![AlignmentAction::Abort { checkpoint_id: 2, reason: DeclineReason::Subsumed { newer: 3 } }];
        assert_eq!(a.on_barrier(0, barrier(2)), expected);
        assert!(a.on_barrier(2, barrier(2)).is_empty());
    }

    #[test]
    fn cancel_marker_releases_and_later_barriers_are_dropped() {
        let mut a = BarrierAligner::new(2);
        a.on_barrier(0, barrier(5));
        let actions = a.on_cancel(5, DeclineReason::CanceledUpstream);
        assert_eq!(
            actions,
            vec![AlignmentAction::Abort { checkpoint_id: 5, reason: DeclineReason::CanceledUpstream }]
        );
        assert!(!a.is_parked(0));
        assert!(a.on_barrier(1, barrier(5)).is_empty());
        assert_eq!(a.aligning(), None);
    }

    #[test]
    fn finished_inputs_do_not_block_alignment() {
        let mut a = BarrierAligner::new(2);
        a.on_barrier(0, barrier(1));
        assert_eq!(triggered(&a.on_end_of_input(1)), Some(1));
    }
}
