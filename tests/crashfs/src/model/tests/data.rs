//! File contents on the volatile state: offsets, sparse extension, truncation, fallocate.

use super::Sim;
use crate::model::{Fallocate, FsError, MAX_FILE_SIZE, SetAttr};

#[test]
fn writes_at_offsets_and_sparse_extension() {
    let mut sim = Sim::new();
    sim.create("f");
    sim.write("f", 4, b"xy");
    assert_eq!(sim.read("f").as_deref(), Some(&b"\0\0\0\0xy"[..]));
    sim.write("f", 1, b"A");
    assert_eq!(sim.read("f").as_deref(), Some(&b"\0A\0\0xy"[..]));
    let ino = sim.ino("f");
    assert_eq!(sim.model.read(ino, 4, 100).unwrap(), b"xy");
    assert_eq!(sim.model.read(ino, 100, 10).unwrap(), b"");
    assert_eq!(sim.model.attr(ino).unwrap().size, 6);
}

#[test]
fn oversized_writes_fail_with_efbig() {
    let mut sim = Sim::new();
    let ino = sim.create("f");
    assert_eq!(sim.model.write(ino, MAX_FILE_SIZE, b"x"), Err(FsError::TooBig));
    assert_eq!(sim.model.write(ino, u64::MAX, b"x"), Err(FsError::TooBig));
    let change = SetAttr { size: Some(MAX_FILE_SIZE + 1), ..SetAttr::default() };
    assert_eq!(sim.model.setattr(ino, change), Err(FsError::TooBig));
}

#[test]
fn directories_are_not_files() {
    let mut sim = Sim::new();
    let dir = sim.mkdir("d");
    assert_eq!(sim.model.write(dir, 0, b"x"), Err(FsError::IsDir));
    assert_eq!(sim.model.read(dir, 0, 1), Err(FsError::IsDir));
    assert_eq!(sim.model.setattr(dir, SetAttr { size: Some(0), ..SetAttr::default() }), Err(FsError::IsDir));
    assert_eq!(sim.model.fsync_dir(sim.ino("")), Ok(()));
    let file = sim.create("f");
    assert_eq!(sim.model.fsync_dir(file), Err(FsError::NotDir));
}

#[test]
fn fallocate_modes() {
    let mut sim = Sim::new();
    let ino = sim.create("f");
    sim.write("f", 0, b"abcdef");
    sim.model.fallocate(ino, 0, 10, Fallocate::Allocate { keep_size: false }).unwrap();
    assert_eq!(sim.read("f").as_deref(), Some(&b"abcdef\0\0\0\0"[..]));
    sim.model.fallocate(ino, 0, 100, Fallocate::Allocate { keep_size: true }).unwrap();
    assert_eq!(sim.model.attr(ino).unwrap().size, 10);
    sim.model.fallocate(ino, 1, 2, Fallocate::PunchHole).unwrap();
    assert_eq!(sim.read("f").as_deref(), Some(&b"a\0\0def\0\0\0\0"[..]));
    sim.model.fallocate(ino, 4, 8, Fallocate::ZeroRange { keep_size: false }).unwrap();
    assert_eq!(sim.read("f").as_deref(), Some(&b"a\0\0d\0\0\0\0\0\0\0\0"[..]));
    assert_eq!(sim.model.fallocate(ino, 0, 0, Fallocate::PunchHole), Err(FsError::Invalid));
}

#[test]
fn fallocate_extension_is_durable_only_after_fsync() {
    let mut sim = Sim::new();
    sim.durable_file("f", b"abc");
    let ino = sim.ino("f");
    sim.model.fallocate(ino, 0, 4096, Fallocate::Allocate { keep_size: false }).unwrap();
    sim.crash();
    assert_eq!(sim.model.attr(ino).unwrap().size, 3);
    sim.model.fallocate(ino, 0, 4096, Fallocate::Allocate { keep_size: false }).unwrap();
    sim.fdatasync("f");
    sim.crash();
    assert_eq!(sim.model.attr(ino).unwrap().size, 4096);
}

#[test]
fn copy_range_copies_between_files() {
    let mut sim = Sim::new();
    let from = sim.create("a");
    let to = sim.create("b");
    sim.write("a", 0, b"0123456789");
    assert_eq!(sim.model.copy_range(from, 2, to, 1, 4), Ok(4));
    assert_eq!(sim.read("b").as_deref(), Some(&b"\x002345"[..]));
}

#[test]
fn setattr_changes_permissions_owner_and_times() {
    let mut sim = Sim::new();
    let ino = sim.create("f");
    let when = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
    let change =
        SetAttr { perm: Some(0o4600), uid: Some(7), gid: Some(8), mtime: Some(when), ..SetAttr::default() };
    let attr = sim.model.setattr(ino, change).unwrap();
    assert_eq!((attr.meta.perm, attr.meta.uid, attr.meta.gid), (0o4600, 7, 8));
    assert_eq!(attr.meta.mtime, when);
}
