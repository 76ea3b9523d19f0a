//! Property test: random sequences of triggers, acks, duplicate acks, declines, timeouts, task
//! failures, metadata results and commit results (including unknown outcomes, applied or not)
//! against the real replicated state machine. After every event it checks:
//! - a task hears of a checkpoint id only after the id was allocated;
//! - a checkpoint is never notified complete before its commit event;
//! - completed (notified) checkpoint ids strictly increase;
//! - no discard names a file (or a directory holding a file) that a checkpoint or savepoint
//!   retained in the replicated store references.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};
use std::time::Duration;

use cairn_protocol::checkpoint::{CheckpointMetadata, MetadataPointer, OperatorSubtaskState, SubtaskState};
use cairn_raft::model::{CheckpointConfig, CheckpointKind, Command, Outcome};
use proptest::prelude::*;
use tokio::time::Instant;

use super::core::tests::{ALL, Harness, ROOT, file, job, metrics};
use super::*;

#[derive(Debug, Clone)]
enum Op {
    Fire,
    Manual,
    Savepoint,
    Allocate {
        ok: bool,
    },
    Ack {
        task: usize,
        pick: usize,
        new_shared: bool,
        drop_one: bool,
    },
    Duplicate {
        pick: usize,
    },
    Decline {
        task: usize,
        pick: usize,
    },
    Timeout {
        pick: usize,
    },
    TaskBounce {
        task: usize,
    },
    Write {
        pick: usize,
        ok: bool,
    },
    /// 6: apply but report unknown; 7: don't apply, report unknown; otherwise commit and report.
    Commit {
        pick: usize,
        mode: u8,
    },
    Advance {
        secs: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => Just(Op::Fire),
        1 => Just(Op::Manual),
        1 => Just(Op::Savepoint),
        3 => prop::bool::weighted(0.85).prop_map(|ok| Op::Allocate { ok }),
        24 => (0..3usize, any::<usize>(), any::<bool>(), any::<bool>())
            .prop_map(|(task, pick, new_shared, drop_one)| Op::Ack { task, pick, new_shared, drop_one }),
        1 => any::<usize>().prop_map(|pick| Op::Duplicate { pick }),
        1 => (0..3usize, any::<usize>()).prop_map(|(task, pick)| Op::Decline { task, pick }),
        1 => any::<usize>().prop_map(|pick| Op::Timeout { pick }),
        1 => (0..3usize).prop_map(|task| Op::TaskBounce { task }),
        5 => (any::<usize>(), prop::bool::weighted(0.9)).prop_map(|(pick, ok)| Op::Write { pick, ok }),
        5 => (any::<usize>(), 0..16u8).prop_map(|(pick, mode)| Op::Commit { pick, mode }),
        1 => (1..20u64).prop_map(|secs| Op::Advance { secs }),
    ]
}

/// The world around the core, and what it has seen.
struct Sim {
    h: Harness,
    allocations: VecDeque<AllocationToken>,
    allocated: BTreeSet<u64>,
    kinds: BTreeMap<u64, CheckpointKind>,
    /// Metadata the core asked to write, by id (kept forever: retained checkpoints' files).
    metadata: BTreeMap<u64, (PathBuf, CheckpointMetadata)>,
    writes: BTreeSet<u64>,
    proposals: BTreeMap<u64, Command>,
    timeouts: BTreeMap<u64, Instant>,
    committed: BTreeSet<u64>,
    last_notified_checkpoint: u64,
    /// Per attempt: shared files confirmed by a completed checkpoint it acknowledged.
    confirmed: BTreeMap<TaskAttemptId, BTreeSet<String>>,
    acked: BTreeMap<(u64, TaskAttemptId), BTreeSet<String>>,
    sent_acks: Vec<(TaskAttemptId, u64, SubtaskState)>,
    next_file: u64,
    next_request: u64,
}

