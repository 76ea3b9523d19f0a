//! `claim` restore mode: once a job restored from `restore_from` has a committed snapshot of its
//! own, it owns the snapshot it restored from and removes it: the store entry first (a retained
//! checkpoint of an ended job is released, a registered savepoint disposed), then the directory.
//! The job's own snapshots never reference those files (its first checkpoint after a restore from
//! outside its own storage is full), so nothing it needs goes away.
//!
//! Shared (incremental) files the claimed checkpoint references stay in their job's `shared/`
//! directory: other checkpoints of that job may reference them too.
//!
//! Idempotent: a leader that takes over repeats it after the next commit; a source that is gone
//! (directory and store entry) is done.

use std::path::{Path, PathBuf};

use super::*;

/// Where the claimed snapshot is recorded in the replicated store.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Owner {
    /// A retained checkpoint of an ended job.
    Retained { job: JobId, checkpoint_id: u64 },
    /// A registered savepoint of a job.
    Savepoint { job: JobId, checkpoint_id: u64 },
    /// Retained by a job that still runs: left alone.
    Live { job: JobId },
    /// Not in the store.
    Unlisted,
}

fn owner_of(jobs: &[std::sync::Arc<cairn_raft::model::JobRecord>], dir: &Path) -> Owner {
    for j in jobs {
        if let Some(c) = j.completed.iter().find(|c| Path::new(&c.metadata_path).parent() == Some(dir)) {
            return if j.status.is_terminal() {
                Owner::Retained { job: j.id.clone(), checkpoint_id: c.id }
            } else {
                Owner::Live { job: j.id.clone() }
            };
        }
        if let Some(s) = j.savepoints.iter().find(|s| Path::new(&s.path) == dir) {
            return Owner::Savepoint { job: j.id.clone(), checkpoint_id: s.checkpoint.id };
        }
    }
    Owner::Unlisted
}

impl JobDriver {
    /// After a commit of this job's own: takes over (and removes) the snapshot it restored
    /// from, when it restored in `claim` mode.
    pub(super) fn release_claimed_restore(&mut self) {
        let Some(record) = self.ctx.reader.job(&self.job) else { return };
        let (cairn_protocol::job::RestoreMode::Claim, Some(from)) =
            (record.spec.restore_mode, &record.spec.restore_from)
        else {
            return;
        };
        if record.restore_point().is_none() || self.claim_released {
            return;
        }
        self.claim_released = true;
        let dir = PathBuf::from(from);
        let (ctx, job) = (self.ctx.clone(), self.job.clone());
        self.io.spawn(async move {
            let command = match owner_of(&ctx.reader.jobs(), &dir) {
                Owner::Live { job: owner } => {
                    tracing::warn!(job = %job, source = %dir.display(), owner = %owner,
                        "claim mode: the restored checkpoint is retained by a live job; leaving it");
                    return;
                }
                Owner::Retained { job, checkpoint_id } => {
                    Some(Command::ReleaseRetainedCheckpoint { job, checkpoint_id })
                }
                Owner::Savepoint { job, checkpoint_id } => Some(Command::DisposeSavepoint { job, checkpoint_id }),
                Owner::Unlisted => None,
            };
            if let Some(command) = command
                && let Err(e) = propose(&ctx, command).await
            {
                tracing::warn!(job = %job, source = %dir.display(), error = %e,
                    "claim mode: cannot take over the restored snapshot from the store; its files stay");
                return;
            }
            tracing::info!(job = %job, source = %dir.display(), "claim mode: removing the snapshot the job restored from");
            let _ = tokio::task::spawn_blocking(move || remove_paths(&[dir], &[])).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use cairn_raft::model::{
        CheckpointKind, CompletedCheckpoint, JobRecord, JobSpec, JobStatus, SavepointRecord,
    };

    use super::*;

    fn snapshot(id: u64, metadata_path: &str) -> CompletedCheckpoint {
        CompletedCheckpoint {
            id,
            kind: CheckpointKind::Checkpoint,
            trigger_time_ms: 1,
            completion_time_ms: 2,
            metadata_path: metadata_path.into(),
            metadata_size: 1,
            metadata_crc32: 1,
            state_size: 0,
        }
    }

    #[test]
    fn the_owner_of_a_claimed_snapshot_is_found_in_the_store() {
        let mut a = JobRecord::new(JobId::new("a").unwrap(), "a".into(), JobSpec::default());
        a.completed.push(snapshot(4, "/cp/a/chk-4/_metadata"));
        a.savepoints.push(SavepointRecord {
            checkpoint: snapshot(5, "/sp/savepoint-a-5-1/_metadata"),
            path: "/sp/savepoint-a-5-1".into(),
        });
        let jobs = vec![std::sync::Arc::new(a.clone())];
        assert_eq!(owner_of(&jobs, Path::new("/cp/a/chk-4")), Owner::Live { job: a.id.clone() });
        assert_eq!(
            owner_of(&jobs, Path::new("/sp/savepoint-a-5-1")),
            Owner::Savepoint { job: a.id.clone(), checkpoint_id: 5 }
        );
        assert_eq!(owner_of(&jobs, Path::new("/elsewhere")), Owner::Unlisted);
        a.status = JobStatus::Canceled;
        assert_eq!(
            owner_of(&[std::sync::Arc::new(a.clone())], Path::new("/cp/a/chk-4")),
            Owner::Retained { job: a.id, checkpoint_id: 4 }
        );
    }
}
