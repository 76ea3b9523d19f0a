//! The `fuser` file system: each kernel request becomes one [`Model`] operation.
//!
//! One [`CrashFsHandler`] serves one FUSE session (one mount). A power loss ends the session
//! and starts another at the same mountpoint; the shared state's generation tells an old
//! session's late requests apart, and they fail with `EIO` (a dead machine answers nothing).

mod convert;

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use convert::{fallocate_op, file_attr, file_type, perm, time};
use fuser::{
    AccessFlags, CopyFileRangeFlags, Errno, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};

use crate::model::{
    Attr, FileKind, FsError, Ino, MAX_FILE_SIZE, MAX_NAME_LEN, Model, NewNode, RenameMode, SetAttr,
};
use crate::shared::{Shared, lock};

/// One entry of an open directory's listing.
struct Listed {
    ino: Ino,
    kind: FileType,
    name: OsString,
}

/// Serves one FUSE session.
pub(crate) struct CrashFsHandler {
    shared: Arc<Mutex<Shared>>,
    generation: u64,
    ttl: Duration,
    /// Listings of open directories, taken at `opendir` (and at each rewind), so that entries
    /// removed while a program iterates (`remove_dir_all`) do not shift the offsets.
    dirs: Mutex<HashMap<u64, Vec<Listed>>>,
    next_handle: AtomicU64,
}

impl CrashFsHandler {
    pub(crate) fn new(shared: Arc<Mutex<Shared>>, generation: u64, ttl: Duration) -> CrashFsHandler {
        CrashFsHandler {
            shared,
            generation,
            ttl,
            dirs: Mutex::new(HashMap::new()),
            next_handle: AtomicU64::new(1),
        }
    }

    /// Runs `op` on the model if this session is still the current one.
    fn model<R>(&self, op: impl FnOnce(&mut Model) -> Result<R, FsError>) -> Result<R, Errno> {
        let mut shared = lock(&self.shared);
        if shared.generation != self.generation {
            return Err(Errno::EIO);
        }
        op(&mut shared.model).map_err(|error| Errno::from_i32(error.errno()))
    }

    /// Replies with a new kernel reference to the inode of `result`.
    fn reply_entry(&self, reply: ReplyEntry, result: Result<Attr, Errno>) {
        match result {
            Ok(attr) => reply.entry(&self.ttl, &file_attr(&attr), Generation(0)),
            Err(errno) => reply.error(errno),
        }
    }

    fn listing(&self, ino: Ino) -> Result<Vec<Listed>, Errno> {
        self.model(|model| {
            let parent = model.parent(ino)?;
            let mut listing = vec![
                Listed { ino, kind: FileType::Directory, name: ".".into() },
                Listed { ino: parent, kind: FileType::Directory, name: "..".into() },
            ];
            listing.extend(model.read_dir(ino)?.into_iter().map(|entry| Listed {
                ino: entry.ino,
                kind: file_type(entry.kind),
                name: entry.name,
            }));
            Ok(listing)
        })
    }
}

