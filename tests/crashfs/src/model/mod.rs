//! The pure persistence model: a volatile state that programs see and a durable state that
//! survives a power cut, with no FUSE and no I/O, so that its rules are testable directly.
//!
//! The rules are documented at the crate root. In short:
//! - every operation changes only the volatile state;
//! - [`Model::fsync`] copies one file's data and size (and, unless `datasync`, its metadata)
//!   to the durable state;
//! - [`Model::fsync_dir`] copies one directory's entries (name → inode) to the durable state;
//! - [`Model::power_loss`] replaces the volatile state by what is reachable from the durable
//!   root through durable directory entries.

mod data;
mod durability;
mod error;
mod namespace;
mod node;
mod tree;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::path::{Component, Path};

pub use durability::{PowerLossReport, Tear};
pub use error::FsError;
pub use node::{
    Attr, DirEntry, Fallocate, FileKind, Ino, MAX_FILE_SIZE, MAX_NAME_LEN, Meta, NewNode, ROOT_INO,
    RenameMode, SECTOR_SIZE, SetAttr,
};
pub use tree::Tree;

use node::{Content, Inode, Live};

/// Operation counters of a [`Model`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// `fsync` calls on files (full: data and metadata).
    pub fsyncs: u64,
    /// `fdatasync` calls on files.
    pub fdatasyncs: u64,
    /// `fsync` calls on directories.
    pub dir_fsyncs: u64,
    /// `write` calls.
    pub writes: u64,
    /// Bytes written by `write` calls.
    pub bytes_written: u64,
    /// Power losses.
    pub power_losses: u64,
}

/// The volatile and the durable state of one file system.
#[derive(Clone, Debug)]
pub struct Model {
    /// What programs see: every inode that has a name or a kernel reference.
    live: BTreeMap<Ino, Live>,
    /// What survives a power cut, per inode: a file's data and size as of its last `fsync`, a
    /// directory's entries as of its last directory `fsync`. Only inodes reachable from the
    /// durable root through durable entries survive; the others are kept while they may
    /// still become reachable (while they are live).
    durable: BTreeMap<Ino, Inode>,
    next_ino: Ino,
    counters: Counters,
}

impl Model {
    /// An empty file system whose root directory (mode 0755) belongs to `uid`/`gid`. The
    /// empty root is durable.
    pub fn new(uid: u32, gid: u32) -> Model {
        let root = Inode { content: Content::Dir(BTreeMap::new()), meta: Meta::new(0o755, uid, gid) };
        let mut live = BTreeMap::new();
        live.insert(ROOT_INO, Live { inode: root.clone(), links: 1, parent: ROOT_INO, lookups: 0 });
        let mut durable = BTreeMap::new();
        durable.insert(ROOT_INO, root);
        Model { live, durable, next_ino: ROOT_INO + 1, counters: Counters::default() }
    }

    /// Operation counters since the model was made.
    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// Attributes of a live inode.
    pub fn attr(&self, ino: Ino) -> Result<Attr, FsError> {
        let live = self.live(ino)?;
        let (size, nlink) = match &live.inode.content {
            Content::File(data) => (data.len() as u64, live.links),
            Content::Symlink(target) => (target.len() as u64, live.links),
            Content::Dir(entries) => {
                let subdirs = entries.values().filter(|child| self.is_dir(**child)).count();
                let nlink = if live.links == 0 { 0 } else { 2 + subdirs as u32 };
                (entries.len() as u64, nlink)
            }
        };
        Ok(Attr { ino, kind: live.inode.content.kind(), size, nlink, meta: live.inode.meta })
    }

    /// The inode named `name` in directory `parent`.
    pub fn lookup(&self, parent: Ino, name: &OsStr) -> Result<Attr, FsError> {
        let child = self.entries(parent)?.get(name).copied().ok_or(FsError::NotFound)?;
        self.attr(child)
    }

