//! The two-phase-commit file sink.
//!
//! - Records are buffered in memory as lines `key,count,seq`.
//! - Pre-commit, in the synchronous snapshot of checkpoint `n`: the buffer is written and fsynced
//!   to `<out>/pending/chk-<n>-part-<i>-of-<p>-<nonce>.pending`; the list of pending files
//!   (union list state `pending`) goes into the checkpoint.
//! - Commit, on notify complete of `n`: every pending file of a checkpoint `<= n` is renamed
//!   atomically into `<out>/committed/` (same name, `.csv`).
//! - Restore from checkpoint `c`: every pending file in the restored state is committed,
//!   idempotently (a file already renamed counts as committed; a file missing from both places
//!   is an error, since that data would be lost). Then pending files of checkpoints newer than `c`
//!   left by earlier runs are deleted: they belong to checkpoints that never completed.
//!
//! The union mode means every new subtask sees all pending files after a rescale; commits race
//! harmlessly because rename is atomic and idempotent here.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use cairn_protocol::checkpoint::OperatorStateMode;
use serde::{Deserialize, Serialize};

use crate::exchange::Record;
use crate::operator::{Operator, OperatorContext, OperatorError, TaskInfo};
use crate::state::storage::{create_dir_all_synced, sync_dir};

pub const PENDING_STATE: &str = "pending";
pub const PENDING_DIR: &str = "pending";
pub const COMMITTED_DIR: &str = "committed";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SinkConfig {
    pub output_dir: PathBuf,
    /// Takes at most this many records per second (per subtask): a slow sink, to see
    /// backpressure and unaligned checkpoints at work. Absent: as fast as it can.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_records_per_sec: Option<u64>,
}

impl SinkConfig {
    pub fn parse(config: &serde_json::Value) -> Result<Self, String> {
        let cfg: Self = serde_json::from_value(config.clone()).map_err(|e| e.to_string())?;
        let dir = cfg.output_dir.to_str().ok_or("output_dir must be valid UTF-8")?;
        cairn_protocol::operators::check_absolute_path(dir).map_err(|e| format!("`output_dir` {e}"))?;
        if cfg.max_records_per_sec == Some(0) {
            return Err("`max_records_per_sec` must be positive (or absent for no limit)".into());
        }
        Ok(cfg)
    }
}

/// Parsed name of a pending or committed file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartName {
    pub checkpoint_id: u64,
    pub part: u32,
    pub of: u32,
    pub nonce: String,
}

impl PartName {
    pub fn stem(&self) -> String {
        format!("chk-{:020}-part-{}-of-{}-{}", self.checkpoint_id, self.part, self.of, self.nonce)
    }

    /// Parses `chk-<id>-part-<i>-of-<p>-<nonce>.<ext>`.
    pub fn parse(file_name: &str) -> Option<Self> {
        let stem = file_name.rsplit_once('.').map_or(file_name, |(s, _)| s);
        let mut it = stem.split('-');
        if it.next()? != "chk" {
            return None;
        }
        let checkpoint_id = it.next()?.parse().ok()?;
        if it.next()? != "part" {
            return None;
        }
        let part = it.next()?.parse().ok()?;
        if it.next()? != "of" {
            return None;
        }
        let of = it.next()?.parse().ok()?;
        let nonce = it.next()?.to_owned();
        if it.next().is_some() {
            return None;
        }
        Some(Self { checkpoint_id, part, of, nonce })
    }
}

fn encode_pending(id: u64, stem: &str) -> Vec<u8> {
    let mut v = id.to_le_bytes().to_vec();
    v.extend_from_slice(stem.as_bytes());
    v
}

fn decode_pending(bytes: &[u8]) -> Result<(u64, String), OperatorError> {
    if bytes.len() < 8 {
        return Err(OperatorError::Failed(format!("pending element is {} bytes", bytes.len())));
    }
    let mut id = [0u8; 8];
    id.copy_from_slice(&bytes[..8]);
    let stem = String::from_utf8(bytes[8..].to_vec())
        .map_err(|_| OperatorError::Failed("pending element name is not UTF-8".into()))?;
    if PartName::parse(&stem).is_none() {
        return Err(OperatorError::Failed(format!("pending element {stem:?} is not a part name")));
    }
    Ok((u64::from_le_bytes(id), stem))
}

