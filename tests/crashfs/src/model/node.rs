//! The inode types shared by the volatile and the durable state.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::time::SystemTime;

/// An inode number. Numbers are never reused within one [`Model`](super::Model), so a durable
/// directory entry always names the inode it named when it was made durable.
pub type Ino = u64;

/// The inode number of the root directory (also FUSE's root inode number).
pub const ROOT_INO: Ino = 1;

/// The unit of torn writes: at a power loss with torn writes enabled, each unsynced sector of
/// a file independently survives or not.
pub const SECTOR_SIZE: usize = 512;

/// The largest file size the model accepts (writes beyond it fail with `EFBIG`). File contents
/// are held in memory as dense byte vectors, so sparse files cost their full size.
pub const MAX_FILE_SIZE: u64 = 1 << 30;

/// The longest file name accepted (`ENAMETOOLONG` beyond).
pub const MAX_NAME_LEN: usize = 255;

/// What kind of object an inode is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FileKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link.
    Symlink,
}

/// Inode metadata other than size and link count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Meta {
    /// Permission bits (`mode & 0o7777`).
    pub perm: u16,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Last access.
    pub atime: SystemTime,
    /// Last modification of the contents.
    pub mtime: SystemTime,
    /// Last change of the contents or the metadata.
    pub ctime: SystemTime,
    /// Creation.
    pub crtime: SystemTime,
}

impl Meta {
    /// Metadata of an inode created now.
    pub fn new(perm: u16, uid: u32, gid: u32) -> Meta {
        let now = SystemTime::now();
        Meta { perm: perm & 0o7777, uid, gid, atime: now, mtime: now, ctime: now, crtime: now }
    }

    /// Records a change of the contents.
    pub(crate) fn touch_contents(&mut self) {
        let now = SystemTime::now();
        self.mtime = now;
        self.ctime = now;
    }

    /// Records a change of the metadata only.
    pub(crate) fn touch_meta(&mut self) {
        self.ctime = SystemTime::now();
    }
}

/// The contents of an inode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Content {
    File(Vec<u8>),
    Dir(BTreeMap<OsString, Ino>),
    Symlink(OsString),
}

impl Content {
    pub(crate) fn kind(&self) -> FileKind {
        match self {
            Content::File(_) => FileKind::File,
            Content::Dir(_) => FileKind::Dir,
            Content::Symlink(_) => FileKind::Symlink,
        }
    }

    /// The same kind of object, freshly created: what a durable directory entry points at
    /// when the inode itself was never synced (an empty file, an empty directory, or the
    /// symlink, whose target is written at creation).
    pub(crate) fn empty_like(&self) -> Content {
        match self {
            Content::File(_) => Content::File(Vec::new()),
            Content::Dir(_) => Content::Dir(BTreeMap::new()),
            Content::Symlink(target) => Content::Symlink(target.clone()),
        }
    }
}

/// One inode as stored in either state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Inode {
    pub(crate) content: Content,
    pub(crate) meta: Meta,
}

/// An inode of the volatile state, with what only the running system knows.
#[derive(Clone, Debug)]
pub(crate) struct Live {
    pub(crate) inode: Inode,
    /// Number of directory entries naming this inode (a directory has at most one).
    pub(crate) links: u32,
    /// For a directory, the directory holding its entry (the root is its own parent).
    pub(crate) parent: Ino,
    /// Kernel references (FUSE lookup count): an unlinked inode lives until they are gone.
    pub(crate) lookups: u64,
}

/// Attributes of an inode, as `stat` reports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attr {
    /// Inode number.
    pub ino: Ino,
    /// Kind of object.
    pub kind: FileKind,
    /// Size in bytes (a directory reports its number of entries).
    pub size: u64,
    /// Link count (a directory counts `.`, its entry and its subdirectories' `..`).
    pub nlink: u32,
    /// Permissions, owner, times.
    pub meta: Meta,
}

/// One entry of a directory listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    /// Inode the entry names.
    pub ino: Ino,
    /// Kind of that inode.
    pub kind: FileKind,
    /// Name of the entry.
    pub name: OsString,
}

/// What [`Model::create`](super::Model::create) makes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NewNode {
    /// An empty regular file.
    File,
    /// An empty directory.
    Dir,
    /// A symbolic link to the given target.
    Symlink(OsString),
}

/// Attribute changes of [`Model::setattr`](super::Model::setattr); `None` leaves a field alone.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SetAttr {
    /// New permission bits.
    pub perm: Option<u16>,
    /// New owner.
    pub uid: Option<u32>,
    /// New group.
    pub gid: Option<u32>,
    /// New size (truncate or extend with zeros).
    pub size: Option<u64>,
    /// New access time.
    pub atime: Option<SystemTime>,
    /// New modification time.
    pub mtime: Option<SystemTime>,
}

/// How [`Model::rename`](super::Model::rename) treats an existing target (`renameat2` flags).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RenameMode {
    /// Replace an existing target (plain `rename`).
    #[default]
    Replace,
    /// Fail with `EEXIST` if the target exists (`RENAME_NOREPLACE`).
    NoReplace,
    /// Swap source and target, which must both exist (`RENAME_EXCHANGE`).
    Exchange,
}

/// The `fallocate` operations the model supports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fallocate {
    /// Mode 0 (extend the size to cover the range, zero filled) or `FALLOC_FL_KEEP_SIZE`
    /// (nothing visible changes).
    Allocate {
        /// `FALLOC_FL_KEEP_SIZE`.
        keep_size: bool,
    },
    /// `FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE`: zero the range inside the file.
    PunchHole,
    /// `FALLOC_FL_ZERO_RANGE`: zero the range, extending the file unless `keep_size`.
    ZeroRange {
        /// `FALLOC_FL_KEEP_SIZE`.
        keep_size: bool,
    },
}
