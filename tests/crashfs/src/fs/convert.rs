//! Conversions between the model's types and fuser's.

use std::time::SystemTime;

use fuser::{FileAttr, FileType, INodeNo, TimeOrNow};

use crate::model::{Attr, Fallocate, FileKind};

/// The fuser file type of a model kind.
pub(super) fn file_type(kind: FileKind) -> FileType {
    match kind {
        FileKind::File => FileType::RegularFile,
        FileKind::Dir => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
    }
}

/// The `stat` attributes of a model inode.
pub(super) fn file_attr(attr: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(attr.ino),
        size: attr.size,
        blocks: attr.size.div_ceil(512),
        atime: attr.meta.atime,
        mtime: attr.meta.mtime,
        ctime: attr.meta.ctime,
        crtime: attr.meta.crtime,
        kind: file_type(attr.kind),
        perm: attr.meta.perm,
        nlink: attr.nlink,
        uid: attr.meta.uid,
        gid: attr.meta.gid,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

/// A `utimensat` time.
pub(super) fn time(time: TimeOrNow) -> SystemTime {
    match time {
        TimeOrNow::SpecificTime(time) => time,
        TimeOrNow::Now => SystemTime::now(),
    }
}

/// Permission bits of a creation or `chmod` mode.
pub(super) fn perm(mode: u32, umask: u32) -> u16 {
    (mode & !umask & 0o7777) as u16
}

/// The model operation of `fallocate` mode flags (`None`: not supported).
pub(super) fn fallocate_op(mode: i32) -> Option<Fallocate> {
    const KEEP: i32 = libc::FALLOC_FL_KEEP_SIZE;
    match mode {
        0 => Some(Fallocate::Allocate { keep_size: false }),
        KEEP => Some(Fallocate::Allocate { keep_size: true }),
        m if m == libc::FALLOC_FL_PUNCH_HOLE | KEEP => Some(Fallocate::PunchHole),
        m if m == libc::FALLOC_FL_ZERO_RANGE => Some(Fallocate::ZeroRange { keep_size: false }),
        m if m == libc::FALLOC_FL_ZERO_RANGE | KEEP => Some(Fallocate::ZeroRange { keep_size: true }),
        _ => None,
    }
}
