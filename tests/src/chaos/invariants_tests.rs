//! The invariant checkers on synthetic histories: a clean run passes every one, and each kind
//! of violation fails exactly the invariant it breaks.

use super::*;
use crate::chaos::history::{
    Completion, FaultRecord, FinalCheck, JobView, Observation, RestoreView, RetainedProblem, RetainedScan,
    SinkScan, StatusAnswer,
};
use crate::chaos::schedule::FaultKind;

const BOUND: u64 = 60_000;

fn view(latest: u64) -> JobView {
    JobView {
        status: "running".into(),
        next_checkpoint_id: latest + 1,
        completed_ids: (latest.saturating_sub(2).max(1)..=latest).filter(|id| *id > 0).collect(),
        num_completed: latest,
        savepoint_ids: vec![],
        attempts: 1,
        latest_restored: None,
    }
}

fn obs(at: u64, term: u64, job: JobView) -> Observation {
    Observation { sent_ms: at - 5, at_ms: at, node: term, term, leader_id: term, job }
}

fn status(at: u64, term: u64) -> StatusAnswer {
    StatusAnswer {
        sent_ms: at - 5,
        at_ms: at,
        asked: format!("cairn-{term}"),
        node: term,
        term,
        leader_id: term,
    }
}

/// Ten checkpoints, one every 100 ms; the leader (term 1) is killed at 1_450, node 2 leads
/// term 2 from 1_700 and restores checkpoint 3; checkpoints 7.. are seen under term 2.
fn clean() -> History {
    let mut h = History { seed: 1, started_ms: 1_000, ..History::default() };
    for i in 1..=10u64 {
        let at = 1_000 + i * 100 + 50;
        let term = if at < 1_450 { 1 } else { 2 };
        if (1_450..1_700).contains(&at) {
            continue;
        }
        let mut job = view(i);
        if term == 2 {
            job.latest_restored = Some(RestoreView { id: 3, restore_time_ms: 1_650 });
            job.attempts = 2;
        }
        h.observations.push(obs(at, term, job));
        h.statuses.push(status(at + 10, term));
        h.completions.push(Completion {
            id: i,
            first_seen_ms: at,
            seen_in_term: term,
            trigger_time_ms: Some(at - 60),
            completion_time_ms: Some(at - 20),
        });
        h.sink_scans.push(SinkScan {
            at_ms: at + 20,
            files: i as usize,
            max_committed: Some(i),
            store_latest_after: i,
        });
        h.retained_scans.push(RetainedScan {
            at_ms: at + 30,
            job_status: "running".into(),
            retained_before: view(i).completed_ids,
            retained_after: view(i).completed_ids,
            files_checked: 6,
            problems: vec![],
        });
    }
    h.faults.push(FaultRecord {
        index: 0,
        kind: FaultKind::KillLeader,
        target: "cairn-1".into(),
        injected_ms: 1_450,
        healed_ms: Some(1_600),
        error: None,
    });
    h.final_check = Some(FinalCheck {
        at_ms: 3_000,
        savepoint: Some((11, "/cp/savepoints/savepoint-demo-11".into())),
        stop_error: None,
        exact_counts: true,
        exactly_once: true,
        verdict: "EXACTLY ONCE: 100 records over 4 keys in 20 files".into(),
    });
    h
}

fn failing(h: &History) -> Vec<&'static str> {
    check_all(h, BOUND).into_iter().filter(|v| !v.passed()).map(|v| v.name).collect()
}

fn only_fails(h: &History, name_prefix: &str) {
    let failed = failing(h);
    assert_eq!(failed.len(), 1, "expected only {name_prefix:?} to fail, got {failed:?}");
    assert!(failed[0].starts_with(name_prefix), "expected {name_prefix:?} to fail, got {failed:?}");
}

#[test]
fn a_clean_history_passes_every_invariant() {
    let h = clean();
    for v in check_all(&h, BOUND) {
        assert!(v.passed(), "{v}");
    }
    assert_eq!(h.recoveries()[0].first_checkpoint, Some(7));
}

#[test]
fn a_counter_that_goes_back_fails_invariant_1() {
    let mut h = clean();
    h.observations[3].job.next_checkpoint_id = 2;
    only_fails(&h, "1 ");
}

#[test]
fn checkpoints_discarded_when_the_job_finished_are_not_a_violation() {
    let mut h = clean();
    let last = h.observations.last_mut().expect("observations");
    last.job.status = "finished".into();
    last.job.completed_ids.clear();
    assert!(failing(&h).is_empty(), "{:?}", failing(&h));
    // A running job whose latest checkpoint drops is still a violation.
    let last = h.observations.last_mut().expect("observations");
    last.job.status = "running".into();
    only_fails(&h, "1 ");
}

#[test]
fn an_id_that_comes_back_after_leaving_the_store_fails_invariant_1() {
    let mut h = clean();
    // Checkpoint 1 was subsumed by the 4th read; the 6th shows it again.
    let j = &mut h.observations[5].job;
    j.completed_ids.insert(0, 1);
    only_fails(&h, "1 ");
}

#[test]
fn a_new_id_below_a_seen_one_fails_invariant_1() {
    let mut h = clean();
    let last = h.observations.len() - 1;
    let j = &mut h.observations[last].job;
    // The read before shows 9 but not 8; then 8 shows up after 9.
    j.completed_ids = vec![8, 9, 10];
    h.observations[last - 1].job.completed_ids = vec![7, 9];
    only_fails(&h, "1 ");
}

