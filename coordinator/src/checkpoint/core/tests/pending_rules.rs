//! Pending checkpoints: acks (success, duplicate, unknown attempt, late), declines, expiry,
//! task failures, subsumption of older pending checkpoints, state handle validation.

use cairn_raft::model::CheckpointConfig;

use super::*;

#[test]
fn ack_completes_when_all_tasks_acked() {
    let mut h = Harness::new(CheckpointConfig::default());
    let id = h.checkpoint();
    assert!(h.ack(A1, id).is_empty());
    assert!(h.ack(A3, id).is_empty());
    let acts = h.ack(A2, id);
    assert!(matches!(acts[..], [Action::WriteMetadata { checkpoint_id: 1, .. }]), "{acts:?}");
}

#[test]
fn duplicate_ack_is_ignored() {
    let mut h = Harness::new(CheckpointConfig::default());
    let id = h.checkpoint();
    h.ack(A1, id);
    let acts = h.ack(A1, id);
    assert!(acts.is_empty(), "a duplicate neither counts nor discards: {acts:?}");
    h.ack(A2, id);
    assert!(h.ack(A3, id).iter().any(|a| matches!(a, Action::WriteMetadata { .. })));
}

#[test]
fn ack_for_unknown_attempt_discards_state() {
    let mut h = Harness::new(CheckpointConfig::default());
    let id = h.checkpoint();
    let stale = TaskAttemptId(99);
    let acts = h.ack_with(stale, id, state(id, stale, &["shared/stale-new"]));
    assert_eq!(
        acts,
        vec![Action::DiscardAckedState {
            checkpoint_id: id,
            attempt: stale,
            cause: StrayAck::UnknownAttempt,
            files: vec![job_path("chk-1/a99.state"), job_path("shared/stale-new")],
        }]
    );
    assert_eq!(h.core.pending_ids(), vec![id], "the checkpoint still waits for its own tasks");
}

#[test]
fn ack_for_discarded_checkpoint_discards_state() {
    let mut h = Harness::new(CheckpointConfig::default());
    let id = h.checkpoint();
    let reason = CheckpointFailureReason::CheckpointDeclined;
    h.handle(Event::TaskDeclined { attempt: A1, checkpoint_id: id, reason, detail: None });
    let acts = h.ack(A2, id);
    assert_eq!(
        acts,
        vec![Action::DiscardAckedState {
            checkpoint_id: id,
            attempt: A2,
            cause: StrayAck::Late { outcome: FinishedOutcome::Failed(reason) },
            files: vec![job_path("chk-1/a2.state")],
        }]
    );
}

#[test]
fn late_ack_for_recent_checkpoint_is_told_apart() {
    let mut h = Harness::new(CheckpointConfig::default());
    let id = h.checkpoint();
    h.advance(CheckpointConfig::default().timeout);
    h.handle(Event::CheckpointTimeout { checkpoint_id: id });
    let late = h.ack(A1, id);
    let unknown = h.ack(A1, 77);
    let cause = |acts: &[Action]| match acts {
        [Action::DiscardAckedState { cause, .. }] => *cause,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        cause(&late),
        StrayAck::Late { outcome: FinishedOutcome::Failed(CheckpointFailureReason::CheckpointExpired) }
    );
    assert_eq!(cause(&unknown), StrayAck::UnknownCheckpoint);
}

#[test]
fn recent_ids_memory_is_bounded() {
    let mut config =
        CoreConfig::new(job(), CheckpointConfig { tolerable_failures: 10, ..Default::default() }, ROOT);
    config.recent_ids = 2;
    let mut h = Harness::with(config);
    let mut ids = Vec::new();
    for _ in 0..3 {
        let id = h.checkpoint();
        let reason = CheckpointFailureReason::CheckpointDeclined;
        h.handle(Event::TaskDeclined { attempt: A1, checkpoint_id: id, reason, detail: None });
        ids.push(id);
    }
    let forgotten = h.ack(A1, ids[0]);
    assert!(matches!(forgotten[..], [Action::DiscardAckedState { cause: StrayAck::UnknownCheckpoint, .. }]));
    let remembered = h.ack(A1, ids[2]);
    assert!(matches!(remembered[..], [Action::DiscardAckedState { cause: StrayAck::Late { .. }, .. }]));
}

#[test]
fn late_ack_never_discards_retained_files() {
    let mut h = Harness::new(CheckpointConfig::default());
    let id = h.checkpoint();
    h.ack_with(A1, id, state(id, A1, &["shared/s1"]));
    h.ack(A2, id);
    h.ack(A3, id);
    h.write_metadata(id);
    h.commit(id);
    // A retried ack of the retained checkpoint, same handles plus one file never kept.
    let mut again = state(id, A1, &["shared/s1"]);
    let extra = file(format!("chk-{id}/orphan.state"));
    again.operators.get_mut("op").unwrap().keyed.insert_whole_file(7, extra);
    let acts = h.ack_with(A1, id, again);
    assert_eq!(
        acts,
        vec![Action::DiscardAckedState {
            checkpoint_id: id,
            attempt: A1,
            cause: StrayAck::Late { outcome: FinishedOutcome::Completed },
            files: vec![job_path("chk-1/orphan.state")],
        }]
    );
}

