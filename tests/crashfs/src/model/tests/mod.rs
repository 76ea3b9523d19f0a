//! Unit tests of the pure model, through a path-based helper.

mod data;
mod namespace;
mod survival;
mod torn;

use std::ffi::OsStr;
use std::path::Path;

use super::{FsError, Ino, Model, NewNode, PowerLossReport, ROOT_INO, RenameMode, SetAttr, Tear};

/// A model driven by paths, the way a program drives a file system.
struct Sim {
    model: Model,
}

impl Sim {
    fn new() -> Sim {
        Sim { model: Model::new(0, 0) }
    }

    fn ino(&self, path: &str) -> Ino {
        self.model.lookup_path(Path::new(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    fn split<'a>(&self, path: &'a str) -> (Ino, &'a OsStr) {
        let path = Path::new(path);
        let parent = path.parent().map_or(ROOT_INO, |p| self.ino(p.to_str().unwrap_or("")));
        (parent, path.file_name().unwrap_or_default())
    }

    fn create(&mut self, path: &str) -> Ino {
        let (parent, name) = self.split(path);
        self.model.create(parent, name, NewNode::File, 0o644, 0, 0).unwrap().ino
    }

    fn mkdir(&mut self, path: &str) -> Ino {
        let (parent, name) = self.split(path);
        self.model.create(parent, name, NewNode::Dir, 0o755, 0, 0).unwrap().ino
    }

    fn write(&mut self, path: &str, offset: u64, bytes: &[u8]) {
        let ino = self.ino(path);
        self.model.write(ino, offset, bytes).unwrap();
    }

    /// Creates (if needed) and overwrites a whole file, like `std::fs::write`.
    fn put(&mut self, path: &str, bytes: &[u8]) {
        let ino = match self.model.lookup_path(Path::new(path)) {
            Ok(ino) => ino,
            Err(_) => self.create(path),
        };
        self.model.setattr(ino, SetAttr { size: Some(0), ..SetAttr::default() }).unwrap();
        self.model.write(ino, 0, bytes).unwrap();
    }

    fn truncate(&mut self, path: &str, size: u64) {
        let ino = self.ino(path);
        self.model.setattr(ino, SetAttr { size: Some(size), ..SetAttr::default() }).unwrap();
    }

    fn fsync(&mut self, path: &str) {
        let ino = self.ino(path);
        self.model.fsync(ino, false).unwrap();
    }

    fn fdatasync(&mut self, path: &str) {
        let ino = self.ino(path);
        self.model.fsync(ino, true).unwrap();
    }

    fn fsync_dir(&mut self, path: &str) {
        let ino = self.ino(path);
        self.model.fsync_dir(ino).unwrap();
    }

    fn rename(&mut self, from: &str, to: &str) -> Result<(), FsError> {
        self.rename_with(from, to, RenameMode::Replace)
    }

    fn rename_with(&mut self, from: &str, to: &str, mode: RenameMode) -> Result<(), FsError> {
        let (parent, name) = self.split(from);
        let (new_parent, new_name) = self.split(to);
        self.model.rename(parent, name, new_parent, new_name, mode)
    }

    fn unlink(&mut self, path: &str) -> Result<(), FsError> {
        let (parent, name) = self.split(path);
        self.model.unlink(parent, name)
    }

    fn rmdir(&mut self, path: &str) -> Result<(), FsError> {
        let (parent, name) = self.split(path);
        self.model.rmdir(parent, name)
    }

    fn crash(&mut self) -> PowerLossReport {
        self.model.power_loss(Tear::Never)
    }

    fn read(&self, path: &str) -> Option<Vec<u8>> {
        let ino = self.model.lookup_path(Path::new(path)).ok()?;
        self.model.read(ino, 0, u32::MAX).ok()
    }

    fn exists(&self, path: &str) -> bool {
        self.model.lookup_path(Path::new(path)).is_ok()
    }

    fn names(&self, path: &str) -> Vec<String> {
        let ino = self.ino(path);
        let entries = self.model.read_dir(ino).unwrap();
        entries.into_iter().map(|e| e.name.to_string_lossy().into_owned()).collect()
    }

    /// A durable file `path` holding `bytes` (data and name synced).
    fn durable_file(&mut self, path: &str, bytes: &[u8]) {
        self.put(path, bytes);
        self.fsync(path);
        let parent = Path::new(path).parent().and_then(Path::to_str).unwrap_or("");
        self.fsync_dir(parent);
    }
}
