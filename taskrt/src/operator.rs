//! The operator contract: what a task calls on the operators of its chain, and in which order.
//!
//! Lifecycle (driven by [`crate::task`]): `initialize_state` (head to tail, after the task loaded
//! restored state into the operator's backends) → `open` (tail to head) → records, watermarks,
//! checkpoints and notifications → `end_input` (when all inputs ended) → `close` (head to tail;
//! may still emit) → `dispose` (tail to head; always, also on failure or cancellation, for every
//! operator that was created).
//!
//! Operators never touch channels or files directly: they emit through and keep state in an
//! [`OperatorContext`] whose backends the task owns and snapshots.

use std::time::Duration;

use crate::exchange::Record;
use crate::state::StateError;
use crate::state::keyed::KeyedStateBackend;
use crate::state::list::OperatorStateBackend;

/// Identity of the subtask an operator runs in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskInfo {
    pub job: String,
    pub vertex: String,
    pub subtask: u32,
    pub parallelism: u32,
    pub max_parallelism: u32,
    pub attempt: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    #[error(transparent)]
    State(#[from] StateError),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("operator is not a source")]
    NotASource,
    #[error("{0}")]
    Failed(String),
}

impl OperatorError {
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        OperatorError::Io { context: context.into(), source }
    }
}

/// What an operator can reach while it is called.
pub struct OperatorContext<'a> {
    pub info: &'a TaskInfo,
    pub operator_id: &'a str,
    keyed: &'a mut KeyedStateBackend,
    lists: &'a mut OperatorStateBackend,
    out: &'a mut Vec<Record>,
}

impl<'a> OperatorContext<'a> {
    pub fn new(
        info: &'a TaskInfo,
        operator_id: &'a str,
        keyed: &'a mut KeyedStateBackend,
        lists: &'a mut OperatorStateBackend,
        out: &'a mut Vec<Record>,
    ) -> Self {
        Self { info, operator_id, keyed, lists, out }
    }

    /// Emits a record to the next operator of the chain (or downstream).
    pub fn emit(&mut self, record: Record) {
        self.out.push(record);
    }

    /// Keyed state for the key groups of this subtask.
    pub fn keyed(&mut self) -> &mut KeyedStateBackend {
        self.keyed
    }

    /// Operator list state of this subtask.
    pub fn lists(&mut self) -> &mut OperatorStateBackend {
        self.lists
    }
}

/// What a source did when polled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourcePoll {
    /// Emitted records; poll again soon.
    Emitted,
    /// Nothing to emit for this long (rate limit, or exhausted and waiting to be stopped).
    Idle(Duration),
    /// The source ended: the task ends its input.
    Finished,
}

/// An operator of a chain. Every method has a sensible default except `process_record`.
pub trait Operator: Send {
    /// Reads restored state from the context (`restored_from` is the checkpoint id, if any).
    fn initialize_state(
        &mut self,
        _ctx: &mut OperatorContext<'_>,
        _restored_from: Option<u64>,
    ) -> Result<(), OperatorError> {
        Ok(())
    }

    fn open(&mut self, _ctx: &mut OperatorContext<'_>) -> Result<(), OperatorError> {
        Ok(())
    }

    fn process_record(&mut self, record: Record, ctx: &mut OperatorContext<'_>) -> Result<(), OperatorError>;

    /// Event time advanced to `watermark`; the task forwards the watermark after this returns.
    fn process_watermark(
        &mut self,
        _watermark: u64,
        _ctx: &mut OperatorContext<'_>,
    ) -> Result<(), OperatorError> {
        Ok(())
    }

    /// Sources only: emit the next records.
    fn poll_source(&mut self, _ctx: &mut OperatorContext<'_>) -> Result<SourcePoll, OperatorError> {
        Err(OperatorError::NotASource)
    }

    /// Sources only: stop emitting (stop-with-savepoint); the task then ends its input.
    fn stop_source(&mut self) {}

    /// After a record: how long the operator needs before it takes the next one (a rate-limited
    /// sink). The task waits that long before it reads more input; the wait is busy time.
    fn throttle(&mut self) -> Option<std::time::Duration> {
        None
    }

    /// Called before the barrier is forwarded; records emitted here precede the barrier.
    fn prepare_snapshot_pre_barrier(
        &mut self,
        _checkpoint_id: u64,
        _ctx: &mut OperatorContext<'_>,
    ) -> Result<(), OperatorError> {
        Ok(())
    }

    /// Synchronous snapshot: bring list state up to date (keyed state is snapshotted by the task).
    fn snapshot_state(
        &mut self,
        _checkpoint_id: u64,
        _ctx: &mut OperatorContext<'_>,
    ) -> Result<(), OperatorError> {
        Ok(())
    }

    fn notify_checkpoint_complete(
        &mut self,
        _checkpoint_id: u64,
        _ctx: &mut OperatorContext<'_>,
    ) -> Result<(), OperatorError> {
        Ok(())
    }

    fn notify_checkpoint_aborted(
        &mut self,
        _checkpoint_id: u64,
        _ctx: &mut OperatorContext<'_>,
    ) -> Result<(), OperatorError> {
        Ok(())
    }

    /// All inputs ended (or the source finished).
    fn end_input(&mut self, _ctx: &mut OperatorContext<'_>) -> Result<(), OperatorError> {
        Ok(())
    }

    fn close(&mut self, _ctx: &mut OperatorContext<'_>) -> Result<(), OperatorError> {
        Ok(())
    }

    /// Releases resources; called exactly once for every created operator, whatever happened.
    fn dispose(&mut self) {}
}

/// Builds operators of one kind. `create` must be free of side effects.
pub trait OperatorFactory: Send + Sync {
    fn create(&self, config: &serde_json::Value, info: &TaskInfo) -> Result<Box<dyn Operator>, String>;
}

/// A factory from a closure.
pub struct FnFactory<F> {
    f: F,
}

impl<F> FnFactory<F>
where
    F: Fn(&serde_json::Value, &TaskInfo) -> Result<Box<dyn Operator>, String> + Send + Sync,
{
    pub fn new(f: F) -> Self {
        Self { f }
    }
}

impl<F> OperatorFactory for FnFactory<F>
where
    F: Fn(&serde_json::Value, &TaskInfo) -> Result<Box<dyn Operator>, String> + Send + Sync,
{
    fn create(&self, config: &serde_json::Value, info: &TaskInfo) -> Result<Box<dyn Operator>, String> {
        (self.f)(config, info)
    }
}
