//! When checkpoints are triggered: the periodic timer, the minimum pause, and the one queued
//! request that waits for a free slot or for the pause to pass.
//!
//! The scheduler owns one trigger timer per job. When it fires it retries the queued request if
//! there is one, otherwise it makes a periodic request. Rules, as Flink's:
//! - the first periodic trigger comes after a random delay in `[min pause, interval]`, then
//!   every `interval` (an interval below the min pause is raised to it);
//! - a non-forced request (periodic, or a manual checkpoint) that finds `max_concurrent`
//!   checkpoints in flight is queued; at most one request is queued, and it is retried whenever
//!   a checkpoint leaves the in-flight set, however it leaves (completed, expired, declined,
//!   failed, subsumed);
//! - a non-forced request that comes less than `min pause` after the last completion is queued
//!   and the timer is re-armed for the earliest allowed time;
//! - savepoints are forced: they bypass both rules and the queue.
//!
//! The periodic timer never stops silently: after every event, if periodic scheduling is on,
//! either the timer is armed or a request is queued (and will be retried when a slot frees).

use std::path::PathBuf;
use std::time::Duration;

use cairn_raft::model::CheckpointKind;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use super::actions::{Action, TimerToken, TriggerKind, instant_after};
use super::error::TriggerError;
use super::pending::Origin;

/// What kind of snapshot a request produces, resolved and validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotProps {
    pub kind: CheckpointKind,
    /// Parent directory of the savepoint directory (savepoints only).
    pub savepoint_parent: Option<PathBuf>,
    pub drain: bool,
}

impl SnapshotProps {
    pub fn checkpoint() -> Self {
        Self { kind: CheckpointKind::Checkpoint, savepoint_parent: None, drain: false }
    }

    /// Savepoints are forced past the concurrency and min-pause rules.
    pub fn is_forced(&self) -> bool {
        self.kind != CheckpointKind::Checkpoint
    }

    /// Validates a manual trigger: a savepoint needs a directory (given or the job's default);
    /// `drain` is only for synchronous savepoints.
    pub fn resolve(kind: TriggerKind, default_savepoint_dir: Option<&str>) -> Result<Self, TriggerError> {
        match kind {
            TriggerKind::Checkpoint => Ok(Self::checkpoint()),
            TriggerKind::Savepoint { target_dir, sync, drain } => {
                if drain && !sync {
                    return Err(TriggerError::DrainRequiresSyncSavepoint);
                }
                let dir = target_dir
                    .filter(|d| !d.trim().is_empty())
                    .or_else(|| default_savepoint_dir.filter(|d| !d.trim().is_empty()).map(str::to_owned))
                    .ok_or(TriggerError::NoSavepointDirectory)?;
                let kind = if sync { CheckpointKind::SyncSavepoint } else { CheckpointKind::Savepoint };
                Ok(Self { kind, savepoint_parent: Some(PathBuf::from(dir)), drain })
            }
        }
    }
}

/// A trigger request on its way to a checkpoint id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub origin: Origin,
    pub props: SnapshotProps,
}

impl Request {
    pub fn periodic() -> Self {
        Self { origin: Origin::Periodic, props: SnapshotProps::checkpoint() }
    }
}

/// The trigger timer, the queued request and the min-pause clock of one job.
#[derive(Debug)]
pub struct Scheduler {
    /// Effective periodic interval (`None`: manual checkpoints only).
    interval: Option<Duration>,
    min_pause: Duration,
    /// Whether periodic scheduling is on (between start and stop, with an interval).
    periodic: bool,
    /// Between start and stop, whatever the interval (a new interval turns periodic on).
    started: bool,
    /// The armed trigger timer: when, and the token a matching fire carries.
    timer: Option<(Instant, TimerToken)>,
    /// Source of fresh timer tokens.
    next_token: u64,
    /// The one non-forced request waiting for a free slot or for the min pause.
    queued: Option<Request>,
    /// When the last checkpoint completed; the min pause counts from here.
    last_completion: Option<Instant>,
    /// Randomness for the initial delay, seeded so tests are deterministic.
    rng: StdRng,
}

