//! The invariants of docs/DESIGN ("Invariants the tests must check"), checked over a recorded
//! [`History`]. Each checker is a pure function, so each is unit-tested on synthetic histories,
//! including histories that must fail.
//!
//! Soundness rests on the order of reads: an observation's contents were committed before its
//! reply arrived (`at_ms`); a scan lists files first and reads the store afterwards, so anything
//! the listing shows happened before that store read.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use super::history::History;

/// The outcome of one invariant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub name: &'static str,
    /// What was checked, e.g. "812 observations, 97 checkpoints".
    pub checked: String,
    /// Every violation found, precise enough to find it in the history.
    pub failures: Vec<String>,
}

impl Verdict {
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let word = if self.passed() { "PASS" } else { "FAIL" };
        write!(f, "{word}  {:<34} {}", self.name, self.checked)?;
        for d in self.failures.iter().take(20) {
            write!(f, "\n        - {d}")?;
        }
        if self.failures.len() > 20 {
            write!(f, "\n        ... and {} more", self.failures.len() - 20)?;
        }
        Ok(())
    }
}

/// Every invariant, in the order of the report.
pub fn check_all(h: &History, recovery_bound_ms: u64) -> Vec<Verdict> {
    vec![
        ids_increase(h),
        notified_only_if_stored(h),
        restore_from_latest(h),
        retained_files_exist(h),
        exactly_once(h),
        stale_leader_commits_nothing(h),
        every_fault_recovered(h, recovery_bound_ms),
    ]
}

/// Invariant 1: checkpoint IDs strictly increase and are never reused. Over the observations
/// in order: the retained list is strictly increasing and below the counter; the counter, the
/// completed count and the latest id never go back; a newly appearing id is above every id
/// seen before; an id that left the store never comes back; no id is both a checkpoint and a
/// savepoint.
pub fn ids_increase(h: &History) -> Verdict {
    let mut failures = Vec::new();
    let mut seen: BTreeSet<u64> = BTreeSet::new();
    let mut savepoints: BTreeSet<u64> = BTreeSet::new();
    let mut gone: BTreeSet<u64> = BTreeSet::new();
    let mut prev: Option<&super::history::Observation> = None;
    for o in &h.observations {
        let j = &o.job;
        let at = o.at_ms;
        if !j.completed_ids.windows(2).all(|w| w[0] < w[1]) {
            failures.push(format!("at {at}: retained ids not strictly increasing: {:?}", j.completed_ids));
        }
        for id in j.completed_ids.iter().chain(&j.savepoint_ids) {
            if *id >= j.next_checkpoint_id {
                failures.push(format!(
                    "at {at}: id {id} is completed but the counter's next id is {}",
                    j.next_checkpoint_id
                ));
            }
        }
        if let Some(p) = prev {
            let pj = &p.job;
            if j.next_checkpoint_id < pj.next_checkpoint_id {
                failures.push(format!(
                    "at {at}: the counter went back from {} to {}",
                    pj.next_checkpoint_id, j.next_checkpoint_id
                ));
            }
            if j.num_completed < pj.num_completed {
                failures.push(format!(
                    "at {at}: the completed count went back from {} to {}",
                    pj.num_completed, j.num_completed
                ));
            }
            // A terminated job's retained checkpoints leave the store (the retention policy
            // discards them): its latest id may drop to none, never to another id.
            let discarded_on_termination = is_terminal(&j.status) && j.completed_ids.is_empty();
            if j.latest_checkpoint() < pj.latest_checkpoint() && !discarded_on_termination {
                failures.push(format!(
                    "at {at}: the latest completed checkpoint went back from {} to {}",
                    pj.latest_checkpoint(),
                    j.latest_checkpoint()
                ));
            }
            for id in pj.completed_ids.iter().filter(|id| !j.completed_ids.contains(id)) {
                gone.insert(*id);
            }
        }
        for id in &j.completed_ids {
            if gone.contains(id) {
                failures.push(format!("at {at}: id {id} left the store and came back (reused)"));
            } else if !seen.contains(id) {
                if let Some(max) = seen.last().filter(|max| *max >= id) {
                    failures.push(format!("at {at}: new id {id} appeared after id {max} (not increasing)"));
                }
                seen.insert(*id);
            }
        }
        savepoints.extend(j.savepoint_ids.iter().copied());
        prev = Some(o);
    }
    for id in seen.intersection(&savepoints) {
        failures.push(format!("id {id} is both a checkpoint and a savepoint"));
    }
    Verdict {
        name: "1 ids strictly increase, never reused",
        checked: format!("{} store reads, {} checkpoint ids", h.observations.len(), seen.len()),
        failures,
    }
}

