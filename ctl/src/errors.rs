//! What can go wrong in a `cairnctl` invocation, and the exit code each outcome maps to.
//!
//! Scripts branch on exit codes, so the mapping from gRPC status codes is made here, once, and
//! unit tested. Every error renders as one line that says what happened and how to fix it.

use std::time::Duration;

use cairn_client::ClientError;
use tonic::Code;

use crate::token::TokenError;

/// The exit codes `cairnctl` documents (`cairnctl --help`, README).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Exit {
    Ok = 0,
    /// Generic or internal failure (a server bug, an unexpected reply, output not writable).
    Internal = 1,
    /// The command line is wrong (clap's own errors use 2 too).
    Usage = 2,
    /// The admin token is missing or was refused.
    Unauthenticated = 3,
    /// The job, checkpoint, savepoint or node does not exist.
    NotFound = 4,
    /// The cluster refused the request (invalid argument, failed precondition): nothing changed.
    Refused = 5,
    /// No leader reachable, a replica unavailable, or the call timed out.
    Unavailable = 6,
    /// The checkpoint or savepoint waited for did not complete.
    SnapshotFailed = 7,
}

impl Exit {
    pub fn code(self) -> u8 {
        self as u8
    }
}

/// The exit code for a call the cluster answered with `code`.
pub fn exit_for_code(code: Code) -> Exit {
    match code {
        Code::Ok => Exit::Ok,
        Code::Unauthenticated | Code::PermissionDenied => Exit::Unauthenticated,
        Code::NotFound => Exit::NotFound,
        Code::InvalidArgument | Code::FailedPrecondition | Code::AlreadyExists | Code::OutOfRange => {
            Exit::Refused
        }
        Code::Unavailable | Code::DeadlineExceeded | Code::ResourceExhausted | Code::Aborted => {
            Exit::Unavailable
        }
        Code::Cancelled | Code::Unknown | Code::Unimplemented | Code::Internal | Code::DataLoss => {
            Exit::Internal
        }
    }
}

/// Why a `cairnctl` invocation failed.
#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    /// An argument that clap could not check (file contents, combinations).
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Token(#[from] TokenError),
    /// The cluster answered with an error that retrying elsewhere does not fix.
    #[error("{}", rejected_message(what, *code, message))]
    Rejected { what: &'static str, code: Code, message: String },
    #[error(
        "{what}: no leader reachable within {} at {} (last error: {last}); check that the replicas \
         run and pass their addresses with --endpoints or CAIRN_ENDPOINTS (or a longer --timeout)",
        humantime::format_duration(*deadline), endpoints.join(", ")
    )]
    NoLeader { what: &'static str, endpoints: Vec<String>, deadline: Duration, last: String },
    #[error(
        "{kind} {id} of job {job} is still in progress after {}; wait again with \
         `cairnctl checkpoint list {job}` or a longer --timeout",
        humantime::format_duration(*waited)
    )]
    WaitTimedOut { kind: String, job: String, id: u64, waited: Duration },
    #[error("{kind} {id} of job {job} {status}: {reason}")]
    SnapshotFailed { kind: String, job: String, id: u64, status: String, reason: String },
    #[error("cannot write the output: {0}")]
    Output(#[from] std::io::Error),
    #[error("{0}")]
    Internal(String),
}

fn rejected_message(what: &str, code: Code, message: &str) -> String {
    match code {
        Code::Unauthenticated | Code::PermissionDenied => format!(
            "{what}: the cluster refused the admin token ({message}); pass the cluster's token with \
             --token, --token-file or CAIRN_ADMIN_TOKEN (a replica keeps it in <data_dir>/admin-token)"
        ),
        Code::NotFound => format!("{what}: not found: {message}"),
        Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange | Code::AlreadyExists => {
            format!("{what}: refused, nothing changed: {message}")
        }
        Code::Unimplemented => format!(
            "{what}: the replica does not serve this call ({message}); are the replicas and cairnctl \
             the same version?"
        ),
        _ => format!("{what}: failed ({code:?}): {message}"),
    }
}

