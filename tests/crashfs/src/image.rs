//! Durable-state images: a [`Tree`] written out as an ordinary directory tree (so that it can
//! be inspected with `ls` and `cat`), and read back.
//!
//! Files keep their contents and permission bits, directories their permission bits, symlinks
//! their targets. Owners and times are not kept; a file with several names is written once
//! per name and loads back as separate files.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use crate::error::Error;
use crate::model::Tree;

/// Writes `tree` (a directory) as the directory `dir`, replacing whatever `dir` was. The new
/// image is built beside `dir` and renamed over it, so `dir` is always a complete image.
pub fn save(tree: &Tree, dir: &Path) -> Result<(), Error> {
    let staging = sibling(dir, "new");
    let old = sibling(dir, "old");
    for leftover in [&staging, &old] {
        remove(leftover)?;
    }
    write(tree, &staging)?;
    if fs::symlink_metadata(dir).is_ok() {
        fs::rename(dir, &old).map_err(|source| Error::Image { path: dir.to_owned(), source })?;
    }
    fs::rename(&staging, dir).map_err(|source| Error::Image { path: dir.to_owned(), source })?;
    remove(&old)
}

/// Reads the directory `dir` as a tree. Entries other than files, directories and symlinks
/// (sockets, devices) are skipped.
pub fn load(dir: &Path) -> Result<Tree, Error> {
    let image_err = |source| Error::Image { path: dir.to_owned(), source };
    let meta = fs::symlink_metadata(dir).map_err(image_err)?;
    let perm = (meta.permissions().mode() & 0o7777) as u16;
    if meta.file_type().is_symlink() {
        return Ok(Tree::Symlink { target: fs::read_link(dir).map_err(image_err)?.into_os_string() });
    }
    if meta.is_file() {
        return Ok(Tree::File { data: fs::read(dir).map_err(image_err)?, perm });
    }
    let mut entries = BTreeMap::new();
    for entry in fs::read_dir(dir).map_err(image_err)? {
        let entry = entry.map_err(image_err)?;
        let kind = entry.file_type().map_err(image_err)?;
        if kind.is_dir() || kind.is_file() || kind.is_symlink() {
            entries.insert(entry.file_name(), load(&entry.path())?);
        }
    }
    Ok(Tree::Dir { perm, entries })
}

fn write(tree: &Tree, path: &Path) -> Result<(), Error> {
    let image_err = |source| Error::Image { path: path.to_owned(), source };
    match tree {
        Tree::File { data, perm } => {
            fs::write(path, data).map_err(image_err)?;
            fs::set_permissions(path, fs::Permissions::from_mode(u32::from(*perm))).map_err(image_err)
        }
        Tree::Symlink { target } => symlink(target, path).map_err(image_err),
        Tree::Dir { perm, entries } => {
            fs::create_dir(path).map_err(image_err)?;
            for (name, child) in entries {
                write(child, &path.join(name))?;
            }
            // Last, so that a read-only directory can still be filled.
            fs::set_permissions(path, fs::Permissions::from_mode(u32::from(*perm))).map_err(image_err)
        }
    }
}

fn sibling(dir: &Path, suffix: &str) -> PathBuf {
    let mut name = dir.file_name().unwrap_or_default().to_owned();
    name.push(format!(".{suffix}"));
    dir.with_file_name(name)
}

fn remove(path: &Path) -> Result<(), Error> {
    let result = match fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(error),
    };
    result.map_err(|source| Error::Image { path: path.to_owned(), source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn save_then_load_round_trips_and_replaces() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("durable");
        let mut entries = BTreeMap::new();
        entries.insert("f".into(), Tree::File { data: b"abc".to_vec(), perm: 0o600 });
        entries.insert("l".into(), Tree::Symlink { target: "f".into() });
        let sub = Tree::Dir {
            perm: 0o700,
            entries: BTreeMap::from([("g".into(), Tree::File { data: vec![], perm: 0o644 })]),
        };
        entries.insert("sub".into(), sub);
        let tree = Tree::Dir { perm: 0o755, entries };
        save(&tree, &dir).unwrap();
        assert_eq!(load(&dir).unwrap(), tree);

        let empty = Tree::Dir { perm: 0o750, entries: BTreeMap::new() };
        save(&empty, &dir).unwrap();
        assert_eq!(load(&dir).unwrap(), empty);
        let names: Vec<_> = fs::read_dir(tmp.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["durable"], "no staging leftovers");
    }
}
