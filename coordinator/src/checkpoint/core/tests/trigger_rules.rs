//! Triggering: ids before triggers, periodic timer, min pause, max concurrent and the queue,
//! savepoints, stop-with-savepoint.

use cairn_raft::model::{CheckpointConfig, CheckpointKind};

use super::*;

#[test]
fn trigger_goes_to_sources_only_after_id_allocated() {
    let mut h = Harness::new(CheckpointConfig::default());
    let (request, acts) = h.request(TriggerKind::Checkpoint);
    assert!(matches!(acts[..], [Action::AllocateCheckpointId { .. }]), "{acts:?}");
    let acts = h.allocate(&acts);
    let (id, options, tasks) = triggered(&acts).unwrap();
    assert_eq!(id, 1);
    assert_eq!(tasks, vec![A1, A2], "only the sources are triggered");
    assert_eq!(options.kind, CheckpointKind::Checkpoint);
    assert_eq!(options.base_dir, PathBuf::from("/cp/job-1"));
    assert_eq!(options.exclusive_dir, "chk-1");
    let timeout_at = h.now.instant + CheckpointConfig::default().timeout;
    assert!(acts.contains(&Action::ScheduleTimeout { checkpoint_id: 1, at: timeout_at }));
    assert!(acts.contains(&Action::TriggerAccepted { request, checkpoint_id: 1 }));
    assert_eq!(answer(&acts, request), None, "answered only when complete");
}

#[test]
fn no_periodic_trigger_without_interval() {
    let mut h = Harness::new(CheckpointConfig::default());
    let acts = h.handle(Event::StartScheduler);
    assert!(acts.is_empty(), "{acts:?}");
    assert!(h.timer.is_none());
}

#[test]
fn periodic_trigger_fires_and_rearms_every_interval() {
    let mut h = Harness::new(CheckpointConfig { min_pause: secs(2), ..periodic(10) });
    let start = h.now.instant;
    h.handle(Event::StartScheduler);
    let (first, _) = h.timer.unwrap();
    assert!(first >= start + secs(2) && first <= start + secs(10), "initial delay in [min pause, interval]");
    let acts = h.fire_timer();
    assert_eq!(allocation_tokens(&acts).len(), 1);
    assert_eq!(h.timer.map(|t| t.0), Some(first + secs(10)));
}

#[test]
fn interval_below_min_pause_is_clamped() {
    let cfg = CheckpointConfig { interval: Some(secs(1)), min_pause: secs(5), ..Default::default() };
    let mut h = Harness::new(cfg);
    h.handle(Event::StartScheduler);
    let acts = h.fire_timer();
    let fired_at = h.now.instant;
    assert_eq!(allocation_tokens(&acts).len(), 1);
    assert_eq!(h.timer.map(|t| t.0), Some(fired_at + secs(5)), "the effective interval is the min pause");
}

#[test]
fn stale_trigger_timer_is_ignored() {
    let mut h = Harness::new(periodic(10));
    h.handle(Event::StartScheduler);
    let (_, old) = h.timer.unwrap();
    h.fire_timer();
    let acts = h.handle(Event::TriggerTimerFired { token: old });
    assert!(acts.is_empty(), "{acts:?}");
}

#[test]
fn min_pause_reschedules_trigger() {
    let mut h =
        Harness::new(CheckpointConfig { min_pause: secs(5), max_concurrent: 2, ..Default::default() });
    let id = h.checkpoint();
    h.complete(id);
    let completed_at = h.now.instant;
    h.advance(secs(1));
    let (request, acts) = h.request(TriggerKind::Checkpoint);
    assert!(allocation_tokens(&acts).is_empty(), "no trigger within the min pause: {acts:?}");
    assert_eq!(answer(&acts, request), None, "the request waits");
    assert_eq!(h.timer.map(|t| t.0), Some(completed_at + secs(5)));
    let acts = h.fire_timer();
    assert_eq!(allocation_tokens(&acts).len(), 1, "triggered once the pause is over");
}

#[test]
fn min_pause_reschedules_periodic_trigger() {
    let mut h = Harness::new(CheckpointConfig { min_pause: secs(5), ..periodic(6) });
    h.handle(Event::StartScheduler);
    let acts = h.fire_timer();
    let acts = h.allocate(&acts);
    let id = triggered(&acts).unwrap().0;
    h.advance(secs(5));
    h.complete(id);
    let completed_at = h.now.instant;
    // The next periodic fire comes 1s after the completion: rescheduled to the end of the pause.
    let acts = h.fire_timer();
    assert!(allocation_tokens(&acts).is_empty(), "{acts:?}");
    assert_eq!(h.timer.map(|t| t.0), Some(completed_at + secs(5)));
    assert_eq!(allocation_tokens(&h.fire_timer()).len(), 1);
}