impl Filesystem for CrashFsHandler {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let result = self.model(|model| {
            let attr = model.lookup(parent.0, name)?;
            model.remember(attr.ino);
            Ok(attr)
        });
        self.reply_entry(reply, result);
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        let _stale_session = self.model(|model| {
            model.forget(ino.0, nlookup);
            Ok(())
        });
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.model(|model| model.attr(ino.0)) {
            Ok(attr) => reply.attr(&self.ttl, &file_attr(&attr)),
            Err(errno) => reply.error(errno),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let change = SetAttr {
            perm: mode.map(|mode| perm(mode, 0)),
            uid,
            gid,
            size,
            atime: atime.map(time),
            mtime: mtime.map(time),
        };
        match self.model(|model| model.setattr(ino.0, change)) {
            Ok(attr) => reply.attr(&self.ttl, &file_attr(&attr)),
            Err(errno) => reply.error(errno),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.model(|model| model.read_link(ino.0)) {
            Ok(target) => reply.data(target.as_bytes()),
            Err(errno) => reply.error(errno),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        let file_type = mode & libc::S_IFMT;
        if file_type != 0 && file_type != libc::S_IFREG {
            // Only regular files: FIFOs, sockets and devices are not modelled.
            return reply.error(Errno::EPERM);
        }
        let result = self.model(|model| {
            let attr =
                model.create(parent.0, name, NewNode::File, perm(mode, umask), req.uid(), req.gid())?;
            model.remember(attr.ino);
            Ok(attr)
        });
        self.reply_entry(reply, result);
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        let result = self.model(|model| {
            let attr = model.create(parent.0, name, NewNode::Dir, perm(mode, umask), req.uid(), req.gid())?;
            model.remember(attr.ino);
            Ok(attr)
        });
        self.reply_entry(reply, result);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.model(|model| model.unlink(parent.0, name)) {
            Ok(()) => reply.ok(),
            Err(errno) => reply.error(errno),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.model(|model| model.rmdir(parent.0, name)) {
            Ok(()) => reply.ok(),
            Err(errno) => reply.error(errno),
        }
    }

    fn symlink(&self, req: &Request, parent: INodeNo, link_name: &OsStr, target: &Path, reply: ReplyEntry) {
        let node = NewNode::Symlink(target.as_os_str().to_owned());
        let result = self.model(|model| {
            let attr = model.create(parent.0, link_name, node, 0o777, req.uid(), req.gid())?;
            model.remember(attr.ino);
            Ok(attr)
        });
        self.reply_entry(reply, result);
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let mode = if flags.is_empty() {
            RenameMode::Replace
        } else if flags == RenameFlags::RENAME_NOREPLACE {
            RenameMode::NoReplace
        } else if flags == RenameFlags::RENAME_EXCHANGE {
            RenameMode::Exchange
        } else {
            return reply.error(Errno::EINVAL);
        };
        match self.model(|model| model.rename(parent.0, name, newparent.0, newname, mode)) {
            Ok(()) => reply.ok(),
            Err(errno) => reply.error(errno),
        }
    }

    fn link(&self, _req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        let result = self.model(|model| {
            let attr = model.link(ino.0, newparent.0, newname)?;
            model.remember(attr.ino);
            Ok(attr)
        });
        self.reply_entry(reply, result);
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.model(|model| model.attr(ino.0)) {
            Ok(attr) if attr.kind == FileKind::Dir => reply.error(Errno::EISDIR),
            // No FOPEN_KEEP_CACHE: the kernel drops its cached pages at every open.
            Ok(_) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(errno) => reply.error(errno),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.model(|model| model.read(ino.0, offset, size)) {
            Ok(data) => reply.data(&data),
            Err(errno) => reply.error(errno),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.model(|model| model.write(ino.0, offset, data)) {
            Ok(written) => reply.written(written),
            Err(errno) => reply.error(errno),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close(2) makes nothing durable.
        reply.ok();
    }

    fn fsync(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, datasync: bool, reply: ReplyEmpty) {
        match self.model(|model| model.fsync(ino.0, datasync)) {
            Ok(()) => reply.ok(),
            Err(errno) => reply.error(errno),
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.listing(ino.0) {
            Ok(listing) => {
                let handle = self.next_handle.fetch_add(1, Ordering::Relaxed);
                lock(&self.dirs).insert(handle, listing);
                reply.opened(FileHandle(handle), FopenFlags::empty());
            }
            Err(errno) => reply.error(errno),
        }
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let mut dirs = lock(&self.dirs);
        if offset == 0 || !dirs.contains_key(&fh.0) {
            // A rewind (or an unknown handle): list the directory as it is now.
            match self.listing(ino.0) {
                Ok(listing) => dirs.insert(fh.0, listing),
                Err(errno) => return reply.error(errno),
            };
        }
        let listing = dirs.get(&fh.0).map(Vec::as_slice).unwrap_or_default();
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        for (index, entry) in listing.iter().enumerate().skip(start) {
            if reply.add(INodeNo(entry.ino), index as u64 + 1, entry.kind, &entry.name) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        lock(&self.dirs).remove(&fh.0);
        reply.ok();
    }

    fn fsyncdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        match self.model(|model| model.fsync_dir(ino.0)) {
            Ok(()) => reply.ok(),
            Err(errno) => reply.error(errno),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        const BLOCK: u64 = 4096;
        let files = match self.model(|model| Ok(model.live_inodes() as u64)) {
            Ok(files) => files,
            Err(errno) => return reply.error(errno),
        };
        // Space is not accounted: a 16 GiB file system that always looks empty.
        let blocks = 16 * MAX_FILE_SIZE / BLOCK;
        reply.statfs(
            blocks,
            blocks,
            blocks,
            files + (1 << 20),
            1 << 20,
            BLOCK as u32,
            MAX_NAME_LEN as u32,
            BLOCK as u32,
        );
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        // Permissions are checked by the kernel (`default_permissions`).
        match self.model(|model| model.attr(ino.0)) {
            Ok(_) => reply.ok(),
            Err(errno) => reply.error(errno),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let result = self.model(|model| {
            let attr = match model.lookup(parent.0, name) {
                Ok(_) if flags & libc::O_EXCL != 0 => return Err(FsError::Exists),
                Ok(attr) if attr.kind == FileKind::Dir => return Err(FsError::IsDir),
                Ok(attr) => attr,
                Err(_) => {
                    model.create(parent.0, name, NewNode::File, perm(mode, umask), req.uid(), req.gid())?
                }
            };
            model.remember(attr.ino);
            Ok(attr)
        });
        match result {
            Ok(attr) => {
                reply.created(&self.ttl, &file_attr(&attr), Generation(0), FileHandle(0), FopenFlags::empty())
            }
            Err(errno) => reply.error(errno),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let Some(op) = fallocate_op(mode) else {
            return reply.error(Errno::EOPNOTSUPP);
        };
        match self.model(|model| model.fallocate(ino.0, offset, length, op)) {
            Ok(()) => reply.ok(),
            Err(errno) => reply.error(errno),
        }
    }

    fn copy_file_range(
        &self,
        _req: &Request,
        ino_in: INodeNo,
        _fh_in: FileHandle,
        offset_in: u64,
        ino_out: INodeNo,
        _fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        match self.model(|model| model.copy_range(ino_in.0, offset_in, ino_out.0, offset_out, len)) {
            Ok(written) => reply.written(written),
            Err(errno) => reply.error(errno),
        }
    }
}
