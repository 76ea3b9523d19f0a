use proptest::prelude::*;

use super::*;
use crate::model::{CheckpointConfig, CommandResponse, JobSpec, SavepointRecord};
use cairn_protocol::restart::RestartStrategy;

fn jid(s: &str) -> JobId {
    JobId::new(s).unwrap()
}

fn register(sm: &mut StateMachineData, job: &str, retained: u32) {
    let spec =
        JobSpec { checkpoint: CheckpointConfig { retained, ..Default::default() }, ..Default::default() };
    sm.apply(&Command::RegisterJob { job: jid(job), name: String::new(), spec }).unwrap();
}

fn allocate(sm: &mut StateMachineData, job: &str) -> u64 {
    match sm.apply(&Command::AllocateCheckpointId { job: jid(job) }).unwrap() {
        Outcome::CheckpointId { id } => id,
        other => panic!("unexpected {other:?}"),
    }
}

fn cp(id: u64) -> CompletedCheckpoint {
    CompletedCheckpoint {
        id,
        kind: CheckpointKind::Checkpoint,
        trigger_time_ms: 10,
        completion_time_ms: 20,
        metadata_path: format!("/cp/job/chk-{id}/_metadata"),
        metadata_size: 100,
        metadata_crc32: 7,
        state_size: 1000,
    }
}

fn add(sm: &mut StateMachineData, job: &str, id: u64) -> Result<Outcome, CommandError> {
    sm.apply(&Command::AddCompletedCheckpoint { job: jid(job), checkpoint: cp(id) })
}

#[test]
fn ids_start_at_one_and_increase() {
    let mut sm = StateMachineData::default();
    register(&mut sm, "a", 1);
    assert_eq!(allocate(&mut sm, "a"), 1);
    assert_eq!(allocate(&mut sm, "a"), 2);
    register(&mut sm, "b", 1);
    assert_eq!(allocate(&mut sm, "b"), 1, "counters are per job");
}