#[test]
fn an_id_used_for_a_checkpoint_and_a_savepoint_fails_invariant_1() {
    let mut h = clean();
    h.observations[4].job.savepoint_ids = vec![7];
    only_fails(&h, "1 ");
}

#[test]
fn output_committed_beyond_the_store_fails_invariant_2() {
    let mut h = clean();
    h.sink_scans[2].max_committed = Some(7);
    only_fails(&h, "2 ");
}

#[test]
fn no_committed_output_at_all_fails_invariant_2() {
    let mut h = clean();
    for s in &mut h.sink_scans {
        s.files = 0;
        s.max_committed = None;
    }
    only_fails(&h, "2 ");
}

#[test]
fn a_restore_from_an_older_checkpoint_fails_invariant_3() {
    let mut h = clean();
    for o in &mut h.observations {
        if let Some(r) = &mut o.job.latest_restored {
            r.id = 2;
        }
    }
    only_fails(&h, "3 ");
}

#[test]
fn a_restore_from_a_checkpoint_the_store_never_held_fails_invariant_3() {
    let mut h = clean();
    // Checkpoint 3 never showed up in any read; a restore from it must fail.
    for o in &mut h.observations {
        o.job.completed_ids.retain(|id| *id != 3);
    }
    only_fails(&h, "3 ");
}

#[test]
fn a_missing_file_of_a_retained_checkpoint_fails_invariant_4() {
    let mut h = clean();
    h.retained_scans[5].problems.push(RetainedProblem { id: 8, what: "chk-8/source-0.state missing".into() });
    only_fails(&h, "4 ");
}

#[test]
fn a_missing_file_of_a_checkpoint_subsumed_during_the_scan_is_fine() {
    let mut h = clean();
    let s = &mut h.retained_scans[5];
    s.retained_after = vec![8, 9, 10];
    s.problems.push(RetainedProblem { id: 7, what: "chk-7/_metadata missing".into() });
    assert!(failing(&h).is_empty(), "{:?}", failing(&h));
}

#[test]
fn a_verifier_violation_fails_invariant_5() {
    let mut h = clean();
    if let Some(f) = &mut h.final_check {
        f.exactly_once = false;
        f.verdict = "VIOLATED: 1 problem(s)\n  - key 3: count 7 committed 2 times".into();
    }
    only_fails(&h, "5 ");
}

#[test]
fn a_missing_final_check_or_a_failed_stop_fails_invariant_5() {
    let mut h = clean();
    h.final_check = None;
    only_fails(&h, "5 ");
    let mut h = clean();
    if let Some(f) = &mut h.final_check {
        f.stop_error = Some("deadline exceeded".into());
        f.exact_counts = false;
    }
    only_fails(&h, "5 ");
}

#[test]
fn a_stale_leader_answering_after_a_newer_term_fails_invariant_6() {
    let mut h = clean();
    // The old leader of term 1 answers a request sent after term 2 had answered.
    h.statuses.push(status(2_500, 1));
    h.statuses.sort_by_key(|s| s.at_ms);
    only_fails(&h, "6 ");
}

#[test]
fn answers_that_overlap_a_leader_change_are_not_stale() {
    let mut h = clean();
    // Sent before term 2 first answered (at 1_760), arrived after it.
    h.statuses.push(StatusAnswer {
        sent_ms: 1_700,
        at_ms: 1_800,
        asked: "cairn-1".into(),
        node: 1,
        term: 1,
        leader_id: 1,
    });
    assert!(failing(&h).is_empty(), "{:?}", failing(&h));
}

#[test]
fn two_leaders_in_one_term_fail_invariant_6() {
    let mut h = clean();
    let mut s = status(2_600, 2);
    s.leader_id = 3;
    h.statuses.push(s);
    only_fails(&h, "6 ");
}

#[test]
fn a_fault_never_recovered_from_fails_liveness() {
    let mut h = clean();
    h.faults.push(FaultRecord {
        index: 1,
        kind: FaultKind::PartitionWorker,
        target: "worker".into(),
        injected_ms: 2_900,
        healed_ms: Some(2_950),
        error: None,
    });
    only_fails(&h, "liveness");
}

#[test]
fn a_fault_that_could_not_be_injected_fails_liveness() {
    let mut h = clean();
    h.faults[0].error = Some("docker kill: no such container".into());
    only_fails(&h, "liveness");
}

#[test]
fn a_slow_recovery_fails_liveness() {
    let h = clean();
    let v = every_fault_recovered(&h, 10);
    assert!(!v.passed());
    assert!(v.failures[0].contains("bound 10 ms"), "{v}");
}

#[test]
fn files_discarded_after_the_job_finished_are_not_a_violation() {
    let mut h = clean();
    let mut last = h.retained_scans[h.retained_scans.len() - 1].clone();
    last.at_ms += 1_000;
    last.job_status = "finished".into();
    last.problems.push(RetainedProblem { id: 10, what: "chk-10/_metadata missing".into() });
    h.retained_scans.push(last.clone());
    assert!(failing(&h).is_empty(), "{:?}", failing(&h));
    // The same problem while the job runs is one.
    last.job_status = "running".into();
    h.retained_scans.push(last);
    only_fails(&h, "4 ");
}
