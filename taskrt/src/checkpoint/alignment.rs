//! Barrier alignment for exactly-once checkpoints, as a pure state machine (no I/O).
//!
//! The task feeds it barriers, cancel markers and end-of-input per input channel; it answers
//! with [`AlignmentAction`]s and tells which channels are parked. A channel that delivered the
//! barrier of the checkpoint being aligned is parked until every live channel has delivered it;
//! then the checkpoint is triggered and all channels are released. A barrier of a newer
//! checkpoint aborts the older alignment (the older checkpoint is subsumed); a cancel marker
//! aborts the checkpoint it names. Barriers of checkpoints already triggered or aborted are
//! dropped.
//!
//! An aligned checkpoint that may turn unaligned (`unaligned_after_ms = Some(t)`) carries a
//! deadline `t` after its trigger; producers announce its barrier on the channels' priority
//! lanes, so the aligner learns of it (and of how many records precede the barrier on each
//! channel) before the barrier itself arrives behind a backlog. Once the deadline passes,
//! [`BarrierAligner::on_timeout`] answers [`AlignmentAction::TriggerUnaligned`]: the task takes
//! the checkpoint at once and records the in-flight records still ahead of the barriers (see
//! [`super::channel_state`]). An unaligned barrier (`Some(0)`) needs no alignment at all: the
//! task takes the checkpoint when the first one arrives ([`BarrierAligner::begin_unaligned`]).

use std::collections::BTreeSet;
use std::time::Duration;

use tokio::time::Instant;

use crate::element::Barrier;
use cairn_protocol::messages::DeclineReason;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AlignmentAction {
    /// All live channels delivered the barrier: take the checkpoint.
    Trigger { barrier: Barrier, alignment: Duration },
    /// Alignment took too long: take the checkpoint now, unaligned; `channels` tells where
    /// each input stands relative to its barrier.
    TriggerUnaligned { barrier: Barrier, alignment: Duration, channels: Vec<ChannelMark> },
    /// Abort checkpoint `checkpoint_id`: decline it and send a cancel marker downstream.
    Abort { checkpoint_id: u64, reason: DeclineReason },
}

/// Where an input channel stands relative to the barrier of a checkpoint turning unaligned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChannelMark {
    /// The barrier was delivered in-band: nothing before it is left.
    BarrierDelivered,
    /// The producer announced the barrier after sending this many records on the channel.
    Announced(u64),
    /// Not known yet: everything delivered until the barrier shows up precedes it.
    Unknown,
    /// The channel ended.
    Ended,
}

#[derive(Debug)]
struct InProgress {
    barrier: Barrier,
    parked: Vec<bool>,
    /// Per channel, records sent before the barrier, as announced on the priority lane.
    announced: Vec<Option<u64>>,
    started: Instant,
    /// When alignment gives up and the checkpoint turns unaligned.
    deadline: Option<Instant>,
}

impl InProgress {
    fn new(barrier: Barrier, channels: usize) -> Self {
        let deadline = unaligned_deadline(&barrier);
        Self {
            barrier,
            parked: vec![false; channels],
            announced: vec![None; channels],
            started: Instant::now(),
            deadline,
        }
    }
}

