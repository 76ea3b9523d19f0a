//! Helpers shared by the integration tests: a crashfs mounted on a fresh temporary directory.

#![allow(dead_code)] // each test binary uses a part

use std::fs::File;
use std::ops::Deref;
use std::path::{Path, PathBuf};

use cairn_crashfs::{CrashFs, MountOptions, MountedFs};
use tempfile::TempDir;

/// A mounted crashfs and its temporary mountpoint (unmounted before the directory goes).
pub struct Mounted {
    pub fs: MountedFs,
    _dir: TempDir,
}

impl Deref for Mounted {
    type Target = MountedFs;

    fn deref(&self) -> &MountedFs {
        &self.fs
    }
}

impl Mounted {
    /// A path below the mountpoint.
    pub fn path(&self, relative: &str) -> PathBuf {
        self.fs.mountpoint().join(relative)
    }
}

/// Mounts with default options; fails the test, saying what to install, if FUSE is missing.
pub fn mount() -> Mounted {
    mount_with(MountOptions::default())
}

pub fn mount_with(options: MountOptions) -> Mounted {
    let dir = tempfile::tempdir().expect("create a temporary mountpoint");
    let fs = CrashFs::mount(dir.path(), options)
        .unwrap_or_else(|error| panic!("crashfs integration tests need a working FUSE mount: {error}"));
    Mounted { fs, _dir: dir }
}

/// `fsync` of a file or directory.
pub fn fsync(path: &Path) {
    File::open(path)
        .and_then(|file| file.sync_all())
        .unwrap_or_else(|e| panic!("fsync {}: {e}", path.display()));
}

/// Writes a file and fsyncs its data (not its name).
pub fn write_synced(path: &Path, bytes: &[u8]) {
    std::fs::write(path, bytes).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    fsync(path);
}

/// The contents of a file, or `None` if it does not exist.
pub fn read(path: &Path) -> Option<Vec<u8>> {
    match std::fs::read(path) {
        Ok(bytes) => Some(bytes),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
        Err(error) => panic!("read {}: {error}", path.display()),
    }
}

/// Sorted entry names of a directory.
pub fn names(dir: &Path) -> Vec<String> {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("read_dir {}: {e}", dir.display()));
    let mut names: Vec<String> =
        entries.map(|entry| entry.expect("dir entry").file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    names
}