fn reserve(sm: &mut StateMachineData, job: &str, count: u32) -> Result<(u64, u32), CommandError> {
    match sm.apply(&Command::ReserveCheckpointIds { job: jid(job), count })? {
        Outcome::CheckpointIds { first, count } => Ok((first, count)),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn reserved_ranges_never_overlap_and_later_ids_start_above_them() {
    let mut sm = StateMachineData::default();
    register(&mut sm, "a", 1);
    assert_eq!(allocate(&mut sm, "a"), 1);
    assert_eq!(reserve(&mut sm, "a", 100), Ok((2, 100)));
    // A later leader (or the store RPC) continues above the whole range, used or not.
    assert_eq!(allocate(&mut sm, "a"), 102);
    assert_eq!(reserve(&mut sm, "a", 1), Ok((103, 1)));
    assert_eq!(sm.job(&jid("a")).unwrap().next_checkpoint_id, 104);
}

#[test]
fn invalid_reservations_are_refused_and_change_nothing() {
    let mut sm = StateMachineData::default();
    register(&mut sm, "a", 1);
    let before = sm.clone();
    for count in [0, MAX_ID_RESERVATION + 1, u32::MAX] {
        assert_eq!(
            reserve(&mut sm, "a", count),
            Err(CommandError::InvalidReservation { job: jid("a"), count, max: MAX_ID_RESERVATION })
        );
    }
    assert_eq!(reserve(&mut sm, "nope", 5), Err(CommandError::UnknownJob { job: jid("nope") }));
    assert_eq!(sm, before);
}

#[test]
fn a_reservation_at_the_end_of_the_id_space_is_shortened_then_refused() {
    let mut sm = StateMachineData::default();
    register(&mut sm, "a", 1);
    sm.apply(&Command::AdvanceCheckpointCounter { job: jid("a"), next: u64::MAX - 3 }).unwrap();
    assert_eq!(reserve(&mut sm, "a", 100), Ok((u64::MAX - 3, 3)));
    assert_eq!(sm.job(&jid("a")).unwrap().next_checkpoint_id, u64::MAX);
    assert_eq!(reserve(&mut sm, "a", 1), Err(CommandError::CounterExhausted { job: jid("a") }));
}

#[test]
fn a_batch_applies_each_command_as_its_own_entry_would() {
    let mut sm = StateMachineData::default();
    register(&mut sm, "a", 1);
    let mut one_by_one = sm.clone();
    let commands = vec![
        Command::AllocateCheckpointId { job: jid("a") },
        Command::AllocateCheckpointId { job: jid("nope") },
        Command::ReserveCheckpointIds { job: jid("a"), count: 3 },
    ];
    let expected: Vec<_> = commands.iter().map(|c| one_by_one.apply(c)).collect();
    let outcome = sm.apply(&Command::Batch { commands: commands.clone() }).unwrap();
    assert_eq!(outcome, Outcome::Batch { results: expected });
    assert_eq!(sm, one_by_one, "the rejection inside did not undo the others");
    let before = sm.clone();
    for bad in [
        Command::Batch { commands: Vec::new() },
        Command::Batch { commands: vec![Command::Batch { commands: commands.clone() }] },
        Command::Batch { commands: vec![commands[0].clone(); MAX_BATCH + 1] },
        Command::Deduplicated {
            request_id: "r".into(),
            fingerprint: 1,
            command: Box::new(Command::Batch { commands: commands.clone() }),
        },
    ] {
        assert!(matches!(sm.apply(&bad), Err(CommandError::InvalidBatch { .. })), "{bad}");
        assert_eq!(sm, before, "{bad} changed the state");
    }
}

#[test]
fn unknown_job_is_rejected() {
    let mut sm = StateMachineData::default();
    let err = sm.apply(&Command::AllocateCheckpointId { job: jid("nope") }).unwrap_err();
    assert_eq!(err, CommandError::UnknownJob { job: jid("nope") });
}

#[test]
fn registering_twice_is_rejected_and_changes_nothing() {
    let mut sm = StateMachineData::default();
    register(&mut sm, "a", 1);
    allocate(&mut sm, "a");
    let before = sm.clone();
    let err = sm
        .apply(&Command::RegisterJob { job: jid("a"), name: "x".into(), spec: JobSpec::default() })
        .unwrap_err();
    assert_eq!(err, CommandError::JobExists { job: jid("a") });
    assert_eq!(sm, before);
}

#[test]
fn zero_retention_is_rejected() {
    let mut sm = StateMachineData::default();
    let spec =
        JobSpec { checkpoint: CheckpointConfig { retained: 0, ..Default::default() }, ..Default::default() };
    let err = sm.apply(&Command::RegisterJob { job: jid("a"), name: String::new(), spec }).unwrap_err();
    assert!(matches!(err, CommandError::InvalidConfig(ref e) if e.field == "retained"), "{err}");
    assert!(sm.jobs.is_empty());
}

#[test]
fn counter_cannot_be_lowered() {
    let mut sm = StateMachineData::default();
    register(&mut sm, "a", 1);
    sm.apply(&Command::AdvanceCheckpointCounter { job: jid("a"), next: 10 }).unwrap();
    let err = sm.apply(&Command::AdvanceCheckpointCounter { job: jid("a"), next: 5 }).unwrap_err();
    assert_eq!(err, CommandError::CounterRegression { job: jid("a"), current: 10, requested: 5 });
    assert_eq!(allocate(&mut sm, "a"), 10);
}

#[test]
fn duplicate_and_unallocated_checkpoints_are_rejected() {
    let mut sm = StateMachineData::default();
    register(&mut sm, "a", 3);
    assert!(matches!(add(&mut sm, "a", 1), Err(CommandError::NotAllocated { id: 1, next: 1, .. })));
    allocate(&mut sm, "a");
    allocate(&mut sm, "a");
    add(&mut sm, "a", 2).unwrap();
    assert_eq!(add(&mut sm, "a", 2), Err(CommandError::DuplicateCheckpoint { job: jid("a"), id: 2 }));
    assert_eq!(add(&mut sm, "a", 1), Err(CommandError::OutOfOrder { job: jid("a"), id: 1, latest: 2 }));
}

#[test]
fn retention_returns_subsumed_oldest_first() {
    let mut sm = StateMachineData::default();
    register(&mut sm, "a", 2);
    for _ in 0..4 {
        allocate(&mut sm, "a");
    }
    add(&mut sm, "a", 1).unwrap();
    add(&mut sm, "a", 2).unwrap();
    assert_eq!(add(&mut sm, "a", 3).unwrap(), Outcome::Subsumed { checkpoints: vec![cp(1)] });
    let cfg = CheckpointConfig { retained: 1, ..Default::default() };
    let out = sm.apply(&Command::UpdateJobConfig { job: jid("a"), checkpoint: cfg }).unwrap();
    assert_eq!(out, Outcome::Subsumed { checkpoints: vec![cp(2)] });
    assert_eq!(sm.job(&jid("a")).unwrap().completed, vec![cp(3)]);
    assert_eq!(sm.job(&jid("a")).unwrap().num_completed, 3);
}

#[test]
fn terminal_jobs_accept_nothing_but_removal() {
    let mut sm = StateMachineData::default();
    register(&mut sm, "a", 1);
    allocate(&mut sm, "a");
    add(&mut sm, "a", 1).unwrap();
    let err = sm.apply(&Command::RemoveJob { job: jid("a") }).unwrap_err();
    assert!(matches!(err, CommandError::JobNotTerminal { .. }));
    sm.apply(&Command::SetJobStatus { job: jid("a"), status: JobStatus::Canceled }).unwrap();
    assert!(matches!(
        sm.apply(&Command::AllocateCheckpointId { job: jid("a") }),
        Err(CommandError::JobTerminal { .. })
    ));
    assert!(matches!(
        sm.apply(&Command::SetJobStatus { job: jid("a"), status: JobStatus::Running }),
        Err(CommandError::JobTerminal { .. })
    ));
    let out = sm.apply(&Command::RemoveJob { job: jid("a") }).unwrap();
    assert_eq!(out, Outcome::JobRemoved { checkpoints: vec![cp(1)], savepoints: vec![] });
    assert!(sm.jobs.is_empty());
}

#[test]
fn retained_checkpoints_are_discarded_only_after_termination() {
    let mut sm = StateMachineData::default();
    register(&mut sm, "a", 2);
    for _ in 0..2 {
        let id = allocate(&mut sm, "a");
        add(&mut sm, "a", id).unwrap();
    }
    let before = sm.clone();
    let err = sm.apply(&Command::DiscardRetainedCheckpoints { job: jid("a") }).unwrap_err();
    assert!(matches!(err, CommandError::JobNotTerminal { .. }));
    assert_eq!(sm, before, "a refused discard changes nothing");
    sm.apply(&Command::SetJobStatus { job: jid("a"), status: JobStatus::Canceled }).unwrap();
    let out = sm.apply(&Command::DiscardRetainedCheckpoints { job: jid("a") }).unwrap();
    assert_eq!(out, Outcome::Subsumed { checkpoints: vec![cp(1), cp(2)] });
    let job = &sm.jobs[&jid("a")];
    assert!(job.completed.is_empty());
    assert_eq!(job.next_checkpoint_id, 3, "the counter is untouched: ids are never reused");
}

#[test]
fn stats_are_recorded_as_objects_only() {
    let mut sm = StateMachineData::default();
    register(&mut sm, "a", 1);
    let bad = sm.apply(&Command::RecordStats { job: jid("a"), stats: serde_json::json!(3) });
    assert!(matches!(bad, Err(CommandError::InvalidStats { .. })));
    let stats = serde_json::json!({"counts": {"failed": 2}});
    sm.apply(&Command::RecordStats { job: jid("a"), stats: stats.clone() }).unwrap();
    assert_eq!(sm.job(&jid("a")).unwrap().stats, Some(stats));
}

#[test]
fn attempts_are_numbered_from_one() {
    let mut sm = StateMachineData::default();
    register(&mut sm, "a", 1);
    assert_eq!(sm.apply(&Command::BeginAttempt { job: jid("a") }), Ok(Outcome::Attempt { attempt: 1 }));
    assert_eq!(sm.apply(&Command::BeginAttempt { job: jid("a") }), Ok(Outcome::Attempt { attempt: 2 }));
    assert_eq!(sm.job(&jid("a")).unwrap().attempts, 2);
}

#[test]
fn illegal_transition_is_rejected() {
    let mut sm = StateMachineData::default();
    register(&mut sm, "a", 1);
    sm.apply(&Command::SetJobStatus { job: jid("a"), status: JobStatus::Running }).unwrap();
    let err = sm.apply(&Command::SetJobStatus { job: jid("a"), status: JobStatus::Created }).unwrap_err();
    assert!(matches!(err, CommandError::IllegalTransition { .. }));
}

#[test]
fn savepoints_register_dispose_and_win_restore_when_newer() {
    let mut sm = StateMachineData::default();
    register(&mut sm, "a", 1);
    for _ in 0..3 {
        allocate(&mut sm, "a");
    }
    add(&mut sm, "a", 2).unwrap();
    let mut sp = cp(3);
    sp.kind = CheckpointKind::Savepoint;
    let rec = SavepointRecord { checkpoint: sp.clone(), path: "/sp/savepoint-a-3".into() };
    sm.apply(&Command::RegisterSavepoint { job: jid("a"), savepoint: rec.clone() }).unwrap();
    assert_eq!(
        sm.apply(&Command::RegisterSavepoint { job: jid("a"), savepoint: rec.clone() }),
        Err(CommandError::DuplicateSavepoint { job: jid("a"), id: 3 })
    );
    assert_eq!(sm.job(&jid("a")).unwrap().restore_point().map(|c| c.id), Some(3));
    let out = sm.apply(&Command::DisposeSavepoint { job: jid("a"), checkpoint_id: 3 }).unwrap();
    assert_eq!(out, Outcome::SavepointDisposed { savepoint: rec });
    assert_eq!(sm.job(&jid("a")).unwrap().restore_point().map(|c| c.id), Some(2));
    assert!(matches!(
        sm.apply(&Command::DisposeSavepoint { job: jid("a"), checkpoint_id: 3 }),
        Err(CommandError::UnknownSavepoint { .. })
    ));
}

#[test]
fn persisted_encoding_is_stable() {
    // Golden encoding: log entries written by an earlier build must stay readable.
    let cmd = Command::AllocateCheckpointId { job: jid("a") };
    let json = serde_json::to_string(&cmd).unwrap();
    assert_eq!(json, r#"{"cmd":"allocate_checkpoint_id","job":"a"}"#);
    let resp = CommandResponse(Ok(Outcome::CheckpointId { id: 7 }));
    assert_eq!(serde_json::to_string(&resp).unwrap(), r#"{"Ok":{"outcome":"checkpoint_id","id":7}}"#);
}

/// A random command over a small set of jobs, so sequences hit the same jobs often.
fn arb_command() -> impl Strategy<Value = Command> {
    let job = prop_oneof![Just("a"), Just("b"), Just("c")].prop_map(jid);
    prop_oneof![
        1 => (job.clone(), 0u32..4).prop_map(|(job, retained)| Command::RegisterJob {
            job,
            name: String::new(),
            spec: JobSpec { checkpoint: CheckpointConfig { retained, ..Default::default() }, ..Default::default() },
        }),
        3 => job.clone().prop_map(|job| Command::AllocateCheckpointId { job }),
        1 => (job.clone(), 0u64..40).prop_map(|(job, next)| Command::AdvanceCheckpointCounter { job, next }),
        3 => (job.clone(), 0u64..40).prop_map(|(job, id)| Command::AddCompletedCheckpoint { job, checkpoint: cp(id) }),
        1 => (job.clone(), 0u32..4).prop_map(|(job, retained)| Command::UpdateJobConfig {
            job,
            checkpoint: CheckpointConfig { retained, ..Default::default() },
        }),
        1 => job.clone().prop_map(|job| Command::SetJobStatus { job, status: JobStatus::Running }),
        1 => job.clone().prop_map(|job| Command::SetJobStatus { job, status: JobStatus::Canceled }),
        1 => job.prop_map(|job| Command::RemoveJob { job }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Per job (per incarnation), allocated IDs strictly increase and are never reused; completed
    /// checkpoints stay sorted and unique; retention never drops the newest completed checkpoint
    /// and never keeps more than configured; a rejected command changes nothing.
    #[test]
    fn ids_increase_and_retention_keeps_newest(cmds in prop::collection::vec(arb_command(), 1..200)) {
        let mut sm = StateMachineData::default();
        let mut last_id: BTreeMap<JobId, u64> = BTreeMap::new();
        for cmd in &cmds {
            let Some(job_id) = cmd.job() else { continue };
            let before = sm.clone();
            let newest_before = sm.job(job_id).and_then(|j| j.latest_completed().cloned());
            match sm.apply(cmd) {
                Err(_) => prop_assert_eq!(&sm, &before, "a rejected command changed state: {}", cmd),
                Ok(Outcome::CheckpointId { id }) => {
                    if let Some(prev) = last_id.get(job_id) {
                        prop_assert!(id > *prev, "id {} after {} for {}", id, prev, job_id);
                    }
                    last_id.insert(job_id.clone(), id);
                }
                Ok(Outcome::JobRemoved { .. }) => { last_id.remove(job_id); }
                Ok(_) => {}
            }
            if let Some(job) = sm.job(job_id) {
                let ids: Vec<u64> = job.completed.iter().map(|c| c.id).collect();
                prop_assert!(ids.windows(2).all(|w| w[0] < w[1]), "completed not increasing: {:?}", ids);
                prop_assert!(ids.len() <= job.spec.checkpoint.retained as usize);
                prop_assert!(ids.iter().all(|id| *id < job.next_checkpoint_id));
                if let (Some(newest), false) = (&newest_before, matches!(cmd, Command::RemoveJob { .. })) {
                    let now = job.latest_completed().map(|c| c.id);
                    prop_assert!(now >= Some(newest.id), "newest checkpoint {} dropped by {}", newest.id, cmd);
                }
            }
        }
    }
}

fn dedup(id: &str, fingerprint: u64, command: Command) -> Command {
    Command::Deduplicated { request_id: id.to_owned(), fingerprint, command: Box::new(command) }
}

#[test]
fn a_repeated_request_acts_once_and_returns_the_first_outcome() {
    let mut sm = StateMachineData::default();
    let spec = JobSpec::default();
    let reg = || Command::RegisterJob { job: jid("a"), name: String::new(), spec: spec.clone() };
    assert_eq!(sm.apply(&dedup("r1", 1, reg())), Ok(Outcome::Done));
    // The retry of the registration is recognised although the job now exists.
    assert_eq!(sm.apply(&dedup("r1", 1, reg())), Ok(Outcome::Repeated { first: Box::new(Outcome::Done) }));
    let alloc = || Command::AllocateCheckpointId { job: jid("a") };
    assert_eq!(sm.apply(&dedup("r2", 2, alloc())), Ok(Outcome::CheckpointId { id: 1 }));
    assert_eq!(
        sm.apply(&dedup("r2", 2, alloc())),
        Ok(Outcome::Repeated { first: Box::new(Outcome::CheckpointId { id: 1 }) })
    );
    assert_eq!(sm.job(&jid("a")).unwrap().next_checkpoint_id, 2, "allocated once");
    // Same id, other arguments: refused, nothing changes.
    let before = sm.clone();
    assert!(matches!(sm.apply(&dedup("r2", 3, alloc())), Err(CommandError::RequestIdReused { .. })));
    assert_eq!(sm, before);
}

#[test]
fn a_rejected_request_is_not_remembered_and_terminal_jobs_still_answer_repeats() {
    let mut sm = StateMachineData::default();
    register(&mut sm, "a", 1);
    let cancel = || Command::SetJobStatus { job: jid("a"), status: JobStatus::Canceled };
    assert_eq!(sm.apply(&dedup("c", 9, cancel())), Ok(Outcome::Done));
    // The job is terminal now, yet the retry of the cancel is answered with its first outcome.
    assert_eq!(sm.apply(&dedup("c", 9, cancel())), Ok(Outcome::Repeated { first: Box::new(Outcome::Done) }));
    // A rejected command leaves no entry behind.
    assert!(sm.apply(&dedup("x", 1, Command::AllocateCheckpointId { job: jid("a") })).is_err());
    assert!(sm.job(&jid("a")).unwrap().requests.outcome("x").is_none());
}

#[test]
fn recorded_requests_map_an_id_to_an_outcome() {
    let mut sm = StateMachineData::default();
    register(&mut sm, "a", 1);
    let rec = |fp, id| Command::RecordRequest {
        job: jid("a"),
        request_id: "t".into(),
        fingerprint: fp,
        outcome: Outcome::CheckpointId { id },
    };
    assert_eq!(sm.apply(&rec(1, 5)), Ok(Outcome::CheckpointId { id: 5 }));
    assert_eq!(
        sm.apply(&rec(1, 6)),
        Ok(Outcome::Repeated { first: Box::new(Outcome::CheckpointId { id: 5 }) })
    );
    assert!(matches!(sm.apply(&rec(2, 5)), Err(CommandError::RequestIdReused { .. })));
}

fn record_failure(sm: &mut StateMachineData, job: &str, at_ms: u64, strategy: RestartStrategy) -> Outcome {
    sm.apply(&Command::RecordFailure {
        job: jid(job),
        at_ms,
        cause: "task failed".into(),
        strategy,
        jitter_permille: 0,
    })
    .unwrap()
}

#[test]
fn a_failure_restarts_per_strategy_and_the_state_is_replicated() {
    let mut sm = StateMachineData::default();
    register(&mut sm, "a", 1);
    sm.apply(&Command::SetJobStatus { job: jid("a"), status: JobStatus::Running }).unwrap();
    let fixed = RestartStrategy::fixed_delay(1, std::time::Duration::from_secs(2));
    let out = record_failure(&mut sm, "a", 1_000, fixed.clone());
    assert_eq!(
        out,
        Outcome::RestartDecided { decision: RestartDecision::Restart { at_ms: 3_000, delay_ms: 2_000 } }
    );
    let job = sm.job(&jid("a")).unwrap();
    assert_eq!(job.status, JobStatus::Restarting);
    assert_eq!(job.restart.next_restart_ms, Some(3_000));
    assert_eq!(job.restart.last_failure.as_ref().map(|f| f.cause.as_str()), Some("task failed"));
    // The same command on another replica decides the same (the state is part of the record).
    let mut replica = sm.clone();
    let again = record_failure(&mut sm, "a", 5_000, fixed.clone());
    assert_eq!(again, record_failure(&mut replica, "a", 5_000, fixed.clone()));
    let reason = match again {
        Outcome::RestartDecided { decision: RestartDecision::GiveUp { reason } } => reason,
        other => panic!("fixed-delay with one attempt must give up at the second failure: {other:?}"),
    };
    assert!(matches!(&sm.job(&jid("a")).unwrap().status, JobStatus::Failed { reason: r } if *r == reason));
    // A failed job records no more failures.
    let err = sm
        .apply(&Command::RecordFailure {
            job: jid("a"),
            at_ms: 9_000,
            cause: "late".into(),
            strategy: fixed,
            jitter_permille: 0,
        })
        .unwrap_err();
    assert!(matches!(err, CommandError::JobTerminal { .. }), "{err}");
}

#[test]
fn a_completed_checkpoint_starts_the_next_failure_at_the_initial_backoff() {
    let mut sm = StateMachineData::default();
    register(&mut sm, "a", 2);
    sm.apply(&Command::SetJobStatus { job: jid("a"), status: JobStatus::Running }).unwrap();
    let exp = RestartStrategy::exponential_delay();
    let delay = |o: Outcome| match o {
        Outcome::RestartDecided { decision: RestartDecision::Restart { delay_ms, .. } } => delay_ms,
        other => panic!("must restart: {other:?}"),
    };
    let mut delays = Vec::new();
    for i in 0..3 {
        delays.push(delay(record_failure(&mut sm, "a", 1_000 * (i + 1), exp.clone())));
        sm.apply(&Command::SetJobStatus { job: jid("a"), status: JobStatus::Running }).unwrap();
    }
    assert_eq!(delays, vec![1_000, 1_500, 2_250]);
    let id = allocate(&mut sm, "a");
    add(&mut sm, "a", id).unwrap();
    assert_eq!(delay(record_failure(&mut sm, "a", 10_000, exp)), 1_000);
    assert_eq!(sm.job(&jid("a")).unwrap().restart.failures, 4);
}

#[test]
fn an_invalid_strategy_is_refused_and_changes_nothing() {
    let mut sm = StateMachineData::default();
    register(&mut sm, "a", 1);
    let bad = RestartStrategy::FailureRate {
        max_failures_per_interval: 0,
        failure_rate_interval: std::time::Duration::from_secs(1),
        delay: std::time::Duration::ZERO,
    };
    let before = sm.clone();
    let err = sm
        .apply(&Command::RecordFailure {
            job: jid("a"),
            at_ms: 1,
            cause: "x".into(),
            strategy: bad,
            jitter_permille: 0,
        })
        .unwrap_err();
    assert!(matches!(err, CommandError::InvalidRestartStrategy(_)), "{err}");
    assert_eq!(sm, before);
}

#[test]
fn a_retained_checkpoint_of_an_ended_job_can_be_released_once() {
    let mut sm = StateMachineData::default();
    register(&mut sm, "a", 2);
    for _ in 0..2 {
        let id = allocate(&mut sm, "a");
        add(&mut sm, "a", id).unwrap();
    }
    let release = Command::ReleaseRetainedCheckpoint { job: jid("a"), checkpoint_id: 1 };
    assert!(
        matches!(sm.apply(&release), Err(CommandError::JobNotTerminal { .. })),
        "a live job keeps its own"
    );
    sm.apply(&Command::SetJobStatus { job: jid("a"), status: JobStatus::Canceled }).unwrap();
    assert_eq!(sm.apply(&release).unwrap(), Outcome::Subsumed { checkpoints: vec![cp(1)] });
    assert!(matches!(sm.apply(&release), Err(CommandError::UnknownCheckpoint { id: 1, .. })));
    assert_eq!(sm.job(&jid("a")).unwrap().completed, vec![cp(2)]);
}

/// A copy of the state (what a snapshot captures) shares the records; applying commands to the
/// state afterwards, the removal of a job included, must leave the copy exactly as it was.
#[test]
fn a_copy_of_the_state_is_unchanged_by_later_commands() {
    let mut sm = StateMachineData::default();
    register(&mut sm, "a", 2);
    register(&mut sm, "b", 1);
    let id = allocate(&mut sm, "a");
    add(&mut sm, "a", id).unwrap();
    let copy = sm.clone();
    let frozen = serde_json::to_string(&copy).unwrap();
    assert!(Arc::ptr_eq(&copy.jobs[&jid("a")], &sm.jobs[&jid("a")]), "the copy shares the records");

    let next = allocate(&mut sm, "a");
    add(&mut sm, "a", next).unwrap();
    sm.apply(&Command::SetJobStatus { job: jid("b"), status: JobStatus::Canceled }).unwrap();
    sm.apply(&Command::RemoveJob { job: jid("b") }).unwrap();
    register(&mut sm, "c", 1);

    assert_eq!(serde_json::to_string(&copy).unwrap(), frozen, "the copy did not change");
    assert_eq!(copy.jobs[&jid("a")].completed.len(), 1);
    assert_eq!(sm.jobs[&jid("a")].completed.len(), 2);
    assert!(copy.jobs.contains_key(&jid("b")) && !sm.jobs.contains_key(&jid("b")));
    assert!(!Arc::ptr_eq(&copy.jobs[&jid("a")], &sm.jobs[&jid("a")]), "a changed record is the state's own");
}

/// Shared records encode as plain records: a state encoded before the change decodes into the
/// same state, and the encoding of a state is the one of its records.
#[test]
fn shared_records_encode_as_plain_records() {
    let mut sm = StateMachineData::default();
    register(&mut sm, "a", 1);
    let id = allocate(&mut sm, "a");
    add(&mut sm, "a", id).unwrap();
    #[derive(Serialize)]
    struct Plain {
        jobs: BTreeMap<JobId, JobRecord>,
    }
    let plain = Plain { jobs: sm.jobs.iter().map(|(id, job)| (id.clone(), JobRecord::clone(job))).collect() };
    let plain_json = serde_json::to_string(&plain).unwrap();
    assert_eq!(serde_json::to_string(&sm).unwrap(), plain_json);
    let decoded: StateMachineData = serde_json::from_str(&plain_json).unwrap();
    assert_eq!(decoded, sm);
}
