//! Restart strategies: when a failed job is deployed again, and when it is given up.
//!
//! Flink's strategies with Flink's names and defaults. Each is a pure function of the strategy,
//! the job's [`RestartState`] (replicated with the job, so a new leader continues a backoff where
//! the old one left it), the failure's wall-clock time and, for jitter, a random sample the
//! proposer draws: [`RestartStrategy::on_failure`] answers "restart at T" or "give up", and
//! updates the state. Nothing here reads a clock.
//!
//! | strategy | restarts | gives up |
//! | --- | --- | --- |
//! | `none` | never | at the first failure |
//! | `fixed-delay` | after `delay` | after `attempts` restarts |
//! | `failure-rate` | after `delay` | when more than `max_failures_per_interval` failures fall in `failure_rate_interval` |
//! | `exponential-delay` | after a backoff from `initial_backoff`, times `backoff_multiplier` per failure, up to `max_backoff`, ± `jitter_factor`; reset after `reset_backoff_threshold` without failure, or when a checkpoint completes | after `attempts_before_reset_backoff` failures without a reset (unlimited by default) |
//!
//! One rule is Cairn's own: a completed checkpoint also resets the exponential backoff
//! ([`RestartState::on_checkpoint_completed`]). Flink's restart strategies cannot see checkpoints,
//! so they reset only on quiet time (an hour by default); a job that recovered and made durable
//! progress since its last failure is not in a crash loop, and its next, unrelated failure should
//! not wait up to `max_backoff`. A loop that never gets to a checkpoint still backs off.
//!
//! `exponential-delay` is the default when the job checkpoints periodically, `none` otherwise
//! (as in Flink); a job's spec or the cluster's configuration may name another.

use std::collections::VecDeque;
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How a job is restarted after a failure.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case", deny_unknown_fields)]
pub enum RestartStrategy {
    /// Never restart: the first failure fails the job.
    None,
    /// Restart after a fixed delay, at most `attempts` times.
    FixedDelay {
        #[serde(default = "defaults::fixed_attempts")]
        attempts: u32,
        #[serde(default = "defaults::delay", with = "humantime_serde")]
        delay: Duration,
    },
    /// Restart after a fixed delay unless more than `max_failures_per_interval` failures happened
    /// within `failure_rate_interval`.
    FailureRate {
        #[serde(default = "defaults::max_failures_per_interval")]
        max_failures_per_interval: u32,
        #[serde(default = "defaults::failure_rate_interval", with = "humantime_serde")]
        failure_rate_interval: Duration,
        #[serde(default = "defaults::delay", with = "humantime_serde")]
        delay: Duration,
    },
    /// Restart after an exponentially growing, jittered backoff.
    ExponentialDelay {
        #[serde(default = "defaults::initial_backoff", with = "humantime_serde")]
        initial_backoff: Duration,
        #[serde(default = "defaults::max_backoff", with = "humantime_serde")]
        max_backoff: Duration,
        #[serde(default = "defaults::backoff_multiplier")]
        backoff_multiplier: f64,
        /// A failure this long after the previous one starts the backoff again.
        #[serde(default = "defaults::reset_backoff_threshold", with = "humantime_serde")]
        reset_backoff_threshold: Duration,
        /// Each backoff is moved by up to this fraction of itself, up or down.
        #[serde(default = "defaults::jitter_factor")]
        jitter_factor: f64,
        /// Failures tolerated between two resets; `None` is unlimited.
        #[serde(default)]
        attempts_before_reset_backoff: Option<u32>,
    },
}

// `backoff_multiplier` and `jitter_factor` are floats; validation refuses NaN, so equality is
// reflexive for every strategy a job can hold.
impl Eq for RestartStrategy {}

/// Flink's defaults, in one place.
mod defaults {
    use std::time::Duration;

    pub fn fixed_attempts() -> u32 {
        1
    }
    pub fn delay() -> Duration {
        Duration::from_secs(1)
    }
    pub fn max_failures_per_interval() -> u32 {
        1
    }
    pub fn failure_rate_interval() -> Duration {
        Duration::from_secs(60)
    }
    pub fn initial_backoff() -> Duration {
        Duration::from_secs(1)
    }
    pub fn max_backoff() -> Duration {
        Duration::from_secs(60)
    }
    pub fn backoff_multiplier() -> f64 {
        1.5
    }
    pub fn reset_backoff_threshold() -> Duration {
        Duration::from_secs(60 * 60)
    }
    pub fn jitter_factor() -> f64 {
        0.1
    }
}

