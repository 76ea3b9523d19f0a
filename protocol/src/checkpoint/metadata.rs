//! The `_metadata` file of a completed checkpoint or savepoint.
//!
//! Raft stores only a [`MetadataPointer`] (path, size, CRC-32); the file holds every subtask's
//! state handles and the coordinator-side (master hook) state. It is written to a temporary file,
//! fsynced, renamed into place and the directory fsynced (and the directory's own entry in its
//! parent), so a reader sees either nothing or the whole file, also after a power loss; a read
//! verifies size and checksum against the pointer before decoding, and every state handle in it
//! after decoding. A leader may instead reuse the directory of a discarded checkpoint
//! ([`write_metadata_reusing`]): the file is overwritten in place under a name nobody reads, fsynced,
//! and the directory renamed into place, with the same guarantee. The file is compact JSON.
//!
//! Versions: 1 had keyed state as one file per key group; 2 has one file per operator and
//! checkpoint indexed by key group (see `keyed`). Both decode.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::keyed::HandleError;
use super::subtask::SubtaskState;

/// Version of the `_metadata` encoding written by this build.
pub const METADATA_VERSION: u32 = 2;

/// Contents of `_metadata`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointMetadata {
    pub version: u32,
    pub job: String,
    pub checkpoint_id: u64,
    /// `checkpoint`, `savepoint` or `sync_savepoint`.
    pub kind: String,
    pub trigger_time_ms: u64,
    pub completion_time_ms: u64,
    /// Parallelism and max parallelism of each vertex at the time of the checkpoint, by vertex id.
    pub vertices: BTreeMap<String, VertexInfo>,
    /// State of each subtask: `(vertex id, subtask index)` flattened as `"<vertex>/<index>"`.
    pub subtasks: BTreeMap<String, SubtaskState>,
    /// Coordinator-side state by hook name (e.g. an external source's offsets), opaque bytes.
    pub master_states: BTreeMap<String, Vec<u8>>,
}

/// Shape of a vertex when the checkpoint was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct VertexInfo {
    pub parallelism: u32,
    pub max_parallelism: u32,
}

impl CheckpointMetadata {
    pub fn subtask_key(vertex: &str, index: u32) -> String {
        format!("{vertex}/{index}")
    }

    /// Bytes of state of every subtask (saturating, like [`SubtaskState::state_size`]).
    pub fn state_size(&self) -> u64 {
        self.subtasks.values().fold(0, |total, s| total.saturating_add(s.state_size()))
    }

    /// Checks every state handle (see `OperatorSubtaskState::validate`), and that key groups lie
    /// below their vertex's max parallelism where the vertex is known (which subtasks and
    /// vertices a snapshot may hold is the assignment's concern).
    pub fn validate_handles(&self) -> Result<(), InvalidHandle> {
        for (subtask, state) in &self.subtasks {
            let vertex = subtask.rsplit_once('/').map_or(subtask.as_str(), |(v, _)| v);
            let max_parallelism = self.vertices.get(vertex).map(|v| v.max_parallelism);
            for (operator, op) in &state.operators {
                let invalid = |reason: String| InvalidHandle {
                    subtask: subtask.clone(),
                    operator: operator.clone(),
                    reason,
                };
                op.validate().map_err(|e: HandleError| invalid(e.to_string()))?;
                if let (Some(max), Some(kg)) = (max_parallelism, op.keyed.key_groups.keys().next_back())
                    && *kg >= max
                {
                    return Err(invalid(format!("key group {kg} is not below max parallelism {max}")));
                }
            }
        }
        Ok(())
    }
}

/// A state handle in `_metadata` that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("subtask {subtask}, operator {operator}: {reason}")]
pub struct InvalidHandle {
    pub subtask: String,
    pub operator: String,
    pub reason: String,
}

/// Locates and verifies a `_metadata` file; this is what Raft stores.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetadataPointer {
    pub path: PathBuf,
    pub size: u64,
    pub crc32: u32,
}