/// When an aligned barrier that may turn unaligned does so: `unaligned_after_ms` after its
/// trigger (Flink's aligned checkpoint timeout counts the start delay too).
fn unaligned_deadline(barrier: &Barrier) -> Option<Instant> {
    let after = barrier.options.unaligned_after_ms.filter(|t| *t > 0)?;
    let waited = crate::element::now_ms().saturating_sub(barrier.timestamp_ms);
    let remaining = Duration::from_millis(after.saturating_sub(waited));
    Instant::now().checked_add(remaining)
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

    /// When the alignment in progress turns unaligned, if it may.
    pub fn deadline(&self) -> Option<Instant> {
        self.current.as_ref().and_then(|c| c.deadline)
    }

    /// Whether a barrier of `checkpoint_id` would be news (not handled, not aborted).
    fn is_new(&self, checkpoint_id: u64) -> bool {
        checkpoint_id > self.last_handled && !self.aborted.contains(&checkpoint_id)
    }

    /// Makes `barrier` the checkpoint in progress, aborting an older one (subsumed). `None`
    /// when a newer one is already in progress (the caller declines `barrier`'s checkpoint).
    fn supersede(
        &mut self,
        barrier: &Barrier,
        actions: &mut Vec<AlignmentAction>,
    ) -> Option<&mut InProgress> {
        let id = barrier.checkpoint_id;
        match self.current.as_ref().map(|c| c.barrier.checkpoint_id) {
            Some(cur) if cur == id => {}
            Some(cur) if cur > id => return None,
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
                self.current = Some(InProgress::new(barrier.clone(), self.finished.len()));
            }
        }
        self.current.as_mut()
    }

    /// A producer announced on `channel`'s priority lane the aligned barrier it sent after
    /// `records_before` records.
    pub fn on_announcement(
        &mut self,
        channel: usize,
        barrier: &Barrier,
        records_before: u64,
    ) -> Vec<AlignmentAction> {
        let mut actions = Vec::new();
        if !self.is_new(barrier.checkpoint_id) {
            return actions;
        }
        if let Some(cur) = self.supersede(barrier, &mut actions)
            && let Some(slot) = cur.announced.get_mut(channel)
        {
            *slot = Some(records_before);
        }
        actions
    }

    /// The first barrier of an unaligned checkpoint arrived: it is taken at once. Returns the
    /// aborts of older checkpoints it subsumes, or `None` when the barrier is stale.
    pub fn begin_unaligned(&mut self, checkpoint_id: u64) -> Option<Vec<AlignmentAction>> {
        if !self.is_new(checkpoint_id) {
            return None;
        }
        let mut actions = Vec::new();
        match self.current.as_ref().map(|c| c.barrier.checkpoint_id) {
            Some(cur) if cur > checkpoint_id => {
                if self.aborted.insert(checkpoint_id) {
                    actions.push(AlignmentAction::Abort {
                        checkpoint_id,
                        reason: DeclineReason::Subsumed { newer: cur },
                    });
                }
                return Some(actions);
            }
            Some(cur) if cur < checkpoint_id => {
                self.aborted.insert(cur);
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
        Some(actions)
    }

    /// The deadline of the alignment in progress passed: it turns unaligned.
    pub fn on_timeout(&mut self) -> Vec<AlignmentAction> {
        let Some(cur) = self.current.take() else { return Vec::new() };
        let id = cur.barrier.checkpoint_id;
        self.last_handled = id;
        self.aborted.retain(|a| *a > id);
        let channels = (0..self.finished.len())
            .map(|c| match (cur.parked[c], self.finished[c], cur.announced[c]) {
                (true, _, _) => ChannelMark::BarrierDelivered,
                (_, true, _) => ChannelMark::Ended,
                (_, _, Some(n)) => ChannelMark::Announced(n),
                _ => ChannelMark::Unknown,
            })
            .collect();
        tracing::info!(checkpoint_id = id, "alignment timed out; taking the checkpoint unaligned");
        vec![AlignmentAction::TriggerUnaligned {
            barrier: Barrier { options: cur.barrier.options.to_unaligned(), ..cur.barrier },
            alignment: cur.started.elapsed(),
            channels,
        }]
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
        match self.supersede(&barrier, &mut actions) {
            Some(cur) => {
                if let Some(p) = cur.parked.get_mut(channel) {
                    *p = true;
                }
            }
            None => {
                // Another channel already delivered a newer barrier: this checkpoint cannot be
                // taken any more. Decline it (once) so the coordinator need not wait for it.
                let newer = self.aligning().unwrap_or(id);
                if self.aborted.insert(id) {
                    tracing::info!(checkpoint_id = id, newer, "late barrier of a subsumed checkpoint");
                    actions.push(AlignmentAction::Abort {
                        checkpoint_id: id,
                        reason: DeclineReason::Subsumed { newer },
                    });
                }
                return actions;
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