/// Invariant 2: nothing is notified complete that is not in the store. The demo sink commits
/// a checkpoint's output only when notified of it (or of a later one), and names committed
/// files by checkpoint id; so every committed id must be at most the store's latest completed
/// id read after the listing.
pub fn notified_only_if_stored(h: &History) -> Verdict {
    let mut failures = Vec::new();
    for s in &h.sink_scans {
        if let Some(max) = s.max_committed.filter(|max| *max > s.store_latest_after) {
            failures.push(format!(
                "at {}: output of checkpoint {max} committed, but the store's latest is {}",
                s.at_ms, s.store_latest_after
            ));
        }
    }
    let with_files = h.sink_scans.iter().filter(|s| s.files > 0).count();
    let mut checked = format!("{} output scans ({with_files} with committed files)", h.sink_scans.len());
    if with_files == 0 {
        failures.push("no output scan saw a committed file: nothing was checked".into());
        checked.push_str(", none useful");
    }
    Verdict { name: "2 notified => in the store", checked, failures }
}

/// Invariant 3: a restore uses the latest completed checkpoint (or a newer savepoint). Every
/// completed checkpoint observed before a restore's time must be at most the restored id, and
/// the restored id must be one the store held.
pub fn restore_from_latest(h: &History) -> Verdict {
    let mut failures = Vec::new();
    let mut restores: Vec<super::history::RestoreView> = Vec::new();
    for o in &h.observations {
        if let Some(r) = o.job.latest_restored.filter(|r| !restores.contains(r)) {
            restores.push(r);
        }
    }
    let known: BTreeSet<u64> = h
        .observations
        .iter()
        .flat_map(|o| o.job.completed_ids.iter().chain(&o.job.savepoint_ids).copied())
        .collect();
    for r in &restores {
        let before = h
            .observations
            .iter()
            .filter(|o| o.at_ms < r.restore_time_ms)
            .map(|o| o.job.latest_checkpoint())
            .max()
            .unwrap_or(0);
        if r.id < before {
            failures.push(format!(
                "restore at {} used checkpoint {}, but checkpoint {before} had completed before",
                r.restore_time_ms, r.id
            ));
        }
        if !known.contains(&r.id) && known.last().is_some_and(|max| *max > r.id) {
            failures.push(format!(
                "restore at {} used checkpoint {}, which the store never held",
                r.restore_time_ms, r.id
            ));
        }
    }
    Verdict {
        name: "3 restore from the latest",
        checked: format!("{} restores recorded by leaders", restores.len()),
        failures,
    }
}

/// Job states after which the retention policy discards the retained checkpoints.
const TERMINAL: [&str; 3] = ["finished", "canceled", "failed"];

fn is_terminal(status: &str) -> bool {
    TERMINAL.iter().any(|t| status.starts_with(t))
}

/// Invariant 4: no file referenced by a retained checkpoint is deleted. A problem found for a
/// checkpoint that was retained both before and after the scan is a violation (one subsumed
/// during the scan may legitimately lose its files). Scans of a terminated job check nothing:
/// its checkpoints are discarded on termination (Flink's default retention policy).
pub fn retained_files_exist(h: &History) -> Verdict {
    let mut failures = Vec::new();
    let mut files = 0;
    for s in &h.retained_scans {
        if is_terminal(&s.job_status) {
            continue;
        }
        files += s.files_checked;
        for p in &s.problems {
            if s.retained_before.contains(&p.id) && s.retained_after.contains(&p.id) {
                failures.push(format!("at {}: retained checkpoint {}: {}", s.at_ms, p.id, p.what));
            }
        }
    }
    if files == 0 {
        failures.push("no retained checkpoint's files were checked".into());
    }
    Verdict {
        name: "4 retained checkpoints' files exist",
        checked: format!("{} scans, {files} file checks", h.retained_scans.len()),
        failures,
    }
}

