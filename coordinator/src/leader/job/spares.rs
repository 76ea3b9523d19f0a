//! Spare checkpoint directories: the directories of discarded checkpoints, reused for new ones.
//!
//! Every completed checkpoint of a job has a `chk-<id>` directory holding its `_metadata`, and
//! retention deletes the oldest retained one's as a new one completes: two inodes allocated and
//! two freed per job and checkpoint. At a thousand checkpoints a second that was the leader's
//! largest single cost on an ext4 without a journal, which skips recently freed inodes when it
//! allocates one (docs/SCALING.md, round 5).
//!
//! So a discarded checkpoint directory that holds nothing but its `_metadata` is renamed to
//! `.spare-chk-<id>` in the job's directory instead of being deleted, and the `_metadata` of a
//! checkpoint whose directory does not exist yet (its tasks wrote no file into it) is written
//! into a spare: claimed by a rename to `.spare-chk-<new id>`, so that a leader deposed a
//! moment ago cannot write into it too, then [`write_metadata_reusing`] overwrites the file in
//! place, fsyncs it, renames the directory to `chk-<new id>` and fsyncs the job's directory.
//! Durability is that of a fresh write, and Raft's pointer (size and CRC) verifies the file
//! as before.
//!
//! At most [`SPARES_PER_JOB`] spares are kept; further discarded directories are deleted. The
//! first use in a term adopts the spares an earlier leader left in the job's directory (up to the
//! limit, the rest are deleted), and [`Spares::remove_all`] deletes them when the job ends.
//! Anything unexpected (a spare that is gone or changed, a failed rename) falls back to a fresh
//! write or a deletion: a spare is only ever a saving.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use cairn_protocol::checkpoint::layout::METADATA_FILE;
use cairn_protocol::checkpoint::{
    CheckpointMetadata, MetadataError, MetadataPointer, write_metadata, write_metadata_reusing,
};

use super::prepare::remove_paths;

/// Spare directories kept per job: one per retained checkpoint subsumed at a completion is
/// enough, the second absorbs an aborted checkpoint's directory.
pub const SPARES_PER_JOB: usize = 2;
const SPARE_PREFIX: &str = ".spare-";
const CHECKPOINT_PREFIX: &str = "chk-";

/// One job's spare directories. Used from blocking tasks; the lock is never held across file
/// operations.
#[derive(Debug, Default)]
pub struct Spares {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    spares: Vec<PathBuf>,
    /// Job directories whose leftover spares were adopted this term.
    scanned: BTreeSet<PathBuf>,
    /// The job ended: nothing is kept any more.
    closed: bool,
}

impl State {
    fn has_room(&self) -> bool {
        !self.closed && self.spares.len() < SPARES_PER_JOB
    }
}

impl Spares {
    /// Writes the `_metadata` at `path` durably, into a spare directory when `path` is a
    /// checkpoint's whose directory does not exist yet and a spare is at hand.
    pub fn write_metadata(
        &self,
        path: &Path,
        meta: &CheckpointMetadata,
    ) -> Result<MetadataPointer, MetadataError> {
        if let Some((job_dir, chk_dir)) = checkpoint_dir_of(path)
            && matches!(chk_dir.try_exists(), Ok(false))
            && let Some(spare) = self.take(job_dir)
            && let Some(claimed) = claim(&spare, job_dir, chk_dir)
        {
            match write_metadata_reusing(&claimed, path, meta) {
                Ok(pointer) => return Ok(pointer),
                Err(e) => {
                    tracing::warn!(spare = %claimed.display(), error = %e, "cannot reuse a spare checkpoint directory; writing a new one");
                    remove_paths(&[claimed], &[]);
                }
            }
        }
        write_metadata(path, meta)
    }

    /// Deletes discarded checkpoint directories, keeping as spares those that hold only their
    /// `_metadata` while there is room. Call after the discarded files inside them are gone.
    pub fn discard(&self, dirs: &[PathBuf]) {
        let mut delete = Vec::new();
        for dir in dirs {
            if !self.keep(dir) {
                delete.push(dir.clone());
            }
        }
        remove_paths(&delete, &[]);
    }

    /// Deletes every spare of the job (in `job_dir` and wherever this term kept one); later
    /// discards delete.
    pub fn remove_all(&self, job_dir: &Path) {
        let mut doomed = {
            let mut state = self.lock();
            state.closed = true;
            std::mem::take(&mut state.spares)
        };
        doomed.extend(leftover_spares(job_dir));
        remove_paths(&doomed, &[]);
    }

