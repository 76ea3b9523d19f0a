//! Stop, redeploy, shutdown and suspension.

use cairn_protocol::config::ExternalizedRetention;
use cairn_raft::model::{CheckpointConfig, JobStatus};

use super::*;

#[test]
fn stop_scheduler_aborts_pending_and_stops_timer() {
    let mut h = Harness::new(CheckpointConfig { max_concurrent: 2, ..periodic(10) });
    h.handle(Event::StartScheduler);
    let acts = h.fire_timer();
    let id = triggered(&h.allocate(&acts)).unwrap().0;
    let acts = h.handle(Event::StopScheduler);
    assert!(acts.contains(&Action::CancelTrigger));
    assert_eq!(aborted(&acts), vec![(id, CheckpointFailureReason::CheckpointCoordinatorSuspend)]);
    assert!(h.timer.is_none());
    assert_eq!(h.core.consecutive_failures(), 0);
}

#[test]
fn redeploy_aborts_pending_of_old_attempts() {
    let mut h = Harness::new(CheckpointConfig::default());
    let id = h.checkpoint();
    let acts = h.handle(Event::TasksRedeployed { tasks: tasks_with_attempts(10) });
    assert_eq!(aborted(&acts), vec![(id, CheckpointFailureReason::JobFailoverRegion)]);
    let (_, acts) = h.request(TriggerKind::Checkpoint);
    let (id, _, sources) = triggered(&h.allocate(&acts)).unwrap();
    assert_eq!(sources, vec![TaskAttemptId(11), TaskAttemptId(12)], "the new attempts are triggered");
    let acts = h.ack(A1, id);
    assert!(
        matches!(acts[..], [Action::DiscardAckedState { cause: StrayAck::UnknownAttempt, .. }]),
        "old attempt"
    );
    for a in [11, 12, 13] {
        h.ack(TaskAttemptId(a), id);
    }
    assert!(
        h.log
            .iter()
            .any(|a| matches!(a, Action::WriteMetadata { checkpoint_id, .. } if *checkpoint_id == id))
    );
}

#[test]
fn shutdown_fails_pending_with_shutdown_reason() {
    let mut h = Harness::new(CheckpointConfig { max_concurrent: 3, ..periodic(10) });
    h.handle(Event::StartScheduler);
    let acking = h.checkpoint();
    let committing = h.checkpoint();
    h.ack_all(committing);
    h.write_metadata(committing);
    let (waiting, _) = h.request(TriggerKind::Checkpoint);
    let acts = h.handle(Event::Shutdown { job_status: JobStatus::Running });
    assert_eq!(aborted(&acts), vec![(acking, CheckpointFailureReason::CheckpointCoordinatorShutdown)]);
    assert_eq!(discards(&acts), vec![(acking, vec![chk_dir(acking)], vec![])]);
    assert_eq!(
        answer(&acts, waiting),
        Some(Err(TriggerError::Rejected { reason: CheckpointFailureReason::CheckpointCoordinatorShutdown }))
    );
    assert!(acts.contains(&Action::CancelTrigger));
    assert!(
        !acts.iter().any(|a| matches!(a, Action::DiscardJobCheckpoints { .. })),
        "running job keeps its checkpoints"
    );
    let (late, acts) = h.request(TriggerKind::Checkpoint);
    assert_eq!(
        answer(&acts, late),
        Some(Err(TriggerError::Rejected { reason: CheckpointFailureReason::CheckpointCoordinatorShutdown }))
    );
    assert!(h.commit(committing).is_empty(), "the shut down core ignores results");
}

