//! Rule tests of the core, on a scripted job: `src` (2 source subtasks, attempts 1 and 2) →
//! `map` (1 subtask, attempt 3). Ids are allocated and completions committed through the real
//! replicated state machine, so retention outcomes are the ones Raft would return. Time is
//! synthetic and only moves when a test says so.

mod completion_rules;
mod finished_rules;
mod lifecycle_rules;
mod pending_rules;
mod trigger_rules;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use cairn_protocol::checkpoint::{
    MetadataPointer, OperatorSubtaskState, StateFile, SubtaskState, TaskCheckpointMetrics,
};
use cairn_raft::model::{CheckpointConfig, Command, JobId, JobSpec, Outcome, StateMachineData};
use tokio::time::Instant;

use crate::checkpoint::*;

pub(crate) const JOB: &str = "job-1";
pub(crate) const ROOT: &str = "/cp";
pub(crate) const A1: TaskAttemptId = TaskAttemptId(1);
pub(crate) const A2: TaskAttemptId = TaskAttemptId(2);
pub(crate) const A3: TaskAttemptId = TaskAttemptId(3);
pub(crate) const ALL: [TaskAttemptId; 3] = [A1, A2, A3];

pub(crate) fn job() -> JobId {
    JobId::new(JOB).unwrap()
}

pub(crate) fn desc(
    vertex: &str,
    subtask: u32,
    parallelism: u32,
    is_source: bool,
    attempt: u64,
) -> TaskDescriptor {
    TaskDescriptor {
        vertex: vertex.into(),
        subtask,
        parallelism,
        max_parallelism: 8,
        is_source,
        inputs: if is_source { Vec::new() } else { vec!["src".into()] },
        attempt: TaskAttemptId(attempt),
    }
}

/// The scripted job, with attempts `base + 1 ..= base + 3`.
pub(crate) fn tasks_with_attempts(base: u64) -> TaskSet {
    TaskSet::new(vec![
        desc("src", 0, 2, true, base + 1),
        desc("src", 1, 2, true, base + 2),
        desc("map", 0, 1, false, base + 3),
    ])
    .unwrap()
}

pub(crate) fn file(path: impl Into<String>) -> StateFile {
    StateFile { path: path.into(), size: 10, crc32: 0 }
}

/// A subtask state with one exclusive keyed file in `chk-<id>/` and the given shared files.
pub(crate) fn state(id: u64, attempt: TaskAttemptId, shared: &[&str]) -> SubtaskState {
    let mut op = OperatorSubtaskState::default();
    op.keyed.insert_whole_file(attempt.0 as u32 % 8, file(format!("chk-{id}/a{}.state", attempt.0)));
    for (i, s) in shared.iter().enumerate() {
        op.keyed.insert_whole_file((attempt.0 as u32 + 3 + i as u32) % 8, file(*s));
    }
    SubtaskState { operators: BTreeMap::from([("op".to_string(), op)]) }
}

pub(crate) fn metrics() -> TaskCheckpointMetrics {
    TaskCheckpointMetrics { sync_ms: 1, async_ms: 2, alignment_ms: 3, state_size: 10, ..Default::default() }
}

pub(crate) fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

pub(crate) fn periodic(interval: u64) -> CheckpointConfig {
    CheckpointConfig { interval: Some(secs(interval)), ..Default::default() }
}

/// A core plus the world around it: clock, replicated state machine, trigger timer.
pub(crate) struct Harness {
    pub core: CheckpointCoordinatorCore,
    pub now: Now,
    /// The replicated state machine ids and completions go through.
    pub sm: StateMachineData,
    /// The trigger timer as the driver would hold it.
    pub timer: Option<(Instant, TimerToken)>,
    /// Every action so far, in order.
    pub log: Vec<Action>,
    next_request: u64,
}

impl Harness {
    pub fn new(cfg: CheckpointConfig) -> Self {
        Self::with(CoreConfig::new(job(), cfg, ROOT))
    }