impl MetadataPointer {
    /// The pointer to `bytes` written at `path`.
    pub fn of(path: &Path, bytes: &[u8]) -> Self {
        Self { path: path.to_owned(), size: bytes.len() as u64, crc32: crc32fast::hash(bytes) }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum MetadataError {
    #[error("cannot write checkpoint metadata {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error("cannot read checkpoint metadata {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("checkpoint metadata {path} is {actual} bytes, expected {expected}")]
    SizeMismatch { path: PathBuf, expected: u64, actual: u64 },
    #[error("checkpoint metadata {path} has checksum {actual:08x}, expected {expected:08x}")]
    ChecksumMismatch { path: PathBuf, expected: u32, actual: u32 },
    #[error("checkpoint metadata {path} cannot be decoded: {source}")]
    Decode { path: PathBuf, source: serde_json::Error },
    #[error("checkpoint metadata {path} has version {version}; this build reads up to {METADATA_VERSION}")]
    UnsupportedVersion { path: PathBuf, version: u32 },
    #[error("checkpoint metadata {path} has an invalid state handle: {source}")]
    InvalidHandle { path: PathBuf, source: InvalidHandle },
}

/// Encodes and durably writes `meta` to `path` (creating parent directories).
///
/// Durable means across a power loss: the file's data and size are synced (fdatasync),
/// it is renamed into place and its directory fsynced; every directory created on the way is fsynced into its parent, and the
/// checkpoint directory's own entry is synced once more in its parent (tasks create it when
/// they write state, and a `_metadata` whose directory entry is lost is lost with it).
pub fn write_metadata(path: &Path, meta: &CheckpointMetadata) -> Result<MetadataPointer, MetadataError> {
    let err = |source| MetadataError::Write { path: path.to_owned(), source };
    let bytes = encode(path, meta)?;
    let dir = path.parent().ok_or_else(|| err(std::io::Error::other("metadata path has no parent")))?;
    let created = create_dir_all_synced(dir).map_err(err)?;
    let tmp = path.with_extension("inprogress");
    {
        let mut f = std::fs::File::create(&tmp).map_err(err)?;
        f.write_all(&bytes).map_err(err)?;
        f.sync_data().map_err(err)?;
    }
    std::fs::rename(&tmp, path).map_err(err)?;
    sync_dir(dir).map_err(err)?;
    if !created && let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        sync_dir(parent).map_err(err)?;
    }
    Ok(MetadataPointer::of(path, &bytes))
}

/// Writes `meta` as `path`, a `_metadata` whose directory does not exist yet, by reusing
/// `spare`: a directory beside that one (same parent) holding an old `_metadata` that nothing
/// references any more, and that only this writer uses (renamed to a name of its own first, so
/// that no other writer has it open). Allocates and frees no inode, where [`write_metadata`]
/// creates a directory and a file (and retention later deletes both).
///
/// The old file is overwritten in place and synced (fdatasync), then `spare` is renamed to `path`'s
/// directory and the parent fsynced, so the new `_metadata` is durable under its final name
/// when this returns, as with [`write_metadata`]. Until the rename, `path` does not exist; a
/// crash in between leaves `spare` holding the new content. `path`'s directory must not exist,
/// or be empty (a rename replaces an empty directory); otherwise this fails and renames nothing.
pub fn write_metadata_reusing(
    spare: &Path,
    path: &Path,
    meta: &CheckpointMetadata,
) -> Result<MetadataPointer, MetadataError> {
    let err = |source| MetadataError::Write { path: path.to_owned(), source };
    let name =
        path.file_name().ok_or_else(|| err(std::io::Error::other("metadata path has no file name")))?;
    let dir = path.parent().ok_or_else(|| err(std::io::Error::other("metadata path has no parent")))?;
    let parent =
        dir.parent().filter(|p| !p.as_os_str().is_empty() && spare.parent() == Some(*p)).ok_or_else(
            || err(std::io::Error::other("the spare directory is not beside the checkpoint directory")),
        )?;
    let bytes = encode(path, meta)?;
    {
        let mut f = std::fs::OpenOptions::new().write(true).open(spare.join(name)).map_err(err)?;
        f.write_all(&bytes).map_err(err)?;
        f.set_len(bytes.len() as u64).map_err(err)?;
        f.sync_data().map_err(err)?;
    }
    std::fs::rename(spare, dir).map_err(err)?;
    sync_dir(parent).map_err(err)?;
    Ok(MetadataPointer::of(path, &bytes))
}

/// The bytes of `_metadata` (compact JSON: the pointer's size and CRC are of these bytes).
fn encode(path: &Path, meta: &CheckpointMetadata) -> Result<Vec<u8>, MetadataError> {
    serde_json::to_vec(meta)
        .map_err(|e| MetadataError::Write { path: path.to_owned(), source: std::io::Error::other(e) })
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// `create_dir_all`, fsyncing every directory it creates into its parent. Returns whether it
/// created `dir`.
fn create_dir_all_synced(dir: &Path) -> std::io::Result<bool> {
    let mut missing = Vec::new();
    let mut cursor = Some(dir);
    while let Some(path) = cursor {
        if path.as_os_str().is_empty() || path.try_exists()? {
            break;
        }
        missing.push(path);
        cursor = path.parent();
    }
    if missing.is_empty() {
        return Ok(false);
    }
    std::fs::create_dir_all(dir)?;
    for created in missing.iter().rev() {
        match created.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => sync_dir(parent)?,
            _ => sync_dir(Path::new("."))?,
        }
    }
    Ok(true)
}

/// Reads `_metadata`, verifying it against the pointer Raft holds.
pub fn read_metadata(ptr: &MetadataPointer) -> Result<CheckpointMetadata, MetadataError> {
    let path = &ptr.path;
    let bytes = std::fs::read(path).map_err(|source| MetadataError::Read { path: path.clone(), source })?;
    if bytes.len() as u64 != ptr.size {
        return Err(MetadataError::SizeMismatch {
            path: path.clone(),
            expected: ptr.size,
            actual: bytes.len() as u64,
        });
    }
    let crc = crc32fast::hash(&bytes);
    if crc != ptr.crc32 {
        return Err(MetadataError::ChecksumMismatch { path: path.clone(), expected: ptr.crc32, actual: crc });
    }
    decode_metadata(path, &bytes)
}

/// Reads `_metadata` without a pointer (e.g. a savepoint given by path): decodes, checks the
/// version and the state handles.
pub fn read_metadata_unverified(path: &Path) -> Result<CheckpointMetadata, MetadataError> {
    let bytes =
        std::fs::read(path).map_err(|source| MetadataError::Read { path: path.to_owned(), source })?;
    decode_metadata(path, &bytes)
}

fn decode_metadata(path: &Path, bytes: &[u8]) -> Result<CheckpointMetadata, MetadataError> {
    let meta: CheckpointMetadata = serde_json::from_slice(bytes)
        .map_err(|source| MetadataError::Decode { path: path.to_owned(), source })?;
    if meta.version > METADATA_VERSION {
        return Err(MetadataError::UnsupportedVersion { path: path.to_owned(), version: meta.version });
    }
    meta.validate_handles()
        .map_err(|source| MetadataError::InvalidHandle { path: path.to_owned(), source })?;
    Ok(meta)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::handles::StateFile;
    use crate::checkpoint::keyed::{KeyGroupSegment, KeyedStateHandle};
    use crate::checkpoint::layout::METADATA_FILE;
    use crate::checkpoint::subtask::OperatorSubtaskState;

    fn segment(offset: u64, length: u64) -> KeyGroupSegment {
        KeyGroupSegment { file: "chk-4/count-0.state".into(), offset, length, crc32: 1 }
    }

    fn sample() -> CheckpointMetadata {
        let op = OperatorSubtaskState {
            keyed: KeyedStateHandle {
                key_groups: BTreeMap::from([(3, segment(0, 10)), (5, segment(10, 6))]),
                files: vec![StateFile { path: "chk-4/count-0.state".into(), size: 16, crc32: 9 }],
            },
            list_states: Vec::new(),
            channel_state: None,
        };
        let mut st = SubtaskState::default();
        st.operators.insert("count".into(), op);
        CheckpointMetadata {
            version: METADATA_VERSION,
            job: "j".into(),
            checkpoint_id: 4,
            kind: "checkpoint".into(),
            trigger_time_ms: 1,
            completion_time_ms: 2,
            vertices: BTreeMap::from([("count".into(), VertexInfo { parallelism: 2, max_parallelism: 8 })]),
            subtasks: BTreeMap::from([(CheckpointMetadata::subtask_key("count", 0), st)]),
            master_states: BTreeMap::from([("offsets".into(), vec![1, 2, 3])]),
        }
    }

    #[test]
    fn a_spare_directory_becomes_the_checkpoint_directory_with_the_new_metadata() {
        use std::os::unix::fs::MetadataExt;
        let root = tempfile::tempdir().unwrap();
        let mut old = sample();
        old.master_states.insert("padding".into(), vec![7; 4096]);
        let first = write_metadata(&root.path().join("j/chk-3/_metadata"), &old).unwrap();
        let spare = root.path().join("j/.spare-chk-3");
        std::fs::rename(root.path().join("j/chk-3"), &spare).unwrap();
        let inodes = (
            std::fs::metadata(&spare).unwrap().ino(),
            std::fs::metadata(spare.join(METADATA_FILE)).unwrap().ino(),
        );

        let path = root.path().join("j/chk-4/_metadata");
        let ptr = write_metadata_reusing(&spare, &path, &sample()).unwrap();

        assert_eq!(read_metadata(&ptr).unwrap(), sample(), "the shorter new content, nothing of the old");
        assert!(ptr.size < first.size);
        assert!(!spare.exists());
        let reused = (
            std::fs::metadata(path.parent().unwrap()).unwrap().ino(),
            std::fs::metadata(&path).unwrap().ino(),
        );
        assert_eq!(reused, inodes, "the directory and the file are the spare's");
    }

    #[test]
    fn reusing_a_spare_refuses_a_target_that_holds_files_and_renames_nothing() {
        let root = tempfile::tempdir().unwrap();
        write_metadata(&root.path().join("j/chk-3/_metadata"), &sample()).unwrap();
        let spare = root.path().join("j/.spare-chk-3");
        std::fs::rename(root.path().join("j/chk-3"), &spare).unwrap();
        std::fs::create_dir_all(root.path().join("j/chk-4")).unwrap();
        std::fs::write(root.path().join("j/chk-4/count-0.state"), b"state").unwrap();

        let err =
            write_metadata_reusing(&spare, &root.path().join("j/chk-4/_metadata"), &sample()).unwrap_err();
        assert!(matches!(err, MetadataError::Write { .. }), "{err}");
        assert!(spare.join(METADATA_FILE).exists());
        assert!(root.path().join("j/chk-4/count-0.state").exists());
        assert!(!root.path().join("j/chk-4/_metadata").exists());

        let elsewhere = root.path().join("other/chk-5/_metadata");
        let err = write_metadata_reusing(&spare, &elsewhere, &sample()).unwrap_err();
        assert!(err.to_string().contains("not beside"), "{err}");
        assert!(spare.exists());
    }

    #[test]
    fn write_then_verified_read_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j/chk-4/_metadata");
        let ptr = write_metadata(&path, &sample()).unwrap();
        assert_eq!(read_metadata(&ptr).unwrap(), sample());
        assert!(!path.with_extension("inprogress").exists());
    }

