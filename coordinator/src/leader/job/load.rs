//! Where a subtask's time went recently (Flink's `backPressuredTimeMsPerSecond`,
//! `busyTimeMsPerSecond`, `idleTimeMsPerSecond`), from the cumulative figures its worker sends
//! every few seconds.
//!
//! The leader keeps, per subtask of the running attempt, the samples of the last [`WINDOW`]
//! (plus the newest one older than that, as the baseline) and takes the rates from the oldest
//! and the newest: each figure's growth per second of the task's running time, on the worker's
//! clock (the three add up to the running time), so the rates add up to 1000 ms/s whatever the
//! delays between the worker and the leader. Samples are stamped with the instant the leader
//! received them, which is only used to age them and to reject figures that grew faster than
//! time passed. Nothing here is replicated: it lives and dies with the attempt.

use std::collections::VecDeque;
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

/// How far back the rates look (at least; the baseline is the newest sample older than this).
pub const WINDOW: Duration = Duration::from_secs(10);
/// Past this without a new sample, the subtask has no current figures.
pub const STALE_AFTER: Duration = Duration::from_secs(15);
/// Figures may grow by this much more than the leader's clock advanced (delays on the way).
const SLACK: Duration = Duration::from_secs(2);
/// Bound on the samples kept per subtask, however often a worker sends.
const MAX_SAMPLES: usize = 64;

/// Cumulative figures of one task attempt, in milliseconds, as its worker sent them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Times {
    pub busy_ms: u64,
    pub idle_ms: u64,
    pub back_pressured_ms: u64,
}

impl Times {
    /// Its running time: the sum, when it does not overflow.
    fn total(&self) -> Option<u64> {
        self.busy_ms.checked_add(self.idle_ms)?.checked_add(self.back_pressured_ms)
    }
}

/// Why a sample was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SampleError {
    #[error("the figures add up to more than u64::MAX milliseconds")]
    Overflow,
    #[error("{figure} went backwards, from {before} ms to {after} ms")]
    Backwards { figure: &'static str, before: u64, after: u64 },
    #[error("the figures grew by {grew:?} while only {elapsed:?} passed on the leader")]
    FasterThanTime { grew: Duration, elapsed: Duration },
    #[error("received before the previous sample")]
    OutOfOrder,
}

/// How back-pressured a subtask is, with Flink's thresholds on the back-pressured ratio.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Backpressure {
    /// At most 10% of the time.
    Ok,
    /// At most 50%.
    Low,
    High,
}

impl Backpressure {
    pub fn name(self) -> &'static str {
        match self {
            Backpressure::Ok => "ok",
            Backpressure::Low => "low",
            Backpressure::High => "high",
        }
    }

    /// The level of `part` out of `whole` (`whole > 0`).
    fn of(part: u64, whole: u64) -> Self {
        let (part, whole) = (u128::from(part), u128::from(whole));
        if part * 10 <= whole {
            Backpressure::Ok
        } else if part * 2 <= whole {
            Backpressure::Low
        } else {
            Backpressure::High
        }
    }
}

/// A subtask's recent figures, in milliseconds per second of running time (they add up to
/// 1000).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Load {
    pub back_pressured_ms_per_second: u32,
    pub busy_ms_per_second: u32,
    pub idle_ms_per_second: u32,
    pub backpressure: Backpressure,
}

/// The recent samples of one subtask attempt.
#[derive(Debug, Clone, Default)]
pub struct LoadWindow {
    samples: VecDeque<(Instant, Times)>,
}

impl LoadWindow {
    /// Takes the figures received at `at`, or says why they make no sense next to the previous
    /// ones (they are then not taken).
    pub fn push(&mut self, at: Instant, times: Times) -> Result<(), SampleError> {
        let total = times.total().ok_or(SampleError::Overflow)?;
        if let Some((prev_at, prev)) = self.samples.back() {
            if at < *prev_at {
                return Err(SampleError::OutOfOrder);
            }
            for (figure, before, after) in [
                ("busy time", prev.busy_ms, times.busy_ms),
                ("idle time", prev.idle_ms, times.idle_ms),
                ("back-pressured time", prev.back_pressured_ms, times.back_pressured_ms),
            ] {
                if after < before {
                    return Err(SampleError::Backwards { figure, before, after });
                }
            }
            // The previous total did not overflow and every figure grew: no underflow.
            let grew = Duration::from_millis(total - prev.total().unwrap_or(0));
            let elapsed = at.duration_since(*prev_at);
            if grew > elapsed + elapsed / 4 + SLACK {
                return Err(SampleError::FasterThanTime { grew, elapsed });
            }
        }
        self.samples.push_back((at, times));
        // Keep one sample at least WINDOW old as the baseline, none older.
        while self.samples.len() > 2
            && self.samples.get(1).is_some_and(|(t, _)| at.duration_since(*t) >= WINDOW)
        {
            self.samples.pop_front();
        }
        while self.samples.len() > MAX_SAMPLES {
            self.samples.pop_front();
        }
        Ok(())
    }