    pub fn with(config: CoreConfig) -> Self {
        let mut sm = StateMachineData::default();
        let spec = JobSpec { checkpoint: config.checkpoint.clone(), ..Default::default() };
        sm.apply(&Command::RegisterJob { job: job(), name: String::new(), spec }).unwrap();
        let core =
            CheckpointCoordinatorCore::new(config, tasks_with_attempts(0), Recovered::default()).unwrap();
        Self {
            core,
            now: Now::new(Instant::now(), 1_000_000),
            sm,
            timer: None,
            log: Vec::new(),
            next_request: 0,
        }
    }

    pub fn handle(&mut self, event: Event) -> Vec<Action> {
        let acts = self.core.handle(self.now, event);
        for a in &acts {
            match a {
                Action::ScheduleTrigger { at, token } => self.timer = Some((*at, *token)),
                Action::CancelTrigger => self.timer = None,
                _ => {}
            }
        }
        self.log.extend(acts.iter().cloned());
        acts
    }

    pub fn advance(&mut self, d: Duration) {
        self.now = self.now.after(d);
    }

    pub fn advance_to(&mut self, at: Instant) {
        if at > self.now.instant {
            self.advance(at - self.now.instant);
        }
    }

    /// Moves time to the armed trigger timer and fires it.
    pub fn fire_timer(&mut self) -> Vec<Action> {
        let (at, token) = self.timer.take().expect("the trigger timer is armed");
        self.advance_to(at);
        self.handle(Event::TriggerTimerFired { token })
    }

    pub fn request(&mut self, kind: TriggerKind) -> (RequestId, Vec<Action>) {
        self.next_request += 1;
        let request = RequestId(self.next_request);
        (request, self.handle(Event::TriggerRequested { request, kind }))
    }

    /// Answers every allocation in `acts` through the replicated counter.
    pub fn allocate(&mut self, acts: &[Action]) -> Vec<Action> {
        let mut out = Vec::new();
        for token in allocation_tokens(acts) {
            let id = match self.sm.apply(&Command::AllocateCheckpointId { job: job() }) {
                Ok(Outcome::CheckpointId { id }) => id,
                other => panic!("allocation failed: {other:?}"),
            };
            out.extend(self.handle(Event::CheckpointIdAllocated { token, checkpoint_id: id }));
        }
        out
    }

    /// Requests a manual checkpoint and allocates its id; returns the id.
    pub fn checkpoint(&mut self) -> u64 {
        let (_, acts) = self.request(TriggerKind::Checkpoint);
        let acts = self.allocate(&acts);
        triggered(&acts).expect("checkpoint triggered").0
    }

    pub fn savepoint(&mut self, dir: Option<&str>, sync: bool) -> u64 {
        let kind = TriggerKind::Savepoint { target_dir: dir.map(str::to_owned), sync, drain: false };
        let (_, acts) = self.request(kind);
        let acts = self.allocate(&acts);
        triggered(&acts).expect("savepoint triggered").0
    }

    pub fn ack(&mut self, attempt: TaskAttemptId, id: u64) -> Vec<Action> {
        self.ack_with(attempt, id, state(id, attempt, &[]))
    }

    pub fn ack_with(&mut self, attempt: TaskAttemptId, id: u64, state: SubtaskState) -> Vec<Action> {
        self.handle(Event::TaskAcknowledged { attempt, checkpoint_id: id, state, metrics: metrics() })
    }

    pub fn ack_all(&mut self, id: u64) -> Vec<Action> {
        ALL.iter().flat_map(|a| self.ack(*a, id)).collect()
    }

    /// Reports the `_metadata` of `id` written where the core asked.
    pub fn write_metadata(&mut self, id: u64) -> Vec<Action> {
        let path = self
            .log
            .iter()
            .rev()
            .find_map(|a| match a {
                Action::WriteMetadata { checkpoint_id, path, .. } if *checkpoint_id == id => {
                    Some(path.clone())
                }
                _ => None,
            })
            .expect("metadata write requested");
        let pointer = MetadataPointer { path, size: 100, crc32: 7 };
        self.handle(Event::MetadataWritten { checkpoint_id: id, pointer })
    }

