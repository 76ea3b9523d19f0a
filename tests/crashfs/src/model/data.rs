//! Operations on file contents and attributes: read, write, truncate, fallocate, setattr. They
//! change only the volatile state; a file's data becomes durable when the file is fsynced.

use super::node::Content;
use super::{Attr, Fallocate, FsError, Ino, MAX_FILE_SIZE, Model, SetAttr};

impl Model {
    /// Up to `size` bytes of file `ino` from `offset` (fewer at the end of the file).
    pub fn read(&self, ino: Ino, offset: u64, size: u32) -> Result<Vec<u8>, FsError> {
        let data = self.file_data(ino)?;
        let start = usize::try_from(offset).unwrap_or(usize::MAX).min(data.len());
        let end = start.saturating_add(size as usize).min(data.len());
        Ok(data[start..end].to_vec())
    }

    /// Writes `bytes` at `offset`, extending the file (with zeros before `offset` if it lies
    /// past the end). Returns the number of bytes written.
    pub fn write(&mut self, ino: Ino, offset: u64, bytes: &[u8]) -> Result<u32, FsError> {
        let len = u32::try_from(bytes.len()).map_err(|_| FsError::Invalid)?;
        let end = offset.checked_add(u64::from(len)).ok_or(FsError::TooBig)?;
        if end > MAX_FILE_SIZE {
            return Err(FsError::TooBig);
        }
        let (start, end) = (offset as usize, end as usize);
        let live = self.live_mut(ino)?;
        let data = match &mut live.inode.content {
            Content::File(data) => data,
            Content::Dir(_) => return Err(FsError::IsDir),
            Content::Symlink(_) => return Err(FsError::Invalid),
        };
        if data.len() < end {
            data.resize(end, 0);
        }
        data[start..end].copy_from_slice(bytes);
        live.inode.meta.touch_contents();
        self.counters.writes += 1;
        self.counters.bytes_written += u64::from(len);
        Ok(len)
    }

    /// Changes attributes; a size change truncates or extends (with zeros) the file.
    pub fn setattr(&mut self, ino: Ino, change: SetAttr) -> Result<Attr, FsError> {
        if let Some(size) = change.size {
            self.set_size(ino, size)?;
        }
        let meta = &mut self.live_mut(ino)?.inode.meta;
        if let Some(perm) = change.perm {
            meta.perm = perm & 0o7777;
        }
        if let Some(uid) = change.uid {
            meta.uid = uid;
        }
        if let Some(gid) = change.gid {
            meta.gid = gid;
        }
        meta.touch_meta();
        if let Some(atime) = change.atime {
            meta.atime = atime;
        }
        if let Some(mtime) = change.mtime {
            meta.mtime = mtime;
        }
        self.attr(ino)
    }

    /// `fallocate(2)` on file `ino`.
    pub fn fallocate(&mut self, ino: Ino, offset: u64, len: u64, op: Fallocate) -> Result<(), FsError> {
        if len == 0 {
            return Err(FsError::Invalid);
        }
        let end = offset.checked_add(len).ok_or(FsError::TooBig)?;
        let size = self.file_data(ino)?.len() as u64;
        match op {
            Fallocate::Allocate { keep_size } => {
                if !keep_size && end > size {
                    self.set_size(ino, end)?;
                }
            }
            Fallocate::PunchHole => self.zero(ino, offset, end.min(size))?,
            Fallocate::ZeroRange { keep_size } => {
                if !keep_size && end > size {
                    self.set_size(ino, end)?;
                }
                // Past the old size the file is zeros already (extension zero fills).
                self.zero(ino, offset, end.min(size))?;
            }
        }
        Ok(())
    }

    /// `copy_file_range(2)`: copies up to `len` bytes between (possibly equal) files.
    pub fn copy_range(
        &mut self,
        from: Ino,
        from_offset: u64,
        to: Ino,
        to_offset: u64,
        len: u64,
    ) -> Result<u32, FsError> {
        let len = u32::try_from(len).unwrap_or(u32::MAX).min(1 << 30);
        let bytes = self.read(from, from_offset, len)?;
        self.write(to, to_offset, &bytes)
    }

    fn file_data(&self, ino: Ino) -> Result<&Vec<u8>, FsError> {
        match &self.live(ino)?.inode.content {
            Content::File(data) => Ok(data),
            Content::Dir(_) => Err(FsError::IsDir),
            Content::Symlink(_) => Err(FsError::Invalid),
        }
    }

    fn set_size(&mut self, ino: Ino, size: u64) -> Result<(), FsError> {
        if size > MAX_FILE_SIZE {
            return Err(FsError::TooBig);
        }
        let live = self.live_mut(ino)?;
        match &mut live.inode.content {
            Content::File(data) => data.resize(size as usize, 0),
            Content::Dir(_) => return Err(FsError::IsDir),
            Content::Symlink(_) => return Err(FsError::Invalid),
        }
        live.inode.meta.touch_contents();
        Ok(())
    }

    /// Zeros `[start, end)` of file `ino` (which covers it).
    fn zero(&mut self, ino: Ino, start: u64, end: u64) -> Result<(), FsError> {
        let live = self.live_mut(ino)?;
        if let Content::File(data) = &mut live.inode.content {
            let end = (end as usize).min(data.len());
            let start = (start as usize).min(end);
            data[start..end].fill(0);
            live.inode.meta.touch_contents();
        }
        Ok(())
    }
}
