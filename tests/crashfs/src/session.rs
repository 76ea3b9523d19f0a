//! Starting and stopping one FUSE session (one mount) at a mountpoint.

use std::fs::{self, OpenOptions};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use fuser::{BackgroundSession, Config, MountOption, SessionACL};
use nix::errno::Errno;
use nix::mount::{MntFlags, umount2};
use nix::sys::wait::{WaitPidFlag, waitpid};
use nix::unistd::Pid;

use crate::error::Error;
use crate::fs::CrashFsHandler;
use crate::shared::Shared;

/// A running FUSE session.
pub(crate) struct FuseSession {
    background: BackgroundSession,
    /// Device number of the mounted file system (names its `/sys/fs/fuse/connections` entry).
    dev: u64,
}

/// How sessions are mounted.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SessionConfig {
    pub(crate) auto_unmount: bool,
    pub(crate) ttl: Duration,
}

/// Reaps the `fusermount3` helpers of this process that have exited. With auto-unmount, fuser
/// starts one per mount and never waits for it; it exits once its mount is gone, and would
/// stay a zombie until this process ends (one per power loss). Only exited helpers whose
/// parent is this process are reaped.
fn reap_exited_helpers() {
    let me = std::process::id();
    let Ok(processes) = fs::read_dir("/proc") else {
        return;
    };
    for entry in processes.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // "<pid> (<comm>) <state> <ppid> ..."; comm may hold spaces and parentheses.
        let (Some((head, rest)), Some(open)) = (stat.rsplit_once(") "), stat.find(" (")) else {
            continue;
        };
        let comm = head.get(open + 2..).unwrap_or_default();
        let mut fields = rest.split(' ');
        let (state, ppid) = (fields.next(), fields.next().and_then(|ppid| ppid.parse::<u32>().ok()));
        if comm.starts_with("fusermount") && state == Some("Z") && ppid == Some(me) {
            let _exit_status = waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG));
        }
    }
}

/// Checks what mounting needs, to fail with a message that says what to install.
pub(crate) fn preflight(mountpoint: &Path, auto_unmount: bool) -> Result<(), Error> {
    if !mountpoint.is_dir() {
        return Err(Error::MountpointMissing { mountpoint: mountpoint.to_owned() });
    }
    if let Err(source) = OpenOptions::new().read(true).write(true).open("/dev/fuse") {
        return Err(if source.kind() == io::ErrorKind::NotFound {
            Error::NoFuseDevice { mountpoint: mountpoint.to_owned() }
        } else {
            Error::FuseDeviceAccess { mountpoint: mountpoint.to_owned(), source }
        });
    }
    let needs_helper = auto_unmount || !nix::unistd::geteuid().is_root();
    if needs_helper && fusermount().is_none() {
        return Err(Error::FusermountMissing { mountpoint: mountpoint.to_owned() });
    }
    Ok(())
}

/// Mounts a session serving `shared` as of `generation`.
pub(crate) fn start(
    mountpoint: &Path,
    shared: &Arc<Mutex<Shared>>,
    generation: u64,
    config: SessionConfig,
) -> Result<FuseSession, Error> {
    reap_exited_helpers();
    let handler = CrashFsHandler::new(Arc::clone(shared), generation, config.ttl);
    let mut fuse_config = Config::default();
    fuse_config.mount_options = vec![
        MountOption::FSName("crashfs".to_owned()),
        MountOption::Subtype("crashfs".to_owned()),
        MountOption::DefaultPermissions,
    ];
    if config.auto_unmount {
        // fusermount3 stays behind and unmounts if this process dies without unmounting.
        fuse_config.mount_options.push(MountOption::AutoUnmount);
        fuse_config.acl = SessionACL::RootAndOwner;
    }
    let background = fuser::spawn_mount(handler, mountpoint, &fuse_config)
        .map_err(|source| mount_error(mountpoint, source))?;
    match fs::metadata(mountpoint) {
        Ok(meta) => Ok(FuseSession { background, dev: meta.dev() }),
        Err(source) => {
            let session = FuseSession { background, dev: 0 };
            if let Err(error) = stop(mountpoint, session, Duration::from_secs(5)) {
                tracing::warn!(%error, "unmounting a mount that does not answer");
            }
            Err(Error::Mount {
                mountpoint: mountpoint.to_owned(),
                source,
                hint: "; the new mount does not answer",
            })
        }
    }
}