#[test]
fn max_concurrent_queues_one_request() {
    let mut h = Harness::new(CheckpointConfig::default());
    h.checkpoint();
    let (queued, acts) = h.request(TriggerKind::Checkpoint);
    assert!(allocation_tokens(&acts).is_empty());
    assert_eq!(answer(&acts, queued), None, "queued, not refused");
    let (second, acts) = h.request(TriggerKind::Checkpoint);
    assert_eq!(
        answer(&acts, second),
        Some(Err(TriggerError::Rejected { reason: CheckpointFailureReason::AlreadyQueued }))
    );
}

#[test]
fn queued_request_resumes_after_completion() {
    let mut h = Harness::new(CheckpointConfig::default());
    let id = h.checkpoint();
    let (queued, _) = h.request(TriggerKind::Checkpoint);
    let acts = h.complete(id);
    assert_eq!(allocation_tokens(&acts).len(), 1, "{acts:?}");
    let acts = h.allocate(&acts);
    assert_eq!(triggered(&acts).map(|t| t.0), Some(2));
    assert!(acts.contains(&Action::TriggerAccepted { request: queued, checkpoint_id: 2 }));
}

#[test]
fn queued_request_resumes_after_decline() {
    let mut h = Harness::new(CheckpointConfig::default());
    let id = h.checkpoint();
    h.request(TriggerKind::Checkpoint);
    let acts = h.handle(Event::TaskDeclined {
        attempt: A3,
        checkpoint_id: id,
        reason: CheckpointFailureReason::CheckpointDeclinedTaskNotReady,
        detail: None,
    });
    assert_eq!(allocation_tokens(&acts).len(), 1, "{acts:?}");
}

#[test]
fn queued_request_resumes_after_expiry() {
    let mut h = Harness::new(CheckpointConfig::default());
    let id = h.checkpoint();
    h.request(TriggerKind::Checkpoint);
    h.advance(CheckpointConfig::default().timeout);
    let acts = h.handle(Event::CheckpointTimeout { checkpoint_id: id });
    assert_eq!(aborted(&acts), vec![(id, CheckpointFailureReason::CheckpointExpired)]);
    assert_eq!(allocation_tokens(&acts).len(), 1, "{acts:?}");
}

#[test]
fn timer_rearms_after_expiry() {
    let mut h = Harness::new(CheckpointConfig { timeout: secs(30), ..periodic(10) });
    h.handle(Event::StartScheduler);
    let acts = h.fire_timer();
    let id = triggered(&h.allocate(&acts)).unwrap().0;
    // The next fire finds checkpoint 1 in flight: the request is queued, the timer not re-armed.
    let acts = h.fire_timer();
    assert!(allocation_tokens(&acts).is_empty());
    assert!(h.timer.is_none());
    h.advance(secs(30));
    let acts = h.handle(Event::CheckpointTimeout { checkpoint_id: id });
    assert_eq!(allocation_tokens(&acts).len(), 1, "the queued periodic trigger resumes");
    assert_eq!(h.timer.map(|t| t.0), Some(h.now.instant + secs(10)), "and the timer is armed again");
}

/// Every way a checkpoint can fail leaves the periodic timer armed (never a silent stop).
#[test]
fn periodic_timer_rearms_on_every_abort_path() {
    type AbortPath = fn(&mut Harness, u64) -> Vec<Action>;
    let paths: [(&str, AbortPath); 8] = [
        ("decline", |h, id| {
            let reason = CheckpointFailureReason::CheckpointDeclined;
            h.handle(Event::TaskDeclined { attempt: A1, checkpoint_id: id, reason, detail: None })
        }),
        ("expiry", |h, id| {
            h.advance(CheckpointConfig::default().timeout);
            h.handle(Event::CheckpointTimeout { checkpoint_id: id })
        }),
        ("task failure", |h, id| {
            let _ = id;
            h.handle(Event::TaskStatusChanged { attempt: A2, status: TaskStatus::Failed })
        }),
        ("task not running", |h, _| {
            h.handle(Event::TaskStatusChanged { attempt: A3, status: TaskStatus::NotRunning })
        }),
        ("metadata write failure", |h, id| {
            h.ack_all(id);
            h.handle(Event::MetadataWriteFailed { checkpoint_id: id, error: "disk full".into() })
        }),
        ("commit rejected", |h, id| {
            h.ack_all(id);
            h.write_metadata(id);
            h.handle(Event::CompletionRejected {
                checkpoint_id: id,
                error: cairn_raft::model::CommandError::UnknownJob { job: job() },
            })
        }),
        ("commit outcome unknown", |h, id| {
            h.ack_all(id);
            h.write_metadata(id);
            h.handle(Event::CompletionOutcomeUnknown { checkpoint_id: id, detail: "leader lost".into() })
        }),
        ("invalid state", |h, id| h.ack_with(A1, id, state(id, A1, &["../escape"]))),
    ];
    for (name, abort) in paths {
        let mut h = Harness::new(CheckpointConfig { tolerable_failures: 100, ..periodic(10) });
        h.handle(Event::StartScheduler);
        let acts = h.fire_timer();
        let id = triggered(&h.allocate(&acts)).unwrap().0;
        h.fire_timer(); // queued behind checkpoint `id`
        assert!(h.timer.is_none(), "{name}");
        let acts = abort(&mut h, id);
        assert!(!h.core.pending_ids().contains(&id), "{name}: checkpoint {id} left: {acts:?}");
        assert!(h.timer.is_some(), "{name}: periodic timer re-armed");
    }
}

