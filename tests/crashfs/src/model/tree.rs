//! A plain snapshot of a namespace ([`Tree`]) to inspect a state, compare states in tests,
//! and save or load the durable state.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Component, Path};

use super::node::Content;
use super::{Counters, FsError, Ino, Model, NewNode, ROOT_INO, SetAttr, Tear};

/// A namespace snapshot: directories hold named subtrees. A file with several names appears
/// once per name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Tree {
    /// A regular file.
    File {
        /// Its contents.
        data: Vec<u8>,
        /// Its permission bits.
        perm: u16,
    },
    /// A directory.
    Dir {
        /// Its permission bits.
        perm: u16,
        /// Its entries.
        entries: BTreeMap<OsString, Tree>,
    },
    /// A symbolic link.
    Symlink {
        /// Its target.
        target: OsString,
    },
}

impl Tree {
    /// The node at a relative path (`.` components ignored), if any.
    pub fn get(&self, path: impl AsRef<Path>) -> Option<&Tree> {
        let mut node = self;
        for component in path.as_ref().components() {
            match component {
                Component::RootDir | Component::CurDir => {}
                Component::Normal(name) => match node {
                    Tree::Dir { entries, .. } => node = entries.get(name)?,
                    _ => return None,
                },
                Component::ParentDir | Component::Prefix(_) => return None,
            }
        }
        Some(node)
    }

    /// The contents of the regular file at `path`, if there is one.
    pub fn file(&self, path: impl AsRef<Path>) -> Option<&[u8]> {
        match self.get(path)? {
            Tree::File { data, .. } => Some(data),
            _ => None,
        }
    }

    /// The entry names of the directory at `path`, if there is one.
    pub fn names(&self, path: impl AsRef<Path>) -> Option<Vec<String>> {
        match self.get(path)? {
            Tree::Dir { entries, .. } => {
                Some(entries.keys().map(|name| name.to_string_lossy().into_owned()).collect())
            }
            _ => None,
        }
    }
}

impl Model {
    /// What programs see now.
    pub fn volatile_tree(&self) -> Tree {
        self.subtree(ROOT_INO, 0)
    }

    /// What programs would see after a power loss without torn writes.
    pub fn durable_tree(&self) -> Tree {
        let mut after = self.clone();
        after.power_loss(Tear::Never);
        after.volatile_tree()
    }

    /// A model whose volatile and durable states are both `tree` (which must be a directory),
    /// every inode owned by `uid`/`gid`. Counters start at zero.
    pub fn from_tree(tree: &Tree, uid: u32, gid: u32) -> Result<Model, FsError> {
        let Tree::Dir { perm, entries } = tree else {
            return Err(FsError::NotDir);
        };
        let mut model = Model::new(uid, gid);
        model.setattr(ROOT_INO, SetAttr { perm: Some(*perm), ..SetAttr::default() })?;
        model.populate(ROOT_INO, entries, uid, gid)?;
        let inodes: Vec<(Ino, bool)> = model
            .live
            .iter()
            .map(|(ino, live)| (*ino, matches!(live.inode.content, Content::Dir(_))))
            .collect();
        for (ino, is_dir) in inodes {
            if is_dir { model.fsync_dir(ino)? } else { model.fsync(ino, false)? }
        }
        model.counters = Counters::default();
        Ok(model)
    }

    fn populate(
        &mut self,
        dir: Ino,
        entries: &BTreeMap<OsString, Tree>,
        uid: u32,
        gid: u32,
    ) -> Result<(), FsError> {
        for (name, node) in entries {
            match node {
                Tree::File { data, perm } => {
                    let ino = self.create(dir, name, NewNode::File, *perm, uid, gid)?.ino;
                    self.write(ino, 0, data)?;
                }
                Tree::Dir { perm, entries } => {
                    let ino = self.create(dir, name, NewNode::Dir, *perm, uid, gid)?.ino;
                    self.populate(ino, entries, uid, gid)?;
                }
                Tree::Symlink { target } => {
                    self.create(dir, name, NewNode::Symlink(target.clone()), 0o777, uid, gid)?;
                }
            }
        }
        Ok(())
    }

    fn subtree(&self, ino: Ino, depth: usize) -> Tree {
        let Some(live) = self.live.get(&ino) else {
            return Tree::Dir { perm: 0, entries: BTreeMap::new() };
        };
        let perm = live.inode.meta.perm;
        match &live.inode.content {
            Content::File(data) => Tree::File { data: data.clone(), perm },
            Content::Symlink(target) => Tree::Symlink { target: target.clone() },
            Content::Dir(entries) => {
                // The volatile namespace is a tree; the bound only guards against a bug.
                let entries = if depth > self.live.len() {
                    BTreeMap::new()
                } else {
                    entries
                        .iter()
                        .map(|(name, child)| (name.clone(), self.subtree(*child, depth + 1)))
                        .collect()
                };
                Tree::Dir { perm, entries }
            }
        }
    }
}