impl Scheduler {
    pub fn new(interval: Option<Duration>, min_pause: Duration, seed: u64) -> Self {
        Self {
            interval,
            min_pause,
            periodic: false,
            started: false,
            timer: None,
            next_token: 0,
            queued: None,
            last_completion: None,
            rng: StdRng::seed_from_u64(seed),
        }
    }

    pub fn is_periodic(&self) -> bool {
        self.periodic
    }

    pub fn has_queued(&self) -> bool {
        self.queued.is_some()
    }

    pub fn armed_at(&self) -> Option<Instant> {
        self.timer.map(|(at, _)| at)
    }

    /// Starts periodic scheduling (a no-op when already on or without an interval): the first
    /// trigger after a random delay in `[min pause, interval]`.
    pub fn start(&mut self, now: Instant, out: &mut Vec<Action>) {
        self.started = true;
        let Some(interval) = self.interval else { return };
        if self.periodic {
            return;
        }
        self.periodic = true;
        let millis = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let hi = millis(interval);
        let lo = millis(self.min_pause).min(hi);
        let delay = Duration::from_millis(self.rng.gen_range(lo..=hi));
        self.arm(instant_after(now, delay), out);
    }

    /// Like [`Scheduler::start`], but the first periodic trigger is due at once.
    pub fn resume(&mut self, now: Instant, out: &mut Vec<Action>) {
        self.started = true;
        if self.interval.is_none() || self.periodic {
            return;
        }
        self.periodic = true;
        self.arm(now, out);
    }

    /// Stops periodic scheduling and disarms the timer; returns the queued request, if any, so
    /// the caller can answer it.
    pub fn stop(&mut self, out: &mut Vec<Action>) -> Option<Request> {
        self.periodic = false;
        self.started = false;
        self.disarm(out);
        self.queued.take()
    }

    /// Applies a new interval and min pause at once: while started, the timer is re-armed one
    /// (new) interval from `now`, or disarmed when the interval is removed; a queued request stays
    /// queued and is retried as before.
    pub fn reconfigure(
        &mut self,
        interval: Option<Duration>,
        min_pause: Duration,
        now: Instant,
        out: &mut Vec<Action>,
    ) {
        self.interval = interval;
        self.min_pause = min_pause;
        if !self.started {
            return;
        }
        self.periodic = interval.is_some();
        if self.queued.is_some() {
            return;
        }
        match interval {
            Some(i) => self.arm(instant_after(now, i), out),
            None => self.disarm(out),
        }
    }

    /// The effective periodic interval in use.
    pub fn interval(&self) -> Option<Duration> {
        self.interval
    }

    /// Records a completion (the min pause starts now).
    pub fn completed(&mut self, now: Instant) {
        self.last_completion = Some(now);
    }

    /// When the min pause forbids a non-forced trigger at `now`: the earliest allowed instant.
    pub fn min_pause_until(&self, now: Instant) -> Option<Instant> {
        let earliest = instant_after(self.last_completion?, self.min_pause);
        (earliest > now).then_some(earliest)
    }

    /// Queues a request (the caller checked the slot is free).
    pub fn queue(&mut self, request: Request) {
        debug_assert!(self.queued.is_none(), "at most one request is queued");
        self.queued = Some(request);
    }

    pub fn take_queued(&mut self) -> Option<Request> {
        self.queued.take()
    }

    /// Accepts a timer fire if its token is the armed one (the timer is then disarmed).
    pub fn fired(&mut self, token: TimerToken) -> bool {
        if self.timer.is_some_and(|(_, t)| t == token) {
            self.timer = None;
            true
        } else {
            false
        }
    }

    pub fn arm(&mut self, at: Instant, out: &mut Vec<Action>) {
        self.next_token += 1;
        let token = TimerToken(self.next_token);
        self.timer = Some((at, token));
        out.push(Action::ScheduleTrigger { at, token });
    }

