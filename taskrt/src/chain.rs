//! The operator chain of one task: the operators, each with the state backends it owns, and the
//! order in which lifecycle calls reach them.
//!
//! Records emitted by operator `i` are passed synchronously through operators `i+1..`; what the
//! last operator emits is returned to the task, which sends it downstream. Open and dispose go
//! tail to head, everything else head to tail (so an upstream operator's close can still emit
//! into an open downstream operator).

use std::collections::BTreeMap;

use crate::exchange::Record;
use crate::operator::{Operator, OperatorContext, OperatorError, SourcePoll, TaskInfo};
use crate::state::keyed::{KeyedStateBackend, UploadedGroups};
use crate::state::list::OperatorStateBackend;
use crate::state::restore::LoadedRestore;
use crate::state::snapshot::{OperatorPlan, SnapshotTarget, plan_operator};

/// One operator with its state.
pub struct ChainMember {
    pub id: String,
    pub operator: Box<dyn Operator>,
    pub keyed: KeyedStateBackend,
    pub lists: OperatorStateBackend,
}

pub struct OperatorChain {
    info: TaskInfo,
    members: Vec<ChainMember>,
    /// How many operators (counted from the tail) were opened; they are the ones to close.
    opened: usize,
    disposed: bool,
    source: bool,
}