    /// The rates over the window as of `now`; `None` before two samples with running time
    /// between them, or when the newest is older than [`STALE_AFTER`].
    pub fn load(&self, now: Instant) -> Option<Load> {
        let (first_at, first) = self.samples.front()?;
        let (last_at, last) = self.samples.back()?;
        if last_at <= first_at || now.saturating_duration_since(*last_at) > STALE_AFTER {
            return None;
        }
        let whole = last.total()?.checked_sub(first.total()?).filter(|w| *w > 0)?;
        let back_pressured = last.back_pressured_ms.checked_sub(first.back_pressured_ms)?;
        let idle = last.idle_ms.checked_sub(first.idle_ms)?;
        let per_second = |part: u64| {
            let ms = u128::from(part) * 1000 / u128::from(whole);
            u32::try_from(ms).unwrap_or(1000).min(1000)
        };
        let back_pressured_ms_per_second = per_second(back_pressured);
        let idle_ms_per_second = per_second(idle).min(1000 - back_pressured_ms_per_second);
        Some(Load {
            back_pressured_ms_per_second,
            busy_ms_per_second: 1000 - back_pressured_ms_per_second - idle_ms_per_second,
            idle_ms_per_second,
            backpressure: Backpressure::of(back_pressured, whole),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn times(busy_ms: u64, idle_ms: u64, back_pressured_ms: u64) -> Times {
        Times { busy_ms, idle_ms, back_pressured_ms }
    }

    #[test]
    fn rates_come_from_the_oldest_and_newest_samples_of_the_window() {
        let t0 = Instant::now();
        let mut w = LoadWindow::default();
        w.push(t0, times(500, 400, 100)).unwrap();
        assert_eq!(w.load(t0), None, "one sample is no rate");
        // 2 s of running time: 1 s back-pressured, 0.6 s busy, 0.4 s idle.
        w.push(t0 + 2 * S, times(1_100, 800, 1_100)).unwrap();
        let load = w.load(t0 + 2 * S).unwrap();
        assert_eq!(
            load,
            Load {
                back_pressured_ms_per_second: 500,
                busy_ms_per_second: 300,
                idle_ms_per_second: 200,
                backpressure: Backpressure::Low,
            }
        );
        // Twenty seconds later, all back-pressured: the window forgot the first samples.
        for i in 1..=10u64 {
            w.push(t0 + Duration::from_secs(2 + 2 * i), times(1_100, 800, 1_100 + 2_000 * i)).unwrap();
        }
        let load = w.load(t0 + 22 * S).unwrap();
        assert_eq!((load.back_pressured_ms_per_second, load.backpressure), (1000, Backpressure::High));
        assert!(w.samples.len() <= 7, "{} samples kept", w.samples.len());
        assert_eq!(w.load(t0 + 22 * S + STALE_AFTER + S), None, "no new sample: no current figure");
    }

    #[test]
    fn the_rates_add_up_to_a_thousand() {
        let t0 = Instant::now();
        let mut w = LoadWindow::default();
        w.push(t0, Times::default()).unwrap();
        w.push(t0 + 3 * S, times(1_001, 999, 1_000)).unwrap();
        let l = w.load(t0 + 3 * S).unwrap();
        assert_eq!(l.back_pressured_ms_per_second + l.busy_ms_per_second + l.idle_ms_per_second, 1000);
        assert_eq!(l.backpressure, Backpressure::Low);
    }

    #[test]
    fn flinks_thresholds() {
        assert_eq!(Backpressure::of(100, 1000), Backpressure::Ok);
        assert_eq!(Backpressure::of(101, 1000), Backpressure::Low);
        assert_eq!(Backpressure::of(500, 1000), Backpressure::Low);
        assert_eq!(Backpressure::of(501, 1000), Backpressure::High);
        assert_eq!(Backpressure::of(u64::MAX, u64::MAX), Backpressure::High);
    }

    #[test]
    fn absurd_figures_are_refused_and_change_nothing() {
        let t0 = Instant::now();
        let mut w = LoadWindow::default();
        assert_eq!(w.push(t0, times(u64::MAX, 1, 0)), Err(SampleError::Overflow));
        w.push(t0, times(1_000, 0, 0)).unwrap();
        let e = w.push(t0 + 2 * S, times(999, 2_000, 0)).unwrap_err();
        assert!(
            matches!(e, SampleError::Backwards { figure: "busy time", before: 1_000, after: 999 }),
            "{e}"
        );
        let e = w.push(t0 + 2 * S, times(1_000, 60_000, 0)).unwrap_err();
        assert!(matches!(e, SampleError::FasterThanTime { .. }), "{e}");
        assert_eq!(w.push(t0 + 2 * S, times(u64::MAX / 2, u64::MAX / 2, 2)), Err(SampleError::Overflow));
        assert_eq!(w.samples.len(), 1, "nothing taken");
        // Within the slack for delays on the way: taken.
        w.push(t0 + 2 * S, times(1_000, 3_500, 0)).unwrap();
        assert_eq!(w.push(t0 + S, times(1_000, 3_600, 0)), Err(SampleError::OutOfOrder));
        let l = w.load(t0 + 2 * S).unwrap();
        assert_eq!((l.idle_ms_per_second, l.backpressure), (1000, Backpressure::Ok));
    }

    #[test]
    fn no_running_time_between_samples_is_no_rate() {
        let t0 = Instant::now();
        let mut w = LoadWindow::default();
        w.push(t0, times(10, 0, 0)).unwrap();
        w.push(t0 + 2 * S, times(10, 0, 0)).unwrap();
        assert_eq!(w.load(t0 + 2 * S), None);
    }

    #[test]
    fn a_flood_of_samples_keeps_memory_bounded() {
        let t0 = Instant::now();
        let mut w = LoadWindow::default();
        for i in 0..1_000u64 {
            w.push(t0 + Duration::from_millis(i), times(i, 0, 0)).unwrap();
        }
        assert_eq!(w.samples.len(), MAX_SAMPLES);
        assert_eq!(w.load(t0 + S).map(|l| l.busy_ms_per_second), Some(1000));
    }
}
