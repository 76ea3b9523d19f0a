//! Errors of model operations, each one an `errno` a system call would return.

/// Why a file system operation failed; [`FsError::errno`] is what the program sees.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FsError {
    /// `ENOENT`.
    #[error("no such file or directory")]
    NotFound,
    /// `EEXIST`.
    #[error("file exists")]
    Exists,
    /// `ENOTDIR`.
    #[error("not a directory")]
    NotDir,
    /// `EISDIR`.
    #[error("is a directory")]
    IsDir,
    /// `ENOTEMPTY`.
    #[error("directory not empty")]
    NotEmpty,
    /// `EINVAL`.
    #[error("invalid argument")]
    Invalid,
    /// `ENAMETOOLONG`.
    #[error("file name too long")]
    NameTooLong,
    /// `EFBIG`.
    #[error("file too large")]
    TooBig,
    /// `EPERM`.
    #[error("operation not permitted")]
    NotPermitted,
    /// `EOPNOTSUPP`.
    #[error("operation not supported")]
    NotSupported,
}

impl FsError {
    /// The `errno` value of this error.
    pub fn errno(self) -> i32 {
        match self {
            FsError::NotFound => libc::ENOENT,
            FsError::Exists => libc::EEXIST,
            FsError::NotDir => libc::ENOTDIR,
            FsError::IsDir => libc::EISDIR,
            FsError::NotEmpty => libc::ENOTEMPTY,
            FsError::Invalid => libc::EINVAL,
            FsError::NameTooLong => libc::ENAMETOOLONG,
            FsError::TooBig => libc::EFBIG,
            FsError::NotPermitted => libc::EPERM,
            FsError::NotSupported => libc::EOPNOTSUPP,
        }
    }
}
