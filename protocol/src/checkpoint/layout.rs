//! Where checkpoint data lives in checkpoint storage.
//!
//! ```text
//! <root>/<job>/chk-<id>/...          exclusive state of checkpoint <id>, and its _metadata
//! <root>/<job>/shared/...            incremental state shared between checkpoints
//! <savepoint-dir>/savepoint-<job>-<id>-<random>/  self-contained savepoint
//! ```

use std::path::{Path, PathBuf};

/// Name of the metadata file inside a checkpoint or savepoint directory.
pub const METADATA_FILE: &str = "_metadata";
/// Name of the directory of shared (incremental) state inside a job's directory.
pub const SHARED_DIR: &str = "shared";

/// Paths of one job's checkpoint storage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointLayout {
    job_dir: PathBuf,
}

impl CheckpointLayout {
    /// `root` is the configured checkpoint storage directory; `job` a validated job id (a safe
    /// path component).
    pub fn new(root: impl AsRef<Path>, job: &str) -> Self {
        Self { job_dir: root.as_ref().join(job) }
    }

    /// The directory all relative state paths of checkpoints resolve against.
    pub fn job_dir(&self) -> &Path {
        &self.job_dir
    }

    /// Relative name of checkpoint `id`'s exclusive directory.
    pub fn chk_rel(id: u64) -> String {
        format!("chk-{id}")
    }

    pub fn chk_dir(&self, id: u64) -> PathBuf {
        self.job_dir.join(Self::chk_rel(id))
    }

    pub fn shared_dir(&self) -> PathBuf {
        self.job_dir.join(SHARED_DIR)
    }

    pub fn metadata_path(&self, id: u64) -> PathBuf {
        self.chk_dir(id).join(METADATA_FILE)
    }

    /// Resolves a relative state path of a checkpoint of this job.
    pub fn resolve(&self, rel: &str) -> PathBuf {
        self.job_dir.join(rel)
    }

    /// Directory of savepoint `id` of `job` under `savepoint_dir`: the whole job id, the
    /// checkpoint id and a random `suffix` (as Flink adds one), so that two jobs, or two
    /// attempts of one job that reuse an id after a restore, never write into the same
    /// directory.
    pub fn savepoint_dir(savepoint_dir: impl AsRef<Path>, job: &str, id: u64, suffix: u64) -> PathBuf {
        savepoint_dir.as_ref().join(format!("savepoint-{job}-{id}-{suffix:012x}"))
    }
}

/// Whether a relative path lies under `shared/`: such files may be referenced by several
/// checkpoints (incremental mode) and are reference-counted.
pub fn is_shared_path(rel: &str) -> bool {
    rel.strip_prefix(SHARED_DIR).is_some_and(|rest| rest.starts_with('/'))
}

/// Rejects relative paths that could escape their base directory (absolute, `..`, empty).
pub fn is_safe_relative(rel: &str) -> bool {
    !rel.is_empty()
        && !rel.starts_with('/')
        && !rel.contains('\\')
        && rel.split('/').all(|seg| !seg.is_empty() && seg != "." && seg != "..")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_follow_the_documented_layout() {
        let l = CheckpointLayout::new("/data/cp", "wordcount");
        assert_eq!(l.chk_dir(7), PathBuf::from("/data/cp/wordcount/chk-7"));
        assert_eq!(l.metadata_path(7), PathBuf::from("/data/cp/wordcount/chk-7/_metadata"));
        assert_eq!(l.shared_dir(), PathBuf::from("/data/cp/wordcount/shared"));
        assert_eq!(
            CheckpointLayout::savepoint_dir("/sp", "wordcount-job", 9, 0xabc),
            PathBuf::from("/sp/savepoint-wordcount-job-9-000000000abc")
        );
        assert_ne!(
            CheckpointLayout::savepoint_dir("/sp", "wordcount", 9, 1),
            CheckpointLayout::savepoint_dir("/sp", "wordcount-2", 9, 1),
            "jobs sharing a prefix get distinct directories"
        );
    }

    #[test]
    fn unsafe_relative_paths_are_rejected() {
        assert!(is_safe_relative("chk-1/a.state"));
        assert!(!is_safe_relative("../other/a"));
        assert!(!is_safe_relative("/etc/passwd"));
        assert!(!is_safe_relative(""));
        assert!(!is_safe_relative("chk-1/./a"));
    }
}
