//! Per-job checkpoint configuration, with Flink's defaults and names.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How a job is checkpointed. Field names follow Flink's `execution.checkpointing.*` options.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CheckpointConfig {
    /// Periodic checkpoint interval; `None` disables periodic checkpoints (Flink's default).
    /// Durations are humantime strings (`"200ms"`, `"10min"`).
    #[serde(with = "humantime_serde")]
    pub interval: Option<Duration>,
    /// A pending checkpoint that has not completed after this long is expired.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Minimum pause between the end of one checkpoint and the trigger of the next.
    #[serde(with = "humantime_serde")]
    pub min_pause: Duration,
    /// Maximum number of checkpoints in flight at once.
    pub max_concurrent: u32,
    /// Consecutive checkpoint failures tolerated before the job is failed.
    pub tolerable_failures: u32,
    /// Completed checkpoints kept; older ones are subsumed and their state discarded.
    pub retained: u32,
    /// Directory savepoints go to when a trigger names none.
    pub savepoint_dir: Option<String>,
    /// Root of the job's checkpoint storage (`<dir>/<job>/chk-<id>/`).
    pub storage_dir: Option<String>,
    /// What happens to the retained checkpoints when the job ends (Flink's
    /// `externalized-checkpoint-retention`). Not written when it is the default, so records
    /// persisted before the setting existed keep their encoding.
    #[serde(skip_serializing_if = "ExternalizedRetention::is_default")]
    pub externalized_retention: ExternalizedRetention,
    /// Unaligned checkpoints (Flink's `execution.checkpointing.unaligned.enabled`, FLIP-76):
    /// barriers overtake the data buffered in the channels, and the records they overtook are
    /// persisted with the checkpoint as channel state, so a checkpoint under backpressure does
    /// not wait for the backlog to drain. Savepoints stay aligned. Not written when false.
    #[serde(skip_serializing_if = "is_false")]
    pub unaligned: bool,
    /// With `unaligned`: checkpoints start aligned and switch to unaligned at a task once this
    /// long has passed since the trigger without the task having aligned (Flink's
    /// `aligned-checkpoint-timeout`). Zero (the default) starts every checkpoint unaligned.
    #[serde(with = "humantime_serde", skip_serializing_if = "Duration::is_zero")]
    pub aligned_checkpoint_timeout: Duration,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// What happens to a job's retained checkpoints when it reaches a terminal state. Savepoints are
/// never touched: they belong to whoever took them.
///
/// Cairn's default differs from Flink's (`no_externalized`): a job that fails for good keeps its
/// retained checkpoints, because a failure is exactly when the state is needed to start again
/// (submit a new job with `restore_from` pointing at the latest one). Cancelling or finishing
/// deletes them unless `retain_on_cancellation` is set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExternalizedRetention {
    /// Keep them whatever the terminal state: finished, canceled or failed.
    RetainOnCancellation,
    /// Keep them when the job failed; delete them when it finished or was canceled.
    #[default]
    DeleteOnCancellation,
    /// Delete them whatever the terminal state.
    NoExternalized,
}

impl ExternalizedRetention {
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// Whether a job ending in a failure keeps its checkpoints.
    pub fn keeps_on_failure(self) -> bool {
        self != Self::NoExternalized
    }

    /// Whether a job that finished or was canceled keeps its checkpoints.
    pub fn keeps_on_cancellation(self) -> bool {
        self == Self::RetainOnCancellation
    }
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        Self {
            interval: None,
            timeout: Duration::from_secs(10 * 60),
            min_pause: Duration::ZERO,
            max_concurrent: 1,
            tolerable_failures: 0,
            retained: 1,
            savepoint_dir: None,
            storage_dir: None,
            externalized_retention: ExternalizedRetention::default(),
            unaligned: false,
            aligned_checkpoint_timeout: Duration::ZERO,
        }
    }
}

/// A configuration value that cannot be used; names the field so users can fix it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[error("invalid checkpoint configuration: `{field}` {reason}")]
pub struct ConfigError {
    pub field: String,
    pub reason: String,
}

impl ConfigError {
    fn new(field: &str, reason: impl Into<String>) -> Self {
        Self { field: field.to_owned(), reason: reason.into() }
    }
}

/// Smallest accepted checkpoint interval and timeout, as Flink enforces.
pub const MIN_INTERVAL: Duration = Duration::from_millis(10);

