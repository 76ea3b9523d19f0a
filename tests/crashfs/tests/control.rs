//! The control API: torn writes, backing directory, stats, unmounting, errors.

#![cfg(feature = "mount-tests")]

mod common;

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Duration;

use cairn_crashfs::{CrashFs, Error, MountOptions, TornWrites, Tree};
use common::{fsync, mount, mount_with, names, read, write_synced};

fn is_mounted(path: &Path) -> bool {
    let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let path = path.to_str().unwrap();
    mounts.lines().any(|line| line.split(' ').nth(4) == Some(path))
}

#[test]
fn torn_writes_keep_whole_sectors_of_unsynced_data() {
    let fs = mount_with(MountOptions {
        torn_writes: Some(TornWrites { seed: 42, keep_probability: 0.5 }),
        ..MountOptions::default()
    });
    let path = fs.path("f");
    write_synced(&path, &[b'a'; 8 * 512]);
    fsync(fs.mountpoint());
    OpenOptions::new().write(true).open(&path).unwrap().write_all_at(&[b'b'; 8 * 512], 0).unwrap();
    let report = fs.power_loss().unwrap();
    assert_eq!(report.sectors_torn_kept + report.sectors_torn_dropped, 8);
    let data = read(&path).unwrap();
    assert_eq!(data.len(), 8 * 512);
    let kept = data.chunks(512).filter(|sector| sector.iter().all(|b| *b == b'b')).count();
    let old = data.chunks(512).filter(|sector| sector.iter().all(|b| *b == b'a')).count();
    assert_eq!((kept + old, kept as u64), (8, report.sectors_torn_kept), "only whole sectors");
}

#[test]
fn open_file_across_power_loss_fails_and_the_new_mount_serves_the_durable_state() {
    let fs =
        mount_with(MountOptions { unmount_timeout: Duration::from_millis(500), ..MountOptions::default() });
    write_synced(&fs.path("f"), b"durable");
    fsync(fs.mountpoint());
    let mut stale = OpenOptions::new().write(true).open(fs.path("f")).unwrap();
    stale.write_all(b"volatile").unwrap();
    fs.power_loss().unwrap();
    assert!(stale.write_all(b"after the cut").is_err(), "the old mount is dead");
    drop(stale);
    assert_eq!(read(&fs.path("f")).as_deref(), Some(&b"durable"[..]));
    fs::write(fs.path("g"), b"new mount works").unwrap();
    assert_eq!(read(&fs.path("g")).as_deref(), Some(&b"new mount works"[..]));
}

#[test]
fn backing_dir_keeps_the_durable_state_for_inspection_and_restart() {
    let backing = tempfile::tempdir().unwrap();
    let options = MountOptions { backing_dir: Some(backing.path().to_owned()), ..MountOptions::default() };
    let fs = mount_with(options.clone());
    fs::create_dir(fs.path("d")).unwrap();
    write_synced(&fs.path("d/kept"), b"survivor");
    fs::write(fs.path("d/lost"), b"unsynced").unwrap();
    fsync(&fs.path("d"));
    fsync(fs.mountpoint());
    fs.power_loss().unwrap();
    let image = backing.path().join("durable");
    assert_eq!(fs::read(image.join("d/kept")).unwrap(), b"survivor");
    assert_eq!(fs::read(image.join("d/lost")).unwrap(), b"", "named durably, never synced");

    // A write after the power loss is not durable: the restarted machine does not see it.
    write_synced(&fs.path("d/kept"), b"synced but its name was already durable");
    fs::write(fs.path("d/kept"), b"overwritten, unsynced").unwrap();
    drop(fs);
    assert_eq!(fs::read(image.join("d/kept")).unwrap(), b"synced but its name was already durable");

    let restarted = mount_with(options);
    assert_eq!(
        read(&restarted.path("d/kept")).as_deref(),
        Some(&b"synced but its name was already durable"[..])
    );
    assert_eq!(names(&restarted.path("d")), ["kept", "lost"]);
}

#[test]
fn save_durable_writes_an_inspectable_tree() {
    let fs = mount();
    write_synced(&fs.path("f"), b"x");
    fsync(fs.mountpoint());
    fs::write(fs.path("g"), b"y").unwrap();
    let out = tempfile::tempdir().unwrap();
    let image = out.path().join("image");
    fs.save_durable(&image).unwrap();
    assert_eq!(common::names(&image), ["f"]);
}

