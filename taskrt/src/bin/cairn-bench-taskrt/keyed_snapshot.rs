//! Scenario 4: the asynchronous part of one keyed operator's snapshot, measured directly (no job,
//! no coordinator): a keyed counter with `keys` keys over `max_parallelism` key groups in one
//! subtask, snapshotted `rounds` times through the task runtime's own synchronous and
//! asynchronous parts. A write hook on the checkpoint storage counts the state files created and
//! every fsync (files and directories).
//!
//! - Full mode: every round writes all key groups (nothing changes between rounds).
//! - Incremental mode: the first round writes all key groups; before each later round
//!   `changed_keys` keys are updated, and the round is confirmed complete after it is written, so
//!   the next one may reference what it wrote.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use cairn_protocol::checkpoint::KeyGroupRange;
use cairn_protocol::keygroups::key_group_of;
use cairn_taskrt::state::keyed::KeyedStateBackend;
use cairn_taskrt::state::list::OperatorStateBackend;
use cairn_taskrt::state::snapshot::{SnapshotTarget, plan_operator, write_plan};
use cairn_taskrt::state::storage::{CheckpointStorage, WriteHook};

const OPERATOR: &str = "count";

/// What the scenario is run with.
#[derive(Debug, Clone)]
pub struct Params {
    pub keys: u64,
    pub max_parallelism: u32,
    pub rounds: u32,
    pub changed_keys: u64,
    pub dir: Option<PathBuf>,
}

/// Counts state files and fsyncs.
#[derive(Debug, Default)]
struct Counter {
    files: AtomicU64,
    fsyncs: AtomicU64,
}

impl WriteHook for Counter {
    fn before_write(&self, _path: &Path) -> std::io::Result<()> {
        self.files.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn after_sync(&self, _path: &Path) {
        self.fsyncs.fetch_add(1, Ordering::Relaxed);
    }
}

/// One snapshot's figures.
#[derive(Debug, Clone, Copy)]
pub struct Round {
    pub sync_part: Duration,
    pub async_part: Duration,
    pub files: u64,
    pub fsyncs: u64,
    pub bytes_persisted: u64,
    /// Key groups changed since the previous round (all of them in the first).
    pub changed_groups: usize,
}

/// The rounds of one mode.
#[derive(Debug, Default)]
pub struct ModeResult {
    pub rounds: Vec<Round>,
}

/// Runs the scenario in full mode and in incremental mode.
pub fn run(p: &Params) -> anyhow::Result<(ModeResult, ModeResult)> {
    Ok((run_mode(p, false)?, run_mode(p, true)?))
}

fn run_mode(p: &Params, incremental: bool) -> anyhow::Result<ModeResult> {
    let dir = match &p.dir {
        Some(parent) => tempfile::Builder::new().prefix("cairn-bench-snapshot").tempdir_in(parent),
        None => tempfile::Builder::new().prefix("cairn-bench-snapshot").tempdir(),
    }
    .context("creating a temporary directory")?;
    let counter = Arc::new(Counter::default());
    let storage = CheckpointStorage::new(dir.path(), "bench").with_write_hook(counter.clone());
    let range = KeyGroupRange::for_subtask(p.max_parallelism, 1, 0).context("max parallelism is zero")?;
    let mut keyed = KeyedStateBackend::new(p.max_parallelism, range);
    for key in 0..p.keys {
        keyed.put_value_u64("count", key, 1)?;
    }
    let lists = OperatorStateBackend::default();
    let cancel = AtomicBool::new(false);
    let mut result = ModeResult::default();
    let mut next_changed = 0u64;
    for round in 0..p.rounds {
        let id = u64::from(round) + 1;
        let changed_groups = if round == 0 {
            keyed.snapshot_groups().count()
        } else if incremental {
            let mut groups = std::collections::BTreeSet::new();
            for _ in 0..p.changed_keys.min(p.keys) {
                let key = next_changed % p.keys.max(1);
                next_changed += 1;
                let value = keyed.value_u64("count", key)?.unwrap_or(0);
                keyed.put_value_u64("count", key, value + 1)?;
                groups.insert(key_group_of(key, p.max_parallelism));
            }
            groups.len()
        } else {
            0
        };
        let target = SnapshotTarget::checkpoint(&storage, id, incremental);
        let files_before = counter.files.load(Ordering::Relaxed);
        let fsyncs_before = counter.fsyncs.load(Ordering::Relaxed);
        let started = Instant::now();
        let plan = plan_operator(OPERATOR, 0, Some(&keyed), &lists, &target);
        let sync_part = started.elapsed();
        let started = Instant::now();
        let mut written = write_plan(&storage, &target, vec![plan], &cancel)?;
        let async_part = started.elapsed();
        result.rounds.push(Round {
            sync_part,
            async_part,
            files: counter.files.load(Ordering::Relaxed) - files_before,
            fsyncs: counter.fsyncs.load(Ordering::Relaxed) - fsyncs_before,
            bytes_persisted: written.bytes_persisted,
            changed_groups,
        });
        if let Some(uploaded) = written.uploaded.remove(OPERATOR) {
            keyed.record_pending(id, uploaded);
        }
        keyed.confirm(id);
    }
    dir.close().context("removing the temporary directory")?;
    Ok(result)
}