    /// Applies the proposed completion of `id` to the state machine and reports the result.
    pub fn commit(&mut self, id: u64) -> Vec<Action> {
        let command = self.proposal(id);
        let event = match self.sm.apply(&command) {
            Ok(outcome) => Event::CompletionCommitted { checkpoint_id: id, outcome },
            Err(error) => Event::CompletionRejected { checkpoint_id: id, error },
        };
        self.handle(event)
    }

    pub fn proposal(&self, id: u64) -> Command {
        self.log
            .iter()
            .rev()
            .find_map(|a| match a {
                Action::ProposeCompletion { checkpoint_id, command } if *checkpoint_id == id => {
                    Some((**command).clone())
                }
                _ => None,
            })
            .expect("completion proposed")
    }

    /// Acks, metadata, commit; returns the commit's actions.
    pub fn complete(&mut self, id: u64) -> Vec<Action> {
        self.ack_all(id);
        self.write_metadata(id);
        self.commit(id)
    }
}

pub(crate) fn allocation_tokens(acts: &[Action]) -> Vec<AllocationToken> {
    acts.iter()
        .filter_map(|a| match a {
            Action::AllocateCheckpointId { token } => Some(*token),
            _ => None,
        })
        .collect()
}

pub(crate) fn triggered(acts: &[Action]) -> Option<(u64, CheckpointOptions, Vec<TaskAttemptId>)> {
    acts.iter().find_map(|a| match a {
        Action::TriggerTasks { checkpoint_id, options, tasks, .. } => {
            Some((*checkpoint_id, options.clone(), tasks.clone()))
        }
        _ => None,
    })
}

pub(crate) fn answer(acts: &[Action], request: RequestId) -> Option<Result<TriggerSuccess, TriggerError>> {
    acts.iter().find_map(|a| match a {
        Action::AnswerTrigger { request: r, result } if *r == request => Some(result.clone()),
        _ => None,
    })
}

pub(crate) fn notified_complete(acts: &[Action]) -> Vec<u64> {
    acts.iter()
        .filter_map(|a| match a {
            Action::NotifyComplete { checkpoint_id, .. } => Some(*checkpoint_id),
            _ => None,
        })
        .collect()
}

pub(crate) fn aborted(acts: &[Action]) -> Vec<(u64, CheckpointFailureReason)> {
    acts.iter()
        .filter_map(|a| match a {
            Action::NotifyAborted { checkpoint_id, reason, .. } => Some((*checkpoint_id, *reason)),
            _ => None,
        })
        .collect()
}

/// `(checkpoint id, dirs, files)` of every `DiscardCheckpoint`.
pub(crate) fn discards(acts: &[Action]) -> Vec<(u64, Vec<PathBuf>, Vec<PathBuf>)> {
    acts.iter()
        .filter_map(|a| match a {
            Action::DiscardCheckpoint { checkpoint_id, dirs, files, .. } => {
                Some((*checkpoint_id, dirs.clone(), files.clone()))
            }
            _ => None,
        })
        .collect()
}

pub(crate) fn any_discard(acts: &[Action]) -> bool {
    acts.iter().any(|a| {
        matches!(
            a,
            Action::DiscardCheckpoint { .. }
                | Action::DiscardAckedState { .. }
                | Action::DiscardJobCheckpoints { .. }
        )
    })
}

pub(crate) fn chk_dir(id: u64) -> PathBuf {
    PathBuf::from(format!("{ROOT}/{JOB}/chk-{id}"))
}

pub(crate) fn job_path(rel: &str) -> PathBuf {
    PathBuf::from(format!("{ROOT}/{JOB}/{rel}"))
}

/// Checks that `dir` is a directory of savepoint `id` of the test job under `parent`
/// (`savepoint-<job>-<id>-<12 hex digits>`), and returns it.
pub(crate) fn savepoint_dir(parent: &str, id: u64, dir: &std::path::Path) -> std::path::PathBuf {
    assert_eq!(dir.parent(), Some(std::path::Path::new(parent)), "{}", dir.display());
    let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    let suffix = name.strip_prefix(&format!("savepoint-{}-{id}-", job())).unwrap_or_else(|| panic!("{name}"));
    assert!(suffix.len() == 12 && suffix.chars().all(|c| c.is_ascii_hexdigit()), "{name}");
    dir.to_owned()
}
