//! The completion pipeline: metadata, commit, notify, retention, discards, failure counting,
//! statistics and master hooks.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use cairn_protocol::checkpoint::CheckpointMetadata;
use cairn_raft::model::{CheckpointConfig, CheckpointKind, CommandError, CompletedCheckpoint, Outcome};

use super::*;
use crate::checkpoint::hooks::tests::CountingHook;

fn written_metadata(acts: &[Action]) -> CheckpointMetadata {
    acts.iter()
        .find_map(|a| match a {
            Action::WriteMetadata { metadata, .. } => Some((**metadata).clone()),
            _ => None,
        })
        .expect("metadata written")
}

#[test]
fn metadata_contains_all_subtask_states_and_master_states() {
    let mut h = Harness::new(CheckpointConfig::default());
    let log = Arc::new(Mutex::new(Vec::new()));
    h.core.add_master_hook(Box::new(CountingHook::new("offsets", log.clone()))).unwrap();
    let id = h.checkpoint();
    let acts = h.ack_all(id);
    let path = acts
        .iter()
        .find_map(|a| match a {
            Action::WriteMetadata { path, .. } => Some(path.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(path, chk_dir(id).join("_metadata"));
    let meta = written_metadata(&acts);
    assert_eq!((meta.job.as_str(), meta.checkpoint_id, meta.kind.as_str()), (JOB, id, "checkpoint"));
    assert_eq!(meta.subtasks.keys().collect::<Vec<_>>(), vec!["map/0", "src/0", "src/1"]);
    assert_eq!(meta.subtasks["src/1"], state(id, A2, &[]));
    assert_eq!(meta.vertices["src"].parallelism, 2);
    assert_eq!(meta.vertices["map"].max_parallelism, 8);
    assert_eq!(meta.master_states["offsets"], 1u64.to_be_bytes().to_vec());
    assert_eq!(*log.lock().unwrap(), vec!["snapshot 1"], "hooks run once, at trigger time");
}

#[test]
fn master_hook_failure_aborts_trigger() {
    let mut h = Harness::new(CheckpointConfig::default());
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut hook = CountingHook::new("offsets", log);
    hook.fail_snapshot = true;
    h.core.add_master_hook(Box::new(hook)).unwrap();
    let (request, acts) = h.request(TriggerKind::Checkpoint);
    let acts = h.allocate(&acts);
    assert!(triggered(&acts).is_none(), "no task hears of it");
    assert!(matches!(
        answer(&acts, request),
        Some(Err(TriggerError::Failed { reason: CheckpointFailureReason::TriggerCheckpointFailure, .. }))
    ));
}

#[test]
fn notify_only_after_commit() {
    let mut h = Harness::new(CheckpointConfig::default());
    let id = h.checkpoint();
    let acts = h.ack_all(id);
    assert!(notified_complete(&acts).is_empty());
    let acts = h.write_metadata(id);
    assert!(notified_complete(&acts).is_empty());
    let command = h.proposal(id);
    let Command::AddCompletedCheckpoint { checkpoint, .. } = command else { panic!("{command:?}") };
    assert_eq!(checkpoint.metadata_path, "/cp/job-1/chk-1/_metadata");
    assert_eq!((checkpoint.metadata_size, checkpoint.metadata_crc32), (100, 7));
    assert_eq!(checkpoint.state_size, 30);
    let acts = h.commit(id);
    let notify = acts.iter().find(|a| matches!(a, Action::NotifyComplete { .. })).unwrap();
    let Action::NotifyComplete { tasks, .. } = notify else { unreachable!() };
    let mut tasks = tasks.clone();
    tasks.sort();
    assert_eq!(tasks, ALL.to_vec(), "every task is notified");
    assert_eq!(h.sm.job(&job()).unwrap().completed.len(), 1);
}

#[test]
fn metadata_write_failure_fails_checkpoint_and_discards() {
    let mut h = Harness::new(CheckpointConfig { tolerable_failures: 5, ..Default::default() });
    let id = h.checkpoint();
    h.ack_all(id);
    let acts = h.handle(Event::MetadataWriteFailed { checkpoint_id: id, error: "EIO".into() });
    assert_eq!(aborted(&acts), vec![(id, CheckpointFailureReason::IoException)]);
    assert_eq!(discards(&acts), vec![(id, vec![chk_dir(id)], vec![])]);
    assert_eq!(h.core.consecutive_failures(), 1, "IO failures count");
}

#[test]
fn metadata_at_unexpected_path_fails_finalization() {
    let mut h = Harness::new(CheckpointConfig { tolerable_failures: 5, ..Default::default() });
    let id = h.checkpoint();
    h.ack_all(id);
    let pointer = MetadataPointer { path: "/elsewhere/_metadata".into(), size: 1, crc32: 1 };
    let acts = h.handle(Event::MetadataWritten { checkpoint_id: id, pointer });
    assert_eq!(aborted(&acts), vec![(id, CheckpointFailureReason::FinalizeCheckpointFailure)]);
}

#[test]
fn commit_rejection_fails_checkpoint_and_discards() {
    let mut h = Harness::new(CheckpointConfig { tolerable_failures: 5, ..Default::default() });
    let id = h.checkpoint();
    h.ack_with(A1, id, state(id, A1, &["shared/new"]));
    h.ack(A2, id);
    h.ack(A3, id);
    h.write_metadata(id);
    let error = CommandError::JobTerminal { job: job(), status: "canceled".into() };
    let acts = h.handle(Event::CompletionRejected { checkpoint_id: id, error });
    assert!(notified_complete(&acts).is_empty());
    assert_eq!(aborted(&acts), vec![(id, CheckpointFailureReason::FinalizeCheckpointFailure)]);
    assert_eq!(discards(&acts), vec![(id, vec![chk_dir(id)], vec![job_path("shared/new")])]);
}

#[test]
fn unknown_commit_outcome_deletes_nothing() {
    let mut h =
        Harness::new(CheckpointConfig { max_concurrent: 2, tolerable_failures: 5, ..Default::default() });
    let (request, acts) = h.request(TriggerKind::Checkpoint);
    h.allocate(&acts);
    let id = 1;
    h.ack_with(A1, id, state(id, A1, &["shared/maybe-retained"]));
    h.ack(A2, id);
    h.ack(A3, id);
    h.write_metadata(id);
    let acts = h.handle(Event::CompletionOutcomeUnknown { checkpoint_id: id, detail: "leader lost".into() });
    assert!(!any_discard(&acts), "{acts:?}");
    assert!(notified_complete(&acts).is_empty() && aborted(&acts).is_empty(), "tasks hear nothing: {acts:?}");
    assert_eq!(answer(&acts, request), Some(Err(TriggerError::OutcomeUnknown { checkpoint_id: id })));
    assert_eq!(h.core.consecutive_failures(), 0);
    // Its files stay protected: a later failed checkpoint reusing the shared file keeps it.
    let next = h.checkpoint();
    h.ack_with(A1, next, state(next, A1, &["shared/maybe-retained"]));
    let reason = CheckpointFailureReason::CheckpointDeclined;
    let acts = h.handle(Event::TaskDeclined { attempt: A2, checkpoint_id: next, reason, detail: None });
    assert_eq!(discards(&acts), vec![(next, vec![chk_dir(next)], vec![])]);
    // And a late ack of the uncertain checkpoint deletes nothing.
    let acts = h.ack_with(A1, id, state(id, A1, &["shared/other"]));
    assert!(matches!(&acts[..], [Action::DiscardAckedState { files, .. }] if files.is_empty()), "{acts:?}");
}

#[test]
fn duplicate_commit_rejection_deletes_nothing() {
    let mut h = Harness::new(CheckpointConfig::default());
    let id = h.checkpoint();
    h.ack_all(id);
    h.write_metadata(id);
    let acts = h.handle(Event::CompletionRejected {
        checkpoint_id: id,
        error: CommandError::DuplicateCheckpoint { job: job(), id },
    });
    assert!(!any_discard(&acts));
}

#[test]
fn out_of_order_commit_counts_as_subsumed() {
    let mut h = Harness::new(CheckpointConfig::default());
    let id = h.checkpoint();
    h.ack_all(id);
    h.write_metadata(id);
    let acts = h.handle(Event::CompletionRejected {
        checkpoint_id: id,
        error: CommandError::OutOfOrder { job: job(), id, latest: id + 1 },
    });
    assert_eq!(aborted(&acts), vec![(id, CheckpointFailureReason::CheckpointSubsumed)]);
    assert_eq!(h.core.consecutive_failures(), 0);
}

#[test]
fn subsumed_checkpoints_discard_exclusive_and_unreferenced_shared_files() {
    let mut h = Harness::new(CheckpointConfig::default());
    let first = h.checkpoint();
    h.ack_with(A1, first, state(first, A1, &["shared/a", "shared/b"]));
    h.ack(A2, first);
    h.ack(A3, first);
    h.write_metadata(first);
    h.commit(first);
    let second = h.checkpoint();
    h.ack_with(A1, second, state(second, A1, &["shared/b", "shared/c"]));
    h.ack(A2, second);
    h.ack(A3, second);
    h.write_metadata(second);
    let acts = h.commit(second);
    let notify_pos = acts.iter().position(|a| matches!(a, Action::NotifyComplete { .. })).unwrap();
    let discard_pos = acts.iter().position(|a| matches!(a, Action::DiscardCheckpoint { .. })).unwrap();
    assert!(notify_pos < discard_pos, "notify first, then retention");
    assert_eq!(discards(&acts), vec![(first, vec![chk_dir(first)], vec![job_path("shared/a")])]);
    assert_eq!(h.core.registry().ref_count("shared/b"), 1);
    assert_eq!(h.core.registry().registered_ids(), vec![second]);
}

#[test]
fn shared_file_referenced_by_another_pending_checkpoint_is_kept() {
    let mut h =
        Harness::new(CheckpointConfig { max_concurrent: 2, tolerable_failures: 5, ..Default::default() });
    let first = h.checkpoint();
    let second = h.checkpoint();
    h.ack_with(A1, first, state(first, A1, &["shared/both"]));
    h.ack_with(A1, second, state(second, A1, &["shared/both"]));
    let reason = CheckpointFailureReason::CheckpointDeclined;
    let acts = h.handle(Event::TaskDeclined { attempt: A2, checkpoint_id: first, reason, detail: None });
    assert_eq!(discards(&acts), vec![(first, vec![chk_dir(first)], vec![])]);
}

#[test]
fn savepoint_commit_registers_savepoint() {
    let mut h = Harness::new(CheckpointConfig::default());
    let (request, acts) =
        h.request(TriggerKind::Savepoint { target_dir: Some("/sp".into()), sync: false, drain: false });
    h.allocate(&acts);
    h.ack_all(1);
    let acts = h.write_metadata(1);
    assert_eq!(acts.len(), 1);
    let Command::RegisterSavepoint { savepoint, .. } = h.proposal(1) else { panic!() };
    let dir = savepoint_dir("/sp", 1, std::path::Path::new(&savepoint.path));
    assert_eq!(savepoint.checkpoint.metadata_path, format!("{}/_metadata", dir.display()));
    assert_eq!(savepoint.checkpoint.kind, CheckpointKind::Savepoint);
    let acts = h.commit(1);
    assert_eq!(notified_complete(&acts), vec![1]);
    assert_eq!(
        answer(&acts, request),
        Some(Ok(TriggerSuccess { checkpoint_id: 1, kind: CheckpointKind::Savepoint, location: dir }))
    );
    assert_eq!(h.sm.job(&job()).unwrap().savepoints.len(), 1);
    assert!(h.core.registry().registered_ids().is_empty(), "savepoints are not in the registry");
    assert!(!any_discard(&acts));
}

#[test]
fn failed_savepoint_discards_its_directory() {
    let mut h = Harness::new(CheckpointConfig::default());
    let id = h.savepoint(Some("/sp"), false);
    let reason = CheckpointFailureReason::CheckpointDeclined;
    let acts = h.handle(Event::TaskDeclined { attempt: A1, checkpoint_id: id, reason, detail: None });
    let found = discards(&acts);
    assert_eq!(found.len(), 1, "{found:?}");
    let (discarded, dirs, files) = &found[0];
    assert_eq!((*discarded, dirs.len(), files.len()), (id, 1, 0));
    savepoint_dir("/sp", id, &dirs[0]);
    assert_eq!(h.core.consecutive_failures(), 0, "savepoint failures do not count");
}

#[test]
fn tolerable_failures_exceeded_fails_job() {
    let mut h = Harness::new(CheckpointConfig { tolerable_failures: 1, ..Default::default() });
    for round in 0..2 {
        let id = h.checkpoint();
        h.advance(CheckpointConfig::default().timeout);
        let acts = h.handle(Event::CheckpointTimeout { checkpoint_id: id });
        let failed = acts.iter().any(|a| {
            matches!(a, Action::FailOver { reason: CheckpointFailureReason::CheckpointExpired, .. })
        });
        assert_eq!(failed, round == 1, "round {round}: {acts:?}");
    }
}

#[test]
fn success_resets_failure_count_in_core() {
    let mut h = Harness::new(CheckpointConfig { tolerable_failures: 1, ..Default::default() });
    let id = h.checkpoint();
    h.advance(CheckpointConfig::default().timeout);
    h.handle(Event::CheckpointTimeout { checkpoint_id: id });
    assert_eq!(h.core.consecutive_failures(), 1);
    let id = h.checkpoint();
    h.complete(id);
    assert_eq!(h.core.consecutive_failures(), 0);
}

#[test]
fn stats_track_trigger_acks_and_completion() {
    let mut h = Harness::new(CheckpointConfig::default());
    let id = h.checkpoint();
    let triggered_at = h.now.wall_ms;
    assert_eq!(h.core.stats().counts.in_progress, 1);
    h.advance(secs(2));
    h.ack_all(id);
    h.write_metadata(id);
    h.advance(secs(1));
    let acts = h.commit(id);
    assert!(acts.iter().any(|a| matches!(a, Action::StatsChanged { counts } if counts.completed == 1)));
    let stats = h.core.stats();
    assert_eq!((stats.counts.triggered, stats.counts.in_progress, stats.counts.completed), (1, 0, 1));
    let c = stats.latest_completed.as_ref().unwrap();
    assert_eq!((c.id, c.trigger_time_ms, c.num_acknowledged, c.num_subtasks), (id, triggered_at, 3, 3));
    assert_eq!(c.end_to_end_ms, Some(3000));
    assert_eq!(c.state_size, 30);
    assert_eq!(c.subtasks[0].end_to_end_ms, 2000);
    assert_eq!(c.subtasks[0].metrics.alignment_ms, 3);
    assert_eq!(c.external_path.as_deref(), Some("/cp/job-1/chk-1"));
}

#[test]
fn recovered_core_rebuilds_registry_and_protects_retained_files() {
    // The old leader retained checkpoint 4, which references shared/kept.
    let mut sm_job = cairn_raft::model::JobRecord::new(job(), JOB.into(), Default::default());
    sm_job.next_checkpoint_id = 5;
    sm_job.num_completed = 4;
    sm_job.completed.push(CompletedCheckpoint {
        id: 4,
        kind: CheckpointKind::Checkpoint,
        trigger_time_ms: 1,
        completion_time_ms: 2,
        metadata_path: "/cp/job-1/chk-4/_metadata".into(),
        metadata_size: 1,
        metadata_crc32: 1,
        state_size: 10,
    });
    let mut st = state(4, A1, &["shared/kept"]);
    st.operators.get_mut("op").unwrap().keyed.remove_key_group(1);
    let meta = CheckpointMetadata {
        version: 1,
        job: JOB.into(),
        checkpoint_id: 4,
        kind: "checkpoint".into(),
        trigger_time_ms: 1,
        completion_time_ms: 2,
        vertices: BTreeMap::new(),
        subtasks: BTreeMap::from([("src/0".to_string(), st)]),
        master_states: BTreeMap::new(),
    };
    let recovered = Recovered::from_job(&sm_job, &BTreeMap::from([(4, meta)]), None);
    let config =
        CoreConfig::new(job(), CheckpointConfig { tolerable_failures: 5, ..Default::default() }, ROOT);
    let mut core = CheckpointCoordinatorCore::new(config, tasks_with_attempts(0), recovered).unwrap();
    assert_eq!(core.stats().counts.completed, 4);
    assert!(core.registry().is_referenced("shared/kept"));
    let now = Now::new(Instant::now(), 0);
    let acts =
        core.handle(now, Event::TriggerRequested { request: RequestId(1), kind: TriggerKind::Checkpoint });
    let token = allocation_tokens(&acts)[0];
    let acts = core.handle(now, Event::CheckpointIdAllocated { token, checkpoint_id: 4 });
    assert!(triggered(&acts).is_none(), "an id at or below the replicated counter is refused");
    let acts =
        core.handle(now, Event::TriggerRequested { request: RequestId(2), kind: TriggerKind::Checkpoint });
    let token = allocation_tokens(&acts)[0];
    core.handle(now, Event::CheckpointIdAllocated { token, checkpoint_id: 5 });
    core.handle(
        now,
        Event::TaskAcknowledged {
            attempt: A1,
            checkpoint_id: 5,
            state: state(5, A1, &["shared/kept", "shared/new"]),
            metrics: metrics(),
        },
    );
    let reason = CheckpointFailureReason::CheckpointDeclined;
    let acts = core.handle(now, Event::TaskDeclined { attempt: A2, checkpoint_id: 5, reason, detail: None });
    assert_eq!(discards(&acts), vec![(5, vec![chk_dir(5)], vec![job_path("shared/new")])]);
    // Retention later subsumes 4 through a commit of 6.
    let acts =
        core.handle(now, Event::TriggerRequested { request: RequestId(3), kind: TriggerKind::Checkpoint });
    let token = allocation_tokens(&acts)[0];
    core.handle(now, Event::CheckpointIdAllocated { token, checkpoint_id: 6 });
    for a in ALL {
        core.handle(
            now,
            Event::TaskAcknowledged {
                attempt: a,
                checkpoint_id: 6,
                state: state(6, a, &[]),
                metrics: metrics(),
            },
        );
    }
    let pointer = MetadataPointer { path: chk_dir(6).join("_metadata"), size: 1, crc32: 1 };
    core.handle(now, Event::MetadataWritten { checkpoint_id: 6, pointer });
    let subsumed = sm_job.completed.clone();
    let acts = core.handle(
        now,
        Event::CompletionCommitted { checkpoint_id: 6, outcome: Outcome::Subsumed { checkpoints: subsumed } },
    );
    assert_eq!(discards(&acts), vec![(4, vec![chk_dir(4)], vec![job_path("shared/kept")])]);
}