#[test]
fn suspension_deletes_nothing_replicated() {
    let mut h = Harness::new(CheckpointConfig { max_concurrent: 3, ..Default::default() });
    let retained = h.checkpoint();
    h.ack_with(A1, retained, state(retained, A1, &["shared/retained"]));
    h.ack(A2, retained);
    h.ack(A3, retained);
    h.write_metadata(retained);
    h.commit(retained);
    let acking = h.checkpoint();
    h.ack_with(A1, acking, state(acking, A1, &["shared/new"]));
    let committing = h.checkpoint();
    h.ack_all(committing);
    h.write_metadata(committing);
    let acts = h.handle(Event::LeadershipLost);
    assert_eq!(aborted(&acts), vec![(acking, CheckpointFailureReason::CheckpointCoordinatorSuspend)]);
    assert_eq!(
        discards(&acts),
        vec![(acking, vec![chk_dir(acking)], vec![])],
        "only the never-proposed checkpoint's own directory; no shared file, nothing committed or committing"
    );
    assert!(!acts.iter().any(|a| matches!(a, Action::DiscardJobCheckpoints { .. })));
    assert!(!h.core.is_running());
}

#[test]
fn terminal_job_discards_checkpoints_per_retention_policy() {
    let mut h = Harness::new(CheckpointConfig { retained: 2, ..Default::default() });
    // Cairn's default keeps a failed job's checkpoints and deletes a canceled job's.
    for _ in 0..2 {
        let id = h.checkpoint();
        h.complete(id);
    }
    let sp = h.savepoint(Some("/sp"), false);
    h.complete(sp);
    let acts = h.handle(Event::Shutdown { job_status: JobStatus::Canceled });
    assert_eq!(
        acts.iter().find(|a| matches!(a, Action::DiscardJobCheckpoints { .. })),
        Some(&Action::DiscardJobCheckpoints {
            checkpoints: vec![1, 2],
            dirs: vec![chk_dir(1), chk_dir(2), job_path("shared")],
        }),
        "savepoints are never discarded"
    );
}

#[test]
fn retain_on_failure_keeps_checkpoints_of_failed_job() {
    let cfg = CheckpointConfig {
        externalized_retention: ExternalizedRetention::DeleteOnCancellation,
        ..Default::default()
    };
    let mut h = Harness::with(CoreConfig::new(job(), cfg, ROOT));
    let id = h.checkpoint();
    h.complete(id);
    let acts = h.handle(Event::Shutdown { job_status: JobStatus::Failed { reason: "boom".into() } });
    assert!(!any_discard(&acts), "{acts:?}");
}

#[test]
fn no_externalized_discards_even_a_failed_jobs_checkpoints() {
    let cfg = CheckpointConfig {
        externalized_retention: ExternalizedRetention::NoExternalized,
        ..Default::default()
    };
    let mut h = Harness::with(CoreConfig::new(job(), cfg, ROOT));
    let id = h.checkpoint();
    h.complete(id);
    let acts = h.handle(Event::Shutdown { job_status: JobStatus::Failed { reason: "boom".into() } });
    assert!(any_discard(&acts), "{acts:?}");
}

#[test]
fn retain_on_cancellation_keeps_a_canceled_jobs_checkpoints() {
    let cfg = CheckpointConfig {
        externalized_retention: ExternalizedRetention::RetainOnCancellation,
        ..Default::default()
    };
    let mut h = Harness::with(CoreConfig::new(job(), cfg, ROOT));
    let id = h.checkpoint();
    h.complete(id);
    let acts = h.handle(Event::Shutdown { job_status: JobStatus::Canceled });
    assert!(!any_discard(&acts), "{acts:?}");
}

#[test]
fn restored_event_updates_stats_and_id_floor() {
    let mut h = Harness::new(CheckpointConfig::default());
    h.handle(Event::Restored { checkpoint_id: 40, external_path: Some("/sp/savepoint-job-1-40".into()) });
    assert_eq!(h.core.stats().counts.restored, 1);
    assert_eq!(h.core.stats().latest_restored.as_ref().map(|r| r.id), Some(40));
    let (_, acts) = h.request(TriggerKind::Checkpoint);
    let token = allocation_tokens(&acts)[0];
    let acts = h.handle(Event::CheckpointIdAllocated { token, checkpoint_id: 40 });
    assert!(triggered(&acts).is_none(), "ids must exceed the restored one");
}