#[test]
fn stats_count_operations_and_losses() {
    let fs = mount();
    write_synced(&fs.path("f"), b"abc");
    fsync(fs.mountpoint());
    fs::write(fs.path("f"), b"abcdef").unwrap();
    fs.power_loss().unwrap();
    let stats = fs.stats();
    assert_eq!((stats.fsyncs, stats.dir_fsyncs, stats.power_losses), (1, 1, 1));
    assert!(stats.writes >= 2 && stats.bytes_written >= 9);
    assert_eq!(stats.last_power_loss.map(|r| r.bytes_dropped), Some(3), "\"def\" was never synced");
    assert_eq!(stats.bytes_dropped_total, 3);
    assert!(stats.to_string().contains("1 power losses"), "{stats}");
}

#[test]
fn unmount_and_drop_leave_no_mount_behind() {
    let dir = tempfile::tempdir().unwrap();
    let mountpoint = dir.path().canonicalize().unwrap();
    let fs = CrashFs::mount(&mountpoint, MountOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    assert!(is_mounted(&mountpoint));
    fs.unmount().unwrap();
    assert!(!is_mounted(&mountpoint));

    let fs = CrashFs::mount(&mountpoint, MountOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    fs.power_loss().unwrap();
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        let _fs = fs;
        panic!("a failing test");
    }));
    assert!(panicked.is_err());
    assert!(!is_mounted(&mountpoint), "unmounted while unwinding");
}

#[test]
fn mounting_on_a_missing_directory_fails_clearly() {
    let error = CrashFs::mount(Path::new("/nonexistent/crashfs"), MountOptions::default()).unwrap_err();
    assert!(matches!(error, Error::MountpointMissing { .. }), "{error}");
    assert!(error.to_string().contains("/nonexistent/crashfs"));
}

#[test]
fn invalid_torn_write_probability_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let options = MountOptions {
        torn_writes: Some(TornWrites { seed: 0, keep_probability: 1.5 }),
        ..MountOptions::default()
    };
    let error = CrashFs::mount(dir.path(), options).unwrap_err();
    assert!(matches!(error, Error::InvalidOption(_)), "{error}");
}

/// Exited auto-unmount helpers (one per mount) of this process that nobody reaped.
fn zombie_helpers() -> usize {
    let me = std::process::id().to_string();
    let Ok(processes) = fs::read_dir("/proc") else { return 0 };
    processes
        .flatten()
        .filter_map(|entry| fs::read_to_string(entry.path().join("stat")).ok())
        .filter(|stat| {
            let Some((head, rest)) = stat.rsplit_once(") ") else { return false };
            let mut fields = rest.split(' ');
            head.contains("(fusermount") && fields.next() == Some("Z") && fields.next() == Some(me.as_str())
        })
        .count()
}

#[test]
fn repeated_power_losses_do_not_pile_up_helper_processes() {
    let fs = mount();
    for round in 0..20u8 {
        fs::write(fs.path("f"), [round]).unwrap();
        fs.power_loss().unwrap();
    }
    assert_eq!(fs.stats().power_losses, 20);
    // Other tests of this binary mount in parallel: allow a few of theirs.
    assert!(zombie_helpers() <= 4, "{} zombie fusermount3 helpers", zombie_helpers());
}

#[test]
fn mounted_fs_can_be_shared_between_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<cairn_crashfs::MountedFs>();
}

#[test]
fn mount_model_serves_a_prepared_tree() {
    use cairn_crashfs::model::Model;
    let tree = Tree::Dir {
        perm: 0o755,
        entries: [("seed".into(), Tree::File { data: b"prepared".to_vec(), perm: 0o640 })].into(),
    };
    let model = Model::from_tree(&tree, 0, 0).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let fs =
        CrashFs::mount_model(dir.path(), model, MountOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    let seed = fs.mountpoint().join("seed");
    assert_eq!(read(&seed).as_deref(), Some(&b"prepared"[..]));
    fs.power_loss().unwrap();
    assert_eq!(read(&seed).as_deref(), Some(&b"prepared"[..]), "a prepared tree is durable");
    fs.unmount().unwrap();
}

#[test]
fn mount_without_auto_unmount_works() {
    let fs = mount_with(MountOptions { auto_unmount: false, ..MountOptions::default() });
    write_synced(&fs.path("f"), b"x");
    fsync(fs.mountpoint());
    fs.power_loss().unwrap();
    assert_eq!(read(&fs.path("f")).as_deref(), Some(&b"x"[..]));
}
