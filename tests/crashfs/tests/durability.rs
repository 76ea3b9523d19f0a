//! What survives a power loss, through real system calls on a mounted crashfs.

#![cfg(feature = "mount-tests")]

mod common;

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;

use common::{fsync, mount, names, read, write_synced};

#[test]
fn write_without_fsync_is_lost() {
    let fs = mount();
    let file = fs.path("f");
    write_synced(&file, b"synced");
    fsync(fs.mountpoint());
    OpenOptions::new().write(true).open(&file).unwrap().write_all_at(b"UNSYNCED", 0).unwrap();
    assert_eq!(read(&file).as_deref(), Some(&b"UNSYNCED"[..]));
    let report = fs.power_loss().unwrap();
    assert_eq!(read(&file).as_deref(), Some(&b"synced"[..]));
    assert_eq!(report.bytes_dropped, 8);
}

#[test]
fn fsynced_new_file_without_dir_fsync_is_lost() {
    let fs = mount();
    write_synced(&fs.path("new"), b"data");
    let report = fs.power_loss().unwrap();
    assert_eq!(read(&fs.path("new")), None);
    assert_eq!(report.files_lost, 1);
}

#[test]
fn created_file_with_dir_fsync_but_no_data_fsync_comes_back_empty() {
    let fs = mount();
    fs::write(fs.path("f"), b"never synced").unwrap();
    fsync(fs.mountpoint());
    fs.power_loss().unwrap();
    assert_eq!(read(&fs.path("f")).as_deref(), Some(&b""[..]));
}

#[test]
fn write_fsync_and_dir_fsync_survive() {
    let fs = mount();
    write_synced(&fs.path("f"), b"durable");
    fsync(fs.mountpoint());
    fs.power_loss().unwrap();
    assert_eq!(read(&fs.path("f")).as_deref(), Some(&b"durable"[..]));
    // And again: a second power loss changes nothing.
    fs.power_loss().unwrap();
    assert_eq!(read(&fs.path("f")).as_deref(), Some(&b"durable"[..]));
}

#[test]
fn sync_data_is_enough_for_the_data() {
    let fs = mount();
    let mut file = File::create(fs.path("f")).unwrap();
    file.write_all(b"fdatasync").unwrap();
    file.sync_data().unwrap();
    drop(file);
    fsync(fs.mountpoint());
    fs.power_loss().unwrap();
    assert_eq!(read(&fs.path("f")).as_deref(), Some(&b"fdatasync"[..]));
    assert_eq!(fs.stats().fdatasyncs, 1);
}

#[test]
fn rename_without_dir_fsync_rolls_back_to_the_old_name_and_content() {
    let fs = mount();
    write_synced(&fs.path("config"), b"old");
    fsync(fs.mountpoint());
    write_synced(&fs.path("config.tmp"), b"new");
    fs::rename(fs.path("config.tmp"), fs.path("config")).unwrap();
    assert_eq!(read(&fs.path("config")).as_deref(), Some(&b"new"[..]));
    fs.power_loss().unwrap();
    assert_eq!(read(&fs.path("config")).as_deref(), Some(&b"old"[..]));
    assert_eq!(names(fs.mountpoint()), ["config"]);
}

#[test]
fn rename_with_dir_fsync_survives() {
    let fs = mount();
    write_synced(&fs.path("config"), b"old");
    fsync(fs.mountpoint());
    write_synced(&fs.path("config.tmp"), b"new");
    fs::rename(fs.path("config.tmp"), fs.path("config")).unwrap();
    fsync(fs.mountpoint());
    fs.power_loss().unwrap();
    assert_eq!(read(&fs.path("config")).as_deref(), Some(&b"new"[..]));
    assert_eq!(names(fs.mountpoint()), ["config"]);
}

#[test]
fn unlink_without_dir_fsync_comes_back() {
    let fs = mount();
    write_synced(&fs.path("f"), b"resurrected");
    fsync(fs.mountpoint());
    fs::remove_file(fs.path("f")).unwrap();
    fs.power_loss().unwrap();
    assert_eq!(read(&fs.path("f")).as_deref(), Some(&b"resurrected"[..]));
    fs::remove_file(fs.path("f")).unwrap();
    fsync(fs.mountpoint());
    fs.power_loss().unwrap();
    assert_eq!(read(&fs.path("f")), None);
}