    pub fn disarm(&mut self, out: &mut Vec<Action>) {
        if self.timer.take().is_some() {
            out.push(Action::CancelTrigger);
        }
    }

    /// Keeps periodic scheduling alive: with periodic scheduling on, no armed timer and nothing
    /// queued, arms the timer one interval from now.
    pub fn ensure_armed(&mut self, now: Instant, out: &mut Vec<Action>) {
        if let Some(interval) = self.interval
            && self.periodic
            && self.timer.is_none()
            && self.queued.is_none()
        {
            self.arm(instant_after(now, interval), out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drain_only_for_sync_savepoint() {
        let sp = |sync, drain| TriggerKind::Savepoint { target_dir: Some("/sp".into()), sync, drain };
        assert_eq!(
            SnapshotProps::resolve(sp(false, true), None),
            Err(TriggerError::DrainRequiresSyncSavepoint)
        );
        let ok = SnapshotProps::resolve(sp(true, true), None).unwrap();
        assert_eq!((ok.kind, ok.drain), (CheckpointKind::SyncSavepoint, true));
    }

    #[test]
    fn savepoint_without_directory_is_a_typed_error() {
        let kind = TriggerKind::Savepoint { target_dir: None, sync: false, drain: false };
        assert_eq!(SnapshotProps::resolve(kind.clone(), None), Err(TriggerError::NoSavepointDirectory));
        assert_eq!(SnapshotProps::resolve(kind.clone(), Some(" ")), Err(TriggerError::NoSavepointDirectory));
        let ok = SnapshotProps::resolve(kind, Some("/default")).unwrap();
        assert_eq!(ok.savepoint_parent, Some(PathBuf::from("/default")));
    }

    #[test]
    fn reconfigure_rearms_a_started_scheduler_at_once() {
        let now = Instant::now();
        let mut s = Scheduler::new(None, Duration::ZERO, 1);
        let mut out = Vec::new();
        // Not started: nothing is armed.
        s.reconfigure(Some(Duration::from_secs(5)), Duration::ZERO, now, &mut out);
        assert!(out.is_empty() && s.armed_at().is_none());
        s.start(now, &mut out);
        out.clear();
        s.reconfigure(Some(Duration::from_millis(100)), Duration::ZERO, now, &mut out);
        assert_eq!(s.armed_at(), Some(now + Duration::from_millis(100)));
        assert!(s.is_periodic());
        s.reconfigure(None, Duration::ZERO, now, &mut out);
        assert!(s.armed_at().is_none() && !s.is_periodic());
        assert!(matches!(out.last(), Some(Action::CancelTrigger)));
    }

    #[test]
    fn resuming_triggers_at_once_then_every_interval() {
        let now = Instant::now();
        let mut s = Scheduler::new(Some(Duration::from_secs(10)), Duration::from_secs(3), 7);
        let mut out = Vec::new();
        s.resume(now, &mut out);
        assert_eq!(s.armed_at(), Some(now));
        assert!(s.is_periodic());
        s.resume(now + Duration::from_secs(1), &mut out);
        assert_eq!(s.armed_at(), Some(now), "a second resume changes nothing");
        let mut idle = Scheduler::new(None, Duration::from_secs(3), 7);
        idle.resume(now, &mut out);
        assert!(idle.armed_at().is_none() && !idle.is_periodic(), "no interval, no trigger");
    }

    #[test]
    fn periodic_initial_delay_lies_between_min_pause_and_interval() {
        let now = Instant::now();
        for seed in 0..50 {
            let mut s = Scheduler::new(Some(Duration::from_secs(10)), Duration::from_secs(3), seed);
            let mut out = Vec::new();
            s.start(now, &mut out);
            let at = s.armed_at().unwrap();
            assert!(at >= now + Duration::from_secs(3) && at <= now + Duration::from_secs(10), "seed {seed}");
            assert!(matches!(out[..], [Action::ScheduleTrigger { .. }]));
        }
    }
}