impl Sim {
    fn new() -> Self {
        let cfg = CheckpointConfig {
            interval: Some(Duration::from_secs(10)),
            timeout: Duration::from_secs(60),
            min_pause: Duration::from_secs(1),
            max_concurrent: 2,
            tolerable_failures: 1000,
            retained: 2,
            savepoint_dir: Some("/sp".into()),
            storage_dir: None,
            externalized_retention: Default::default(),
            ..Default::default()
        };
        let mut sim = Self {
            h: Harness::new(cfg),
            allocations: VecDeque::new(),
            allocated: BTreeSet::new(),
            kinds: BTreeMap::new(),
            metadata: BTreeMap::new(),
            writes: BTreeSet::new(),
            proposals: BTreeMap::new(),
            timeouts: BTreeMap::new(),
            committed: BTreeSet::new(),
            last_notified_checkpoint: 0,
            confirmed: BTreeMap::new(),
            acked: BTreeMap::new(),
            sent_acks: Vec::new(),
            next_file: 0,
            next_request: 0,
        };
        sim.send(Event::StartScheduler);
        sim
    }

    fn send(&mut self, event: Event) {
        let acts = self.h.handle(event);
        self.observe(&acts);
    }

    fn pick<T: Copy>(items: impl IntoIterator<Item = T>, pick: usize) -> Option<T> {
        let items: Vec<T> = items.into_iter().collect();
        (!items.is_empty()).then(|| items[pick % items.len()])
    }

    fn run(&mut self, op: Op) {
        match op {
            Op::Fire => {
                if self.h.timer.is_some() {
                    let acts = self.h.fire_timer();
                    self.observe(&acts);
                }
            }
            Op::Manual | Op::Savepoint => {
                self.next_request += 1;
                let kind = match op {
                    Op::Manual => TriggerKind::Checkpoint,
                    _ => TriggerKind::Savepoint { target_dir: None, sync: false, drain: false },
                };
                self.send(Event::TriggerRequested { request: RequestId(self.next_request), kind });
            }
            Op::Allocate { ok } => {
                if let Some(token) = self.allocations.pop_front() {
                    if ok {
                        let id = match self.h.sm.apply(&Command::AllocateCheckpointId { job: job() }) {
                            Ok(Outcome::CheckpointId { id }) => id,
                            other => panic!("{other:?}"),
                        };
                        self.allocated.insert(id);
                        self.send(Event::CheckpointIdAllocated { token, checkpoint_id: id });
                    } else {
                        self.send(Event::CheckpointIdAllocationFailed { token, error: "injected".into() });
                    }
                }
            }
            Op::Ack { task, pick, new_shared, drop_one } => {
                let attempt = ALL[task];
                let candidates = self
                    .h
                    .core
                    .pending_ids()
                    .into_iter()
                    .filter(|id| !self.acked.contains_key(&(*id, attempt)));
                let Some(id) = Self::pick(candidates, pick) else { return };
                let state = self.make_state(id, attempt, new_shared, drop_one);
                self.sent_acks.push((attempt, id, state.clone()));
                self.send(Event::TaskAcknowledged { attempt, checkpoint_id: id, state, metrics: metrics() });
            }
            Op::Duplicate { pick } => {
                if !self.sent_acks.is_empty() {
                    let (attempt, id, state) = self.sent_acks[pick % self.sent_acks.len()].clone();
                    self.send(Event::TaskAcknowledged {
                        attempt,
                        checkpoint_id: id,
                        state,
                        metrics: metrics(),
                    });
                }
            }
            Op::Decline { task, pick } => {
                if let Some(id) = Self::pick(self.h.core.pending_ids(), pick) {
                    let reason = CheckpointFailureReason::CheckpointDeclined;
                    self.send(Event::TaskDeclined {
                        attempt: ALL[task],
                        checkpoint_id: id,
                        reason,
                        detail: None,
                    });
                }
            }
            Op::Timeout { pick } => {
                if let Some(id) = Self::pick(self.timeouts.keys().copied(), pick) {
                    let at = self.timeouts.remove(&id).unwrap_or(self.h.now.instant);
                    self.h.advance_to(at);
                    self.send(Event::CheckpointTimeout { checkpoint_id: id });
                }
            }
            Op::TaskBounce { task } => {
                self.send(Event::TaskStatusChanged { attempt: ALL[task], status: TaskStatus::Failed });
                self.send(Event::TaskStatusChanged { attempt: ALL[task], status: TaskStatus::Running });
            }
            Op::Write { pick, ok } => {
                if let Some(id) = Self::pick(self.writes.iter().copied(), pick) {
                    self.writes.remove(&id);
                    if ok {
                        let path = self.metadata[&id].0.clone();
                        let pointer = MetadataPointer { path, size: 1, crc32: 1 };
                        self.send(Event::MetadataWritten { checkpoint_id: id, pointer });
                    } else {
                        self.send(Event::MetadataWriteFailed { checkpoint_id: id, error: "injected".into() });
                    }
                }
            }
            Op::Commit { pick, mode } => {
                let Some(id) = Self::pick(self.proposals.keys().copied(), pick) else { return };
                let Some(command) = self.proposals.remove(&id) else { return };
                let event = if mode == 7 {
                    Event::CompletionOutcomeUnknown { checkpoint_id: id, detail: "not applied".into() }
                } else {
                    let result = self.h.sm.apply(&command);
                    if mode == 6 {
                        Event::CompletionOutcomeUnknown { checkpoint_id: id, detail: "applied".into() }
                    } else {
                        match result {
                            Ok(outcome) => {
                                self.committed.insert(id);
                                Event::CompletionCommitted { checkpoint_id: id, outcome }
                            }
                            Err(error) => Event::CompletionRejected { checkpoint_id: id, error },
                        }
                    }
                };
                self.send(event);
            }
            Op::Advance { secs } => self.h.advance(Duration::from_secs(secs)),
        }
    }

