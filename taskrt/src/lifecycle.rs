//! The task lifecycle as an explicit state machine; the legal transitions live only here.
//!
//! ```text
//! created → restoring → running → finishing → finished
//!    └──────────┴──────────┴──────────┴──→ failed(cause) | canceled
//! ```

use std::fmt;

use cairn_protocol::messages::TaskStatus;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskState {
    Created,
    Restoring,
    Running,
    Finishing,
    Finished,
    Failed(String),
    Canceled,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("illegal task state transition {from} -> {to}")]
pub struct IllegalTransition {
    pub from: TaskState,
    pub to: TaskState,
}

impl fmt::Display for TaskState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TaskState::Created => write!(f, "created"),
            TaskState::Restoring => write!(f, "restoring"),
            TaskState::Running => write!(f, "running"),
            TaskState::Finishing => write!(f, "finishing"),
            TaskState::Finished => write!(f, "finished"),
            TaskState::Failed(_) => write!(f, "failed"),
            TaskState::Canceled => write!(f, "canceled"),
        }
    }
}

impl TaskState {
    pub fn is_terminal(&self) -> bool {
        matches!(self, TaskState::Finished | TaskState::Failed(_) | TaskState::Canceled)
    }

    /// Whether `self → to` is legal.
    pub fn can_become(&self, to: &TaskState) -> bool {
        use TaskState::*;
        match (self, to) {
            (Created, Restoring) | (Restoring, Running) | (Running, Finishing) | (Finishing, Finished) => {
                true
            }
            (from, Failed(_) | Canceled) => !from.is_terminal(),
            _ => false,
        }
    }

    /// Performs the transition, or reports it as illegal (leaving `self` unchanged).
    pub fn transition(&mut self, to: TaskState) -> Result<(), IllegalTransition> {
        if !self.can_become(&to) {
            return Err(IllegalTransition { from: self.clone(), to });
        }
        *self = to;
        Ok(())
    }

    pub fn status(&self) -> TaskStatus {
        match self {
            TaskState::Created => TaskStatus::Created,
            TaskState::Restoring => TaskStatus::Restoring,
            TaskState::Running => TaskStatus::Running,
            TaskState::Finishing => TaskStatus::Finishing,
            TaskState::Finished => TaskStatus::Finished,
            TaskState::Failed(c) => TaskStatus::Failed(c.clone()),
            TaskState::Canceled => TaskStatus::Canceled,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_documented_transitions_are_legal() {
        let mut s = TaskState::Created;
        assert!(s.transition(TaskState::Running).is_err());
        s.transition(TaskState::Restoring).unwrap();
        s.transition(TaskState::Running).unwrap();
        s.transition(TaskState::Finishing).unwrap();
        s.transition(TaskState::Finished).unwrap();
        assert!(s.transition(TaskState::Canceled).is_err());
        assert!(s.transition(TaskState::Failed("x".into())).is_err());
        let mut s = TaskState::Running;
        s.transition(TaskState::Failed("boom".into())).unwrap();
        assert_eq!(s.status(), TaskStatus::Failed("boom".into()));
        assert!(s.transition(TaskState::Failed("again".into())).is_err(), "a task fails once");
    }
}
