//! What survives which sequence of operations.

use super::Sim;
use crate::model::{Model, RenameMode, Tear, Tree};

#[test]
fn write_without_fsync_is_lost() {
    let mut sim = Sim::new();
    sim.durable_file("f", b"synced");
    sim.write("f", 0, b"UNSYNCED and longer");
    let report = sim.crash();
    assert_eq!(sim.read("f").as_deref(), Some(&b"synced"[..]));
    assert_eq!(report.bytes_dropped, "UNSYNCED and longer".len() as u64);
    assert_eq!(report.files_lost, 0);
}

#[test]
fn fsynced_new_file_without_dir_fsync_is_lost() {
    let mut sim = Sim::new();
    sim.put("new", b"data");
    sim.fsync("new");
    let report = sim.crash();
    assert!(!sim.exists("new"));
    assert_eq!(report.files_lost, 1);
    assert_eq!(report.bytes_dropped, 4);
}

#[test]
fn created_file_with_dir_fsync_but_no_data_fsync_survives_empty() {
    let mut sim = Sim::new();
    sim.put("f", b"never synced");
    sim.fsync_dir("");
    sim.crash();
    assert_eq!(sim.read("f").as_deref(), Some(&b""[..]));
}

#[test]
fn data_fsync_before_or_after_dir_fsync_both_survive() {
    let mut sim = Sim::new();
    sim.put("data-first", b"one");
    sim.fsync("data-first");
    sim.fsync_dir("");
    sim.put("name-first", b"two");
    sim.fsync_dir("");
    sim.fsync("name-first");
    sim.crash();
    assert_eq!(sim.read("data-first").as_deref(), Some(&b"one"[..]));
    assert_eq!(sim.read("name-first").as_deref(), Some(&b"two"[..]));
}

#[test]
fn file_keeps_the_data_of_its_last_fsync() {
    let mut sim = Sim::new();
    sim.durable_file("f", b"v1");
    sim.put("f", b"v2");
    sim.fsync("f");
    sim.put("f", b"v3");
    sim.crash();
    assert_eq!(sim.read("f").as_deref(), Some(&b"v2"[..]));
}

#[test]
fn rename_without_dir_fsync_rolls_back_to_old_name_and_content() {
    let mut sim = Sim::new();
    sim.durable_file("config", b"old");
    sim.put("config.tmp", b"new");
    sim.fsync("config.tmp");
    sim.rename("config.tmp", "config").unwrap();
    assert_eq!(sim.read("config").as_deref(), Some(&b"new"[..]));
    sim.crash();
    assert_eq!(sim.read("config").as_deref(), Some(&b"old"[..]));
    assert!(!sim.exists("config.tmp"));
}

#[test]
fn rename_of_a_durable_file_without_dir_fsync_restores_the_old_name() {
    let mut sim = Sim::new();
    sim.durable_file("a", b"content");
    sim.rename("a", "b").unwrap();
    sim.crash();
    assert_eq!(sim.names(""), ["a"]);
    assert_eq!(sim.read("a").as_deref(), Some(&b"content"[..]));
}

#[test]
fn rename_with_dir_fsync_survives() {
    let mut sim = Sim::new();
    sim.durable_file("config", b"old");
    sim.put("config.tmp", b"new");
    sim.fsync("config.tmp");
    sim.rename("config.tmp", "config").unwrap();
    sim.fsync_dir("");
    sim.crash();
    assert_eq!(sim.read("config").as_deref(), Some(&b"new"[..]));
    assert_eq!(sim.names(""), ["config"]);
}

#[test]
fn rename_of_unsynced_data_with_dir_fsync_survives_empty() {
    // The classic bug: rename over the old file without fsyncing the new one first.
    let mut sim = Sim::new();
    sim.durable_file("config", b"old");
    sim.put("config.tmp", b"new");
    sim.rename("config.tmp", "config").unwrap();
    sim.fsync_dir("");
    sim.crash();
    assert_eq!(sim.read("config").as_deref(), Some(&b""[..]));
}

#[test]
fn cross_directory_rename_needs_both_parents_synced() {
    let mut sim = Sim::new();
    sim.mkdir("src");
    sim.mkdir("dst");
    sim.fsync_dir("");
    sim.durable_file("src/f", b"x");

    sim.rename("src/f", "dst/f").unwrap();
    sim.fsync_dir("dst");
    let mut only_new_parent = Sim { model: sim.model.clone() };
    only_new_parent.crash();
    // The source entry was never removed durably: the file has both names.
    assert_eq!(only_new_parent.read("src/f").as_deref(), Some(&b"x"[..]));
    assert_eq!(only_new_parent.read("dst/f").as_deref(), Some(&b"x"[..]));
    let attr = only_new_parent.model.attr(only_new_parent.ino("dst/f")).unwrap();
    assert_eq!(attr.nlink, 2);

    sim.fsync_dir("src");
    sim.crash();
    assert!(!sim.exists("src/f"));
    assert_eq!(sim.read("dst/f").as_deref(), Some(&b"x"[..]));
}