/// Unmounts a session and waits (up to `timeout`) for its thread to end. A mount still in use
/// (open files, working directories) has its connection aborted (`MNT_FORCE`, or fusectl), so
/// whatever still uses it gets `ENOTCONN`, and is detached lazily: it leaves the namespace at
/// once.
pub(crate) fn stop(mountpoint: &Path, session: FuseSession, timeout: Duration) -> Result<(), Error> {
    let FuseSession { background, dev } = session;
    detach(mountpoint, dev).map_err(|source| Error::Unmount { mountpoint: mountpoint.to_owned(), source })?;
    let (done_tx, done_rx) = mpsc::channel();
    let joiner = thread::Builder::new().name("crashfs-unmount".to_owned()).spawn(move || {
        let _receiver_gone = done_tx.send(background.umount_and_join());
    });
    if let Err(source) = joiner {
        return Err(Error::Unmount { mountpoint: mountpoint.to_owned(), source });
    }
    let joined = done_rx.recv_timeout(timeout);
    reap_exited_helpers();
    match joined {
        Ok(Ok(())) => Ok(()),
        // Without auto-unmount, fuser unmounts again, and finds nothing mounted: the session
        // thread ends by itself (its connection is gone), unjoined.
        Ok(Err(source)) if source.raw_os_error() == Some(libc::EINVAL) => Ok(()),
        Ok(Err(source)) => Err(Error::Unmount { mountpoint: mountpoint.to_owned(), source }),
        Err(RecvTimeoutError::Timeout) => {
            tracing::warn!(
                mountpoint = %mountpoint.display(),
                "crashfs session still in use after unmount; it was detached and ends when its files close"
            );
            Ok(())
        }
        Err(RecvTimeoutError::Disconnected) => Err(Error::Unmount {
            mountpoint: mountpoint.to_owned(),
            source: io::Error::other("the FUSE session thread panicked"),
        }),
    }
}

/// Removes the mount from the namespace.
fn detach(mountpoint: &Path, dev: u64) -> io::Result<()> {
    match umount2(mountpoint, MntFlags::empty()) {
        Ok(()) | Err(Errno::EINVAL) => Ok(()), // EINVAL: no longer a mountpoint
        Err(Errno::EBUSY) => {
            // Still in use. MNT_FORCE aborts the FUSE connection (whatever still uses the
            // mount gets ENOTCONN, and the session thread ends); the mount itself may stay
            // busy, so it is then detached.
            if let Ok(()) | Err(Errno::EINVAL) = umount2(mountpoint, MntFlags::MNT_FORCE) {
                return Ok(());
            }
            umount2(mountpoint, MntFlags::MNT_DETACH)?;
            abort_connection(dev);
            Ok(())
        }
        Err(Errno::EPERM) => fusermount_unmount(mountpoint, dev),
        Err(errno) => Err(errno.into()),
    }
}

/// Unmounts through the setuid helper (when not root).
fn fusermount_unmount(mountpoint: &Path, dev: u64) -> io::Result<()> {
    let helper = fusermount().ok_or_else(|| io::Error::other("fusermount3 not found"))?;
    let plain = Command::new(&helper).args(["-u", "-q", "--"]).arg(mountpoint).output()?;
    if plain.status.success() {
        return Ok(());
    }
    let lazy = Command::new(&helper).args(["-u", "-z", "-q", "--"]).arg(mountpoint).output()?;
    if lazy.status.success() {
        abort_connection(dev);
        return Ok(());
    }
    Err(io::Error::other(String::from_utf8_lossy(&lazy.stderr).trim().to_owned()))
}

/// Aborts a FUSE connection through fusectl, if it is mounted (a fallback for when
/// `MNT_FORCE` is refused): the detached mount's users get `ENOTCONN` and its session thread
/// ends now rather than when the last file closes.
fn abort_connection(dev: u64) {
    if dev == 0 || nix::sys::stat::major(dev) != 0 {
        return;
    }
    let abort = format!("/sys/fs/fuse/connections/{}/abort", nix::sys::stat::minor(dev));
    if fs::write(&abort, "1").is_err() {
        tracing::debug!(%abort, "cannot abort the FUSE connection (fusectl not mounted?)");
    }
}

/// The `fusermount3` (or `fusermount`) helper, as fuser finds it.
fn fusermount() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("FUSERMOUNT_PATH") {
        return Some(PathBuf::from(path)).filter(|path| path.is_file());
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs =
        std::env::split_paths(&path).chain(["/usr/bin", "/bin", "/usr/sbin", "/sbin"].map(PathBuf::from));
    dirs.flat_map(|dir| ["fusermount3", "fusermount"].map(|name| dir.join(name)))
        .find(|candidate| candidate.is_file())
}

fn mount_error(mountpoint: &Path, source: io::Error) -> Error {
    let message = source.to_string();
    let hint = if message.contains("user_allow_other") {
        "; a non-root user needs `user_allow_other` in /etc/fuse.conf for auto-unmount, or \
         MountOptions::auto_unmount set to false"
    } else if source.raw_os_error() == Some(libc::EPERM) || source.kind() == io::ErrorKind::PermissionDenied {
        "; mounting needs root (CAP_SYS_ADMIN) or the setuid `fusermount3` of the fuse3 package"
    } else if source.kind() == io::ErrorKind::NotFound {
        "; is the fuse3 package (`fusermount3`) installed?"
    } else {
        ""
    };
    Error::Mount { mountpoint: mountpoint.to_owned(), source, hint }
}