pub struct TwoPhaseFileSink {
    output: PathBuf,
    subtask: u32,
    parallelism: u32,
    /// Distinguishes this run's files from files of earlier runs of the same subtask index.
    nonce: String,
    buffer: Vec<u8>,
    /// `(checkpoint id, stem of its pending file)` of pre-committed, not yet committed data.
    pending: BTreeSet<(u64, String)>,
    limit: Option<RateLimit>,
}

/// Spaces records `1/rate` seconds apart on tokio's clock; a pause shorter than a millisecond
/// is carried over rather than slept.
struct RateLimit {
    interval: std::time::Duration,
    next: tokio::time::Instant,
}

impl RateLimit {
    fn new(rate: u64) -> Self {
        Self {
            interval: std::time::Duration::from_nanos(1_000_000_000 / rate.max(1)),
            next: tokio::time::Instant::now(),
        }
    }

    fn after_record(&mut self) -> Option<std::time::Duration> {
        let now = tokio::time::Instant::now();
        // Idle time is not saved up for a burst.
        self.next = self.next.max(now) + self.interval;
        let wait = self.next - now;
        (wait >= std::time::Duration::from_millis(1)).then_some(wait)
    }
}

impl TwoPhaseFileSink {
    pub fn new(config: SinkConfig, info: &TaskInfo) -> Self {
        Self {
            output: config.output_dir,
            subtask: info.subtask,
            parallelism: info.parallelism.max(1),
            nonce: format!("{:016x}", rand::random::<u64>()),
            buffer: Vec::new(),
            pending: BTreeSet::new(),
            limit: config.max_records_per_sec.map(RateLimit::new),
        }
    }

    fn pending_dir(&self) -> PathBuf {
        self.output.join(PENDING_DIR)
    }

    fn committed_dir(&self) -> PathBuf {
        self.output.join(COMMITTED_DIR)
    }

    /// Renames one pending file into `committed/`, idempotently.
    fn commit(&self, stem: &str) -> Result<(), OperatorError> {
        let from = self.pending_dir().join(format!("{stem}.pending"));
        let to = self.committed_dir().join(format!("{stem}.csv"));
        match std::fs::rename(&from, &to) {
            Ok(()) => {
                tracing::debug!(file = %to.display(), "committed sink file");
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && to.exists() => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(OperatorError::Failed(format!(
                "pending sink file {} is missing and was never committed: its data is lost",
                from.display()
            ))),
            Err(e) => Err(OperatorError::io(format!("committing {}", from.display()), e)),
        }
    }

    fn commit_up_to(&mut self, checkpoint_id: u64) -> Result<(), OperatorError> {
        let due: Vec<(u64, String)> =
            self.pending.iter().take_while(|(id, _)| *id <= checkpoint_id).cloned().collect();
        if due.is_empty() {
            return Ok(());
        }
        for entry in due {
            self.commit(&entry.1)?;
            self.pending.remove(&entry);
        }
        self.sync_commits()
    }

    /// Makes renames into `committed/` durable: first the new names, then the removal of the
    /// old ones (a rename is durable in each directory only once that directory is synced).
    fn sync_commits(&self) -> Result<(), OperatorError> {
        sync_dir(&self.committed_dir())?;
        sync_dir(&self.pending_dir())?;
        Ok(())
    }

    /// Deletes pending files of checkpoints newer than `restored` that earlier runs left behind
    /// for the part indices this subtask is responsible for.
    fn delete_stale_pending(&self, restored: Option<u64>) -> Result<(), OperatorError> {
        let dir = self.pending_dir();
        let entries = std::fs::read_dir(&dir)
            .map_err(|e| OperatorError::io(format!("listing {}", dir.display()), e))?;
        for entry in entries {
            let entry = entry.map_err(|e| OperatorError::io(format!("listing {}", dir.display()), e))?;
            let name = entry.file_name();
            let Some(part) = name.to_str().and_then(PartName::parse) else { continue };
            let newer = restored.is_none_or(|c| part.checkpoint_id > c);
            let mine = part.part % self.parallelism == self.subtask && part.nonce != self.nonce;
            if newer && mine {
                tracing::info!(file = ?name, ?restored, "deleting pending sink file of an uncompleted checkpoint");
                if let Err(e) = std::fs::remove_file(entry.path())
                    && e.kind() != std::io::ErrorKind::NotFound
                {
                    return Err(OperatorError::io(format!("deleting {}", entry.path().display()), e));
                }
            }
        }
        Ok(())
    }
}

/// Creates `path` (and its parents) so that it survives a power loss.
fn create_dir(path: &Path) -> Result<(), OperatorError> {
    Ok(create_dir_all_synced(path)?)
}

impl Operator for TwoPhaseFileSink {
    fn initialize_state(
        &mut self,
        ctx: &mut OperatorContext<'_>,
        restored_from: Option<u64>,
    ) -> Result<(), OperatorError> {
        create_dir(&self.pending_dir())?;
        create_dir(&self.committed_dir())?;
        // Union state: the pending files of every old subtask, several per checkpoint id.
        let mut restored = BTreeSet::new();
        for e in ctx.lists().get(PENDING_STATE) {
            restored.insert(decode_pending(e)?);
        }
        for (_, stem) in &restored {
            self.commit(stem)?;
        }
        self.delete_stale_pending(restored_from)?;
        self.sync_commits()?;
        tracing::info!(
            subtask = self.subtask,
            committed_on_restore = restored.len(),
            ?restored_from,
            "sink initialized"
        );
        Ok(())
    }

