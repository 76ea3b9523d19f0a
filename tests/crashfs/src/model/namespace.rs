//! Operations on directory entries: create, link, unlink, rmdir, rename. They change only the
//! volatile state; a directory's entries become durable when the directory is fsynced.

use std::collections::BTreeMap;
use std::ffi::OsStr;

use super::node::{Content, Inode, Live};
use super::{Attr, FsError, Ino, Meta, Model, NewNode, ROOT_INO, RenameMode, check_name};

impl Model {
    /// Creates a file, directory or symlink named `name` in `parent`.
    pub fn create(
        &mut self,
        parent: Ino,
        name: &OsStr,
        node: NewNode,
        perm: u16,
        uid: u32,
        gid: u32,
    ) -> Result<Attr, FsError> {
        check_name(name)?;
        if self.entries(parent)?.contains_key(name) {
            return Err(FsError::Exists);
        }
        let content = match node {
            NewNode::File => Content::File(Vec::new()),
            NewNode::Dir => Content::Dir(BTreeMap::new()),
            NewNode::Symlink(target) => Content::Symlink(target),
        };
        let ino = self.alloc_ino();
        let inode = Inode { content, meta: Meta::new(perm, uid, gid) };
        self.live.insert(ino, Live { inode, links: 1, parent, lookups: 0 });
        self.entries_mut(parent)?.insert(name.to_owned(), ino);
        self.live_mut(parent)?.inode.meta.touch_contents();
        self.attr(ino)
    }

    /// Adds the name `new_name` in `new_parent` for the existing non-directory `ino`.
    pub fn link(&mut self, ino: Ino, new_parent: Ino, new_name: &OsStr) -> Result<Attr, FsError> {
        check_name(new_name)?;
        if self.is_dir(ino) {
            return Err(FsError::NotPermitted);
        }
        self.live(ino)?;
        if self.entries(new_parent)?.contains_key(new_name) {
            return Err(FsError::Exists);
        }
        self.entries_mut(new_parent)?.insert(new_name.to_owned(), ino);
        self.live_mut(new_parent)?.inode.meta.touch_contents();
        let live = self.live_mut(ino)?;
        live.links += 1;
        live.inode.meta.touch_meta();
        self.attr(ino)
    }

    /// Removes the non-directory entry `name` from `parent`.
    pub fn unlink(&mut self, parent: Ino, name: &OsStr) -> Result<(), FsError> {
        let child = self.entries(parent)?.get(name).copied().ok_or(FsError::NotFound)?;
        if self.is_dir(child) {
            return Err(FsError::IsDir);
        }
        self.remove_entry(parent, name, child)
    }

    /// Removes the empty directory `name` from `parent`.
    pub fn rmdir(&mut self, parent: Ino, name: &OsStr) -> Result<(), FsError> {
        let child = self.entries(parent)?.get(name).copied().ok_or(FsError::NotFound)?;
        if !self.entries(child)?.is_empty() {
            return Err(FsError::NotEmpty);
        }
        self.remove_entry(parent, name, child)
    }

    /// Moves the entry `name` of `parent` to `new_name` in `new_parent`, with `rename(2)`
    /// (or `renameat2(2)` with `mode`) semantics.
    pub fn rename(
        &mut self,
        parent: Ino,
        name: &OsStr,
        new_parent: Ino,
        new_name: &OsStr,
        mode: RenameMode,
    ) -> Result<(), FsError> {
        check_name(new_name)?;
        let source = self.entries(parent)?.get(name).copied().ok_or(FsError::NotFound)?;
        let target = self.entries(new_parent)?.get(new_name).copied();
        if mode == RenameMode::Exchange {
            let target = target.ok_or(FsError::NotFound)?;
            return self.exchange(parent, name, source, new_parent, new_name, target);
        }
        if target == Some(source) {
            // Two names of one inode: rename(2) does nothing.
            return Ok(());
        }
        if mode == RenameMode::NoReplace && target.is_some() {
            return Err(FsError::Exists);
        }
        if self.is_dir(source) {
            if self.is_within(new_parent, source) {
                return Err(FsError::Invalid);
            }
            if let Some(target) = target {
                if !self.is_dir(target) {
                    return Err(FsError::NotDir);
                }
                if !self.entries(target)?.is_empty() {
                    return Err(FsError::NotEmpty);
                }
            }
        } else if target.is_some_and(|target| self.is_dir(target)) {
            return Err(FsError::IsDir);
        }

        self.entries_mut(parent)?.remove(name);
        self.entries_mut(new_parent)?.insert(new_name.to_owned(), source);
        self.live_mut(parent)?.inode.meta.touch_contents();
        self.live_mut(new_parent)?.inode.meta.touch_contents();
        let moved = self.live_mut(source)?;
        moved.inode.meta.touch_meta();
        if matches!(moved.inode.content, Content::Dir(_)) {
            moved.parent = new_parent;
        }
        if let Some(target) = target {
            self.drop_link(target);
        }
        Ok(())
    }

    fn exchange(
        &mut self,
        parent: Ino,
        name: &OsStr,
        source: Ino,
        new_parent: Ino,
        new_name: &OsStr,
        target: Ino,
    ) -> Result<(), FsError> {
        if (self.is_dir(source) && self.is_within(new_parent, source))
            || (self.is_dir(target) && self.is_within(parent, target))
        {
            return Err(FsError::Invalid);
        }
        self.entries_mut(parent)?.insert(name.to_owned(), target);
        self.entries_mut(new_parent)?.insert(new_name.to_owned(), source);
        for (ino, holder) in [(source, new_parent), (target, parent)] {
            let live = self.live_mut(ino)?;
            live.inode.meta.touch_meta();
            if matches!(live.inode.content, Content::Dir(_)) {
                live.parent = holder;
            }
        }
        self.live_mut(parent)?.inode.meta.touch_contents();
        self.live_mut(new_parent)?.inode.meta.touch_contents();
        Ok(())
    }

    fn remove_entry(&mut self, parent: Ino, name: &OsStr, child: Ino) -> Result<(), FsError> {
        self.entries_mut(parent)?.remove(name);
        self.live_mut(parent)?.inode.meta.touch_contents();
        self.drop_link(child);
        Ok(())
    }

    /// One name of `ino` is gone (a directory has only one).
    fn drop_link(&mut self, ino: Ino) {
        if let Some(live) = self.live.get_mut(&ino) {
            live.links = match live.inode.content {
                Content::Dir(_) => 0,
                _ => live.links.saturating_sub(1),
            };
            live.inode.meta.touch_meta();
        }
        self.free_if_unused(ino);
    }

    /// Whether `dir` is `ancestor` or lies below it.
    fn is_within(&self, dir: Ino, ancestor: Ino) -> bool {
        let mut current = dir;
        // Bounded walk: the volatile tree has no cycles, but never loop on a broken one.
        for _ in 0..=self.live.len() {
            if current == ancestor {
                return true;
            }
            if current == ROOT_INO {
                return false;
            }
            match self.live.get(&current) {
                Some(live) => current = live.parent,
                None => return false,
            }
        }
        false
    }
}