/// Invariant 5: end-to-end exactly once, by the demo job's verifier after the final
/// stop-with-savepoint.
pub fn exactly_once(h: &History) -> Verdict {
    let mut failures = Vec::new();
    let checked = match &h.final_check {
        None => {
            failures.push("the run ended before the final check".into());
            "no final check".to_owned()
        }
        Some(f) => {
            if let Some(e) = &f.stop_error {
                failures.push(format!("stop-with-savepoint failed: {e}"));
            }
            if !f.exactly_once {
                failures.push(f.verdict.clone());
            } else if !f.exact_counts {
                failures.push(format!(
                    "{} (consistent, but not checked against the final savepoint's source offsets)",
                    f.verdict
                ));
            }
            f.verdict.lines().next().unwrap_or_default().to_owned()
        }
    };
    Verdict { name: "5 exactly once (verifier)", checked, failures }
}

/// Invariant 6: a stale leader commits nothing. Every linearizable answer (direct status
/// probes and the leader reads) must come from a term at least as high as any answered before
/// the request was sent, and one term has one leader. Commits a stale leader makes a task do
/// are caught by invariant 2.
pub fn stale_leader_commits_nothing(h: &History) -> Verdict {
    let mut failures = Vec::new();
    // (sent, received, term, leader, who)
    let mut answers: Vec<(u64, u64, u64, u64, String)> = h
        .statuses
        .iter()
        .map(|s| (s.sent_ms, s.at_ms, s.term, s.leader_id, format!("{} (node {})", s.asked, s.node)))
        .chain(
            h.observations
                .iter()
                .map(|o| (o.sent_ms, o.at_ms, o.term, o.leader_id, format!("node {}", o.node))),
        )
        .collect();
    answers.sort_by_key(|a| a.1);
    // prefix_max[i]: the highest term among the first i + 1 answers to arrive.
    let prefix_max: Vec<u64> = answers
        .iter()
        .scan(0, |max, a| {
            *max = (*max).max(a.2);
            Some(*max)
        })
        .collect();
    let mut leaders: BTreeMap<u64, u64> = BTreeMap::new();
    for (sent, at, term, leader, who) in &answers {
        let arrived_before = answers.partition_point(|b| b.1 < *sent);
        let higher = arrived_before.checked_sub(1).map(|i| prefix_max[i]).filter(|max| max > term);
        if let Some(higher) = higher {
            failures.push(format!(
                "at {at}: {who} answered as leader of term {term}, after term {higher} had answered"
            ));
        }
        match leaders.get(term) {
            Some(l) if l != leader => {
                failures.push(format!("term {term} has two leaders: node {l} and node {leader} ({who})"))
            }
            _ => {
                leaders.insert(*term, *leader);
            }
        }
    }
    Verdict {
        name: "6 a stale leader commits nothing",
        checked: format!("{} linearizable answers over {} terms", answers.len(), leaders.len()),
        failures,
    }
}

/// Liveness: every fault was injected, and a checkpoint triggered after it completed within
/// `bound_ms`.
pub fn every_fault_recovered(h: &History, bound_ms: u64) -> Verdict {
    let mut failures = Vec::new();
    for f in &h.faults {
        if let Some(e) = &f.error {
            failures.push(format!("fault {} ({}) on {}: {e}", f.index, f.kind, f.target));
        }
    }
    let recoveries = h.recoveries();
    for r in &recoveries {
        match r.recovery_ms {
            Some(ms) if ms <= bound_ms => {}
            Some(ms) => failures.push(format!(
                "fault {} ({}): first checkpoint after it completed {ms} ms later (bound {bound_ms} ms)",
                r.fault, r.kind
            )),
            None => {
                failures.push(format!("fault {} ({}): no checkpoint completed after it", r.fault, r.kind))
            }
        }
    }
    if h.faults.is_empty() {
        failures.push("no fault was injected".into());
    }
    Verdict {
        name: "liveness: every fault recovered",
        checked: format!("{} faults, bound {} s", h.faults.len(), bound_ms / 1000),
        failures,
    }
}

#[cfg(test)]
#[path = "invariants_tests.rs"]
mod tests;