    fn process_record(
        &mut self,
        record: Record,
        _ctx: &mut OperatorContext<'_>,
    ) -> Result<(), OperatorError> {
        use std::io::Write;
        // Writing into a Vec cannot fail.
        let _ = writeln!(self.buffer, "{},{},{}", record.key, record.value, record.seq);
        Ok(())
    }

    fn throttle(&mut self) -> Option<std::time::Duration> {
        self.limit.as_mut().and_then(RateLimit::after_record)
    }

    fn snapshot_state(
        &mut self,
        checkpoint_id: u64,
        ctx: &mut OperatorContext<'_>,
    ) -> Result<(), OperatorError> {
        if !self.buffer.is_empty() {
            let name = PartName {
                checkpoint_id,
                part: self.subtask,
                of: self.parallelism,
                nonce: self.nonce.clone(),
            };
            let path = self.pending_dir().join(format!("{}.pending", name.stem()));
            let write = || -> std::io::Result<()> {
                use std::io::Write;
                let mut f = std::fs::File::create(&path)?;
                f.write_all(&self.buffer)?;
                f.sync_all()
            };
            write().map_err(|e| OperatorError::io(format!("pre-committing {}", path.display()), e))?;
            sync_dir(&self.pending_dir())?;
            self.buffer.clear();
            self.pending.insert((checkpoint_id, name.stem()));
        }
        let elements = self.pending.iter().map(|(id, stem)| encode_pending(*id, stem)).collect();
        ctx.lists().set(PENDING_STATE, OperatorStateMode::Union, elements)?;
        Ok(())
    }

    fn notify_checkpoint_complete(
        &mut self,
        checkpoint_id: u64,
        _ctx: &mut OperatorContext<'_>,
    ) -> Result<(), OperatorError> {
        self.commit_up_to(checkpoint_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn part_names_round_trip() {
        let n = PartName { checkpoint_id: 12, part: 1, of: 3, nonce: "00ab".into() };
        assert_eq!(PartName::parse(&format!("{}.pending", n.stem())), Some(n.clone()));
        assert_eq!(PartName::parse(&format!("{}.csv", n.stem())), Some(n));
        assert_eq!(PartName::parse("other.csv"), None);
    }
}
