//! The system calls programs use work on a mounted crashfs (before any power loss).

#![cfg(feature = "mount-tests")]

mod common;

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};

use common::{mount, names, read};
use nix::errno::Errno;
use nix::fcntl::{FallocateFlags, Flock, FlockArg, RenameFlags, fallocate, renameat2};

#[test]
fn create_write_read_at_offsets_and_sparse_extension() {
    let fs = mount();
    let path = fs.path("f");
    let mut file = OpenOptions::new().create(true).read(true).write(true).truncate(true).open(&path).unwrap();
    file.write_all(b"hello").unwrap();
    file.write_all_at(b"world", 10_000).unwrap();
    assert_eq!(file.metadata().unwrap().len(), 10_005);
    let mut buf = [1u8; 5];
    file.read_exact_at(&mut buf, 5).unwrap();
    assert_eq!(buf, [0; 5], "the gap reads as zeros");
    file.seek(SeekFrom::Start(0)).unwrap();
    let mut all = Vec::new();
    file.read_to_end(&mut all).unwrap();
    assert_eq!(&all[..5], b"hello");
    assert_eq!(&all[10_000..], b"world");

    // O_APPEND and O_TRUNC.
    let mut append = OpenOptions::new().append(true).open(&path).unwrap();
    append.write_all(b"!").unwrap();
    assert_eq!(fs::metadata(&path).unwrap().len(), 10_006);
    drop(OpenOptions::new().write(true).truncate(true).open(&path).unwrap());
    assert_eq!(read(&path).as_deref(), Some(&b""[..]));

    // create_new on an existing file.
    let again = OpenOptions::new().write(true).create_new(true).open(&path);
    assert_eq!(again.unwrap_err().kind(), std::io::ErrorKind::AlreadyExists);
}

#[test]
fn large_writes_round_trip() {
    let fs = mount();
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    fs::write(fs.path("big"), &data).unwrap();
    assert_eq!(fs::read(fs.path("big")).unwrap(), data);
}

#[test]
fn metadata_permissions_times_and_set_len() {
    let fs = mount();
    let path = fs.path("f");
    fs::write(&path, b"abc").unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
    let meta = fs::metadata(&path).unwrap();
    assert_eq!(meta.permissions().mode() & 0o7777, 0o600);
    assert!(meta.is_file());
    assert_eq!(meta.nlink(), 1);
    let when = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_600_000_000);
    File::options().write(true).open(&path).unwrap().set_modified(when).unwrap();
    assert_eq!(fs::metadata(&path).unwrap().modified().unwrap(), when);
    let file = OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(10).unwrap();
    assert_eq!(read(&path).as_deref(), Some(&b"abc\0\0\0\0\0\0\0"[..]));
    file.set_len(1).unwrap();
    assert_eq!(read(&path).as_deref(), Some(&b"a"[..]));
}

#[test]
fn directories_listing_and_removal() {
    let fs = mount();
    fs::create_dir_all(fs.path("a/b/c")).unwrap();
    fs::write(fs.path("a/x"), b"").unwrap();
    assert_eq!(names(&fs.path("a")), ["b", "x"]);
    assert!(fs::metadata(fs.path("a/b")).unwrap().is_dir());
    assert_eq!(fs::create_dir(fs.path("a")).unwrap_err().kind(), std::io::ErrorKind::AlreadyExists);
    assert_eq!(fs::remove_dir(fs.path("a")).unwrap_err().raw_os_error(), Some(libc::ENOTEMPTY));
    assert_eq!(fs::remove_file(fs.path("a/b")).unwrap_err().raw_os_error(), Some(libc::EISDIR));

    // More entries than one readdir reply holds, removed while listed.
    fs::create_dir(fs.path("many")).unwrap();
    for i in 0..400 {
        fs::write(fs.path(&format!("many/a-rather-long-file-name-to-fill-buffers-{i:04}")), b"x").unwrap();
    }
    assert_eq!(names(&fs.path("many")).len(), 400);
    fs::remove_dir_all(fs.path("many")).unwrap();
    fs::remove_dir_all(fs.path("a")).unwrap();
    assert!(names(fs.mountpoint()).is_empty());
}

