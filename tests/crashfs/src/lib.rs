//! `cairn-crashfs`: a test-only FUSE file system that loses unsynced data on command, for
//! crash-consistency tests (in the spirit of Jepsen's LazyFS and the abstract persistence
//! model of the ALICE paper, "All File Systems Are Not Created Equal", OSDI 2014).
//!
//! # What it models
//!
//! The file system keeps two states, both in memory:
//!
//! - the **volatile** state: what programs see. Every operation acts on it only, so reads
//!   always see the latest writes, as on a real file system;
//! - the **durable** state: what would survive a power cut. It changes only by these rules:
//!   1. `fsync(fd)` / `fdatasync(fd)` of a file makes that inode's current data and size
//!      durable. `fsync` also makes its metadata (permissions, owner, times) durable;
//!      `fdatasync` does not (data and size are treated the same by both).
//!   2. `fsync` of a directory (`File::open(dir)?.sync_all()`) makes that directory's current
//!      entries (name → inode) durable, and its metadata.
//!   3. Nothing else is durable: creating a file, `mkdir`, `rename`, `unlink`, `rmdir`,
//!      `link`, `symlink` are durable only once the directory holding the changed entry is
//!      fsynced (both directories for a cross-directory rename: with only one synced, the
//!      other keeps its old entry). `close`, `sync_file_range(2)` and `sync(2)`/`syncfs(2)`
//!      make nothing durable (the first two never reach a FUSE file system as an fsync, and
//!      fuser does not implement `FUSE_SYNCFS`). A write to a file opened with `O_SYNC` or
//!      `O_DSYNC` is durable when it returns: the kernel sends an fsync after it.
//!   4. An inode that gets its first durable name (rule 2) without ever having been synced
//!      itself is durable empty: a file with no data, a directory with no entries (a
//!      symlink with its target, which is written at creation).
//!
//! Rule 3 matters in practice: sled 0.34's `Db::flush` writes with `pwrite` and
//! `sync_file_range(2)` only (its background flusher calls `fsync` every `flush_every_ms`), and
//! never fsyncs a directory, so keys acknowledged by `flush()` alone are lost here (see
//! `tests/sled.rs`).
//!
//! A **power loss** ([`MountedFs::power_loss`]) makes the volatile state a copy of what is
//! reachable from the durable root through durable directory entries, each inode with its
//! durable contents. So:
//! - a file whose name was made durable but whose data was never fsynced survives with the
//!   data of its last fsync (possibly empty);
//! - a file whose data was fsynced but whose name was never made durable is gone;
//! - an unlink or rename whose directory was not fsynced is undone (the old name comes back
//!   with the old inode and that inode's durable data);
//! - a directory whose durable state names a subdirectory twice (moved, with only the new
//!   parent synced) keeps the first name found (breadth-first, by name) and drops the other.
//!
//! With [`TornWrites`], each *unsynced* 512-byte sector of a surviving file (where the
//! volatile contents differ from the durable ones) independently survives with a given
//! probability (seeded generator), modelling torn writes at sector granularity; a torn file
//! grows to cover a surviving sector past its durable size, and never shrinks.
//!
//! The rules are implemented by the pure [`model::Model`] (no FUSE, no I/O), which the FUSE
//! layer wraps, so they are unit tested without mounting.
//!
//! # What it does not model
//!
//! - No reordering or partial persistence beyond the rules above: an `fsync` is atomic, data
//!   of different files is independent, and nothing becomes durable on its own (no
//!   background writeback, no journal commit that makes an unrelated rename durable as
//!   ext4 would). This is stricter than most real file systems, as POSIX allows.
//! - Extended attributes, POSIX ACLs, FIFOs, sockets and device nodes are not supported
//!   (`EOPNOTSUPP`/`EPERM`). Hard links and symlinks are. File locks (`flock`, `fcntl`) are
//!   handled by the kernel locally (the FUSE lock operations are not implemented), which
//!   works for processes of one machine; a power loss drops them with the mount.
//! - `mmap`: reads work; shared writable mappings reach the file system only when the kernel
//!   writes the pages back, so their durability is not modelled (not tested).
//! - Contents live in memory (files up to 1 GiB, sparse regions cost memory). Permission
//!   checks are the kernel's (`default_permissions`).
//! - The file system is served by the test process itself. If that process is killed while
//!   one of its own threads is inside a system call on the mount, the kernel waits forever
//!   for an answer that will not come: the process stays a zombie and the mount stays (the
//!   auto-unmount helper waits for it). `umount -f <mountpoint>` (as root) aborts the
//!   connection and frees both. Run workloads in child processes and keep the driver's own
//!   accesses short; a test that fails by panicking unmounts cleanly (on drop).
//!
//! # How to use it
//!
//! ```no_run
//! use cairn_crashfs::{CrashFs, MountOptions};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = tempfile::tempdir()?;
//! let fs = CrashFs::mount(dir.path(), MountOptions::default())?;
//! let file = fs.mountpoint().join("log");
//! std::fs::write(&file, b"hello")?;
//! std::fs::File::open(&file)?.sync_all()?; // data durable, name not yet
//! std::fs::File::open(fs.mountpoint())?.sync_all()?; // name durable
//! // ... SIGKILL every process using the mount, then:
//! let report = fs.power_loss()?;
//! assert_eq!(std::fs::read(&file)?, b"hello");
//! println!("{report}; {}", fs.stats());
//! fs.unmount()?;
//! # Ok(())
//! # }
//! ```
//!
//! The file system runs on a background thread of the calling process; the programs under
//! test usually run as child processes on the mount. Before [`MountedFs::power_loss`], kill
//! them (`SIGKILL`) and close this process's own files on the mount: the power loss unmounts
//! (if the mount is still in use, its connection is aborted and it is detached: whatever
//! still uses the old mount gets `EIO` or `ENOTCONN`) and mounts again at the same
//! mountpoint, so no kernel cache survives it.
//!
//! [`MountOptions::backing_dir`] keeps the durable state on the real disk: it is written
//! there (as an ordinary directory tree, see [`image`]) after every power loss and at
//! unmount, and loaded from there at mount. A failed trial can be inspected there, and a
//! "machine" restarted on what survived by mounting again with the same backing directory.
//!
//! Mounting needs `/dev/fuse` and the `fusermount3` helper (Debian package `fuse3`); root, or
//! `user_allow_other` in /etc/fuse.conf for auto-unmount. Building needs neither libfuse nor
//! pkg-config. When mounting is impossible, [`CrashFs::mount`] fails with an [`Error`] that
//! says what to install.

mod error;
mod fs;
pub mod image;
pub mod model;
mod mount;
mod session;
mod shared;
mod stats;

pub use error::Error;
pub use model::{PowerLossReport, Tree};
pub use mount::{CrashFs, MountOptions, MountedFs, TornWrites};
pub use stats::Stats;
