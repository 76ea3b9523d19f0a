//! One task: a mailbox loop that owns an operator chain, its inputs and outputs, its barrier
//! aligner and its in-flight asynchronous snapshots.
//!
//! [`run_task`] drives the lifecycle in the reference's order: restore state → initialize
//! operators → open (tail to head) → run → close (head to tail) → end of data downstream →
//! final checkpoint → end of input downstream → dispose; a failure or cancellation at any point
//! cancels the asynchronous snapshot parts (removing their files) and disposes the operators.
//! The loop selects, in priority order (`biased`): coordinator messages (trigger, notify,
//! abort, cancel), finished asynchronous snapshot parts, then input (records and barriers from
//! upstream, or the source's next records). During a synchronous savepoint the input arm is
//! disabled until the savepoint is notified complete or aborted. Sending downstream awaits the
//! bounded channels: a task blocked by backpressure handles its next message once the send went
//! through.
//!
//! The task accounts for its running time as Flink does ([`crate::metrics::TaskTimes`]): a send
//! waiting for room downstream is back-pressured time, waiting in the mailbox with no message,
//! outcome or input ready is idle time, and the rest is busy time.
//!
//! Finishing follows Flink's FLIP-147: once its input ended (a bounded source ran out, or every
//! upstream channel delivered `EndOfData`) a task closes its operators, sends `EndOfData`
//! downstream and stays in `finishing`, still taking part in checkpoints, until a checkpoint it
//! snapshotted after its end of data is completed. Its completion notice lets two-phase-commit
//! operators commit everything the task ever produced; once it arrived and every upstream
//! channel delivered `EndOfInput` (so no upstream task can still send it a barrier), the task
//! sends `EndOfInput` and finishes. A task whose inputs all ended takes a trigger like a source
//! does (the coordinator triggers it when every source finished). A stop-with-savepoint is its
//! own final checkpoint: a task that completed a synchronous savepoint finishes without
//! waiting.
//!
//! Unaligned checkpoints (FLIP-76): the first barrier of an unaligned checkpoint (on a priority
//! lane, overtaking the buffered records) triggers the checkpoint at once, without parking any
//! channel, and the barrier goes downstream on the priority lanes. A [`ChannelRecorder`] then
//! keeps the records still ahead of each channel's barrier; once every channel delivered them
//! they are written as the checkpoint's channel state and the acknowledgement (which waits for
//! both the asynchronous part and the channel state) carries them. An aligned checkpoint with
//! an alignment timeout turns unaligned the same way when its deadline passes. On restore the
//! channel state is replayed through the chain before any new input is read.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use cairn_protocol::checkpoint::{KeyGroupRange, TaskCheckpointMetrics};
use tokio::sync::mpsc;
use tokio::time::sleep_until;

use crate::chain::OperatorChain;
use crate::checkpoint::alignment::{AlignmentAction, BarrierAligner, ChannelMark};
use crate::checkpoint::channel_state;
use crate::checkpoint::pool::{AsyncOutcome, InFlightSnapshots, SnapshotPool};
use crate::exchange::{Barrier, ExchangeError, InputEvent, InputGate, OutputGate, Record, StreamElement};
use crate::lifecycle::{IllegalTransition, TaskState};
use crate::metrics::{AckedCheckpoint, TaskCounters, TaskObserver, Wait};
use crate::operator::{OperatorError, SourcePoll};
use crate::state::StateError;
use crate::state::restore::load;
use crate::state::snapshot::{SnapshotTarget, WrittenSnapshot, remove_files};
use crate::state::storage::CheckpointStorage;
use cairn_protocol::assign::TaskRestore;
use cairn_protocol::checkpoint::{ChannelStateHandle, CheckpointLayout};
use cairn_protocol::messages::{
    CheckpointOptions, CoordinatorMessage, DeclineReason, TaskAttemptId, TaskMessage, TermFence, ToTask,
};

/// Everything a task is built from.
pub struct TaskSetup {
    pub id: TaskAttemptId,
    pub chain: OperatorChain,
    pub inputs: InputGate,
    pub outputs: OutputGate,
    /// Coordinator → task (bounded).
    pub control: mpsc::Receiver<CoordinatorMessage>,
    /// Task → coordinator (bounded, shared by the tasks of a worker).
    pub reports: mpsc::Sender<TaskMessage>,
    pub restore: Option<TaskRestore>,
    pub storage: CheckpointStorage,
    pub pool: SnapshotPool,
    /// Upload only changed key groups to `shared/` for periodic checkpoints.
    pub incremental: bool,
    pub observer: TaskObserver,
}

/// How a task ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskOutcome {
    Finished,
    Failed(String),
    Canceled,
}

