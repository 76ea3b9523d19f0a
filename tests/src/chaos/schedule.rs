//! The fault schedule: which faults, in which order, how long each lasts, all drawn from one
//! seed so that `--seed N` replays the same schedule.
//!
//! A schedule fixes the kinds, fault windows, settle pauses and replica picks; when a fault
//! starts depends on how fast the cluster recovered from the previous one, so the wall-clock
//! timing of a replay differs while the sequence of faults is the same.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

/// What the nemesis does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// SIGKILL the leader's container; start it again after the window.
    KillLeader,
    /// Freeze the leader's container (cgroup freezer) for the window.
    PauseLeader,
    /// Disconnect the leader from the cluster network for the window.
    PartitionLeader,
    /// Disconnect the worker from the cluster network for the window.
    PartitionWorker,
    /// Restart one replica (any role) with its data: SIGTERM, then start.
    RestartReplica,
    /// Fill the checkpoint volume to the last byte for the window, then free it.
    FillCheckpointVolume,
    /// Checkpoint storage too slow for the checkpoint timeout for the window (the job's timeout
    /// cut to 10 ms): checkpoints expire until it is healed.
    ExpireCheckpoints,
    /// Make the job's checkpoint directory and the sink's pending directory read-only for the
    /// window: tasks fail in the asynchronous part (state files) and in the synchronous part
    /// (the sink's pre-commit) of every checkpoint.
    FailSnapshots,
    /// Take a savepoint, then delete its directory under the running job.
    DeleteSavepoint,
}

impl FaultKind {
    pub const ALL: [FaultKind; 9] = [
        FaultKind::KillLeader,
        FaultKind::PauseLeader,
        FaultKind::PartitionLeader,
        FaultKind::PartitionWorker,
        FaultKind::RestartReplica,
        FaultKind::FillCheckpointVolume,
        FaultKind::ExpireCheckpoints,
        FaultKind::FailSnapshots,
        FaultKind::DeleteSavepoint,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FaultKind::KillLeader => "kill-leader",
            FaultKind::PauseLeader => "pause-leader",
            FaultKind::PartitionLeader => "partition-leader",
            FaultKind::PartitionWorker => "partition-worker",
            FaultKind::RestartReplica => "restart-replica",
            FaultKind::FillCheckpointVolume => "fill-checkpoint-volume",
            FaultKind::ExpireCheckpoints => "expire-checkpoints",
            FaultKind::FailSnapshots => "fail-snapshots",
            FaultKind::DeleteSavepoint => "delete-savepoint",
        }
    }

    /// Bounds of the fault window in milliseconds: how long the fault stays in place before it
    /// is healed. A restart heals itself (`docker restart` is one step).
    fn window_ms(self) -> (u64, u64) {
        match self {
            FaultKind::KillLeader => (2_000, 8_000),
            FaultKind::PauseLeader => (2_000, 8_000),
            FaultKind::PartitionLeader => (3_000, 10_000),
            FaultKind::PartitionWorker => (3_000, 8_000),
            FaultKind::RestartReplica => (0, 0),
            FaultKind::FillCheckpointVolume => (4_000, 10_000),
            FaultKind::ExpireCheckpoints => (3_000, 8_000),
            FaultKind::FailSnapshots => (3_000, 8_000),
            FaultKind::DeleteSavepoint => (0, 0),
        }
    }
}

impl std::fmt::Display for FaultKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One fault as planned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedFault {
    pub kind: FaultKind,
    /// How long the fault stays in place.
    pub window: Duration,
    /// Quiet time after the cluster recovered, before the next fault.
    pub settle: Duration,
    /// Which replica a replica-level fault that does not target the leader picks (modulo the
    /// number of replicas).
    pub replica_pick: u32,
}

/// A seeded sequence of faults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    pub seed: u64,
    pub faults: Vec<PlannedFault>,
}

/// Bounds of the quiet time between faults, in milliseconds.
const SETTLE_MS: (u64, u64) = (2_000, 5_000);
/// Faults planned for a long run; the runner stops at its deadline, long before this many.
const LONG_RUN_FAULTS: usize = 1_000;

impl Schedule {
    /// Every kind exactly once, in a seeded order (the CI run).
    pub fn quick(seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut kinds = FaultKind::ALL.to_vec();
        kinds.shuffle(&mut rng);
        let faults = kinds.into_iter().map(|k| plan(&mut rng, k)).collect();
        Self { seed, faults }
    }

    /// Every kind once first (so even a short run covers them all), then kinds drawn at random.
    pub fn long(seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut kinds = FaultKind::ALL.to_vec();
        kinds.shuffle(&mut rng);
        while kinds.len() < LONG_RUN_FAULTS {
            let k = FaultKind::ALL[rng.gen_range(0..FaultKind::ALL.len())];
            kinds.push(k);
        }
        let faults = kinds.into_iter().map(|k| plan(&mut rng, k)).collect();
        Self { seed, faults }
    }
}

fn plan(rng: &mut StdRng, kind: FaultKind) -> PlannedFault {
    let (lo, hi) = kind.window_ms();
    PlannedFault {
        kind,
        window: Duration::from_millis(rng.gen_range(lo..=hi)),
        settle: Duration::from_millis(rng.gen_range(SETTLE_MS.0..=SETTLE_MS.1)),
        replica_pick: rng.r#gen(),
    }
}

/// A fresh seed for a run that was not given one.
pub fn random_seed() -> u64 {
    rand::random()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_replays_the_same_schedule() {
        assert_eq!(Schedule::quick(42), Schedule::quick(42));
        assert_eq!(Schedule::long(7).faults[..50], Schedule::long(7).faults[..50]);
        assert_ne!(Schedule::quick(42).faults, Schedule::quick(43).faults);
    }

    #[test]
    fn a_quick_schedule_has_every_kind_exactly_once() {
        for seed in 0..20 {
            let s = Schedule::quick(seed);
            let mut kinds: Vec<_> = s.faults.iter().map(|f| f.kind).collect();
            kinds.sort();
            assert_eq!(kinds, FaultKind::ALL.to_vec(), "seed {seed}");
        }
    }

    #[test]
    fn a_long_schedule_starts_with_every_kind_and_keeps_windows_in_bounds() {
        let s = Schedule::long(9);
        let n = FaultKind::ALL.len();
        let mut first: Vec<_> = s.faults[..n].iter().map(|f| f.kind).collect();
        first.sort();
        assert_eq!(first, FaultKind::ALL.to_vec());
        for f in &s.faults {
            let (lo, hi) = f.kind.window_ms();
            let w = f.window.as_millis() as u64;
            assert!(lo <= w && w <= hi, "{f:?}");
            let settle = f.settle.as_millis() as u64;
            assert!((SETTLE_MS.0..=SETTLE_MS.1).contains(&settle), "{f:?}");
        }
        // Later kinds are drawn, not cycled: every kind shows up again.
        for k in FaultKind::ALL {
            assert!(s.faults[n..].iter().filter(|f| f.kind == k).count() > 50, "{k}");
        }
    }
}
