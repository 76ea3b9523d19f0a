//! The report printed at the end of a run: per fault kind the count and the time to recover
//! (p50/p99/max, from injection to the completion of the first checkpoint triggered after the
//! fault), then every invariant's verdict.

use std::collections::BTreeMap;
use std::fmt::Write;

use super::history::History;
use super::invariants::Verdict;
use super::schedule::FaultKind;

/// Recovery figures of one fault kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KindFigures {
    pub kind: FaultKind,
    pub count: usize,
    /// Recovery times in milliseconds, ascending (faults that never recovered are left out).
    pub recovery_ms: Vec<u64>,
}

impl KindFigures {
    pub fn unrecovered(&self) -> usize {
        self.count - self.recovery_ms.len()
    }
}

/// Nearest-rank percentile of an ascending slice (`None` when empty).
pub fn percentile(sorted: &[u64], p: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// Figures per fault kind, every kind listed (a kind never injected has count 0).
pub fn figures(h: &History) -> Vec<KindFigures> {
    let mut by_kind: BTreeMap<FaultKind, KindFigures> = FaultKind::ALL
        .iter()
        .map(|k| (*k, KindFigures { kind: *k, count: 0, recovery_ms: vec![] }))
        .collect();
    for f in &h.faults {
        if let Some(k) = by_kind.get_mut(&f.kind) {
            k.count += 1;
        }
    }
    for r in h.recoveries() {
        if let (Some(k), Some(ms)) = (by_kind.get_mut(&r.kind), r.recovery_ms) {
            k.recovery_ms.push(ms);
        }
    }
    let mut out: Vec<KindFigures> = by_kind.into_values().collect();
    for k in &mut out {
        k.recovery_ms.sort_unstable();
    }
    out
}

fn secs(ms: Option<u64>) -> String {
    ms.map_or_else(|| "-".to_owned(), |ms| format!("{:.1} s", ms as f64 / 1000.0))
}

/// Renders the whole report. `replay` is the command line that replays this schedule.
pub fn render(h: &History, verdicts: &[Verdict], replay: &str, run_secs: u64) -> String {
    let mut s = String::new();
    let terms: std::collections::BTreeSet<u64> = h.observations.iter().map(|o| o.term).collect();
    let _ = writeln!(s, "==================== cairn-chaos report ====================");
    let _ = writeln!(s, "seed {}   replay: {replay}", h.seed);
    let _ = writeln!(
        s,
        "{} faults in {run_secs} s; {} checkpoints seen completed; {} store reads; leader terms seen: {}",
        h.faults.len(),
        h.completions.len(),
        h.observations.len(),
        terms.len()
    );
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "{:<24} {:>5}  {:>9} {:>9} {:>9}  (time to recover: injection -> first checkpoint after it)",
        "fault kind", "count", "p50", "p99", "max"
    );
    for k in figures(h) {
        let note = if k.unrecovered() > 0 {
            format!("  {} never recovered", k.unrecovered())
        } else {
            String::new()
        };
        let _ = writeln!(
            s,
            "{:<24} {:>5}  {:>9} {:>9} {:>9}{note}",
            k.kind.name(),
            k.count,
            secs(percentile(&k.recovery_ms, 50.0)),
            secs(percentile(&k.recovery_ms, 99.0)),
            secs(k.recovery_ms.last().copied()),
        );
    }
    let _ = writeln!(s);
    let _ = writeln!(s, "faults:");
    let recoveries = h.recoveries();
    for f in &h.faults {
        let rec = recoveries.iter().find(|r| r.fault == f.index);
        let window = f.healed_ms.map(|heal| heal.saturating_sub(f.injected_ms));
        let _ = writeln!(
            s,
            "  #{:<3} +{:>6.1} s  {:<24} on {:<22} window {:>7}  recovered {:>7}{}{}",
            f.index,
            f.injected_ms.saturating_sub(h.started_ms) as f64 / 1000.0,
            f.kind.name(),
            f.target,
            secs(window),
            secs(rec.and_then(|r| r.recovery_ms)),
            rec.and_then(|r| r.first_checkpoint).map_or_else(String::new, |id| format!(" (checkpoint {id})")),
            f.error.as_deref().map_or_else(String::new, |e| format!("  ERROR: {e}")),
        );
    }
    let _ = writeln!(s);
    let _ = writeln!(s, "invariants:");
    for v in verdicts {
        let _ = writeln!(s, "{v}");
    }
    let failed = verdicts.iter().filter(|v| !v.passed()).count();
    let _ = writeln!(s);
    if failed == 0 {
        let _ = writeln!(s, "VERDICT: PASS ({} of {} checks)", verdicts.len(), verdicts.len());
    } else {
        let _ = writeln!(s, "VERDICT: FAIL ({failed} of {} checks failed; replay: {replay})", verdicts.len());
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chaos::history::{Completion, FaultRecord};

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 50.0), Some(50));
        assert_eq!(percentile(&v, 99.0), Some(99));
        assert_eq!(percentile(&[7], 99.0), Some(7));
        assert_eq!(percentile(&[3, 9], 50.0), Some(3));
        assert_eq!(percentile(&[], 50.0), None);
    }

    #[test]
    fn figures_group_recoveries_by_kind_and_count_the_unrecovered() {
        let fault = |index, kind, at| FaultRecord {
            index,
            kind,
            target: "x".into(),
            injected_ms: at,
            healed_ms: Some(at + 100),
            error: None,
        };
        let done = |id, at| Completion {
            id,
            first_seen_ms: at + 10,
            seen_in_term: 1,
            trigger_time_ms: Some(at - 100),
            completion_time_ms: Some(at),
        };
        let h = History {
            faults: vec![
                fault(0, FaultKind::KillLeader, 1_000),
                fault(1, FaultKind::KillLeader, 5_000),
                fault(2, FaultKind::PauseLeader, 9_000),
            ],
            completions: vec![done(1, 3_000), done(2, 6_000)],
            ..History::default()
        };
        let f = figures(&h);
        assert_eq!(f.len(), FaultKind::ALL.len());
        let kill = f.iter().find(|k| k.kind == FaultKind::KillLeader).unwrap();
        assert_eq!((kill.count, kill.recovery_ms.clone()), (2, vec![1_000, 2_000]));
        let pause = f.iter().find(|k| k.kind == FaultKind::PauseLeader).unwrap();
        assert_eq!((pause.count, pause.unrecovered()), (1, 1));
        let text = render(&h, &[], "cairn-chaos --seed 1", 10);
        assert!(text.contains("kill-leader"), "{text}");
        assert!(text.contains("1 never recovered"), "{text}");
        assert!(text.contains("VERDICT: PASS"), "{text}");
    }
}