    /// Resolves a relative path (from the root; `.` components are ignored, `..` is refused)
    /// in the volatile state, without following symlinks.
    pub fn lookup_path(&self, path: &Path) -> Result<Ino, FsError> {
        let mut ino = ROOT_INO;
        for component in path.components() {
            match component {
                Component::RootDir | Component::CurDir => {}
                Component::Normal(name) => ino = self.lookup(ino, name)?.ino,
                Component::ParentDir | Component::Prefix(_) => return Err(FsError::Invalid),
            }
        }
        Ok(ino)
    }

    /// The entries of a directory (without `.` and `..`), sorted by name.
    pub fn read_dir(&self, ino: Ino) -> Result<Vec<DirEntry>, FsError> {
        let entries = self.entries(ino)?;
        Ok(entries
            .iter()
            .filter_map(|(name, child)| {
                let kind = self.live.get(child)?.inode.content.kind();
                Some(DirEntry { ino: *child, kind, name: name.clone() })
            })
            .collect())
    }

    /// The directory holding a directory's entry (the root's parent is the root).
    pub fn parent(&self, dir: Ino) -> Result<Ino, FsError> {
        let live = self.live(dir)?;
        match live.inode.content {
            Content::Dir(_) => Ok(live.parent),
            _ => Err(FsError::NotDir),
        }
    }

    /// The target of a symbolic link.
    pub fn read_link(&self, ino: Ino) -> Result<OsString, FsError> {
        match &self.live(ino)?.inode.content {
            Content::Symlink(target) => Ok(target.clone()),
            _ => Err(FsError::Invalid),
        }
    }

    /// Records one more kernel reference to `ino` (a FUSE lookup): an unlinked inode stays
    /// readable and writable until its references are forgotten.
    pub fn remember(&mut self, ino: Ino) {
        if let Some(live) = self.live.get_mut(&ino) {
            live.lookups += 1;
        }
    }

    /// Drops `count` kernel references to `ino` (a FUSE forget), freeing the inode if it has
    /// no name left.
    pub fn forget(&mut self, ino: Ino, count: u64) {
        if let Some(live) = self.live.get_mut(&ino) {
            live.lookups = live.lookups.saturating_sub(count);
        }
        self.free_if_unused(ino);
    }

    /// Number of live inodes (named, or unnamed but still referenced).
    pub fn live_inodes(&self) -> usize {
        self.live.len()
    }

    fn live(&self, ino: Ino) -> Result<&Live, FsError> {
        self.live.get(&ino).ok_or(FsError::NotFound)
    }

    fn live_mut(&mut self, ino: Ino) -> Result<&mut Live, FsError> {
        self.live.get_mut(&ino).ok_or(FsError::NotFound)
    }

    fn is_dir(&self, ino: Ino) -> bool {
        self.live.get(&ino).is_some_and(|live| matches!(live.inode.content, Content::Dir(_)))
    }

    fn entries(&self, dir: Ino) -> Result<&BTreeMap<OsString, Ino>, FsError> {
        match &self.live(dir)?.inode.content {
            Content::Dir(entries) => Ok(entries),
            _ => Err(FsError::NotDir),
        }
    }

    fn entries_mut(&mut self, dir: Ino) -> Result<&mut BTreeMap<OsString, Ino>, FsError> {
        match &mut self.live_mut(dir)?.inode.content {
            Content::Dir(entries) => Ok(entries),
            _ => Err(FsError::NotDir),
        }
    }

    fn alloc_ino(&mut self) -> Ino {
        let ino = self.next_ino;
        self.next_ino += 1;
        ino
    }

    /// Removes an inode that has neither a name nor a kernel reference.
    fn free_if_unused(&mut self, ino: Ino) {
        if ino == ROOT_INO {
            return;
        }
        if self.live.get(&ino).is_some_and(|live| live.links == 0 && live.lookups == 0) {
            self.live.remove(&ino);
        }
    }
}

/// Checks a name for a new directory entry.
fn check_name(name: &OsStr) -> Result<(), FsError> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes == b"." || bytes == b".." || bytes.contains(&b'/') || bytes.contains(&0) {
        return Err(FsError::Invalid);
    }
    if bytes.len() > MAX_NAME_LEN {
        return Err(FsError::NameTooLong);
    }
    Ok(())
}