/// Why the loop stopped early.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    #[error("canceled")]
    Canceled,
    #[error("operator failed: {0}")]
    Operator(#[from] OperatorError),
    #[error(transparent)]
    Exchange(#[from] ExchangeError),
    #[error("restoring state failed: {0}")]
    Restore(#[source] StateError),
    #[error("input channel {channel} closed without end of input (upstream task died)")]
    UpstreamDisconnected { channel: usize },
    #[error("input channel {channel} delivered a record after its end of data")]
    RecordAfterEndOfData { channel: usize },
    #[error(transparent)]
    Lifecycle(#[from] IllegalTransition),
}

/// What woke the mailbox.
enum Wake {
    Control(Option<CoordinatorMessage>),
    AsyncPart(AsyncOutcome),
    Input(InputEvent),
    SourceDue,
    AlignmentTimeout,
    OutputRoom,
}

/// The in-flight records of a checkpoint, for its acknowledgement.
#[derive(Debug)]
enum ChannelPart {
    /// Aligned, or nothing was in flight.
    None,
    /// The recorder is still collecting them.
    Recording,
    Written(ChannelStateHandle),
}

/// Figures of a checkpoint between its synchronous part and its acknowledgement.
#[derive(Debug)]
struct PendingAck {
    metrics: TaskCheckpointMetrics,
    /// The coordinator aborted it: drop the result instead of acknowledging.
    aborted: bool,
    /// The asynchronous part's result, once it is in and the channel state is not.
    written: Option<WrittenSnapshot>,
    channels: ChannelPart,
}

struct Task {
    id: TaskAttemptId,
    state: TaskState,
    chain: OperatorChain,
    inputs: InputGate,
    outputs: OutputGate,
    control: mpsc::Receiver<CoordinatorMessage>,
    reports: mpsc::Sender<TaskMessage>,
    restore: Option<TaskRestore>,
    storage: CheckpointStorage,
    in_flight: InFlightSnapshots,
    incremental: bool,
    observer: TaskObserver,
    aligner: BarrierAligner,
    fence: TermFence,
    pending: BTreeMap<u64, PendingAck>,
    /// Set while a synchronous savepoint waits for its completion: no input is processed.
    sync_savepoint: Option<u64>,
    /// All inputs (or the source) ended: no record will be processed any more.
    input_ended: bool,
    /// Input channels that delivered `EndOfData` (or `EndOfInput`).
    data_ended: Vec<bool>,
    /// The first checkpoint snapshotted after the input ended: its completion (or a later
    /// one's) lets the task finish.
    final_checkpoint: Option<u64>,
    /// A completion notice covering `final_checkpoint` arrived, or a synchronous savepoint
    /// (stop-with-savepoint) completed: nothing is left to wait for once the input ended.
    may_finish: bool,
    /// The source asked not to be polled before this instant (on tokio's clock, which tests
    /// can pause).
    source_idle_until: Option<tokio::time::Instant>,
    /// The most records one source poll or one input element has made the chain emit: the room
    /// the task waits for in every output channel before it takes more (so that, once it knows
    /// its bursts, it never waits inside a send).
    burst: usize,
    watermarks: Vec<u64>,
    current_watermark: u64,
}

/// Runs a task to its end. Never panics on task errors: they become [`TaskOutcome::Failed`]
/// (reported to the coordinator exactly once).
pub async fn run_task(setup: TaskSetup) -> TaskOutcome {
    let mut task = Task::new(setup);
    let result = task.invoke().await;
    task.conclude(result).await
}

impl Task {
    fn new(s: TaskSetup) -> Self {
        let n = s.inputs.len();
        Self {
            id: s.id,
            state: TaskState::Created,
            chain: s.chain,
            inputs: s.inputs,
            outputs: s.outputs.counting_into(s.observer.counters.clone()),
            control: s.control,
            reports: s.reports,
            restore: s.restore,
            storage: s.storage,
            in_flight: InFlightSnapshots::new(s.pool),
            incremental: s.incremental,
            observer: s.observer,
            aligner: BarrierAligner::new(n),
            fence: TermFence::default(),
            pending: BTreeMap::new(),
            sync_savepoint: None,
            input_ended: false,
            data_ended: vec![false; n],
            final_checkpoint: None,
            may_finish: false,
            source_idle_until: None,
            burst: 1,
            watermarks: vec![0; n],
            current_watermark: 0,
        }
    }

    fn counters(&self) -> &TaskCounters {
        &self.observer.counters
    }

    async fn report(&mut self, msg: TaskMessage) {
        if self.reports.send(msg).await.is_err() {
            tracing::warn!(task = %self.id, "coordinator link closed; report dropped");
        }
    }

    async fn set_state(&mut self, to: TaskState) -> Result<(), TaskError> {
        self.state.transition(to)?;
        tracing::info!(task = %self.id, state = %self.state, "task state");
        if self.state == TaskState::Running {
            self.counters().start_running();
        } else if self.state.is_terminal() {
            self.counters().stop_running();
        }
        self.observer.state.send_replace(self.state.clone());
        self.report(TaskMessage::Status { task: self.id.clone(), status: self.state.status() }).await;
        Ok(())
    }

    async fn invoke(&mut self) -> Result<(), TaskError> {
        self.set_state(TaskState::Restoring).await?;
        let restored_from = self.restore.as_ref().map(|r| r.checkpoint_id);
        let mut in_flight = Vec::new();
        if let Some(restore) = self.restore.take() {
            let info = self.chain.info();
            let own = KeyGroupRange::for_subtask(info.max_parallelism, info.parallelism, info.subtask);
            if own != Some(restore.key_groups) {
                return Err(TaskError::Restore(StateError::Assignment {
                    vertex: info.vertex.clone(),
                    reason: format!(
                        "restore descriptor covers key groups {:?}, subtask {} of {} owns {own:?}",
                        restore.key_groups, info.subtask, info.parallelism
                    ),
                }));
            }
            // Shared files of our own checkpoints may be referenced again by incremental
            // checkpoints; files of another job's snapshot (a restore from another job's
            // retained checkpoint) never are, so this job's first checkpoint is full and it
            // never depends on, nor deletes, files it does not own.
            let own_files = restore.base_dir == self.storage.job_dir();
            let loading = tokio::task::spawn_blocking(move || load(&restore));
            let mut loaded = self
                .while_not_running(loading)
                .await?
                .map_err(|e| TaskError::Restore(StateError::Worker(e.to_string())))?
                .map_err(TaskError::Restore)?;
            in_flight = std::mem::take(&mut loaded.in_flight);
            self.chain.install_restored(loaded, own_files)?;
        }
        self.chain.initialize_state(restored_from)?;
        self.drain_control_while_not_running().await?;
        self.chain.open()?;
        self.set_state(TaskState::Running).await?;
        if !in_flight.is_empty() {
            // The records an unaligned checkpoint caught in flight come first, as they did; the
            // task takes part in checkpoints meanwhile (what is left of them is in flight still).
            tracing::info!(task = %self.id, records = in_flight.len(), "replaying in-flight records");
            self.inputs.set_recovered(in_flight);
        }

        self.run_loop().await?;

        self.set_state(TaskState::Finishing).await?;
        let mut out = Vec::new();
        self.chain.close(&mut out)?;
        self.emit(out).await?;
        self.outputs.broadcast(StreamElement::EndOfData).await?;
        self.await_final_checkpoint().await?;
        self.outputs.broadcast(StreamElement::EndOfInput).await?;
        // Checkpoints already snapshotted are still acknowledged.
        while !self.in_flight.is_empty() {
            let outcome = self.in_flight.next().await;
            self.on_async_outcome(outcome).await?;
        }
        self.chain.dispose();
        self.set_state(TaskState::Finished).await?;
        Ok(())
    }

    /// Cleans up after the loop and turns the result into the outcome.
    async fn conclude(&mut self, result: Result<(), TaskError>) -> TaskOutcome {
        let outcome = match result {
            Ok(()) => return TaskOutcome::Finished,
            Err(TaskError::Canceled) => TaskOutcome::Canceled,
            Err(e) => {
                let mut cause = e.to_string();
                let mut src = std::error::Error::source(&e);
                while let Some(s) = src {
                    let text = s.to_string();
                    if !cause.contains(&text) {
                        cause.push_str(": ");
                        cause.push_str(&text);
                    }
                    src = s.source();
                }
                TaskOutcome::Failed(cause)
            }
        };
        self.in_flight.cancel_all().await;
        self.chain.dispose();
        let terminal = match &outcome {
            TaskOutcome::Canceled => TaskState::Canceled,
            TaskOutcome::Failed(cause) => {
                tracing::error!(task = %self.id, cause = %cause, "task failed");
                TaskState::Failed(cause.clone())
            }
            TaskOutcome::Finished => TaskState::Finished,
        };
        if let Err(e) = self.set_state(terminal).await {
            tracing::error!(task = %self.id, error = %e, "cannot record the task's end");
        }
        outcome
    }

    /// Awaits `fut` while answering coordinator messages the way a not-yet-running task does.
    async fn while_not_running<F: std::future::Future>(&mut self, fut: F) -> Result<F::Output, TaskError> {
        tokio::pin!(fut);
        loop {
            tokio::select! {
                biased;
                msg = self.control.recv() => self.on_control_not_running(msg).await?,
                out = &mut fut => return Ok(out),
            }
        }
    }

    async fn drain_control_while_not_running(&mut self) -> Result<(), TaskError> {
        loop {
            match self.control.try_recv() {
                Ok(msg) => self.on_control_not_running(Some(msg)).await?,
                Err(mpsc::error::TryRecvError::Empty) => return Ok(()),
                Err(mpsc::error::TryRecvError::Disconnected) => return Err(TaskError::Canceled),
            }
        }
    }

    async fn on_control_not_running(&mut self, msg: Option<CoordinatorMessage>) -> Result<(), TaskError> {
        let Some(msg) = msg else { return Err(TaskError::Canceled) };
        if !self.admit(&msg) {
            return Ok(());
        }
        match msg.body {
            ToTask::Cancel => Err(TaskError::Canceled),
            ToTask::TriggerCheckpoint { checkpoint_id, .. } => {
                self.decline(checkpoint_id, DeclineReason::TaskNotReady).await;
                self.outputs.broadcast(StreamElement::CancelMarker(checkpoint_id)).await?;
                Ok(())
            }
            other => {
                tracing::debug!(task = %self.id, message = ?other, "ignoring notification while not running");
                Ok(())
            }
        }
    }

    fn admit(&mut self, msg: &CoordinatorMessage) -> bool {
        if self.fence.admit(msg.term) {
            return true;
        }
        tracing::warn!(
            task = %self.id,
            term = msg.term,
            highest_term = self.fence.highest(),
            message = ?msg.body,
            "ignoring message from a stale leader term"
        );
        false
    }

    async fn run_loop(&mut self) -> Result<(), TaskError> {
        while !self.input_ended {
            self.turn(true).await?;
        }
        Ok(())
    }

    /// After the end of data: keeps answering the coordinator, acknowledging checkpoints and
    /// forwarding barriers until a checkpoint taken since is completed and every upstream task
    /// finished.
    async fn await_final_checkpoint(&mut self) -> Result<(), TaskError> {
        if !self.may_finish {
            tracing::info!(task = %self.id, "end of data: waiting for a final checkpoint");
        }
        while !(self.may_finish && self.inputs.all_finished()) {
            self.turn(false).await?;
        }
        Ok(())
    }

    /// One turn of the mailbox: a coordinator message, a finished asynchronous part, or input
    /// (records, barriers and events from upstream; for a source, its next records while
    /// `poll_source`).
    ///
    /// Waiting for one of them when none is ready is idle time; handling it is not.
    async fn turn(&mut self, poll_source: bool) -> Result<(), TaskError> {
        let is_source = self.chain.is_source();
        let input_open = self.sync_savepoint.is_none();
        let idle_until = self.source_idle_until;
        let align_deadline = self.aligner.deadline().filter(|_| input_open);
        // A task that used up its cooperative budget yields here, untimed: otherwise its wakes
        // would find nothing ready (the budget says so, not the channels) and the time until it
        // runs again would count as idle.
        if !tokio::task::coop::has_budget_remaining() {
            tokio::task::coop::consume_budget().await;
        }
        // New input, or a source's next records, only while every output channel has room; the
        // wait for room is back-pressured time, spent answering the coordinator.
        let burst = self.burst;
        let room = self.outputs.has_room(burst);
        let waiting = if room { Wait::Idle } else { Wait::BackPressured };
        let (control, in_flight, inputs, outputs) =
            (&mut self.control, &mut self.in_flight, &mut self.inputs, &self.outputs);
        let wake = self.observer.counters.time_if_pending(waiting, async {
            tokio::select! {
                biased;
                msg = control.recv() => Wake::Control(msg),
                outcome = in_flight.next(), if !in_flight.is_empty() => Wake::AsyncPart(outcome),
                event = inputs.next_if(room), if input_open && !is_source => Wake::Input(event),
                _ = wait_until(idle_until), if input_open && is_source && poll_source && room => Wake::SourceDue,
                _ = outputs.room(burst), if !room => Wake::OutputRoom,
                _ = wait_until(align_deadline), if align_deadline.is_some() => Wake::AlignmentTimeout,
            }
        });
        match wake.await {
            Wake::Control(Some(msg)) => self.on_control(msg).await,
            Wake::Control(None) => Err(TaskError::Canceled),
            Wake::AsyncPart(outcome) => self.on_async_outcome(outcome).await,
            Wake::Input(event) => self.on_input(event).await,
            Wake::SourceDue => self.poll_source().await,
            Wake::AlignmentTimeout => {
                let actions = self.aligner.on_timeout();
                self.apply_alignment(actions).await
            }
            Wake::OutputRoom => Ok(()),
        }
    }

    async fn emit(&mut self, records: Vec<Record>) -> Result<(), TaskError> {
        self.burst = self.burst.max(records.len());
        let n = records.len() as u64;
        for r in records {
            self.outputs.emit(r).await?;
        }
        TaskCounters::add(&self.counters().records_out, n);
        Ok(())
    }

    async fn decline(&mut self, checkpoint_id: u64, reason: DeclineReason) {
        tracing::info!(task = %self.id, checkpoint_id, reason = %reason, "declining checkpoint");
        TaskCounters::add(&self.counters().checkpoints_declined, 1);
        if let Some(series) = &self.observer.export {
            series.declined();
        }
        self.report(TaskMessage::Decline { task: self.id.clone(), checkpoint_id, reason }).await;
    }

    async fn on_control(&mut self, msg: CoordinatorMessage) -> Result<(), TaskError> {
        if !self.admit(&msg) {
            return Ok(());
        }
        match msg.body {
            ToTask::TriggerCheckpoint { checkpoint_id, timestamp_ms, options } => {
                self.on_trigger(checkpoint_id, timestamp_ms, options).await
            }
            ToTask::NotifyCheckpointComplete { checkpoint_id } => {
                self.on_notify_complete(checkpoint_id).await
            }
            ToTask::NotifyCheckpointAborted { checkpoint_id } => self.on_notify_aborted(checkpoint_id).await,
            ToTask::Cancel => Err(TaskError::Canceled),
        }
    }

    async fn on_trigger(
        &mut self,
        checkpoint_id: u64,
        timestamp_ms: u64,
        options: CheckpointOptions,
    ) -> Result<(), TaskError> {
        // A task whose inputs all ended is triggered like a source once its upstream finished.
        if !self.chain.is_source() && !self.input_ended {
            self.decline(checkpoint_id, DeclineReason::NotASource).await;
            return Ok(());
        }
        self.aligner.note_triggered(checkpoint_id);
        let barrier = Barrier { checkpoint_id, timestamp_ms, options };
        // A task triggered like a source has no input left to record.
        self.perform_checkpoint(barrier, Duration::ZERO, None).await
    }

    /// Prepare → forward the barrier → synchronous snapshot → start the asynchronous part.
    /// `unaligned` names where each input channel stands relative to the barrier when the
    /// checkpoint is taken unaligned: the records still ahead of the barriers are recorded.
    async fn perform_checkpoint(
        &mut self,
        barrier: Barrier,
        alignment: Duration,
        unaligned: Option<Vec<ChannelMark>>,
    ) -> Result<(), TaskError> {
        let id = barrier.checkpoint_id;
        if !matches!(self.state, TaskState::Running | TaskState::Finishing) || self.sync_savepoint.is_some() {
            self.decline(id, DeclineReason::TaskNotReady).await;
            self.outputs.broadcast(StreamElement::CancelMarker(id)).await?;
            return Ok(());
        }
        let started = Instant::now();
        let start_delay_ms = crate::element::now_ms().saturating_sub(barrier.timestamp_ms);
        let kind = barrier.options.kind;
        tracing::debug!(task = %self.id, checkpoint_id = id, kind = kind.as_str(), "starting checkpoint");
        if kind.is_synchronous() {
            self.sync_savepoint = Some(id);
            if barrier.options.drain && self.chain.is_source() {
                self.advance_to_end_of_event_time().await?;
            }
        }
        let mut out = Vec::new();
        self.chain.prepare_snapshot_pre_barrier(id, &mut out)?;
        self.emit(out).await?;
        let target = match (&barrier.options.target_location, kind.is_savepoint()) {
            (Some(dir), true) => SnapshotTarget::savepoint(dir, id),
            (_, savepoint) => SnapshotTarget::checkpoint(&self.storage, id, self.incremental && !savepoint),
        };
        self.outputs.broadcast(StreamElement::Barrier(barrier)).await?;
        let plans = match self.chain.snapshot(&target) {
            Ok(plans) => plans,
            Err(e) if kind.is_synchronous() => {
                // Stop-with-savepoint: without this snapshot the task would go back to normal
                // processing although its job is being stopped, so it fails (as Flink does).
                self.decline(id, DeclineReason::SnapshotFailed(e.to_string())).await;
                return Err(e.into());
            }
            Err(e) => {
                // A failed synchronous part costs this checkpoint, not the task.
                tracing::warn!(task = %self.id, checkpoint_id = id, error = %e,
                    "synchronous part of the checkpoint failed; declining it");
                self.decline(id, DeclineReason::SnapshotFailed(format!("synchronous part: {e}"))).await;
                return Ok(());
            }
        };
        let sync = started.elapsed();
        TaskCounters::add(&self.counters().sync_pause_micros, sync.as_micros() as u64);
        let metrics = TaskCheckpointMetrics {
            start_delay_ms,
            alignment_ms: alignment.as_millis() as u64,
            sync_ms: sync.as_millis() as u64,
            ..Default::default()
        };
        if self.state == TaskState::Finishing && !kind.is_synchronous() {
            self.final_checkpoint.get_or_insert(id);
        }
        let channels = match unaligned {
            Some(marks) => self.start_recording(id, &marks).await,
            None => ChannelPart::None,
        };
        self.pending.insert(id, PendingAck { metrics, aborted: false, written: None, channels });
        self.in_flight.spawn(self.storage.clone(), target, plans);
        Ok(())
    }

    /// Starts recording the in-flight records of unaligned checkpoint `id`.
    async fn start_recording(&mut self, id: u64, marks: &[ChannelMark]) -> ChannelPart {
        if let Some(old_id) = self.inputs.recording() {
            // Only one unaligned checkpoint runs at a time: an older one still recording was
            // aborted or expired by the coordinator, or is subsumed now.
            self.inputs.abandon_recording(old_id);
            if self.pending.remove(&old_id).is_some_and(|p| !p.aborted) {
                self.in_flight.cancel(old_id);
                self.decline(old_id, DeclineReason::Subsumed { newer: id }).await;
            }
        }
        if self.inputs.start_recording(id, marks, &self.data_ended) {
            ChannelPart::Recording
        } else {
            ChannelPart::None
        }
    }

    /// Once the input gate has every channel's in-flight records: writes them and acknowledges
    /// the checkpoint if its asynchronous part is in too.
    async fn finish_recording_if_complete(&mut self) -> Result<(), TaskError> {
        let Some((id, records)) = self.inputs.take_completed_recording() else { return Ok(()) };
        let Some(mut pending) = self.pending.remove(&id) else { return Ok(()) };
        if pending.aborted {
            return Ok(());
        }
        let channels = if records.is_empty() {
            ChannelPart::None
        } else {
            let info = self.chain.info();
            let head = self.chain.operator_ids().next().unwrap_or(info.vertex.as_str());
            let rel = format!("{}/{head}-{}.channels", CheckpointLayout::chk_rel(id), info.subtask);
            let (storage, base) = (self.storage.clone(), self.storage.job_dir().to_owned());
            let written =
                tokio::task::spawn_blocking(move || channel_state::write(&storage, &base, rel, &records))
                    .await;
            match written {
                Ok(Ok(handle)) => ChannelPart::Written(handle),
                Ok(Err(e)) => {
                    tracing::warn!(task = %self.id, checkpoint_id = id, error = %e,
                        "writing the in-flight records failed; declining the checkpoint");
                    if let Some(w) = &pending.written {
                        remove_files(&w.written);
                    }
                    self.in_flight.cancel(id);
                    self.decline(id, DeclineReason::SnapshotFailed(format!("channel state: {e}"))).await;
                    return Ok(());
                }
                Err(e) => return Err(TaskError::Restore(StateError::Worker(e.to_string()))),
            }
        };
        pending.channels = channels;
        if pending.written.is_some() {
            self.acknowledge(id, pending).await;
        } else {
            self.pending.insert(id, pending);
        }
        Ok(())
    }

    /// Sends the acknowledgement of checkpoint `id`, whose asynchronous part and channel state
    /// are both written.
    async fn acknowledge(&mut self, id: u64, pending: PendingAck) {
        let PendingAck { mut metrics, written: Some(mut written), channels, .. } = pending else { return };
        if let ChannelPart::Written(handle) = channels {
            metrics.channel_state_bytes = handle.file.size;
            written.bytes_persisted = written.bytes_persisted.saturating_add(handle.file.size);
            let head = self.chain.operator_ids().next().unwrap_or_default().to_owned();
            written.state.operators.entry(head).or_default().channel_state = Some(handle);
        }
        metrics.bytes_persisted = written.bytes_persisted;
        metrics.state_size = written.state.state_size();
        self.chain.record_uploaded(id, written.uploaded);
        let counters = self.counters();
        TaskCounters::add(&counters.bytes_persisted, written.bytes_persisted);
        TaskCounters::add(&counters.checkpoints_acknowledged, 1);
        self.observer.last_ack.send_replace(Some(AckedCheckpoint { checkpoint_id: id, metrics }));
        if let Some(series) = &self.observer.export {
            series.acknowledged(id, &metrics);
        }
        tracing::debug!(task = %self.id, checkpoint_id = id, ?metrics, "acknowledging checkpoint");
        self.report(TaskMessage::Acknowledge {
            task: self.id.clone(),
            checkpoint_id: id,
            state: written.state,
            metrics,
        })
        .await;
    }

    async fn advance_to_end_of_event_time(&mut self) -> Result<(), TaskError> {
        let mut out = Vec::new();
        self.chain.process_watermark(u64::MAX, &mut out)?;
        self.emit(out).await?;
        self.current_watermark = u64::MAX;
        self.outputs.broadcast(StreamElement::Watermark(u64::MAX)).await?;
        Ok(())
    }

    async fn on_async_outcome(&mut self, outcome: AsyncOutcome) -> Result<(), TaskError> {
        let id = outcome.checkpoint_id;
        let pending = self.pending.remove(&id);
        if outcome.result.is_err() {
            // The checkpoint is declined: its in-flight records are not needed.
            self.inputs.abandon_recording(id);
        }
        match outcome.result {
            Ok(written) => {
                let Some(mut pending) = pending.filter(|p| !p.aborted) else {
                    tracing::debug!(task = %self.id, checkpoint_id = id, "dropping files of an aborted checkpoint");
                    remove_files(&written.written);
                    return Ok(());
                };
                pending.metrics.async_ms = outcome.duration.as_millis() as u64;
                pending.written = Some(written);
                if matches!(pending.channels, ChannelPart::Recording) {
                    // The acknowledgement waits for the in-flight records.
                    self.pending.insert(id, pending);
                } else {
                    self.acknowledge(id, pending).await;
                }
                Ok(())
            }
            Err(StateError::Cancelled { .. }) => {
                tracing::debug!(task = %self.id, checkpoint_id = id, "asynchronous part cancelled");
                Ok(())
            }
            Err(source) if checkpoint_dir_discarded(&source, id) => {
                // The coordinator discards the directory of a checkpoint it aborted (as Flink
                // does); a task whose asynchronous part was still writing into it can learn of
                // the abort this way before the notification arrives. That is no failure of the
                // task: decline (a late decline is ignored, and one for a checkpoint still
                // pending counts against its tolerable failures) and go on.
                tracing::info!(task = %self.id, checkpoint_id = id, error = %source,
                    "checkpoint directory discarded while writing; declining the checkpoint");
                self.decline(id, DeclineReason::SnapshotFailed(source.to_string())).await;
                Ok(())
            }
            Err(source) => {
                // A failed asynchronous part (a full or slow disk, a vanished directory) costs
                // this checkpoint, not the task: decline it and keep processing (Flink's
                // `handleExecutionException`). The coordinator's failure manager decides whether
                // failing checkpoints mean the job must fail over.
                tracing::warn!(task = %self.id, checkpoint_id = id, error = %source,
                    "asynchronous part of the checkpoint failed; declining it");
                self.decline(id, DeclineReason::SnapshotFailed(format!("asynchronous part: {source}"))).await;
                Ok(())
            }
        }
    }

    async fn on_notify_complete(&mut self, checkpoint_id: u64) -> Result<(), TaskError> {
        if !matches!(self.state, TaskState::Running | TaskState::Finishing) {
            tracing::debug!(task = %self.id, checkpoint_id, "ignoring completion while not running");
            return Ok(());
        }
        let mut out = Vec::new();
        self.chain.notify_complete(checkpoint_id, &mut out)?;
        self.emit(out).await?;
        if self.final_checkpoint.is_some_and(|f| checkpoint_id >= f) {
            tracing::info!(task = %self.id, checkpoint_id, "final checkpoint complete; finishing");
            self.may_finish = true;
        }
        if self.sync_savepoint == Some(checkpoint_id) {
            self.sync_savepoint = None;
            // Stop-with-savepoint: the savepoint is the final checkpoint of every task.
            self.may_finish = true;
            tracing::info!(task = %self.id, checkpoint_id, "synchronous savepoint complete; finishing");
            if self.chain.is_source() {
                self.chain.stop_source();
                self.end_input().await?;
            }
        }
        Ok(())
    }

    async fn on_notify_aborted(&mut self, checkpoint_id: u64) -> Result<(), TaskError> {
        if let Some(p) = self.pending.get_mut(&checkpoint_id) {
            p.aborted = true;
            if let Some(w) = p.written.take() {
                remove_files(&w.written);
            }
            self.in_flight.cancel(checkpoint_id);
        }
        self.inputs.abandon_recording(checkpoint_id);
        if self.aligner.aligning() == Some(checkpoint_id) {
            let actions = self.aligner.on_cancel(checkpoint_id, DeclineReason::AbortedByCoordinator);
            self.apply_alignment(actions).await?;
        }
        if self.sync_savepoint == Some(checkpoint_id) {
            tracing::info!(task = %self.id, checkpoint_id, "synchronous savepoint aborted; resuming");
            self.sync_savepoint = None;
        }
        if matches!(self.state, TaskState::Running | TaskState::Finishing) {
            let mut out = Vec::new();
            self.chain.notify_aborted(checkpoint_id, &mut out)?;
            self.emit(out).await?;
        }
        Ok(())
    }

    async fn end_input(&mut self) -> Result<(), TaskError> {
        if self.input_ended {
            return Ok(());
        }
        let mut out = Vec::new();
        self.chain.end_input(&mut out)?;
        self.emit(out).await?;
        self.input_ended = true;
        Ok(())
    }

    async fn poll_source(&mut self) -> Result<(), TaskError> {
        let mut out = Vec::new();
        let poll = self.chain.poll_source(&mut out)?;
        self.emit(out).await?;
        match poll {
            SourcePoll::Emitted => self.source_idle_until = None,
            SourcePoll::Idle(d) => self.source_idle_until = Some(tokio::time::Instant::now() + d),
            SourcePoll::Finished => self.end_input().await?,
        }
        Ok(())
    }

    async fn on_input(&mut self, event: InputEvent) -> Result<(), TaskError> {
        let (channel, element) = match event {
            InputEvent::Disconnected { channel } => return Err(TaskError::UpstreamDisconnected { channel }),
            InputEvent::Priority { channel, event } => {
                self.on_priority_barrier(channel, event.barrier, event.records_before).await?;
                self.sync_parking();
                return self.finish_recording_if_complete().await;
            }
            InputEvent::RecordingComplete => return self.finish_recording_if_complete().await,
            InputEvent::Recovered(r) => {
                self.process(r).await?;
                return self.finish_recording_if_complete().await;
            }
            InputEvent::Element { channel, element } => (channel, element),
        };
        match element {
            StreamElement::Record(_) if self.data_ended.get(channel).copied().unwrap_or(true) => {
                return Err(TaskError::RecordAfterEndOfData { channel });
            }
            StreamElement::Watermark(_) if self.input_ended => {}
            StreamElement::Record(r) => self.process(r).await?,
            StreamElement::Watermark(w) => {
                if let Some(slot) = self.watermarks.get_mut(channel) {
                    *slot = (*slot).max(w);
                }
                self.advance_watermark().await?;
            }
            StreamElement::Barrier(b) if self.inputs.recording() == Some(b.checkpoint_id) => {
                // The barrier of the checkpoint being recorded: the input gate noted its place
                // when it took it from the channel.
            }
            StreamElement::Barrier(b) if b.options.is_unaligned() => {
                // An unaligned barrier without a priority lane: it marks its position itself.
                let delivered = self.delivered(channel);
                self.on_priority_barrier(channel, b, delivered).await?;
            }
            StreamElement::Barrier(b) => {
                let actions = self.aligner.on_barrier(channel, b);
                self.apply_alignment(actions).await?;
            }
            StreamElement::CancelMarker(id) => {
                let actions = self.aligner.on_cancel(id, DeclineReason::CanceledUpstream);
                self.apply_alignment(actions).await?;
            }
            StreamElement::EndOfData => self.on_end_of_data(channel).await?,
            StreamElement::EndOfInput => {
                self.inputs.mark_finished(channel);
                let actions = self.aligner.on_end_of_input(channel);
                self.apply_alignment(actions).await?;
                self.on_end_of_data(channel).await?;
            }
        }
        self.sync_parking();
        self.finish_recording_if_complete().await
    }

    async fn process(&mut self, r: Record) -> Result<(), TaskError> {
        TaskCounters::add(&self.counters().records_in, 1);
        let mut out = Vec::new();
        self.chain.process_record(r, &mut out)?;
        self.emit(out).await?;
        if let Some(pause) = self.chain.throttle() {
            tokio::time::sleep(pause).await;
        }
        Ok(())
    }

    fn delivered(&self, channel: usize) -> u64 {
        self.inputs.records_delivered().get(channel).copied().unwrap_or(0)
    }

    /// A barrier that overtook `records_before` records of `channel` (an unaligned one), or the
    /// announcement of an aligned one that may turn unaligned.
    async fn on_priority_barrier(
        &mut self,
        channel: usize,
        barrier: Barrier,
        records_before: u64,
    ) -> Result<(), TaskError> {
        let id = barrier.checkpoint_id;
        if self.inputs.recording() == Some(id) {
            self.inputs.set_boundary(channel, records_before);
            return Ok(());
        }
        if !barrier.options.is_unaligned() {
            let actions = self.aligner.on_announcement(channel, &barrier, records_before);
            return self.apply_alignment(actions).await;
        }
        let Some(aborts) = self.aligner.begin_unaligned(id) else {
            tracing::debug!(task = %self.id, checkpoint_id = id, channel, "dropping a stale unaligned barrier");
            return Ok(());
        };
        let stale = aborts
            .iter()
            .any(|a| matches!(a, AlignmentAction::Abort { checkpoint_id, .. } if *checkpoint_id == id));
        self.apply_alignment(aborts).await?;
        if stale {
            return Ok(());
        }
        let mut marks = vec![ChannelMark::Unknown; self.inputs.len()];
        if let Some(m) = marks.get_mut(channel) {
            *m = ChannelMark::Announced(records_before);
        }
        self.perform_checkpoint(barrier, Duration::ZERO, Some(marks)).await
    }

    /// A channel will deliver no more records (its barriers still count for alignment until
    /// its `EndOfInput`); once every channel did, the task's input ended.
    async fn on_end_of_data(&mut self, channel: usize) -> Result<(), TaskError> {
        if let Some(ended) = self.data_ended.get_mut(channel) {
            *ended = true;
        }
        if self.input_ended {
            return Ok(());
        }
        if let Some(slot) = self.watermarks.get_mut(channel) {
            *slot = u64::MAX;
        }
        if self.data_ended.iter().all(|e| *e) {
            self.end_input().await
        } else {
            self.advance_watermark().await
        }
    }

    async fn advance_watermark(&mut self) -> Result<(), TaskError> {
        let min = self.watermarks.iter().copied().min().unwrap_or(0);
        if min > self.current_watermark {
            self.current_watermark = min;
            let mut out = Vec::new();
            self.chain.process_watermark(min, &mut out)?;
            self.emit(out).await?;
            self.outputs.broadcast(StreamElement::Watermark(min)).await?;
        }
        Ok(())
    }

    fn sync_parking(&mut self) {
        for i in 0..self.inputs.len() {
            self.inputs.set_parked(i, self.aligner.is_parked(i));
        }
    }

    async fn apply_alignment(&mut self, actions: Vec<AlignmentAction>) -> Result<(), TaskError> {
        for action in actions {
            match action {
                AlignmentAction::Trigger { barrier, alignment } => {
                    self.sync_parking();
                    self.perform_checkpoint(barrier, alignment, None).await?;
                }
                AlignmentAction::TriggerUnaligned { barrier, alignment, channels } => {
                    self.sync_parking();
                    self.perform_checkpoint(barrier, alignment, Some(channels)).await?;
                }
                AlignmentAction::Abort { checkpoint_id, reason } => {
                    self.decline(checkpoint_id, reason).await;
                    self.outputs.broadcast(StreamElement::CancelMarker(checkpoint_id)).await?;
                }
            }
        }
        self.sync_parking();
        Ok(())
    }
}

async fn wait_until(deadline: Option<tokio::time::Instant>) {
    if let Some(d) = deadline {
        sleep_until(d).await;
    }
}

/// Whether a snapshot failed because its own checkpoint directory (`chk-<id>`) vanished: a write
/// or sync inside it found it gone.
fn checkpoint_dir_discarded(err: &StateError, checkpoint_id: u64) -> bool {
    let StateError::Io { path, source } = err else { return false };
    let chk = CheckpointLayout::chk_rel(checkpoint_id);
    source.kind() == std::io::ErrorKind::NotFound && path.components().any(|c| c.as_os_str() == chk.as_str())
}
