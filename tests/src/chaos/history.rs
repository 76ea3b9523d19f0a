//! What a chaos run saw: every observation of the replicated store, every direct status answer
//! of a replica, every fault with its injection and heal times, the file-system scans of the
//! checkpoint and output volumes, and the final exactly-once check.
//!
//! Times are milliseconds since the Unix epoch on the host; the containers share the host's
//! clock, so times stamped by the leader (`_metadata` trigger and completion times, restore
//! times) compare with them directly. The history is written as JSON next to the report, so a
//! failed run can be examined afterwards.

use serde::{Deserialize, Serialize};

use super::schedule::FaultKind;

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// The demo job's replicated record as the leader answered it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobView {
    pub status: String,
    /// The ID the next allocation returns.
    pub next_checkpoint_id: u64,
    /// Retained completed checkpoints, oldest first.
    pub completed_ids: Vec<u64>,
    /// Completed checkpoints ever added.
    pub num_completed: u64,
    pub savepoint_ids: Vec<u64>,
    pub attempts: u32,
    /// The latest restore the leader recorded in its statistics (`None` before the first).
    pub latest_restored: Option<RestoreView>,
}

impl JobView {
    /// Highest completed checkpoint or savepoint id (0 when none).
    pub fn latest(&self) -> u64 {
        self.completed_ids.iter().chain(&self.savepoint_ids).copied().max().unwrap_or(0)
    }

    /// Highest completed checkpoint id, savepoints excluded (0 when none).
    pub fn latest_checkpoint(&self) -> u64 {
        self.completed_ids.last().copied().unwrap_or(0)
    }
}

/// A restore recorded by a leader.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestoreView {
    pub id: u64,
    pub restore_time_ms: u64,
}

/// One successful linearizable read of the leader: its status, then the job's record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Observation {
    /// When the status request was sent.
    pub sent_ms: u64,
    /// When the job's reply arrived: everything it shows was committed before.
    pub at_ms: u64,
    /// The replica that answered.
    pub node: u64,
    pub term: u64,
    pub leader_id: u64,
    pub job: JobView,
}

/// A successful `Cluster.Status` answer of one replica asked directly (only a leader that
/// confirmed its leadership with a quorum answers; followers refuse with a not-leader status).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusAnswer {
    /// When the request was sent (requests go out one at a time).
    pub sent_ms: u64,
    /// When the answer arrived.
    pub at_ms: u64,
    /// The replica's container name.
    pub asked: String,
    pub node: u64,
    pub term: u64,
    pub leader_id: u64,
}

/// A completed checkpoint as first seen, with the times its `_metadata` records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Completion {
    pub id: u64,
    pub first_seen_ms: u64,
    /// Term of the leader whose read first showed it.
    pub seen_in_term: u64,
    /// From `_metadata` (`None` when it was subsumed and deleted before it could be read).
    pub trigger_time_ms: Option<u64>,
    pub completion_time_ms: Option<u64>,
}

/// One injected fault.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultRecord {
    pub index: usize,
    pub kind: FaultKind,
    /// Container (or volume) the fault hit.
    pub target: String,
    pub injected_ms: u64,
    /// When the fault was undone (the injection time for faults that heal themselves).
    pub healed_ms: Option<u64>,
    /// Why the fault could not be injected or healed, if so.
    pub error: Option<String>,
}

/// The output volume's `committed/` directory listed, then the store read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SinkScan {
    pub at_ms: u64,
    pub files: usize,
    /// Highest checkpoint id in a committed file's name.
    pub max_committed: Option<u64>,
    /// Highest completed checkpoint or savepoint id in the store, read after the listing.
    pub store_latest_after: u64,
}

/// A problem with one retained checkpoint's files.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetainedProblem {
    pub id: u64,
    pub what: String,
}

/// The store read, every retained checkpoint's `_metadata` and state files checked on the
/// checkpoint volume, then the store read again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetainedScan {
    pub at_ms: u64,
    /// The job's status at the second store read: a terminal job's checkpoints are discarded
    /// by the retention policy (Flink's default), so its scans check nothing.
    pub job_status: String,
    pub retained_before: Vec<u64>,
    pub retained_after: Vec<u64>,
    pub files_checked: usize,
    pub problems: Vec<RetainedProblem>,
}