impl CheckpointConfig {
    /// Checks every field; returns the first problem, naming the field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(interval) = self.interval
            && interval < MIN_INTERVAL
        {
            return Err(ConfigError::new(
                "interval",
                "must be at least 10ms (or unset to disable periodic checkpoints)",
            ));
        }
        if self.timeout < MIN_INTERVAL {
            return Err(ConfigError::new("timeout", "must be at least 10ms"));
        }
        if self.max_concurrent == 0 {
            return Err(ConfigError::new("max_concurrent", "must be at least 1"));
        }
        if self.retained == 0 {
            return Err(ConfigError::new(
                "retained",
                "must be at least 1: the latest completed checkpoint is always kept",
            ));
        }
        for (field, dir) in [("savepoint_dir", &self.savepoint_dir), ("storage_dir", &self.storage_dir)] {
            if let Some(d) = dir {
                if d.trim().is_empty() {
                    return Err(ConfigError::new(field, "must not be empty (leave it unset instead)"));
                }
                // Every replica and worker resolves it: absolute, and naming what it says.
                crate::operators::check_absolute_path(d).map_err(|why| ConfigError::new(field, why))?;
            }
        }
        if !self.unaligned && !self.aligned_checkpoint_timeout.is_zero() {
            return Err(ConfigError::new(
                "aligned_checkpoint_timeout",
                "only applies to unaligned checkpoints: set `unaligned` to true, or remove it",
            ));
        }
        if self.unaligned && self.max_concurrent != 1 {
            return Err(ConfigError::new(
                "max_concurrent",
                "must be 1 with unaligned checkpoints (a task records the in-flight data of one checkpoint at a time)",
            ));
        }
        Ok(())
    }

    /// How the barriers of a periodic checkpoint cross the channels: `None` aligned, `Some(0)`
    /// unaligned, `Some(t)` aligned until `t` milliseconds after the trigger, then unaligned.
    /// (Savepoints are always aligned.)
    pub fn unaligned_after_ms(&self) -> Option<u64> {
        self.unaligned.then(|| u64::try_from(self.aligned_checkpoint_timeout.as_millis()).unwrap_or(u64::MAX))
    }

    /// The interval actually used for periodic triggers: an interval below `min_pause` is
    /// raised to `min_pause`, as Flink's coordinator does.
    pub fn effective_interval(&self) -> Option<Duration> {
        self.interval.map(|i| i.max(self.min_pause))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_flinks() {
        let c = CheckpointConfig::default();
        assert_eq!(c.interval, None);
        assert_eq!(c.timeout, Duration::from_secs(600));
        assert_eq!(c.min_pause, Duration::ZERO);
        assert_eq!(c.max_concurrent, 1);
        assert_eq!(c.tolerable_failures, 0);
        assert_eq!(c.retained, 1);
        assert!(c.validate().is_ok());
    }

    #[test]
    fn zero_retention_is_rejected_naming_the_field() {
        let c = CheckpointConfig { retained: 0, ..Default::default() };
        assert_eq!(c.validate().unwrap_err().field, "retained");
    }

    #[test]
    fn interval_below_min_pause_is_clamped() {
        let c = CheckpointConfig {
            interval: Some(Duration::from_millis(100)),
            min_pause: Duration::from_millis(500),
            ..Default::default()
        };
        assert_eq!(c.effective_interval(), Some(Duration::from_millis(500)));
    }

    #[test]
    fn durations_are_humantime_strings() {
        let c: CheckpointConfig = serde_json::from_str(r#"{"interval":"200ms","timeout":"1m"}"#).unwrap();
        assert_eq!(c.interval, Some(Duration::from_millis(200)));
        assert_eq!(c.timeout, Duration::from_secs(60));
        let json = serde_json::to_value(CheckpointConfig::default()).unwrap();
        assert_eq!(json["timeout"], "10m");
        assert_eq!(json["interval"], serde_json::Value::Null);
    }

    #[test]
    fn unaligned_settings_are_checked_and_mapped_to_barrier_options() {
        let c: CheckpointConfig = serde_json::from_str(r#"{"unaligned":true}"#).unwrap();
        assert_eq!(c.unaligned_after_ms(), Some(0));
        let c: CheckpointConfig =
            serde_json::from_str(r#"{"unaligned":true,"aligned_checkpoint_timeout":"2s"}"#).unwrap();
        assert_eq!(c.unaligned_after_ms(), Some(2000));
        assert_eq!(CheckpointConfig::default().unaligned_after_ms(), None);

        let stray: CheckpointConfig = serde_json::from_str(r#"{"aligned_checkpoint_timeout":"2s"}"#).unwrap();
        assert_eq!(stray.validate().unwrap_err().field, "aligned_checkpoint_timeout");
        let concurrent = CheckpointConfig { unaligned: true, max_concurrent: 2, ..Default::default() };
        assert_eq!(concurrent.validate().unwrap_err().field, "max_concurrent");

        let json = serde_json::to_value(CheckpointConfig::default()).unwrap();
        assert!(json.get("unaligned").is_none() && json.get("aligned_checkpoint_timeout").is_none());
    }

    #[test]
    fn unknown_fields_are_rejected() {
        let err = serde_json::from_str::<CheckpointConfig>(r#"{"retain": 3}"#).unwrap_err();
        assert!(err.to_string().contains("unknown field"), "{err}");
    }
}