#[test]
fn stray_ack_never_discards_files_outside_its_own_checkpoint() {
    let mut h = Harness::new(CheckpointConfig::default());
    let mut bogus = state(5, A1, &[]);
    bogus.operators.get_mut("op").unwrap().keyed.insert_whole_file(6, file("chk-4/not-yours.state"));
    bogus.operators.get_mut("op").unwrap().keyed.insert_whole_file(7, file("../../etc/passwd"));
    let acts = h.ack_with(A1, 5, bogus);
    assert_eq!(
        acts,
        vec![Action::DiscardAckedState {
            checkpoint_id: 5,
            attempt: A1,
            cause: StrayAck::UnknownCheckpoint,
            files: vec![job_path("chk-5/a1.state")],
        }]
    );
}

#[test]
fn decline_aborts_with_reason() {
    let mut h = Harness::new(CheckpointConfig { tolerable_failures: 5, ..Default::default() });
    let (request, acts) = h.request(TriggerKind::Checkpoint);
    h.allocate(&acts);
    h.ack_with(A1, 1, state(1, A1, &["shared/new"]));
    let reason = CheckpointFailureReason::CheckpointDeclinedAlignmentLimitExceeded;
    let acts = h.handle(Event::TaskDeclined {
        attempt: A2,
        checkpoint_id: 1,
        reason,
        detail: Some("too much".into()),
    });
    assert_eq!(aborted(&acts), vec![(1, reason)]);
    assert_eq!(discards(&acts), vec![(1, vec![chk_dir(1)], vec![job_path("shared/new")])]);
    assert_eq!(
        answer(&acts, request),
        Some(Err(TriggerError::Failed { checkpoint_id: 1, reason, detail: Some("too much".into()) }))
    );
    let failed = h.core.stats().latest_failed.clone().unwrap();
    assert_eq!(failed.failure.unwrap().reason, reason);
    assert!(h.core.pending_ids().is_empty());
}

#[test]
fn decline_from_stale_attempt_is_ignored() {
    let mut h = Harness::new(CheckpointConfig::default());
    let id = h.checkpoint();
    let reason = CheckpointFailureReason::CheckpointDeclined;
    let acts =
        h.handle(Event::TaskDeclined { attempt: TaskAttemptId(42), checkpoint_id: id, reason, detail: None });
    assert!(acts.is_empty());
    assert_eq!(h.core.pending_ids(), vec![id]);
}

#[test]
fn expiry_at_timeout() {
    let mut h =
        Harness::new(CheckpointConfig { timeout: secs(60), tolerable_failures: 5, ..Default::default() });
    let id = h.checkpoint();
    h.advance(secs(59));
    assert!(h.handle(Event::CheckpointTimeout { checkpoint_id: id }).is_empty(), "early fire ignored");
    h.advance(secs(1));
    let acts = h.handle(Event::CheckpointTimeout { checkpoint_id: id });
    assert_eq!(aborted(&acts), vec![(id, CheckpointFailureReason::CheckpointExpired)]);
    assert_eq!(discards(&acts), vec![(id, vec![chk_dir(id)], vec![])]);
    assert!(h.handle(Event::CheckpointTimeout { checkpoint_id: id }).is_empty(), "a second fire is harmless");
}

#[test]
fn timeout_during_commit_is_ignored() {
    let mut h = Harness::new(CheckpointConfig { timeout: secs(60), ..Default::default() });
    let id = h.checkpoint();
    h.ack_all(id);
    h.write_metadata(id);
    h.advance(secs(60));
    assert!(h.handle(Event::CheckpointTimeout { checkpoint_id: id }).is_empty());
    assert_eq!(notified_complete(&h.commit(id)), vec![id], "the commit decides");
}

#[test]
fn timeout_while_writing_metadata_expires_and_late_metadata_is_discarded() {
    let mut h =
        Harness::new(CheckpointConfig { timeout: secs(60), tolerable_failures: 5, ..Default::default() });
    let id = h.checkpoint();
    h.ack_all(id);
    h.advance(secs(60));
    let acts = h.handle(Event::CheckpointTimeout { checkpoint_id: id });
    assert_eq!(aborted(&acts), vec![(id, CheckpointFailureReason::CheckpointExpired)]);
    let acts = h.write_metadata(id);
    assert_eq!(
        acts,
        vec![Action::DiscardCheckpoint {
            checkpoint_id: id,
            cause: DiscardCause::LateMetadata,
            dirs: vec![chk_dir(id)],
            files: vec![]
        }]
    );
}