#[test]
fn manual_checkpoint_is_answered_after_commit() {
    let mut h = Harness::new(CheckpointConfig::default());
    let (request, acts) = h.request(TriggerKind::Checkpoint);
    h.allocate(&acts);
    let acts = h.complete(1);
    assert_eq!(
        answer(&acts, request),
        Some(Ok(TriggerSuccess { checkpoint_id: 1, kind: CheckpointKind::Checkpoint, location: chk_dir(1) }))
    );
}

#[test]
fn savepoint_bypasses_max_concurrent() {
    let mut h = Harness::new(CheckpointConfig::default());
    h.checkpoint();
    let kind = TriggerKind::Savepoint { target_dir: Some("/sp".into()), sync: false, drain: false };
    let (_, acts) = h.request(kind);
    assert_eq!(allocation_tokens(&acts).len(), 1, "forced past max concurrent: {acts:?}");
    assert_eq!(h.core.pending_ids(), vec![1]);
    let acts = h.allocate(&acts);
    assert_eq!(triggered(&acts).map(|t| t.0), Some(2));
}

#[test]
fn savepoint_bypasses_min_pause() {
    let mut h = Harness::new(CheckpointConfig { min_pause: secs(60), ..Default::default() });
    let id = h.checkpoint();
    h.complete(id);
    assert_eq!(h.savepoint(Some("/sp"), false), 2);
}

#[test]
fn savepoint_goes_to_given_or_default_directory() {
    let mut h =
        Harness::new(CheckpointConfig { savepoint_dir: Some("/default-sp".into()), ..Default::default() });
    let kind = TriggerKind::Savepoint { target_dir: None, sync: false, drain: false };
    let (_, acts) = h.request(kind);
    let (_, options, _) = triggered(&h.allocate(&acts)).unwrap();
    let first = savepoint_dir("/default-sp", 1, &options.base_dir);
    assert_eq!(options.exclusive_dir, "");
    let kind = TriggerKind::Savepoint { target_dir: Some("/mine".into()), sync: false, drain: false };
    let (_, acts) = h.request(kind);
    let (_, options, _) = triggered(&h.allocate(&acts)).unwrap();
    savepoint_dir("/mine", 2, &options.base_dir);
    assert_ne!(first.file_name(), options.base_dir.file_name());
}

#[test]
fn savepoint_without_directory_is_answered_with_typed_error() {
    let mut h = Harness::new(CheckpointConfig::default());
    let (request, acts) = h.request(TriggerKind::Savepoint { target_dir: None, sync: false, drain: false });
    assert_eq!(answer(&acts, request), Some(Err(TriggerError::NoSavepointDirectory)));
    assert!(allocation_tokens(&acts).is_empty());
}

#[test]
fn drain_flag_is_refused_for_non_sync_savepoint() {
    let mut h = Harness::new(CheckpointConfig::default());
    let kind = TriggerKind::Savepoint { target_dir: Some("/sp".into()), sync: false, drain: true };
    let (request, acts) = h.request(kind);
    assert_eq!(answer(&acts, request), Some(Err(TriggerError::DrainRequiresSyncSavepoint)));
    let kind = TriggerKind::Savepoint { target_dir: Some("/sp".into()), sync: true, drain: true };
    let (_, acts) = h.request(kind);
    let (_, options, _) = triggered(&h.allocate(&acts)).unwrap();
    assert_eq!((options.kind, options.drain), (CheckpointKind::SyncSavepoint, true));
}