    /// A task's state for checkpoint `id`: its exclusive file, the shared files a completed
    /// checkpoint confirmed (minus one, sometimes), and sometimes a new shared file.
    fn make_state(
        &mut self,
        id: u64,
        attempt: TaskAttemptId,
        new_shared: bool,
        drop_one: bool,
    ) -> SubtaskState {
        let savepoint = self.kinds.get(&id).is_some_and(|k| *k != CheckpointKind::Checkpoint);
        let mut shared: BTreeSet<String> = if savepoint {
            BTreeSet::new()
        } else {
            self.confirmed.get(&attempt).cloned().unwrap_or_default()
        };
        if drop_one && let Some(first) = shared.iter().next().cloned() {
            shared.remove(&first);
        }
        if new_shared && !savepoint {
            self.next_file += 1;
            shared.insert(format!("shared/t{}-{}", attempt.0, self.next_file));
        }
        self.acked.insert((id, attempt), shared.clone());
        let mut op = OperatorSubtaskState::default();
        op.list_states.push(cairn_protocol::checkpoint::OperatorListState {
            name: "own".into(),
            mode: cairn_protocol::checkpoint::OperatorStateMode::RoundRobin,
            file: file(format!("chk-{id}/t{}.state", attempt.0)),
            offsets: vec![0],
        });
        for (i, s) in shared.iter().enumerate() {
            op.list_states.push(cairn_protocol::checkpoint::OperatorListState {
                name: format!("shared-{i}"),
                mode: cairn_protocol::checkpoint::OperatorStateMode::Union,
                file: file(s.clone()),
                offsets: vec![0],
            });
        }
        SubtaskState { operators: BTreeMap::from([("op".to_string(), op)]) }
    }