#[test]
fn rename_replace_noreplace_and_exchange() {
    let fs = mount();
    fs::write(fs.path("a"), b"A").unwrap();
    fs::write(fs.path("b"), b"B").unwrap();
    let error = renameat2(None, &fs.path("a"), None, &fs.path("b"), RenameFlags::RENAME_NOREPLACE);
    assert_eq!(error, Err(Errno::EEXIST));
    renameat2(None, &fs.path("a"), None, &fs.path("b"), RenameFlags::RENAME_EXCHANGE).unwrap();
    assert_eq!(read(&fs.path("a")).as_deref(), Some(&b"B"[..]));
    fs::rename(fs.path("a"), fs.path("b")).unwrap();
    assert_eq!(names(fs.mountpoint()), ["b"]);
    assert_eq!(read(&fs.path("b")).as_deref(), Some(&b"B"[..]));

    fs::create_dir(fs.path("d1")).unwrap();
    fs::create_dir(fs.path("d2")).unwrap();
    fs::rename(fs.path("b"), fs.path("d1/b")).unwrap();
    fs::rename(fs.path("d1"), fs.path("d2/d1")).unwrap();
    assert_eq!(read(&fs.path("d2/d1/b")).as_deref(), Some(&b"B"[..]));
    assert_eq!(
        fs::rename(fs.path("d2"), fs.path("d2/d1/inside")).unwrap_err().raw_os_error(),
        Some(libc::EINVAL)
    );
}

#[test]
fn hard_links_and_symlinks() {
    let fs = mount();
    fs::write(fs.path("f"), b"linked").unwrap();
    fs::hard_link(fs.path("f"), fs.path("g")).unwrap();
    assert_eq!(fs::metadata(fs.path("f")).unwrap().nlink(), 2);
    fs::remove_file(fs.path("f")).unwrap();
    assert_eq!(read(&fs.path("g")).as_deref(), Some(&b"linked"[..]));
    std::os::unix::fs::symlink("g", fs.path("l")).unwrap();
    assert_eq!(fs::read_link(fs.path("l")).unwrap().to_str(), Some("g"));
    assert_eq!(read(&fs.path("l")).as_deref(), Some(&b"linked"[..]));
}

#[test]
fn unlinked_open_file_stays_usable() {
    let fs = mount();
    let mut file =
        OpenOptions::new().create(true).read(true).write(true).truncate(true).open(fs.path("f")).unwrap();
    fs::remove_file(fs.path("f")).unwrap();
    file.write_all(b"orphan").unwrap();
    file.sync_all().unwrap();
    let mut back = String::new();
    file.seek(SeekFrom::Start(0)).unwrap();
    file.read_to_string(&mut back).unwrap();
    assert_eq!(back, "orphan");
    assert!(names(fs.mountpoint()).is_empty());
}

#[test]
fn fallocate_extends_the_file() {
    let fs = mount();
    let file = File::create(fs.path("f")).unwrap();
    fallocate(file.as_raw_fd(), FallocateFlags::empty(), 0, 8192).unwrap();
    assert_eq!(file.metadata().unwrap().len(), 8192);
    fallocate(file.as_raw_fd(), FallocateFlags::FALLOC_FL_KEEP_SIZE, 0, 100_000).unwrap();
    assert_eq!(file.metadata().unwrap().len(), 8192);
}

#[test]
fn flock_is_exclusive_between_open_files() {
    let fs = mount();
    fs::write(fs.path("lock"), b"").unwrap();
    let first = Flock::lock(File::open(fs.path("lock")).unwrap(), FlockArg::LockExclusiveNonblock)
        .unwrap_or_else(|(_, errno)| panic!("first lock: {errno}"));
    let second = Flock::lock(File::open(fs.path("lock")).unwrap(), FlockArg::LockExclusiveNonblock);
    assert_eq!(second.err().map(|(_, errno)| errno), Some(Errno::EWOULDBLOCK));
    drop(first);
    let third = Flock::lock(File::open(fs.path("lock")).unwrap(), FlockArg::LockExclusiveNonblock);
    assert!(third.is_ok(), "the lock is released with its file");
}

#[test]
fn statfs_access_and_copy() {
    let fs = mount();
    let stat = nix::sys::statvfs::statvfs(fs.mountpoint()).unwrap();
    assert!(stat.blocks() > 0 && stat.blocks_available() > 0);
    assert!(nix::unistd::access(fs.mountpoint(), nix::unistd::AccessFlags::W_OK).is_ok());
    fs::write(fs.path("src"), b"copy me").unwrap();
    assert_eq!(fs::copy(fs.path("src"), fs.path("dst")).unwrap(), 7);
    assert_eq!(read(&fs.path("dst")).as_deref(), Some(&b"copy me"[..]));
}
