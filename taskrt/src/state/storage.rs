//! Checkpoint storage as the task side sees it: durable file writes under the job's checkpoint
//! directory (or a savepoint directory), verified reads, and a hook to inject faults in tests.
//!
//! Paths in handles are relative (see `cairn_protocol::checkpoint::layout`); every relative path
//! read from a handle is checked with `is_safe_relative` before it is resolved.

use std::fmt;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cairn_protocol::checkpoint::layout::is_safe_relative;
use cairn_protocol::checkpoint::{CheckpointLayout, KeyGroupSegment, StateFile};

use super::StateError;

/// Called around state file writes; tests use it to fail or stall writes, tests and the
/// benchmark to count files and fsyncs.
pub trait WriteHook: Send + Sync {
    /// Before a state file is created; an error fails the write.
    fn before_write(&self, path: &Path) -> std::io::Result<()>;

    /// After `path` (a state file or a directory) was fsynced through this storage.
    fn after_sync(&self, _path: &Path) {}
}

/// The job's checkpoint storage.
#[derive(Clone)]
pub struct CheckpointStorage {
    layout: CheckpointLayout,
    hook: Option<Arc<dyn WriteHook>>,
}

impl fmt::Debug for CheckpointStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CheckpointStorage")
            .field("job_dir", &self.layout.job_dir())
            .field("hook", &self.hook.is_some())
            .finish()
    }
}

impl CheckpointStorage {
    /// `root` is the checkpoint storage directory; `job` a validated job id.
    pub fn new(root: impl AsRef<Path>, job: &str) -> Self {
        Self { layout: CheckpointLayout::new(root, job), hook: None }
    }

    pub fn with_write_hook(mut self, hook: Arc<dyn WriteHook>) -> Self {
        self.hook = Some(hook);
        self
    }

    pub fn layout(&self) -> &CheckpointLayout {
        &self.layout
    }

    pub fn job_dir(&self) -> &Path {
        self.layout.job_dir()
    }

    /// Writes `bytes` to `path` (creating parent directories durably) and fsyncs it. The file's
    /// own entry in its directory is not synced here: the caller syncs each directory once
    /// after writing all its files ([`sync_dir`]).
    pub fn write_file(&self, path: &Path, bytes: &[u8]) -> Result<(), StateError> {
        let err = |source| StateError::Io { path: path.to_owned(), source };
        if let Some(hook) = &self.hook {
            hook.before_write(path).map_err(err)?;
        }
        if let Some(dir) = path.parent() {
            create_dir_all_synced_then(dir, |synced| self.synced(synced))?;
        }
        let mut f = std::fs::File::create(path).map_err(err)?;
        f.write_all(bytes).map_err(err)?;
        f.sync_all().map_err(err)?;
        self.synced(path);
        Ok(())
    }

    /// [`sync_dir`], reported to the write hook.
    pub fn sync_dir(&self, dir: &Path) -> Result<(), StateError> {
        sync_dir(dir)?;
        self.synced(dir);
        Ok(())
    }

    fn synced(&self, path: &Path) {
        if let Some(hook) = &self.hook {
            hook.after_sync(path);
        }
    }
}

/// Fsyncs a directory so that new entries in it are durable.
pub fn sync_dir(dir: &Path) -> Result<(), StateError> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|source| StateError::Io { path: dir.to_owned(), source })
}

/// `create_dir_all` that survives a power loss: every directory it creates is fsynced into
/// its parent (a new `chk-<id>/` whose entry in the job directory was never synced disappears
/// with everything in it, even when its own entries were synced).
pub fn create_dir_all_synced(dir: &Path) -> Result<(), StateError> {
    create_dir_all_synced_then(dir, |_| {})
}

/// [`create_dir_all_synced`], calling `synced` with every directory it fsyncs.
fn create_dir_all_synced_then(dir: &Path, mut synced: impl FnMut(&Path)) -> Result<(), StateError> {
    let err = |path: &Path| {
        let path = path.to_owned();
        move |source| StateError::Io { path, source }
    };
    // The directories that do not exist yet, innermost first.
    let mut missing = Vec::new();
    let mut cursor = Some(dir);
    while let Some(path) = cursor {
        if path.as_os_str().is_empty() || path.try_exists().map_err(err(path))? {
            break;
        }
        missing.push(path);
        cursor = path.parent();
    }
    if missing.is_empty() {
        return Ok(());
    }
    std::fs::create_dir_all(dir).map_err(err(dir))?;
    for created in missing.iter().rev() {
        let parent = match created.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent,
            _ => Path::new("."),
        };
        sync_dir(parent)?;
        synced(parent);
    }
    Ok(())
}

/// Resolves a handle's relative path against `base`, refusing unsafe paths.
pub fn resolve(base: &Path, rel: &str) -> Result<PathBuf, StateError> {
    if !is_safe_relative(rel) {
        return Err(StateError::UnsafePath { path: rel.to_owned() });
    }
    Ok(base.join(rel))
}

/// The error of failing to open or read `path`; a missing file is named as such.
fn read_error(path: &Path, source: std::io::Error) -> StateError {
    if source.kind() == std::io::ErrorKind::NotFound {
        StateError::Missing { path: path.to_owned() }
    } else {
        StateError::Io { path: path.to_owned(), source }
    }
}