#[test]
fn unlink_without_dir_fsync_comes_back() {
    let mut sim = Sim::new();
    sim.durable_file("f", b"keep me");
    sim.unlink("f").unwrap();
    assert!(!sim.exists("f"));
    sim.crash();
    assert_eq!(sim.read("f").as_deref(), Some(&b"keep me"[..]));
}

#[test]
fn unlink_with_dir_fsync_is_gone() {
    let mut sim = Sim::new();
    sim.durable_file("f", b"bye");
    sim.unlink("f").unwrap();
    sim.fsync_dir("");
    sim.crash();
    assert!(!sim.exists("f"));
}

#[test]
fn unlinked_open_file_synced_after_unlink_comes_back_with_new_data() {
    let mut sim = Sim::new();
    sim.durable_file("f", b"old");
    let ino = sim.ino("f");
    sim.model.remember(ino); // the kernel holds it open
    sim.unlink("f").unwrap();
    sim.model.write(ino, 0, b"new").unwrap();
    sim.model.fsync(ino, false).unwrap();
    sim.crash();
    assert_eq!(sim.read("f").as_deref(), Some(&b"new"[..]));
}

#[test]
fn truncate_is_durable_only_after_fsync() {
    let mut sim = Sim::new();
    sim.durable_file("f", b"0123456789");
    sim.truncate("f", 4);
    assert_eq!(sim.read("f").as_deref(), Some(&b"0123"[..]));
    let report = sim.crash();
    assert_eq!(sim.read("f").as_deref(), Some(&b"0123456789"[..]));
    assert_eq!(report.bytes_dropped, 0, "nothing readable before the cut was lost");

    sim.truncate("f", 4);
    sim.fsync("f");
    sim.truncate("f", 6); // extension with zeros, not synced
    sim.crash();
    assert_eq!(sim.read("f").as_deref(), Some(&b"0123"[..]));

    sim.truncate("f", 6);
    sim.fdatasync("f");
    sim.crash();
    assert_eq!(sim.read("f").as_deref(), Some(&b"0123\0\0"[..]));
}

#[test]
fn fdatasync_makes_data_durable_but_not_permissions() {
    let mut sim = Sim::new();
    sim.durable_file("f", b"a");
    let ino = sim.ino("f");
    let change = crate::model::SetAttr { perm: Some(0o600), ..Default::default() };
    sim.model.setattr(ino, change).unwrap();
    sim.write("f", 0, b"b");
    sim.fdatasync("f");
    sim.crash();
    assert_eq!(sim.read("f").as_deref(), Some(&b"b"[..]));
    assert_eq!(sim.model.attr(ino).unwrap().meta.perm, 0o644);

    sim.model.setattr(ino, change).unwrap();
    sim.fsync("f");
    sim.crash();
    assert_eq!(sim.model.attr(ino).unwrap().meta.perm, 0o600);
}

#[test]
fn mkdir_is_durable_only_after_parent_fsync() {
    let mut sim = Sim::new();
    sim.mkdir("a");
    sim.fsync_dir("a");
    let report = sim.crash();
    assert!(!sim.exists("a"));
    assert_eq!(report.dirs_lost, 1);

    sim.mkdir("a");
    sim.fsync_dir("");
    sim.crash();
    assert!(sim.exists("a"));
}

#[test]
fn nested_directories_need_every_level_synced() {
    let mut sim = Sim::new();
    sim.mkdir("a");
    sim.mkdir("a/b");
    sim.put("a/b/f", b"deep");
    sim.fsync("a/b/f");
    sim.fsync_dir("a/b");

    let mut without_root = Sim { model: sim.model.clone() };
    without_root.crash();
    assert!(without_root.names("").is_empty(), "a was never named durably");

    sim.fsync_dir("");
    let mut without_a = Sim { model: sim.model.clone() };
    without_a.crash();
    assert_eq!(without_a.names(""), ["a"]);
    assert!(without_a.names("a").is_empty(), "a's entries were never synced");

    sim.fsync_dir("a");
    sim.crash();
    assert_eq!(sim.read("a/b/f").as_deref(), Some(&b"deep"[..]));
}

#[test]
fn rmdir_without_parent_fsync_comes_back() {
    let mut sim = Sim::new();
    sim.mkdir("d");
    sim.fsync_dir("");
    sim.rmdir("d").unwrap();
    sim.crash();
    assert!(sim.exists("d"));
    sim.rmdir("d").unwrap();
    sim.fsync_dir("");
    sim.crash();
    assert!(!sim.exists("d"));
}