impl CtlError {
    pub fn exit(&self) -> Exit {
        match self {
            Self::Usage(_) => Exit::Usage,
            Self::Token(_) => Exit::Unauthenticated,
            Self::Rejected { code, .. } => exit_for_code(*code),
            Self::NoLeader { .. } | Self::WaitTimedOut { .. } => Exit::Unavailable,
            Self::SnapshotFailed { .. } => Exit::SnapshotFailed,
            Self::Output(_) | Self::Internal(_) => Exit::Internal,
        }
    }

    /// Converts a client failure, naming the endpoints that were tried.
    pub fn from_client(err: ClientError, endpoints: &[String]) -> Self {
        match err {
            ClientError::NoEndpoints | ClientError::BadEndpoint { .. } => {
                Self::Usage(format!("{err}; pass replica addresses as --endpoints host:port,host:port"))
            }
            ClientError::NoLeader { what, deadline, last } => {
                Self::NoLeader { what, endpoints: endpoints.to_vec(), deadline, last }
            }
            ClientError::Rejected { what, status } => {
                Self::Rejected { what, code: status.code(), message: status.message().to_owned() }
            }
            ClientError::BadToken { reason } => Self::Token(TokenError::Invalid { reason }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_grpc_code_maps_to_a_documented_exit_code() {
        let cases = [
            (Code::Ok, 0),
            (Code::Cancelled, 1),
            (Code::Unknown, 1),
            (Code::InvalidArgument, 5),
            (Code::DeadlineExceeded, 6),
            (Code::NotFound, 4),
            (Code::AlreadyExists, 5),
            (Code::PermissionDenied, 3),
            (Code::ResourceExhausted, 6),
            (Code::FailedPrecondition, 5),
            (Code::Aborted, 6),
            (Code::OutOfRange, 5),
            (Code::Unimplemented, 1),
            (Code::Internal, 1),
            (Code::Unavailable, 6),
            (Code::DataLoss, 1),
            (Code::Unauthenticated, 3),
        ];
        for (code, exit) in cases {
            assert_eq!(exit_for_code(code).code(), exit, "{code:?}");
        }
    }

    #[test]
    fn client_failures_map_to_exit_codes() {
        let eps = vec!["127.0.0.1:1".to_owned(), "127.0.0.1:2".to_owned()];
        let rejected = |code| {
            CtlError::from_client(
                ClientError::Rejected { what: "describe job", status: tonic::Status::new(code, "x") },
                &eps,
            )
        };
        assert_eq!(rejected(Code::Unauthenticated).exit(), Exit::Unauthenticated);
        assert_eq!(rejected(Code::NotFound).exit(), Exit::NotFound);
        assert_eq!(rejected(Code::FailedPrecondition).exit(), Exit::Refused);
        let no_leader = CtlError::from_client(
            ClientError::NoLeader {
                what: "cluster status",
                deadline: Duration::from_secs(3),
                last: "127.0.0.1:2: connection refused".into(),
            },
            &eps,
        );
        assert_eq!(no_leader.exit(), Exit::Unavailable);
        let text = no_leader.to_string();
        assert!(text.contains("127.0.0.1:1, 127.0.0.1:2") && text.contains("--endpoints"), "{text}");
        let bad = CtlError::from_client(ClientError::BadToken { reason: "r".into() }, &eps);
        assert_eq!(bad.exit(), Exit::Unauthenticated);
    }

    #[test]
    fn messages_say_how_to_fix_it() {
        let e = CtlError::Rejected {
            what: "cluster status",
            code: Code::Unauthenticated,
            message: "wrong admin token".into(),
        };
        assert!(e.to_string().contains("--token-file"), "{e}");
        let e = CtlError::Rejected { what: "cancel job", code: Code::NotFound, message: "no job x".into() };
        assert_eq!(e.to_string(), "cancel job: not found: no job x");
        let e = CtlError::SnapshotFailed {
            kind: "checkpoint".into(),
            job: "j".into(),
            id: 3,
            status: "failed".into(),
            reason: "CHECKPOINT_EXPIRED".into(),
        };
        assert_eq!(e.exit(), Exit::SnapshotFailed);
        assert_eq!(e.to_string(), "checkpoint 3 of job j failed: CHECKPOINT_EXPIRED");
    }
}