impl RestartStrategy {
    /// `exponential-delay` with Flink's defaults.
    pub fn exponential_delay() -> Self {
        Self::ExponentialDelay {
            initial_backoff: defaults::initial_backoff(),
            max_backoff: defaults::max_backoff(),
            backoff_multiplier: defaults::backoff_multiplier(),
            reset_backoff_threshold: defaults::reset_backoff_threshold(),
            jitter_factor: defaults::jitter_factor(),
            attempts_before_reset_backoff: None,
        }
    }

    /// `fixed-delay` with `attempts` restarts `delay` apart.
    pub fn fixed_delay(attempts: u32, delay: Duration) -> Self {
        Self::FixedDelay { attempts, delay }
    }

    /// The strategy a job gets when neither its spec nor the cluster names one: exponential
    /// delay when it checkpoints periodically, none otherwise (Flink's rule).
    pub fn default_for(checkpointing: bool) -> Self {
        if checkpointing { Self::exponential_delay() } else { Self::None }
    }

    /// The strategy's name, as written in configuration.
    pub fn name(&self) -> &'static str {
        match self {
            Self::None => "none",
            Self::FixedDelay { .. } => "fixed-delay",
            Self::FailureRate { .. } => "failure-rate",
            Self::ExponentialDelay { .. } => "exponential-delay",
        }
    }

    /// Checks every parameter; the error names the field.
    pub fn validate(&self) -> Result<(), RestartStrategyError> {
        let bad = |field: &'static str, reason: &str| {
            Err(RestartStrategyError {
                strategy: self.name().to_owned(),
                field: field.to_owned(),
                reason: reason.to_owned(),
            })
        };
        match self {
            Self::None | Self::FixedDelay { .. } => Ok(()),
            Self::FailureRate { max_failures_per_interval, failure_rate_interval, .. } => {
                if *max_failures_per_interval == 0 {
                    return bad("max_failures_per_interval", "must be at least 1");
                }
                if failure_rate_interval.is_zero() {
                    return bad("failure_rate_interval", "must be longer than 0s");
                }
                Ok(())
            }
            Self::ExponentialDelay {
                initial_backoff,
                max_backoff,
                backoff_multiplier,
                reset_backoff_threshold,
                jitter_factor,
                attempts_before_reset_backoff,
            } => {
                if initial_backoff.is_zero() {
                    return bad("initial_backoff", "must be longer than 0s");
                }
                if max_backoff < initial_backoff {
                    return bad("max_backoff", "must be at least initial_backoff");
                }
                if !backoff_multiplier.is_finite() || *backoff_multiplier < 1.0 {
                    return bad("backoff_multiplier", "must be a number of at least 1.0");
                }
                if reset_backoff_threshold.is_zero() {
                    return bad("reset_backoff_threshold", "must be longer than 0s");
                }
                if !jitter_factor.is_finite() || !(0.0..=1.0).contains(jitter_factor) {
                    return bad("jitter_factor", "must be between 0.0 and 1.0");
                }
                if *attempts_before_reset_backoff == Some(0) {
                    return bad("attempts_before_reset_backoff", "must be at least 1 (or unset: unlimited)");
                }
                Ok(())
            }
        }
    }

    /// Decides what a failure at `now_ms` (wall clock, ms since the epoch) leads to, and records
    /// it in `state`. `jitter` is a sample in `[-1, 1]` the caller drew at random (so that every
    /// replica applying the decision computes the same backoff).
    pub fn on_failure(
        &self,
        state: &mut RestartState,
        now_ms: u64,
        jitter: f64,
        cause: &str,
    ) -> RestartDecision {
        state.failures = state.failures.saturating_add(1);
        state.last_failure = Some(FailureRecord { at_ms: now_ms, cause: truncate(cause) });
        let decision = match self {
            Self::None => RestartDecision::GiveUp {
                reason: format!("the restart strategy is none; the job failed: {cause}"),
            },
            Self::FixedDelay { attempts, delay } => {
                if state.restarts >= *attempts {
                    RestartDecision::GiveUp {
                        reason: format!(
                            "the fixed-delay restart strategy allows {attempts} restart(s) and all were used; last failure: {cause}"
                        ),
                    }
                } else {
                    restart_after(now_ms, *delay)
                }
            }
            Self::FailureRate { max_failures_per_interval, failure_rate_interval, delay } => {
                let window = duration_ms(*failure_rate_interval);
                state.failure_times.push_back(now_ms);
                while state.failure_times.front().is_some_and(|t| now_ms.saturating_sub(*t) > window) {
                    state.failure_times.pop_front();
                }
                while state.failure_times.len() > *max_failures_per_interval as usize + 1 {
                    state.failure_times.pop_front();
                }
                if state.failure_times.len() > *max_failures_per_interval as usize {
                    RestartDecision::GiveUp {
                        reason: format!(
                            "more than {max_failures_per_interval} failure(s) within {} (failure-rate restart strategy); last failure: {cause}",
                            humantime::format_duration(*failure_rate_interval)
                        ),
                    }
                } else {
                    restart_after(now_ms, *delay)
                }
            }
            Self::ExponentialDelay {
                initial_backoff,
                max_backoff,
                backoff_multiplier,
                reset_backoff_threshold,
                jitter_factor,
                attempts_before_reset_backoff,
            } => {
                let quiet_for = state.previous_failure_ms.map(|p| now_ms.saturating_sub(p));
                let reset = quiet_for.is_none_or(|q| q >= duration_ms(*reset_backoff_threshold));
                let backoff = if reset || state.backoff_ms == 0 {
                    state.attempts_since_reset = 0;
                    duration_ms(*initial_backoff)
                } else {
                    let grown =
                        (state.backoff_ms as f64 * backoff_multiplier).min(duration_ms(*max_backoff) as f64);
                    grown as u64
                };
                state.backoff_ms = backoff;
                state.attempts_since_reset = state.attempts_since_reset.saturating_add(1);
                match attempts_before_reset_backoff {
                    Some(limit) if state.attempts_since_reset > *limit => RestartDecision::GiveUp {
                        reason: format!(
                            "{limit} failure(s) in a row without {} of quiet (exponential-delay restart strategy); last failure: {cause}",
                            humantime::format_duration(*reset_backoff_threshold)
                        ),
                    },
                    _ => {
                        let spread = backoff as f64 * jitter_factor * jitter.clamp(-1.0, 1.0);
                        let delay = (backoff as f64 + spread).max(0.0) as u64;
                        restart_after(now_ms, Duration::from_millis(delay))
                    }
                }
            }
        };
        state.previous_failure_ms = Some(now_ms);
        match &decision {
            RestartDecision::Restart { at_ms, .. } => {
                state.restarts = state.restarts.saturating_add(1);
                state.next_restart_ms = Some(*at_ms);
            }
            RestartDecision::GiveUp { .. } => state.next_restart_ms = None,
        }
        decision
    }
}

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn restart_after(now_ms: u64, delay: Duration) -> RestartDecision {
    let delay_ms = duration_ms(delay);
    RestartDecision::Restart { at_ms: now_ms.saturating_add(delay_ms), delay_ms }
}

