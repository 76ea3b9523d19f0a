//! Errors of the control API.

use std::io;
use std::path::PathBuf;

/// Why mounting, a power loss, unmounting or saving an image failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The mountpoint is not an existing directory.
    #[error("cannot mount crashfs at {}: the mountpoint is not an existing directory", mountpoint.display())]
    MountpointMissing {
        /// The mountpoint asked for.
        mountpoint: PathBuf,
    },
    /// There is no FUSE device.
    #[error(
        "cannot mount crashfs at {}: /dev/fuse does not exist; load the fuse kernel module \
         (`modprobe fuse`), and in a container pass the device (`--device /dev/fuse`)",
        mountpoint.display()
    )]
    NoFuseDevice {
        /// The mountpoint asked for.
        mountpoint: PathBuf,
    },
    /// The FUSE device exists but cannot be opened.
    #[error(
        "cannot mount crashfs at {}: cannot open /dev/fuse ({source}); run as root or give this \
         user read-write access to /dev/fuse",
        mountpoint.display()
    )]
    FuseDeviceAccess {
        /// The mountpoint asked for.
        mountpoint: PathBuf,
        /// Why opening failed.
        source: io::Error,
    },
    /// The `fusermount3` helper is not installed.
    #[error(
        "cannot mount crashfs at {}: `fusermount3` is not installed (needed to mount and for \
         auto-unmount); install the fuse3 package (`apt-get install fuse3`)",
        mountpoint.display()
    )]
    FusermountMissing {
        /// The mountpoint asked for.
        mountpoint: PathBuf,
    },
    /// The kernel or `fusermount3` refused the mount.
    #[error("cannot mount crashfs at {}: {source}{hint}", mountpoint.display())]
    Mount {
        /// The mountpoint asked for.
        mountpoint: PathBuf,
        /// What the mount attempt reported.
        source: io::Error,
        /// What to do about it, if known (starts with "; ").
        hint: &'static str,
    },
    /// Unmounting failed.
    #[error("cannot unmount crashfs at {}: {source}", mountpoint.display())]
    Unmount {
        /// The mountpoint.
        mountpoint: PathBuf,
        /// What the unmount attempt reported.
        source: io::Error,
    },
    /// An option is out of range.
    #[error("invalid crashfs option: {0}")]
    InvalidOption(String),
    /// Reading or writing a durable-state image failed.
    #[error("crashfs durable image {}: {source}", path.display())]
    Image {
        /// The file or directory that failed.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// A saved durable-state image cannot be loaded into the model.
    #[error("crashfs durable image {} cannot be loaded: {reason}", path.display())]
    BadImage {
        /// The image directory.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}
