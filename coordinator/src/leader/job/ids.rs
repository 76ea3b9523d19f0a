//! Checkpoint ids off the critical path: the driver reserves a range of ids in one Raft commit
//! (`Command::ReserveCheckpointIds`) and hands them out locally, so a trigger does not wait for
//! a Raft round trip. The replicated counter moves past the whole range at the commit, so a
//! later leader (or a later attempt of this job) starts above every id reserved here: ids stay
//! strictly increasing and are never reused; what a range did not hand out is skipped.
//!
//! A range belongs to the driver's generation: a new preparation (which may advance the
//! counter for a restore) discards it, so no id below a restored savepoint is handed out.
//!
//! A range is reserved only once the coordinator core exists, on its first allocation: the
//! core starts above the replicated counter, so a range reserved before it was created would
//! lie below the core's highest id and every id in it would be refused.

use std::collections::VecDeque;

use super::*;
use crate::checkpoint::AllocationToken;

/// Ids reserved per commit. At one checkpoint a second this is one commit every 100 s; the
/// price is a gap of at most this many ids when the leader changes.
pub(super) const IDS_PER_RESERVATION: u32 = 100;

/// The driver's reserved ids and the allocations waiting for the next range.
#[derive(Debug, Default)]
pub(super) struct IdReservation {
    /// The next id to hand out and the end (exclusive) of the range.
    next: u64,
    end: u64,
    /// Generation the range was reserved in.
    generation: u64,
    /// A reservation is being committed (for this generation).
    in_flight: Option<u64>,
    waiting: VecDeque<AllocationToken>,
}

impl IdReservation {
    fn take(&mut self, generation: u64) -> Option<u64> {
        if self.generation != generation || self.next >= self.end {
            return None;
        }
        let id = self.next;
        self.next += 1;
        Some(id)
    }
}

impl JobDriver {
    /// Carries out `Action::AllocateCheckpointId`: an id from the range, or after the next
    /// reservation commits.
    pub(super) fn allocate_id(&mut self, token: AllocationToken) {
        if self.ids.waiting.is_empty()
            && let Some(id) = self.ids.take(self.generation)
        {
            self.spawn_internal(async move {
                Internal::Core(Event::CheckpointIdAllocated { token, checkpoint_id: id })
            });
            return;
        }
        self.ids.waiting.push_back(token);
        self.reserve_ids();
    }

    /// Starts a reservation unless one for this generation is being committed already.
    fn reserve_ids(&mut self) {
        if self.ids.in_flight == Some(self.generation) {
            return;
        }
        let generation = self.generation;
        self.ids.in_flight = Some(generation);
        let (ctx, job) = (self.ctx.clone(), self.job.clone());
        self.spawn_internal(async move {
            let result = propose(&ctx, Command::ReserveCheckpointIds { job, count: IDS_PER_RESERVATION })
                .await
                .map_err(|e| e.to_string())
                .and_then(|(outcome, _)| match outcome {
                    Outcome::CheckpointIds { first, count } => Ok((first, count)),
                    other => Err(format!("unexpected outcome {other:?}")),
                });
            Internal::IdsReserved { generation, result }
        });
    }

    /// A reservation committed (or failed): serve the waiting allocations from it.
    pub(super) fn on_ids_reserved(&mut self, generation: u64, result: Result<(u64, u32), String>) {
        if self.ids.in_flight == Some(generation) {
            self.ids.in_flight = None;
        }
        if generation != self.generation {
            // Superseded by a new preparation; its waiters (if any) wait for the current one.
            if !self.ids.waiting.is_empty() {
                self.reserve_ids();
            }
            return;
        }
        match result {
            Ok((first, count)) => {
                tracing::debug!(job = %self.job, first, count, "checkpoint ids reserved");
                self.ids.generation = generation;
                self.ids.next = first;
                self.ids.end = first.saturating_add(u64::from(count));
                while let Some(&token) = self.ids.waiting.front() {
                    let Some(id) = self.ids.take(generation) else { break };
                    self.ids.waiting.pop_front();
                    self.on_internal(Internal::Core(Event::CheckpointIdAllocated {
                        token,
                        checkpoint_id: id,
                    }));
                }
                if !self.ids.waiting.is_empty() {
                    self.reserve_ids();
                }
            }
            Err(error) => {
                tracing::warn!(job = %self.job, %error, "cannot reserve checkpoint ids");
                for token in std::mem::take(&mut self.ids.waiting) {
                    self.on_internal(Internal::Core(Event::CheckpointIdAllocationFailed {
                        token,
                        error: error.clone(),
                    }));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_serves_its_generation_only_and_in_order() {
        let mut ids = IdReservation { next: 5, end: 8, generation: 2, ..IdReservation::default() };
        assert_eq!(ids.take(1), None, "another generation's range is not used");
        assert_eq!(ids.take(2), Some(5));
        assert_eq!(ids.take(2), Some(6));
        assert_eq!(ids.take(2), Some(7));
        assert_eq!(ids.take(2), None, "exhausted");
    }
}