/// Longest failure cause kept in the replicated state.
pub const MAX_CAUSE_LEN: usize = 1024;

fn truncate(cause: &str) -> String {
    if cause.len() <= MAX_CAUSE_LEN {
        return cause.to_owned();
    }
    let mut end = MAX_CAUSE_LEN;
    while !cause.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &cause[..end])
}

/// A restart strategy parameter that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[error("invalid {strategy} restart strategy: `{field}` {reason}")]
pub struct RestartStrategyError {
    pub strategy: String,
    pub field: String,
    pub reason: String,
}

/// What a failure leads to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "decision", rename_all = "snake_case")]
pub enum RestartDecision {
    /// Deploy again at `at_ms` (wall clock), `delay_ms` after the failure.
    Restart { at_ms: u64, delay_ms: u64 },
    /// The strategy gives up: the job fails for good.
    GiveUp { reason: String },
}

/// One failure, as remembered with the job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailureRecord {
    pub at_ms: u64,
    pub cause: String,
}

/// What a restart strategy remembers about a job's failures. Replicated with the job.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RestartState {
    /// Failures recorded in the job's life.
    pub failures: u64,
    /// Restarts the strategy granted in the job's life (fixed-delay counts these).
    pub restarts: u32,
    /// When the granted restart may happen (wall clock, ms); `None` when none is pending.
    pub next_restart_ms: Option<u64>,
    /// The latest failure.
    pub last_failure: Option<FailureRecord>,
    /// Time of the failure before the latest (exponential-delay's reset rule).
    pub previous_failure_ms: Option<u64>,
    /// Current exponential backoff, before jitter (0: none yet).
    pub backoff_ms: u64,
    /// Failures since the backoff was last reset (exponential-delay).
    pub attempts_since_reset: u32,
    /// Recent failure times (failure-rate), oldest first, bounded by the allowed rate.
    pub failure_times: VecDeque<u64>,
}