/// Reads the file of a handle and verifies its size and CRC-32.
pub fn read_verified(base: &Path, file: &StateFile) -> Result<Vec<u8>, StateError> {
    let path = resolve(base, &file.path)?;
    let bytes = std::fs::read(&path).map_err(|e| read_error(&path, e))?;
    if bytes.len() as u64 != file.size {
        return Err(StateError::SizeMismatch { path, expected: file.size, actual: bytes.len() as u64 });
    }
    let actual = crc32fast::hash(&bytes);
    if actual != file.crc32 {
        return Err(StateError::ChecksumMismatch { path, expected: file.crc32, actual });
    }
    Ok(bytes)
}

/// Reads the given key-group segments of `file` (segments checked against the handle: inside
/// the file, not overlapping) and passes each one's bytes to `each`, after verifying the file's
/// size and the segment's CRC-32. Only the segments are read; adjacent ones with one read.
pub fn read_segments<'a>(
    base: &Path,
    file: &StateFile,
    segments: impl IntoIterator<Item = (u32, &'a KeyGroupSegment)>,
    mut each: impl FnMut(u32, &[u8]) -> Result<(), StateError>,
) -> Result<(), StateError> {
    let path = resolve(base, &file.path)?;
    let io = |source| StateError::Io { path: path.clone(), source };
    let mut f = std::fs::File::open(&path).map_err(|e| read_error(&path, e))?;
    let actual = f.metadata().map_err(io)?.len();
    if actual != file.size {
        return Err(StateError::SizeMismatch { path, expected: file.size, actual });
    }
    let mut segments: Vec<(u32, &KeyGroupSegment)> = segments.into_iter().collect();
    segments.sort_unstable_by_key(|(_, s)| s.offset);
    let mut rest = segments.as_slice();
    while let Some(((_, first), _)) = rest.split_first() {
        // The run of segments that follow each other without a gap.
        let mut end = first.offset;
        let mut n = 0;
        while let Some((_, s)) = rest.get(n).filter(|(_, s)| s.offset == end) {
            end = s.end().filter(|e| *e <= actual).ok_or_else(|| StateError::ElementOutOfBounds {
                path: path.clone(),
                start: s.offset,
                end: s.offset.saturating_add(s.length),
                len: actual,
            })?;
            n += 1;
        }
        let (run, after) = rest.split_at(n);
        rest = after;
        let too_large = || StateError::Corrupt {
            path: path.clone(),
            reason: format!("segments {}..{end} do not fit in memory", first.offset),
        };
        let mut bytes = vec![0u8; usize::try_from(end - first.offset).map_err(|_| too_large())?];
        f.seek(SeekFrom::Start(first.offset)).map_err(io)?;
        f.read_exact(&mut bytes).map_err(io)?;
        for (kg, s) in run {
            // Inside `bytes` by construction of the run.
            let start = usize::try_from(s.offset - first.offset).map_err(|_| too_large())?;
            let len = usize::try_from(s.length).map_err(|_| too_large())?;
            let segment = bytes.get(start..start.saturating_add(len)).ok_or_else(too_large)?;
            let crc = crc32fast::hash(segment);
            if crc != s.crc32 {
                return Err(StateError::SegmentChecksumMismatch {
                    path,
                    key_group: *kg,
                    expected: s.crc32,
                    actual: crc,
                });
            }
            each(*kg, segment)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synced_directory_creation_creates_every_level_once() {
        let dir = tempfile::tempdir().unwrap();
        let nested = dir.path().join("job/chk-3/sub");
        create_dir_all_synced(&nested).unwrap();
        assert!(nested.is_dir());
        create_dir_all_synced(&nested).unwrap();
        let file = dir.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        assert!(matches!(create_dir_all_synced(&file.join("below")), Err(StateError::Io { .. })));
    }

    #[derive(Default)]
    struct Synced(std::sync::Mutex<Vec<PathBuf>>);

    impl WriteHook for Synced {
        fn before_write(&self, _path: &Path) -> std::io::Result<()> {
            Ok(())
        }

        fn after_sync(&self, path: &Path) {
            self.0.lock().unwrap().push(path.to_owned());
        }
    }

    #[test]
    fn write_hook_sees_every_fsync() {
        let dir = tempfile::tempdir().unwrap();
        let hook = Arc::new(Synced::default());
        let storage = CheckpointStorage::new(dir.path(), "job").with_write_hook(hook.clone());
        let chk = storage.job_dir().join("chk-1");
        storage.write_file(&chk.join("a"), b"a").unwrap();
        storage.write_file(&chk.join("b"), b"b").unwrap();
        storage.sync_dir(&chk).unwrap();
        let synced = hook.0.lock().unwrap().clone();
        // Creating job/chk-1 syncs the root and job/ once each; then each file; then chk-1.
        let expected =
            vec![dir.path().to_owned(), storage.job_dir().to_owned(), chk.join("a"), chk.join("b"), chk];
        assert_eq!(synced, expected);
    }

    #[test]
    fn verified_read_detects_corruption_and_unsafe_paths() {
        let dir = tempfile::tempdir().unwrap();
        let storage = CheckpointStorage::new(dir.path(), "job");
        let path = storage.job_dir().join("chk-1/x.state");
        storage.write_file(&path, b"hello").unwrap();
        let handle = StateFile { path: "chk-1/x.state".into(), size: 5, crc32: crc32fast::hash(b"hello") };
        assert_eq!(read_verified(storage.job_dir(), &handle).unwrap(), b"hello");
        std::fs::write(&path, b"hellO").unwrap();
        assert!(matches!(
            read_verified(storage.job_dir(), &handle),
            Err(StateError::ChecksumMismatch { .. })
        ));
        let escaping = StateFile { path: "../x".into(), ..handle };
        assert!(matches!(read_verified(storage.job_dir(), &escaping), Err(StateError::UnsafePath { .. })));
    }
}
