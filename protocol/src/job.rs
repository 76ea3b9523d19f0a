//! What a user submits: the job's identity and its spec (graph, checkpoint configuration,
//! restore source). The replicated registry stores these as they are; both planes and the CLI
//! validate them with the code here.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::config::CheckpointConfig;

/// A job identifier: 1 to 64 characters of `[A-Za-z0-9_.-]`, not starting with `.` (it names
/// a directory in checkpoint storage, so it must be a safe path component).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct JobId(String);

/// Why a string is not a valid [`JobId`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JobIdError {
    #[error("job id is empty")]
    Empty,
    #[error("job id is {0} characters long; at most 64 are allowed")]
    TooLong(usize),
    #[error("job id {0:?} may only contain letters, digits, '_', '-' and '.', and may not start with '.'")]
    BadChar(String),
}

impl JobId {
    pub const MAX_LEN: usize = 64;

    pub fn new(s: impl Into<String>) -> Result<Self, JobIdError> {
        let s = s.into();
        if s.is_empty() {
            return Err(JobIdError::Empty);
        }
        if s.len() > Self::MAX_LEN {
            return Err(JobIdError::TooLong(s.len()));
        }
        let ok = s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
        if !ok || s.starts_with('.') {
            return Err(JobIdError::BadChar(s));
        }
        Ok(Self(s))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for JobId {
    type Error = JobIdError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::new(s)
    }
}

impl From<JobId> for String {
    fn from(j: JobId) -> String {
        j.0
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a job runs and how it is checkpointed, as submitted.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct JobSpec {
    /// The job graph, owned and validated by the task runtime; opaque to the state machine.
    pub graph: serde_json::Value,
    pub checkpoint: CheckpointConfig,
    /// Savepoint (or retained checkpoint) path to restore from on first start.
    pub restore_from: Option<String>,
    /// Whether state in `restore_from` that maps to no operator may be skipped.
    pub allow_non_restored_state: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_ids_are_safe_path_components() {
        assert!(JobId::new("wordcount-1.v2").is_ok());
        assert_eq!(JobId::new(""), Err(JobIdError::Empty));
        assert!(matches!(JobId::new("../etc"), Err(JobIdError::BadChar(_))));
        assert!(matches!(JobId::new(".hidden"), Err(JobIdError::BadChar(_))));
        assert!(matches!(JobId::new("a/b"), Err(JobIdError::BadChar(_))));
        assert_eq!(JobId::new("x".repeat(65)), Err(JobIdError::TooLong(65)));
    }

    #[test]
    fn job_id_deserialization_validates() {
        assert!(serde_json::from_str::<JobId>("\"a/b\"").is_err());
        assert_eq!(serde_json::from_str::<JobId>("\"ok\"").unwrap().as_str(), "ok");
    }
}