    #[test]
    fn corrupted_metadata_is_detected() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("_metadata");
        let ptr = write_metadata(&path, &sample()).unwrap();
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[10] ^= 0xff;
        std::fs::write(&path, &bytes).unwrap();
        assert!(matches!(read_metadata(&ptr), Err(MetadataError::ChecksumMismatch { .. })));
        std::fs::write(&path, b"{}").unwrap();
        assert!(matches!(read_metadata(&ptr), Err(MetadataError::SizeMismatch { .. })));
        std::fs::remove_file(&path).unwrap();
        assert!(matches!(read_metadata(&ptr), Err(MetadataError::Read { .. })));
    }

    /// `_metadata` as version 1 wrote it: keyed state as one file per key group.
    const VERSION_1: &str = r#"{
  "version": 1,
  "job": "j",
  "checkpoint_id": 4,
  "kind": "checkpoint",
  "trigger_time_ms": 1,
  "completion_time_ms": 2,
  "vertices": { "count": { "parallelism": 1, "max_parallelism": 8 } },
  "subtasks": {
    "count/0": {
      "operators": {
        "count": {
          "keyed": {
            "3": { "path": "chk-4/count-kg-3.state", "size": 10, "crc32": 1 },
            "5": { "path": "shared/count-kg-5-00ff.state", "size": 6, "crc32": 2 }
          },
          "list_states": []
        }
      }
    }
  },
  "master_states": {}
}"#;

    #[test]
    fn version_1_metadata_decodes_as_one_segment_per_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("_metadata");
        std::fs::write(&path, VERSION_1).unwrap();
        let ptr = MetadataPointer {
            path: path.clone(),
            size: VERSION_1.len() as u64,
            crc32: crc32fast::hash(VERSION_1.as_bytes()),
        };
        let meta = read_metadata(&ptr).unwrap();
        assert_eq!(meta, read_metadata_unverified(&path).unwrap());
        let keyed = &meta.subtasks["count/0"].operators["count"].keyed;
        let whole =
            |file: &str, length, crc32| KeyGroupSegment { file: file.into(), offset: 0, length, crc32 };
        assert_eq!(keyed.key_groups[&3], whole("chk-4/count-kg-3.state", 10, 1));
        assert_eq!(keyed.key_groups[&5], whole("shared/count-kg-5-00ff.state", 6, 2));
        let paths: Vec<&str> = meta.subtasks["count/0"].files().map(|f| f.path.as_str()).collect();
        assert_eq!(paths, ["chk-4/count-kg-3.state", "shared/count-kg-5-00ff.state"]);
        assert_eq!(meta.state_size(), 16);
        // Written again, it is version 2 and reads back the same.
        let again = dir.path().join("again/_metadata");
        let meta2 = CheckpointMetadata { version: METADATA_VERSION, ..meta.clone() };
        let ptr = write_metadata(&again, &meta2).unwrap();
        assert_eq!(read_metadata(&ptr).unwrap().subtasks, meta.subtasks);
    }

    #[test]
    fn metadata_with_an_invalid_handle_is_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("_metadata");
        let mut bad = sample();
        let op = bad.subtasks.get_mut("count/0").unwrap().operators.get_mut("count").unwrap();
        op.keyed.key_groups.insert(6, segment(12, 8));
        let ptr = write_metadata(&path, &bad).unwrap();
        let err = read_metadata(&ptr).unwrap_err();
        assert!(matches!(err, MetadataError::InvalidHandle { .. }), "{err}");
        let text = err.to_string();
        assert!(text.contains("count/0") && text.contains("key group 6"), "{text}");

        let mut beyond = sample();
        beyond.vertices.get_mut("count").unwrap().max_parallelism = 4;
        let ptr = write_metadata(&path, &beyond).unwrap();
        let err = read_metadata(&ptr).unwrap_err();
        assert!(err.to_string().contains("key group 5 is not below max parallelism 4"), "{err}");
    }
}