impl RestartState {
    /// The job completed a checkpoint: it recovered and made durable progress, so its next
    /// failure starts a new incident: exponential-delay backs off from `initial_backoff` again
    /// and counts `attempts_before_reset_backoff` afresh. What counts over the job's life
    /// (failures, fixed-delay's restarts, failure-rate's window) stays.
    pub fn on_checkpoint_completed(&mut self) {
        self.backoff_ms = 0;
        self.attempts_since_reset = 0;
        self.previous_failure_ms = None;
    }
}

impl fmt::Display for RestartStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1000;

    fn at(d: &RestartDecision) -> u64 {
        match d {
            RestartDecision::Restart { at_ms, .. } => *at_ms,
            RestartDecision::GiveUp { reason } => panic!("gave up: {reason}"),
        }
    }

    #[test]
    fn none_gives_up_at_once_naming_the_cause() {
        let mut st = RestartState::default();
        let d = RestartStrategy::None.on_failure(&mut st, 10, 0.0, "task count/0 failed");
        assert!(matches!(&d, RestartDecision::GiveUp { reason } if reason.contains("task count/0 failed")));
        assert_eq!(st.failures, 1);
        assert_eq!(st.next_restart_ms, None);
    }

    #[test]
    fn fixed_delay_allows_its_attempts_then_gives_up() {
        let s = RestartStrategy::fixed_delay(2, Duration::from_secs(3));
        let mut st = RestartState::default();
        assert_eq!(at(&s.on_failure(&mut st, 100 * S, 0.0, "a")), 103 * S);
        assert_eq!(at(&s.on_failure(&mut st, 200 * S, 0.0, "b")), 203 * S);
        let d = s.on_failure(&mut st, 300 * S, 0.0, "c");
        assert!(
            matches!(&d, RestartDecision::GiveUp { reason } if reason.contains("2 restart(s)") && reason.contains(": c"))
        );
        assert_eq!(st.restarts, 2);
        assert_eq!(st.last_failure.as_ref().map(|f| f.cause.as_str()), Some("c"));
    }

    #[test]
    fn failure_rate_counts_failures_in_the_sliding_interval() {
        let s = RestartStrategy::FailureRate {
            max_failures_per_interval: 2,
            failure_rate_interval: Duration::from_secs(60),
            delay: Duration::from_secs(1),
        };
        let mut st = RestartState::default();
        assert_eq!(at(&s.on_failure(&mut st, 0, 0.0, "1")), S);
        assert_eq!(at(&s.on_failure(&mut st, 10 * S, 0.0, "2")), 11 * S);
        // A third failure within 60 s of the first gives up ...
        let mut early = st.clone();
        assert!(matches!(s.on_failure(&mut early, 50 * S, 0.0, "3"), RestartDecision::GiveUp { .. }));
        // ... one after the first left the window does not.
        assert_eq!(at(&s.on_failure(&mut st, 65 * S, 0.0, "3")), 66 * S);
        assert!(st.failure_times.len() <= 3);
    }

    #[test]
    fn exponential_delay_grows_caps_jitters_and_resets() {
        let s = RestartStrategy::ExponentialDelay {
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(4),
            backoff_multiplier: 2.0,
            reset_backoff_threshold: Duration::from_secs(100),
            jitter_factor: 0.1,
            attempts_before_reset_backoff: None,
        };
        let mut st = RestartState::default();
        let mut t = 0;
        let mut delays = Vec::new();
        for _ in 0..5 {
            t += 2 * S;
            delays.push(at(&s.on_failure(&mut st, t, 0.0, "x")) - t);
        }
        assert_eq!(delays, vec![1000, 2000, 4000, 4000, 4000]);
        // Jitter moves the delay by at most the factor.
        t += 2 * S;
        let jittered = at(&s.on_failure(&mut st, t, 1.0, "x")) - t;
        assert_eq!(jittered, 4400);
        t += 2 * S;
        assert_eq!(at(&s.on_failure(&mut st, t, -1.0, "x")) - t, 3600);
        // Quiet for longer than the threshold: back to the initial backoff.
        t += 200 * S;
        assert_eq!(at(&s.on_failure(&mut st, t, 0.0, "x")) - t, 1000);
        assert_eq!(st.attempts_since_reset, 1);
    }

    #[test]
    fn a_completed_checkpoint_resets_the_backoff_but_not_the_lifetime_counts() {
        let s = RestartStrategy::exponential_delay();
        let mut st = RestartState::default();
        let mut t = 0;
        for _ in 0..20 {
            t += S;
            s.on_failure(&mut st, t, 0.0, "storage full");
        }
        assert_eq!(st.backoff_ms, 60_000, "twenty failures in a row reach the cap");
        st.on_checkpoint_completed();
        t += S;
        assert_eq!(at(&s.on_failure(&mut st, t, 0.0, "x")) - t, 1000, "a new incident starts small");
        assert_eq!((st.failures, st.restarts), (21, 21));
        // fixed-delay keeps counting its restarts across checkpoints.
        let fixed = RestartStrategy::fixed_delay(2, Duration::from_secs(1));
        let mut st = RestartState::default();
        fixed.on_failure(&mut st, S, 0.0, "x");
        st.on_checkpoint_completed();
        fixed.on_failure(&mut st, 2 * S, 0.0, "x");
        assert!(matches!(fixed.on_failure(&mut st, 3 * S, 0.0, "x"), RestartDecision::GiveUp { .. }));
    }

    #[test]
    fn exponential_delay_defaults_are_flinks_and_unlimited() {
        let RestartStrategy::ExponentialDelay {
            initial_backoff,
            max_backoff,
            backoff_multiplier,
            reset_backoff_threshold,
            jitter_factor,
            attempts_before_reset_backoff,
        } = RestartStrategy::exponential_delay()
        else {
            panic!("not exponential")
        };
        assert_eq!(initial_backoff, Duration::from_secs(1));
        assert_eq!(max_backoff, Duration::from_secs(60));
        assert_eq!(backoff_multiplier, 1.5);
        assert_eq!(reset_backoff_threshold, Duration::from_secs(3600));
        assert_eq!(jitter_factor, 0.1);
        assert_eq!(attempts_before_reset_backoff, None);
        let s = RestartStrategy::exponential_delay();
        let mut st = RestartState::default();
        for i in 0..1000 {
            assert!(matches!(s.on_failure(&mut st, i * S, 0.0, "x"), RestartDecision::Restart { .. }));
        }
        assert_eq!(st.backoff_ms, 60_000);
        assert_eq!(RestartStrategy::default_for(true), RestartStrategy::exponential_delay());
        assert_eq!(RestartStrategy::default_for(false), RestartStrategy::None);
    }

    #[test]
    fn exponential_delay_limits_attempts_between_resets() {
        let s = RestartStrategy::ExponentialDelay {
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(1),
            backoff_multiplier: 1.5,
            reset_backoff_threshold: Duration::from_secs(3600),
            jitter_factor: 0.0,
            attempts_before_reset_backoff: Some(2),
        };
        let mut st = RestartState::default();
        at(&s.on_failure(&mut st, 0, 0.0, "1"));
        at(&s.on_failure(&mut st, S, 0.0, "2"));
        assert!(matches!(s.on_failure(&mut st, 2 * S, 0.0, "3"), RestartDecision::GiveUp { .. }));
    }

    #[test]
    fn configuration_uses_flinks_names_with_defaults_and_is_validated() {
        let s: RestartStrategy =
            serde_json::from_str(r#"{"type":"fixed-delay","attempts":3,"delay":"10s"}"#).unwrap();
        assert_eq!(s, RestartStrategy::fixed_delay(3, Duration::from_secs(10)));
        let s: RestartStrategy = serde_json::from_str(r#"{"type":"exponential-delay"}"#).unwrap();
        assert_eq!(s, RestartStrategy::exponential_delay());
        let s: RestartStrategy = serde_json::from_str(r#"{"type":"failure-rate"}"#).unwrap();
        assert!(s.validate().is_ok());
        assert!(serde_json::from_str::<RestartStrategy>(r#"{"type":"fixed-delay","tries":3}"#).is_err());
        assert!(serde_json::from_str::<RestartStrategy>(r#"{"type":"sometimes"}"#).is_err());
        let bad = RestartStrategy::ExponentialDelay {
            initial_backoff: Duration::from_secs(2),
            max_backoff: Duration::from_secs(1),
            backoff_multiplier: 1.5,
            reset_backoff_threshold: Duration::from_secs(1),
            jitter_factor: 0.1,
            attempts_before_reset_backoff: None,
        };
        assert_eq!(bad.validate().unwrap_err().field, "max_backoff");
        let json = serde_json::to_value(RestartStrategy::exponential_delay()).unwrap();
        assert_eq!(json["type"], "exponential-delay");
        assert_eq!(json["max_backoff"], "1m");
    }

    #[test]
    fn long_causes_are_truncated_on_a_char_boundary() {
        let mut st = RestartState::default();
        let cause = "é".repeat(2000);
        RestartStrategy::None.on_failure(&mut st, 0, 0.0, &cause);
        let kept = &st.last_failure.unwrap().cause;
        assert!(kept.len() <= MAX_CAUSE_LEN + "…".len());
    }
}