type OpCall<'f> = &'f mut dyn FnMut(&mut dyn Operator, &mut OperatorContext<'_>) -> Result<(), OperatorError>;

impl OperatorChain {
    pub fn new(info: TaskInfo, members: Vec<ChainMember>, source: bool) -> Self {
        Self { info, members, opened: 0, disposed: false, source }
    }

    pub fn info(&self) -> &TaskInfo {
        &self.info
    }

    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    pub fn operator_ids(&self) -> impl Iterator<Item = &str> {
        self.members.iter().map(|m| m.id.as_str())
    }

    pub fn member(&self, operator_id: &str) -> Option<&ChainMember> {
        self.members.iter().find(|m| m.id == operator_id)
    }

    /// Calls `f` on member `i`, then pushes what it emitted through the rest of the chain.
    fn call_at(&mut self, i: usize, f: OpCall<'_>, out: &mut Vec<Record>) -> Result<(), OperatorError> {
        let mut emitted = Vec::new();
        {
            let info = &self.info;
            let Some(m) = self.members.get_mut(i) else { return Ok(()) };
            let mut ctx = OperatorContext::new(info, &m.id, &mut m.keyed, &mut m.lists, &mut emitted);
            f(m.operator.as_mut(), &mut ctx)?;
        }
        self.push_through(i + 1, emitted, out)
    }

    fn push_through(
        &mut self,
        start: usize,
        mut records: Vec<Record>,
        out: &mut Vec<Record>,
    ) -> Result<(), OperatorError> {
        let info = &self.info;
        for m in self.members.iter_mut().skip(start) {
            if records.is_empty() {
                return Ok(());
            }
            let mut next = Vec::with_capacity(records.len());
            for r in records.drain(..) {
                let mut ctx = OperatorContext::new(info, &m.id, &mut m.keyed, &mut m.lists, &mut next);
                m.operator.process_record(r, &mut ctx)?;
            }
            records = next;
        }
        out.append(&mut records);
        Ok(())
    }

    /// Calls `f` on every member, head to tail.
    fn call_all(&mut self, f: OpCall<'_>, out: &mut Vec<Record>) -> Result<(), OperatorError> {
        for i in 0..self.members.len() {
            self.call_at(i, f, out)?;
        }
        Ok(())
    }

    /// Installs restored state into the backends (before `initialize_state`). With
    /// `own_files`, restored shared files may be referenced again by incremental checkpoints.
    /// State for an operator this task does not have is refused: the leader assigns state only
    /// to the operators of each subtask, so it means the assignment and the graph disagree.
    pub fn install_restored(
        &mut self,
        restored: LoadedRestore,
        own_files: bool,
    ) -> Result<(), OperatorError> {
        let mut by_op = restored.operators;
        if let Some(orphan) = by_op.keys().find(|op| !self.members.iter().any(|m| m.id == **op)) {
            return Err(OperatorError::Failed(format!(
                "the restore assignment holds state of operator {orphan}, which this task does not run"
            )));
        }
        for m in &mut self.members {
            let Some(op) = by_op.remove(&m.id) else { continue };
            for g in op.groups {
                m.keyed.restore_group(g.key_group, g.data, &g.segment, &g.file, own_files)?;
            }
            for (name, mode, elements) in op.lists {
                m.lists.set(&name, mode, elements)?;
            }
        }
        Ok(())
    }

    pub fn initialize_state(&mut self, restored_from: Option<u64>) -> Result<(), OperatorError> {
        let mut out = Vec::new();
        self.call_all(&mut |op, ctx| op.initialize_state(ctx, restored_from), &mut out)?;
        if !out.is_empty() {
            return Err(OperatorError::Failed("operators must not emit while initializing state".into()));
        }
        Ok(())
    }

    /// Opens tail to head. On error, the operators opened so far stay recorded for close.
    pub fn open(&mut self) -> Result<(), OperatorError> {
        let info = &self.info;
        for m in self.members.iter_mut().rev() {
            let mut emitted = Vec::new();
            let mut ctx = OperatorContext::new(info, &m.id, &mut m.keyed, &mut m.lists, &mut emitted);
            m.operator.open(&mut ctx)?;
            self.opened += 1;
            if !emitted.is_empty() {
                return Err(OperatorError::Failed(format!("operator {} emitted records in open", m.id)));
            }
        }
        Ok(())
    }

    /// Whether the head operator is a source (decided by its kind's factory).
    pub fn is_source(&self) -> bool {
        self.source
    }

    pub fn process_record(&mut self, record: Record, out: &mut Vec<Record>) -> Result<(), OperatorError> {
        self.push_through(0, vec![record], out)
    }

    /// The longest wait any operator asks for before the next record (see `Operator::throttle`).
    pub fn throttle(&mut self) -> Option<std::time::Duration> {
        self.members.iter_mut().filter_map(|m| m.operator.throttle()).max()
    }

    pub fn process_watermark(&mut self, watermark: u64, out: &mut Vec<Record>) -> Result<(), OperatorError> {
        self.call_all(&mut |op, ctx| op.process_watermark(watermark, ctx), out)
    }

    pub fn poll_source(&mut self, out: &mut Vec<Record>) -> Result<SourcePoll, OperatorError> {
        let mut poll = SourcePoll::Finished;
        self.call_at(
            0,
            &mut |op, ctx| {
                poll = op.poll_source(ctx)?;
                Ok(())
            },
            out,
        )?;
        Ok(poll)
    }

    pub fn stop_source(&mut self) {
        if let Some(m) = self.members.first_mut() {
            m.operator.stop_source();
        }
    }

    pub fn prepare_snapshot_pre_barrier(
        &mut self,
        checkpoint_id: u64,
        out: &mut Vec<Record>,
    ) -> Result<(), OperatorError> {
        self.call_all(&mut |op, ctx| op.prepare_snapshot_pre_barrier(checkpoint_id, ctx), out)
    }

    /// Synchronous snapshot of every operator: lets each update its list state, then serializes.
    pub fn snapshot(&mut self, target: &SnapshotTarget) -> Result<Vec<OperatorPlan>, OperatorError> {
        let mut emitted = Vec::new();
        self.call_all(&mut |op, ctx| op.snapshot_state(target.checkpoint_id, ctx), &mut emitted)?;
        if !emitted.is_empty() {
            return Err(OperatorError::Failed("operators must not emit in snapshot_state".into()));
        }
        let subtask = self.info.subtask;
        Ok(self
            .members
            .iter()
            .map(|m| plan_operator(&m.id, subtask, Some(&m.keyed), &m.lists, target))
            .collect())
    }

    /// Incremental bookkeeping after an acknowledged checkpoint.
    pub fn record_uploaded(&mut self, checkpoint_id: u64, mut uploaded: BTreeMap<String, UploadedGroups>) {
        for m in &mut self.members {
            if let Some(groups) = uploaded.remove(&m.id) {
                m.keyed.record_pending(checkpoint_id, groups);
            }
        }
    }

    pub fn notify_complete(
        &mut self,
        checkpoint_id: u64,
        out: &mut Vec<Record>,
    ) -> Result<(), OperatorError> {
        for m in &mut self.members {
            m.keyed.confirm(checkpoint_id);
        }
        self.call_all(&mut |op, ctx| op.notify_checkpoint_complete(checkpoint_id, ctx), out)
    }

    pub fn notify_aborted(&mut self, checkpoint_id: u64, out: &mut Vec<Record>) -> Result<(), OperatorError> {
        for m in &mut self.members {
            m.keyed.discard_pending(checkpoint_id);
        }
        self.call_all(&mut |op, ctx| op.notify_checkpoint_aborted(checkpoint_id, ctx), out)
    }

    pub fn end_input(&mut self, out: &mut Vec<Record>) -> Result<(), OperatorError> {
        self.call_all(&mut |op, ctx| op.end_input(ctx), out)
    }

    /// Closes head to tail the operators that were opened.
    pub fn close(&mut self, out: &mut Vec<Record>) -> Result<(), OperatorError> {
        let first_opened = self.members.len() - self.opened;
        for i in first_opened..self.members.len() {
            self.call_at(i, &mut |op, ctx| op.close(ctx), out)?;
        }
        Ok(())
    }

    /// Disposes every operator tail to head, once.
    pub fn dispose(&mut self) {
        if std::mem::replace(&mut self.disposed, true) {
            return;
        }
        for m in self.members.iter_mut().rev() {
            m.operator.dispose();
        }
    }
}
