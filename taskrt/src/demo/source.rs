//! The deterministic sequence source.
//!
//! Keys `0..keys` are split among the subtasks (key `k` to subtask `k mod p` on a fresh start;
//! on restore, the offsets list state is redistributed round-robin). For each owned key the
//! source emits `Record { key, value: 1, seq }` with `seq = 1, 2, …`, cycling over its keys.
//! Its offsets (`key → records emitted`) are list state, one element per key. With
//! `records_per_key` set it is bounded: once every owned key reached the limit it finishes (the
//! task then waits for a final checkpoint, so that everything it emitted is committed
//! downstream, and the job ends `finished`). `idle_after_limit` keeps it running instead, idle
//! but still checkpointing until stopped, for a job that must outlive its output.

use std::time::{Duration, Instant};

use cairn_protocol::checkpoint::OperatorStateMode;
use serde::{Deserialize, Serialize};

use crate::exchange::Record;
use crate::operator::{Operator, OperatorContext, OperatorError, SourcePoll, TaskInfo};

pub const OFFSETS_STATE: &str = "offsets";

fn default_keys() -> u64 {
    16
}
fn default_batch() -> u64 {
    64
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceConfig {
    #[serde(default = "default_keys")]
    pub keys: u64,
    /// Stop emitting a key after this many records (`None`: unbounded).
    #[serde(default)]
    pub records_per_key: Option<u64>,
    /// Records per second per subtask (`None`: as fast as downstream takes them).
    #[serde(default)]
    pub rate_per_sec: Option<u64>,
    /// Records per poll, at most.
    #[serde(default = "default_batch")]
    pub batch: u64,
    /// With `records_per_key`: stay running (idle) after the last record instead of finishing.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub idle_after_limit: bool,
}

impl Default for SourceConfig {
    fn default() -> Self {
        Self {
            keys: default_keys(),
            records_per_key: None,
            rate_per_sec: None,
            batch: default_batch(),
            idle_after_limit: false,
        }
    }
}

impl SourceConfig {
    pub fn parse(config: &serde_json::Value) -> Result<Self, String> {
        let cfg: Self = if config.is_null() {
            Self::default()
        } else {
            serde_json::from_value(config.clone()).map_err(|e| e.to_string())?
        };
        if cfg.keys == 0 || cfg.batch == 0 || cfg.rate_per_sec == Some(0) {
            return Err("keys, batch and rate_per_sec must be positive".into());
        }
        Ok(cfg)
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
    }
}

pub fn encode_offset(key: u64, emitted: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(16);
    v.extend_from_slice(&key.to_le_bytes());
    v.extend_from_slice(&emitted.to_le_bytes());
    v
}

pub fn decode_offset(bytes: &[u8]) -> Result<(u64, u64), String> {
    let arr: [u8; 16] =
        bytes.try_into().map_err(|_| format!("offset element is {} bytes, expected 16", bytes.len()))?;
    let mut k = [0u8; 8];
    let mut n = [0u8; 8];
    k.copy_from_slice(&arr[..8]);
    n.copy_from_slice(&arr[8..]);
    Ok((u64::from_le_bytes(k), u64::from_le_bytes(n)))
}

pub struct SequenceSource {
    config: SourceConfig,
    subtask: u32,
    parallelism: u32,
    /// `(key, records emitted)`, sorted by key.
    offsets: Vec<(u64, u64)>,
    cursor: usize,
    started: Option<Instant>,
    emitted_since_start: u64,
    stopped: bool,
}

impl SequenceSource {
    pub fn new(config: SourceConfig, info: &TaskInfo) -> Self {
        Self {
            config,
            subtask: info.subtask,
            parallelism: info.parallelism.max(1),
            offsets: Vec::new(),
            cursor: 0,
            started: None,
            emitted_since_start: 0,
            stopped: false,
        }
    }

    fn exhausted(&self, emitted: u64) -> bool {
        self.config.records_per_key.is_some_and(|limit| emitted >= limit)
    }

    /// A bounded source whose every owned key reached the limit (or that owns no key).
    fn finished(&self) -> bool {
        self.config.records_per_key.is_some()
            && !self.config.idle_after_limit
            && self.offsets.iter().all(|(_, emitted)| self.exhausted(*emitted))
    }
}

impl Operator for SequenceSource {
    fn initialize_state(
        &mut self,
        ctx: &mut OperatorContext<'_>,
        restored_from: Option<u64>,
    ) -> Result<(), OperatorError> {
        if restored_from.is_some() {
            for e in ctx.lists().get(OFFSETS_STATE) {
                self.offsets.push(decode_offset(e).map_err(OperatorError::Failed)?);
            }
        } else {
            self.offsets = (0..self.config.keys)
                .filter(|k| k % u64::from(self.parallelism) == u64::from(self.subtask))
                .map(|k| (k, 0))
                .collect();
        }
        self.offsets.sort_unstable();
        tracing::info!(
            subtask = self.subtask,
            keys = self.offsets.len(),
            ?restored_from,
            "sequence source initialized"
        );
        Ok(())
    }

    fn process_record(
        &mut self,
        _record: Record,
        _ctx: &mut OperatorContext<'_>,
    ) -> Result<(), OperatorError> {
        Err(OperatorError::Failed("a source has no input".into()))
    }

    fn poll_source(&mut self, ctx: &mut OperatorContext<'_>) -> Result<SourcePoll, OperatorError> {
        if self.stopped || self.finished() {
            return Ok(SourcePoll::Finished);
        }
        let started = *self.started.get_or_insert_with(Instant::now);
        let mut budget = self.config.batch;
        if let Some(rate) = self.config.rate_per_sec {
            let allowed = (started.elapsed().as_secs_f64() * rate as f64) as u64;
            let available = allowed.saturating_sub(self.emitted_since_start);
            if available == 0 {
                let next = Duration::from_secs_f64((self.emitted_since_start + 1) as f64 / rate as f64);
                return Ok(SourcePoll::Idle(
                    next.saturating_sub(started.elapsed()).max(Duration::from_micros(100)),
                ));
            }
            budget = budget.min(available);
        }
        let n = self.offsets.len();
        let mut emitted = 0;
        let mut idle_checks = 0;
        while emitted < budget && idle_checks < n {
            let i = self.cursor % n;
            self.cursor = (self.cursor + 1) % n;
            let (key, count) = self.offsets[i];
            if self.exhausted(count) {
                idle_checks += 1;
                continue;
            }
            idle_checks = 0;
            self.offsets[i].1 = count + 1;
            ctx.emit(Record { key, value: 1, seq: count + 1 });
            emitted += 1;
        }
        self.emitted_since_start += emitted;
        if emitted == 0 {
            return Ok(SourcePoll::Idle(Duration::from_millis(20)));
        }
        Ok(SourcePoll::Emitted)
    }

    fn stop_source(&mut self) {
        self.stopped = true;
    }

    fn snapshot_state(
        &mut self,
        _checkpoint_id: u64,
        ctx: &mut OperatorContext<'_>,
    ) -> Result<(), OperatorError> {
        let elements = self.offsets.iter().map(|(k, n)| encode_offset(*k, *n)).collect();
        ctx.lists().set(OFFSETS_STATE, OperatorStateMode::RoundRobin, elements)?;
        Ok(())
    }
}