#[test]
fn sync_savepoint_pauses_periodic_checkpoints_until_it_fails() {
    let mut h = Harness::new(CheckpointConfig { max_concurrent: 2, ..periodic(10) });
    h.handle(Event::StartScheduler);
    let acts = h.fire_timer();
    let periodic_id = triggered(&h.allocate(&acts)).unwrap().0;
    let sp = h.savepoint(Some("/sp"), true);
    assert!(h.timer.is_none(), "periodic checkpoints stop for stop-with-savepoint");
    assert!(
        aborted(&h.log).contains(&(periodic_id, CheckpointFailureReason::CheckpointCoordinatorSuspend)),
        "checkpoints in flight are aborted"
    );
    let reason = CheckpointFailureReason::CheckpointDeclinedTaskNotReady;
    h.handle(Event::TaskDeclined { attempt: A1, checkpoint_id: sp, reason, detail: None });
    assert!(h.timer.is_some(), "a failed stop-with-savepoint resumes periodic checkpoints");
}

#[test]
fn completed_sync_savepoint_keeps_periodic_checkpoints_stopped() {
    let mut h = Harness::new(periodic(10));
    h.handle(Event::StartScheduler);
    let sp = h.savepoint(Some("/sp"), true);
    let acts = h.complete(sp);
    assert_eq!(notified_complete(&acts), vec![sp]);
    assert!(h.timer.is_none());
}

#[test]
fn id_allocation_failure_answers_request_and_frees_slot() {
    let mut h = Harness::new(CheckpointConfig::default());
    let (request, acts) = h.request(TriggerKind::Checkpoint);
    let token = allocation_tokens(&acts)[0];
    let (queued, _) = h.request(TriggerKind::Checkpoint);
    let acts = h.handle(Event::CheckpointIdAllocationFailed { token, error: "not leader".into() });
    assert_eq!(
        answer(&acts, request),
        Some(Err(TriggerError::Rejected { reason: CheckpointFailureReason::TriggerCheckpointFailure }))
    );
    let acts = h.allocate(&acts);
    assert!(acts.contains(&Action::TriggerAccepted { request: queued, checkpoint_id: 1 }));
}

#[test]
fn trigger_refused_when_task_not_running() {
    let mut h = Harness::new(CheckpointConfig::default());
    h.handle(Event::TaskStatusChanged { attempt: A3, status: TaskStatus::NotRunning });
    let (request, acts) = h.request(TriggerKind::Checkpoint);
    assert_eq!(
        answer(&acts, request),
        Some(Err(TriggerError::Rejected { reason: CheckpointFailureReason::NotAllRequiredTasksRunning }))
    );
    assert!(allocation_tokens(&acts).is_empty(), "no id is spent");
}

#[test]
fn task_stopping_during_allocation_aborts_trigger() {
    let mut h = Harness::new(CheckpointConfig::default());
    let (request, acts) = h.request(TriggerKind::Checkpoint);
    h.handle(Event::TaskStatusChanged { attempt: A1, status: TaskStatus::NotRunning });
    let acts = h.allocate(&acts);
    assert!(triggered(&acts).is_none(), "no task hears of the id");
    assert_eq!(
        answer(&acts, request),
        Some(Err(TriggerError::Rejected { reason: CheckpointFailureReason::NotAllRequiredTasksRunning }))
    );
}

#[test]
fn non_increasing_id_is_refused() {
    let mut h = Harness::new(CheckpointConfig { max_concurrent: 2, ..Default::default() });
    assert_eq!(h.checkpoint(), 1);
    let (request, acts) = h.request(TriggerKind::Checkpoint);
    let token = allocation_tokens(&acts)[0];
    let acts = h.handle(Event::CheckpointIdAllocated { token, checkpoint_id: 1 });
    assert!(triggered(&acts).is_none());
    assert!(matches!(answer(&acts, request), Some(Err(TriggerError::Rejected { .. }))));
}

#[test]
fn huge_configured_durations_do_not_overflow() {
    let cfg = CheckpointConfig {
        interval: Some(Duration::MAX),
        timeout: Duration::MAX,
        min_pause: Duration::MAX,
        max_concurrent: 2,
        ..Default::default()
    };
    let mut h = Harness::new(cfg);
    h.handle(Event::StartScheduler);
    assert!(h.timer.is_some());
    let id = h.checkpoint();
    h.complete(id);
    let (_, acts) = h.request(TriggerKind::Checkpoint);
    assert!(allocation_tokens(&acts).is_empty(), "waits for the (very long) min pause");
}