    fn observe(&mut self, acts: &[Action]) {
        for a in acts {
            match a {
                Action::AllocateCheckpointId { token } => self.allocations.push_back(*token),
                Action::TriggerTasks { checkpoint_id, options, .. } => {
                    assert!(
                        self.allocated.contains(checkpoint_id),
                        "trigger for unallocated id {checkpoint_id}"
                    );
                    self.kinds.insert(*checkpoint_id, options.kind);
                }
                Action::ScheduleTimeout { checkpoint_id, at } => {
                    self.timeouts.insert(*checkpoint_id, *at);
                }
                Action::WriteMetadata { checkpoint_id, path, metadata } => {
                    self.writes.insert(*checkpoint_id);
                    self.metadata.insert(*checkpoint_id, (path.clone(), (**metadata).clone()));
                }
                Action::ProposeCompletion { checkpoint_id, command } => {
                    self.proposals.insert(*checkpoint_id, (**command).clone());
                }
                Action::NotifyComplete { checkpoint_id, .. } => {
                    let id = *checkpoint_id;
                    assert!(self.committed.contains(&id), "checkpoint {id} notified before its commit");
                    if self.kinds.get(&id) == Some(&CheckpointKind::Checkpoint) {
                        assert!(id > self.last_notified_checkpoint, "completed ids must increase: {id}");
                        self.last_notified_checkpoint = id;
                        for attempt in ALL {
                            if let Some(shared) = self.acked.get(&(id, attempt)) {
                                self.confirmed.insert(attempt, shared.clone());
                            }
                        }
                    }
                }
                Action::DiscardCheckpoint { dirs, files, .. } => self.check_discard(dirs, files),
                Action::DiscardAckedState { files, .. } => self.check_discard(&[], files),
                Action::DiscardJobCheckpoints { dirs, .. } => self.check_discard(dirs, &[]),
                _ => {}
            }
        }
    }

    /// No discard touches what the replicated store retains.
    fn check_discard(&self, dirs: &[PathBuf], files: &[PathBuf]) {
        let Some(record) = self.h.sm.job(&job()) else { return };
        let mut retained_files = BTreeSet::new();
        let mut retained_dirs = BTreeSet::new();
        let job_dir = PathBuf::from(ROOT).join(job().as_str());
        for c in &record.completed {
            retained_dirs
                .insert(Path::new(&c.metadata_path).parent().map(Path::to_path_buf).unwrap_or_default());
            retained_files.insert(PathBuf::from(&c.metadata_path));
            if let Some((_, meta)) = self.metadata.get(&c.id) {
                retained_files
                    .extend(meta.subtasks.values().flat_map(|s| s.files()).map(|f| job_dir.join(&f.path)));
            }
        }
        for s in &record.savepoints {
            retained_dirs.insert(PathBuf::from(&s.path));
            retained_files.insert(PathBuf::from(&s.checkpoint.metadata_path));
            if let Some((_, meta)) = self.metadata.get(&s.checkpoint.id) {
                let base = PathBuf::from(&s.path);
                retained_files
                    .extend(meta.subtasks.values().flat_map(|st| st.files()).map(|f| base.join(&f.path)));
            }
        }
        for f in files {
            assert!(!retained_files.contains(f), "discard names retained file {}", f.display());
        }
        for d in dirs {
            assert!(!retained_dirs.contains(d), "discard names retained directory {}", d.display());
            if let Some(f) = retained_files.iter().find(|f| f.starts_with(d)) {
                panic!("discarding {} deletes retained file {}", d.display(), f.display());
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_event_sequences_keep_invariants(ops in prop::collection::vec(op(), 1..400)) {
        let mut sim = Sim::new();
        for op in ops {
            sim.run(op);
        }
        // Periodic scheduling never stops silently.
        prop_assert!(
            sim.h.timer.is_some() || !sim.allocations.is_empty() || !sim.h.core.pending_ids().is_empty(),
            "periodic timer disarmed with nothing in flight"
        );
    }
}