#[test]
fn truncate_is_durable_only_after_fsync() {
    let fs = mount();
    let path = fs.path("f");
    write_synced(&path, b"0123456789");
    fsync(fs.mountpoint());
    let file = OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(4).unwrap();
    drop(file);
    fs.power_loss().unwrap();
    assert_eq!(read(&path).as_deref(), Some(&b"0123456789"[..]));

    let file = OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(4).unwrap();
    file.sync_all().unwrap();
    drop(file);
    fs.power_loss().unwrap();
    assert_eq!(read(&path).as_deref(), Some(&b"0123"[..]));
}

#[test]
fn nested_directories_need_every_parent_synced() {
    let fs = mount();
    fs::create_dir_all(fs.path("a/b")).unwrap();
    write_synced(&fs.path("a/b/f"), b"deep");
    fsync(&fs.path("a/b"));
    fsync(&fs.path("a"));
    fs.power_loss().unwrap();
    assert!(names(fs.mountpoint()).is_empty(), "the root was never synced");

    fs::create_dir_all(fs.path("a/b")).unwrap();
    write_synced(&fs.path("a/b/f"), b"deep");
    fsync(&fs.path("a/b"));
    fsync(fs.mountpoint());
    fs.power_loss().unwrap();
    assert_eq!(names(fs.mountpoint()), ["a"]);
    assert!(names(&fs.path("a")).is_empty(), "a itself was never synced");

    fs::create_dir_all(fs.path("a/b")).unwrap();
    write_synced(&fs.path("a/b/f"), b"deep");
    fsync(&fs.path("a/b"));
    fsync(&fs.path("a"));
    fs.power_loss().unwrap();
    assert_eq!(read(&fs.path("a/b/f")).as_deref(), Some(&b"deep"[..]));
}

#[test]
fn remove_dir_all_is_durable_after_parent_fsync() {
    let fs = mount();
    fs::create_dir_all(fs.path("tree/sub")).unwrap();
    write_synced(&fs.path("tree/sub/f"), b"x");
    for dir in ["tree/sub", "tree", ""] {
        fsync(&fs.path(dir));
    }
    fs::remove_dir_all(fs.path("tree")).unwrap();
    let mut undone = fs.durable_tree();
    assert_eq!(undone.file("tree/sub/f"), Some(&b"x"[..]), "not durable yet");
    fsync(fs.mountpoint());
    undone = fs.durable_tree();
    assert_eq!(undone.names(""), Some(vec![]));
    fs.power_loss().unwrap();
    assert!(names(fs.mountpoint()).is_empty());
}

#[test]
fn child_process_writes_and_is_killed() {
    let fs = mount();
    let dir = fs.mountpoint().to_str().unwrap().to_owned();
    // A shell writes a synced file, then keeps appending unsynced data until killed (or until
    // a write fails, so that it cannot outlive a killed test process).
    let script = format!(
        "cd '{dir}' && printf synced > f && sync f && sync . && echo ready && \
         while printf x >> f; do :; done"
    );
    let mut child = std::process::Command::new("sh")
        .args(["-c", &script])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    let stdout = child.stdout.take().unwrap();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    std::thread::sleep(std::time::Duration::from_millis(100));
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(read(&fs.path("f")).unwrap().len() > 6, "appended before the kill");
    fs.power_loss().unwrap();
    assert_eq!(read(&fs.path("f")).as_deref(), Some(&b"synced"[..]));
}

#[test]
fn o_dsync_writes_are_synced_by_the_kernel() {
    // For O_SYNC/O_DSYNC files the kernel sends an fsync after every write.
    use std::os::unix::fs::OpenOptionsExt;
    let fs = mount();
    let mut file =
        OpenOptions::new().create(true).write(true).custom_flags(libc::O_DSYNC).open(fs.path("f")).unwrap();
    fsync(fs.mountpoint());
    file.write_all(b"dsync").unwrap();
    drop(file);
    fs.power_loss().unwrap();
    assert_eq!(read(&fs.path("f")).as_deref(), Some(&b"dsync"[..]));
}

#[test]
fn syncfs_makes_nothing_durable() {
    let fs = mount();
    fs::write(fs.path("f"), b"data").unwrap();
    let root = File::open(fs.mountpoint()).unwrap();
    nix::unistd::syncfs(std::os::fd::AsRawFd::as_raw_fd(&root)).unwrap();
    drop(root);
    fs.power_loss().unwrap();
    assert_eq!(read(&fs.path("f")), None);
}