/// The end of the run: stop-with-savepoint, then the verifier over the committed output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinalCheck {
    pub at_ms: u64,
    /// The final savepoint's id and directory (container path).
    pub savepoint: Option<(u64, String)>,
    /// Why the job could not be stopped with a savepoint, if so.
    pub stop_error: Option<String>,
    /// The output was checked against the source offsets in the final savepoint (exactly the
    /// records the source emitted), not only for internal consistency.
    pub exact_counts: bool,
    pub exactly_once: bool,
    /// The verifier's verdict, or why it could not run.
    pub verdict: String,
}

/// Everything a run recorded.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct History {
    pub seed: u64,
    pub started_ms: u64,
    pub observations: Vec<Observation>,
    pub statuses: Vec<StatusAnswer>,
    pub completions: Vec<Completion>,
    pub faults: Vec<FaultRecord>,
    pub sink_scans: Vec<SinkScan>,
    pub retained_scans: Vec<RetainedScan>,
    pub final_check: Option<FinalCheck>,
}

/// How long one fault took to recover from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recovery {
    pub fault: usize,
    pub kind: FaultKind,
    pub injected_ms: u64,
    pub healed_ms: u64,
    /// The first checkpoint triggered after the fault was injected and completed.
    pub first_checkpoint: Option<u64>,
    /// From injection to that checkpoint's completion.
    pub recovery_ms: Option<u64>,
}

impl History {
    /// Recovery of every fault that was injected: from injection to the completion of the first
    /// checkpoint triggered after it (so a checkpoint already in flight does not count). Where
    /// `_metadata` could not be read, the first checkpoint first seen after the heal counts,
    /// with its first sighting as its completion time.
    pub fn recoveries(&self) -> Vec<Recovery> {
        self.faults
            .iter()
            .filter(|f| f.error.is_none())
            .map(|f| {
                let healed = f.healed_ms.unwrap_or(f.injected_ms);
                let first = self
                    .completions
                    .iter()
                    .filter_map(|c| match (c.trigger_time_ms, c.completion_time_ms) {
                        (Some(t), Some(done)) if t >= f.injected_ms => Some((c.id, done)),
                        (None, _) | (_, None) if c.first_seen_ms > healed => Some((c.id, c.first_seen_ms)),
                        _ => None,
                    })
                    .min_by_key(|(_, done)| *done);
                Recovery {
                    fault: f.index,
                    kind: f.kind,
                    injected_ms: f.injected_ms,
                    healed_ms: healed,
                    first_checkpoint: first.map(|(id, _)| id),
                    recovery_ms: first.map(|(_, done)| done.saturating_sub(f.injected_ms)),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn completion(id: u64, trigger: Option<u64>, done: Option<u64>, seen: u64) -> Completion {
        Completion {
            id,
            first_seen_ms: seen,
            seen_in_term: 1,
            trigger_time_ms: trigger,
            completion_time_ms: done,
        }
    }

    fn fault(kind: FaultKind, injected: u64, healed: u64) -> FaultRecord {
        FaultRecord {
            index: 0,
            kind,
            target: "cairn-1".into(),
            injected_ms: injected,
            healed_ms: Some(healed),
            error: None,
        }
    }

    #[test]
    fn recovery_counts_the_first_checkpoint_triggered_after_the_fault() {
        let h = History {
            faults: vec![fault(FaultKind::KillLeader, 1_000, 5_000)],
            completions: vec![
                // In flight at the fault: completes after it but does not count.
                completion(4, Some(900), Some(1_100), 1_150),
                completion(5, Some(2_500), Some(2_900), 3_000),
                completion(6, Some(3_000), Some(3_200), 3_300),
            ],
            ..History::default()
        };
        let r = &h.recoveries()[0];
        assert_eq!(r.first_checkpoint, Some(5));
        assert_eq!(r.recovery_ms, Some(1_900));
    }

    #[test]
    fn without_metadata_the_first_checkpoint_seen_after_the_heal_counts() {
        let h = History {
            faults: vec![fault(FaultKind::FillCheckpointVolume, 1_000, 5_000)],
            completions: vec![completion(4, None, None, 4_000), completion(5, None, None, 6_000)],
            ..History::default()
        };
        let r = &h.recoveries()[0];
        assert_eq!((r.first_checkpoint, r.recovery_ms), (Some(5), Some(5_000)));
    }

    #[test]
    fn a_fault_never_recovered_from_has_no_recovery_time() {
        let h = History {
            faults: vec![fault(FaultKind::PauseLeader, 1_000, 2_000)],
            completions: vec![completion(4, Some(900), Some(1_100), 1_150)],
            ..History::default()
        };
        assert_eq!(h.recoveries()[0].recovery_ms, None);
    }
}