#[test]
fn task_failure_fails_unacknowledged_checkpoints() {
    let mut h = Harness::new(CheckpointConfig { max_concurrent: 2, ..Default::default() });
    let first = h.checkpoint();
    let second = h.checkpoint();
    h.ack(A1, first);
    let acts = h.handle(Event::TaskStatusChanged { attempt: A1, status: TaskStatus::Failed });
    assert_eq!(aborted(&acts), vec![(second, CheckpointFailureReason::TaskFailure)]);
    assert_eq!(h.core.pending_ids(), vec![first], "the checkpoint it acknowledged survives");
    assert_eq!(h.core.consecutive_failures(), 0, "task failures do not count");
}

#[test]
fn task_not_running_aborts_unacknowledged_checkpoints() {
    let mut h = Harness::new(CheckpointConfig::default());
    let id = h.checkpoint();
    let acts = h.handle(Event::TaskStatusChanged { attempt: A3, status: TaskStatus::NotRunning });
    assert_eq!(aborted(&acts), vec![(id, CheckpointFailureReason::NotAllRequiredTasksRunning)]);
}

#[test]
fn completion_subsumes_older_pending_checkpoints_but_not_savepoints() {
    let mut h = Harness::new(CheckpointConfig { max_concurrent: 3, ..Default::default() });
    let older = h.checkpoint();
    let savepoint = h.savepoint(Some("/sp"), false);
    let newer = h.checkpoint();
    let acts = h.complete(newer);
    assert_eq!(notified_complete(&acts), vec![newer]);
    assert_eq!(aborted(&acts), vec![(older, CheckpointFailureReason::CheckpointSubsumed)]);
    assert_eq!(h.core.pending_ids(), vec![savepoint]);
    assert_eq!(h.core.consecutive_failures(), 0, "subsumption does not count");
}

#[test]
fn invalid_state_path_aborts_checkpoint() {
    let mut h = Harness::new(CheckpointConfig { tolerable_failures: 5, ..Default::default() });
    let id = h.checkpoint();
    let mut bad = state(id, A1, &[]);
    bad.operators.get_mut("op").unwrap().keyed.insert_whole_file(6, file("chk-9/other-checkpoint.state"));
    let acts = h.ack_with(A1, id, bad);
    assert_eq!(aborted(&acts), vec![(id, CheckpointFailureReason::CheckpointDeclined)]);
    let detail = h.core.stats().latest_failed.clone().unwrap().failure.unwrap().detail.unwrap();
    assert!(detail.contains("outside chk-1/"), "{detail}");
    assert_eq!(discards(&acts), vec![(id, vec![chk_dir(id)], vec![])], "only its own directory goes");
}

#[test]
fn inconsistent_keyed_handle_aborts_checkpoint_naming_it() {
    use cairn_protocol::checkpoint::KeyGroupSegment;
    let segment =
        |file: &str, offset, length| KeyGroupSegment { file: file.into(), offset, length, crc32: 0 };
    let own = |id: u64| format!("chk-{id}/a1.state");
    type Damage = Box<dyn Fn(u64, &mut OperatorSubtaskState)>;
    let cases: [(&str, Damage); 4] = [
        (
            "key groups 1 and 5 overlap",
            Box::new(move |id, op| {
                op.keyed.key_groups.insert(5, segment(&own(id), 4, 6));
            }),
        ),
        (
            "key group 5: segment 8..11 is outside",
            Box::new(move |id, op| {
                op.keyed.key_groups.insert(5, segment(&own(id), 8, 3));
            }),
        ),
        (
            "key group 5 lies in \"shared/unlisted\", which is not among the handle's files",
            Box::new(move |_, op| {
                op.keyed.key_groups.insert(5, segment("shared/unlisted", 0, 1));
            }),
        ),
        (
            "key group 5: segment at offset 18446744073709551615 of 2 bytes",
            Box::new(move |id, op| {
                op.keyed.key_groups.insert(5, segment(&own(id), u64::MAX, 2));
            }),
        ),
    ];
    for (expected, damage) in cases {
        let mut h = Harness::new(CheckpointConfig { tolerable_failures: 5, ..Default::default() });
        let id = h.checkpoint();
        let mut bad = state(id, A1, &[]);
        damage(id, bad.operators.get_mut("op").unwrap());
        let acts = h.ack_with(A1, id, bad);
        assert_eq!(aborted(&acts), vec![(id, CheckpointFailureReason::CheckpointDeclined)], "{expected}");
        let detail = h.core.stats().latest_failed.clone().unwrap().failure.unwrap().detail.unwrap();
        assert!(detail.contains("operator op: ") && detail.contains(expected), "{expected}: {detail}");
    }
}

#[test]
fn savepoint_state_must_not_be_shared() {
    let mut h = Harness::new(CheckpointConfig::default());
    let id = h.savepoint(Some("/sp"), false);
    let acts = h.ack_with(A1, id, state(id, A1, &["shared/x"]));
    assert_eq!(aborted(&acts), vec![(id, CheckpointFailureReason::CheckpointDeclined)]);
}