    fn keep(&self, dir: &Path) -> bool {
        let Some(job_dir) = dir.parent().filter(|_| is_checkpoint_dir_name(dir)) else { return false };
        self.adopt(job_dir);
        let room = self.lock().has_room();
        if !room || !holds_only_metadata(dir) {
            return false;
        }
        let Some(name) = dir.file_name() else { return false };
        let spare = job_dir.join(format!("{SPARE_PREFIX}{}", name.to_string_lossy()));
        if let Err(e) = std::fs::rename(dir, &spare) {
            tracing::debug!(dir = %dir.display(), error = %e, "cannot keep a discarded checkpoint directory as a spare");
            return false;
        }
        let mut state = self.lock();
        if !state.has_room() {
            drop(state);
            remove_paths(&[spare], &[]);
        } else {
            state.spares.push(spare);
        }
        true
    }

    fn take(&self, job_dir: &Path) -> Option<PathBuf> {
        self.adopt(job_dir);
        let mut state = self.lock();
        let at = state.spares.iter().position(|s| s.parent() == Some(job_dir))?;
        Some(state.spares.swap_remove(at))
    }

    /// Takes over the spares an earlier leader left in `job_dir`, once per term and directory.
    fn adopt(&self, job_dir: &Path) {
        {
            // Checked on every write and discard: no allocation once the directory is known.
            let mut state = self.lock();
            if state.scanned.contains(job_dir) {
                return;
            }
            state.scanned.insert(job_dir.to_owned());
        }
        let mut surplus = Vec::new();
        for spare in leftover_spares(job_dir) {
            let usable = holds_only_metadata(&spare);
            let mut state = self.lock();
            if usable && state.has_room() {
                state.spares.push(spare);
            } else {
                surplus.push(spare);
            }
        }
        remove_paths(&surplus, &[]);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Nothing panics while holding the lock; a poisoned one still holds consistent state.
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Makes `spare` this writer's alone before it is opened: renamed to the spare name of the
/// checkpoint directory it is about to become (`chk-<id>`'s id is new, so no other writer uses
/// that name). A leader deposed a moment ago may hold the same spare; only one rename wins.
/// Left behind by a crash, the claimed directory is a spare like any other.
fn claim(spare: &Path, job_dir: &Path, chk_dir: &Path) -> Option<PathBuf> {
    let claimed = job_dir.join(format!("{SPARE_PREFIX}{}", chk_dir.file_name()?.to_string_lossy()));
    if claimed == spare {
        return None;
    }
    match std::fs::rename(spare, &claimed) {
        Ok(()) => Some(claimed),
        Err(e) => {
            tracing::debug!(spare = %spare.display(), error = %e, "a spare checkpoint directory is gone");
            None
        }
    }
}

/// `(job directory, checkpoint directory)` of a `.../<job>/chk-<id>/_metadata` path.
fn checkpoint_dir_of(path: &Path) -> Option<(&Path, &Path)> {
    if path.file_name()? != METADATA_FILE {
        return None;
    }
    let chk_dir = path.parent().filter(|d| is_checkpoint_dir_name(d))?;
    let job_dir = chk_dir.parent().filter(|p| !p.as_os_str().is_empty())?;
    Some((job_dir, chk_dir))
}

fn is_checkpoint_dir_name(dir: &Path) -> bool {
    dir.file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix(CHECKPOINT_PREFIX))
        .is_some_and(|id| !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()))
}

/// Whether `dir` holds exactly one entry, a regular file named `_metadata`.
fn holds_only_metadata(dir: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else { return false };
    let mut seen = 0;
    for entry in entries {
        let Ok(entry) = entry else { return false };
        seen += 1;
        let is_file = entry.file_type().is_ok_and(|t| t.is_file());
        if seen > 1 || entry.file_name() != METADATA_FILE || !is_file {
            return false;
        }
    }
    seen == 1
}

/// The `.spare-chk-<id>` directories in `job_dir`.
fn leftover_spares(job_dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(job_dir) else { return Vec::new() };
    entries
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name().to_str().is_some_and(|n| {
                n.strip_prefix(SPARE_PREFIX).is_some_and(|rest| is_checkpoint_dir_name(Path::new(rest)))
            }) && e.file_type().is_ok_and(|t| t.is_dir())
        })
        .map(|e| e.path())
        .collect()
}

#[cfg(test)]
mod tests;