#[test]
fn remove_dir_all_then_fsync_of_parent_only_forgets_the_whole_tree() {
    let mut sim = Sim::new();
    sim.mkdir("d");
    sim.mkdir("d/e");
    sim.durable_file("d/e/f", b"x");
    sim.fsync_dir("d");
    sim.fsync_dir("");
    sim.unlink("d/e/f").unwrap();
    sim.rmdir("d/e").unwrap();
    sim.rmdir("d").unwrap();
    sim.fsync_dir("");
    sim.crash();
    assert!(sim.names("").is_empty());
}

#[test]
fn directory_moved_with_only_the_new_parent_synced_keeps_one_name() {
    let mut sim = Sim::new();
    sim.mkdir("a");
    sim.mkdir("b");
    sim.mkdir("a/d");
    sim.fsync_dir("a");
    sim.fsync_dir("");
    sim.rename("a/d", "b/d").unwrap();
    sim.fsync_dir("b");
    let report = sim.crash();
    // Durably both a/d and b/d name the directory; it comes back under the first one found.
    assert_eq!(report.entries_dropped, 1);
    let names: Vec<bool> = ["a/d", "b/d"].iter().map(|p| sim.exists(p)).collect();
    assert_eq!(names.iter().filter(|e| **e).count(), 1);
}

#[test]
fn hard_link_needs_its_directory_synced() {
    let mut sim = Sim::new();
    sim.durable_file("f", b"x");
    let ino = sim.ino("f");
    sim.model.link(ino, crate::model::ROOT_INO, std::ffi::OsStr::new("g")).unwrap();
    assert_eq!(sim.model.attr(ino).unwrap().nlink, 2);
    let mut unsynced = Sim { model: sim.model.clone() };
    unsynced.crash();
    assert_eq!(unsynced.names(""), ["f"]);
    sim.fsync_dir("");
    sim.crash();
    assert_eq!(sim.names(""), ["f", "g"]);
    assert_eq!(sim.model.attr(ino).unwrap().nlink, 2);
}

#[test]
fn power_loss_is_idempotent_and_keeps_inode_numbers() {
    let mut sim = Sim::new();
    sim.mkdir("d");
    sim.durable_file("d/f", b"x");
    sim.fsync_dir("");
    let ino = sim.ino("d/f");
    sim.crash();
    let once = sim.model.volatile_tree();
    let report = sim.crash();
    assert_eq!(sim.model.volatile_tree(), once);
    assert_eq!(report, crate::model::PowerLossReport::default());
    assert_eq!(sim.ino("d/f"), ino);
}

#[test]
fn durable_tree_is_the_state_after_a_power_loss() {
    let mut sim = Sim::new();
    sim.mkdir("d");
    sim.durable_file("d/f", b"x");
    sim.fsync_dir("");
    sim.put("d/g", b"unsynced");
    sim.write("d/f", 1, b"yz");
    let predicted = sim.model.durable_tree();
    sim.crash();
    assert_eq!(sim.model.volatile_tree(), predicted);
    assert_eq!(predicted.file("d/f"), Some(&b"x"[..]));
    assert_eq!(predicted.names("d"), Some(vec!["f".to_owned()]));
}

#[test]
fn from_tree_makes_everything_durable() {
    let mut sim = Sim::new();
    sim.mkdir("d");
    sim.put("d/f", b"x");
    sim.put("top", b"y");
    let tree = sim.model.volatile_tree();
    let mut loaded = Model::from_tree(&tree, 0, 0).unwrap();
    assert_eq!(loaded.volatile_tree(), tree);
    loaded.power_loss(Tear::Never);
    assert_eq!(loaded.volatile_tree(), tree);
    assert!(Model::from_tree(&Tree::Symlink { target: "x".into() }, 0, 0).is_err());
}

#[test]
fn durable_inodes_of_deleted_files_are_collected() {
    let mut sim = Sim::new();
    for round in 0..20 {
        let name = format!("snap.{round}");
        sim.put(&name, b"snapshot");
        sim.fsync(&name);
        sim.unlink(&name).unwrap();
        sim.fsync_dir("");
    }
    assert_eq!(sim.model.durable.len(), 1, "only the root is left");
}

#[test]
fn counters_count_syncs_and_writes() {
    let mut sim = Sim::new();
    sim.put("f", b"abc");
    sim.fsync("f");
    sim.fdatasync("f");
    sim.fsync_dir("");
    sim.crash();
    let counters = sim.model.counters();
    assert_eq!((counters.fsyncs, counters.fdatasyncs, counters.dir_fsyncs), (1, 1, 1));
    assert_eq!((counters.writes, counters.bytes_written, counters.power_losses), (1, 3, 1));
}

#[test]
fn noreplace_rename_is_checked_against_the_volatile_state() {
    let mut sim = Sim::new();
    sim.durable_file("a", b"1");
    sim.put("b", b"2");
    assert_eq!(sim.rename_with("a", "b", RenameMode::NoReplace), Err(crate::model::FsError::Exists));
    sim.crash();
    // b was never durable: now the rename goes through.
    sim.rename_with("a", "b", RenameMode::NoReplace).unwrap();
}
