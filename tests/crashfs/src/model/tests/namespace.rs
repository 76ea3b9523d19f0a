//! POSIX semantics of namespace operations on the volatile state.

use std::ffi::OsStr;

use super::Sim;
use crate::model::{FsError, NewNode, ROOT_INO, RenameMode};

#[test]
fn create_refuses_existing_and_bad_names() {
    let mut sim = Sim::new();
    sim.create("f");
    let model = &mut sim.model;
    assert_eq!(model.create(ROOT_INO, OsStr::new("f"), NewNode::File, 0o644, 0, 0), Err(FsError::Exists));
    for bad in ["", ".", "..", "a/b"] {
        let result = model.create(ROOT_INO, OsStr::new(bad), NewNode::File, 0o644, 0, 0);
        assert_eq!(result, Err(FsError::Invalid), "{bad:?}");
    }
    let long = "x".repeat(256);
    let result = model.create(ROOT_INO, OsStr::new(&long), NewNode::Dir, 0o755, 0, 0);
    assert_eq!(result, Err(FsError::NameTooLong));
    let file = sim.ino("f");
    let result = sim.model.create(file, OsStr::new("child"), NewNode::File, 0o644, 0, 0);
    assert_eq!(result, Err(FsError::NotDir));
}

#[test]
fn rename_replaces_an_existing_file() {
    let mut sim = Sim::new();
    sim.put("a", b"A");
    sim.put("b", b"B");
    let replaced = sim.ino("b");
    sim.rename("a", "b").unwrap();
    assert_eq!(sim.names(""), ["b"]);
    assert_eq!(sim.read("b").as_deref(), Some(&b"A"[..]));
    assert_eq!(sim.model.attr(replaced), Err(FsError::NotFound), "replaced inode is freed");
}

#[test]
fn rename_noreplace_and_exchange() {
    let mut sim = Sim::new();
    sim.put("a", b"A");
    sim.put("b", b"B");
    assert_eq!(sim.rename_with("a", "b", RenameMode::NoReplace), Err(FsError::Exists));
    sim.rename_with("a", "c", RenameMode::NoReplace).unwrap();
    sim.rename_with("b", "c", RenameMode::Exchange).unwrap();
    assert_eq!(sim.read("b").as_deref(), Some(&b"A"[..]));
    assert_eq!(sim.read("c").as_deref(), Some(&b"B"[..]));
    assert_eq!(sim.rename_with("b", "missing", RenameMode::Exchange), Err(FsError::NotFound));
}

#[test]
fn rename_type_rules() {
    let mut sim = Sim::new();
    sim.mkdir("d");
    sim.mkdir("d/sub");
    sim.mkdir("full");
    sim.create("full/x");
    sim.mkdir("empty");
    sim.create("f");
    assert_eq!(sim.rename("f", "d"), Err(FsError::IsDir));
    assert_eq!(sim.rename("d", "f"), Err(FsError::NotDir));
    assert_eq!(sim.rename("d", "full"), Err(FsError::NotEmpty));
    assert_eq!(sim.rename("d", "d/sub/inside"), Err(FsError::Invalid));
    assert_eq!(sim.rename("missing", "x"), Err(FsError::NotFound));
    sim.rename("d", "empty").unwrap();
    assert_eq!(sim.names(""), ["empty", "f", "full"]);
    assert_eq!(sim.names("empty"), ["sub"]);
    let moved = sim.ino("empty/sub");
    sim.rename("empty/sub", "full/sub").unwrap();
    assert_eq!(sim.model.parent(moved), Ok(sim.ino("full")));
}

#[test]
fn rename_between_two_names_of_one_inode_does_nothing() {
    let mut sim = Sim::new();
    sim.create("a");
    let ino = sim.ino("a");
    sim.model.link(ino, ROOT_INO, OsStr::new("b")).unwrap();
    sim.rename("a", "b").unwrap();
    assert_eq!(sim.names(""), ["a", "b"]);
}

#[test]
fn unlink_and_rmdir_type_rules() {
    let mut sim = Sim::new();
    sim.mkdir("d");
    sim.create("d/f");
    sim.create("f");
    assert_eq!(sim.unlink("d"), Err(FsError::IsDir));
    assert_eq!(sim.rmdir("f"), Err(FsError::NotDir));
    assert_eq!(sim.rmdir("d"), Err(FsError::NotEmpty));
    assert_eq!(sim.unlink("nope"), Err(FsError::NotFound));
    sim.unlink("d/f").unwrap();
    sim.rmdir("d").unwrap();
    assert_eq!(sim.names(""), ["f"]);
}

#[test]
fn unlinked_inode_lives_while_the_kernel_references_it() {
    let mut sim = Sim::new();
    sim.put("f", b"still here");
    let ino = sim.ino("f");
    sim.model.remember(ino);
    sim.unlink("f").unwrap();
    assert_eq!(sim.model.read(ino, 0, 100).unwrap(), b"still here");
    assert_eq!(sim.model.attr(ino).unwrap().nlink, 0);
    sim.model.forget(ino, 1);
    assert_eq!(sim.model.attr(ino), Err(FsError::NotFound));
}

#[test]
fn directory_link_counts() {
    let mut sim = Sim::new();
    sim.mkdir("d");
    sim.mkdir("d/a");
    sim.mkdir("d/b");
    sim.create("d/f");
    assert_eq!(sim.model.attr(sim.ino("d")).unwrap().nlink, 4);
    assert_eq!(sim.model.attr(ROOT_INO).unwrap().nlink, 3);
    let file = sim.ino("d/f");
    assert_eq!(sim.model.link(sim.ino("d"), ROOT_INO, OsStr::new("x")), Err(FsError::NotPermitted));
    sim.model.link(file, ROOT_INO, OsStr::new("x")).unwrap();
    assert_eq!(sim.model.attr(file).unwrap().nlink, 2);
}

#[test]
fn symlinks_hold_their_target() {
    let mut sim = Sim::new();
    let attr =
        sim.model.create(ROOT_INO, OsStr::new("l"), NewNode::Symlink("target/path".into()), 0o777, 0, 0);
    let ino = attr.unwrap().ino;
    assert_eq!(sim.model.read_link(ino).unwrap(), "target/path");
    sim.fsync_dir("");
    sim.crash();
    assert_eq!(sim.model.read_link(sim.ino("l")).unwrap(), "target/path");
}
