//! Per-scenario summaries of a run.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use super::schedule::Scenario;
use super::trial::{Invariant, TrialReport};

/// One trial's outcome, as the summary counts it.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// The trial ran; its violations (none: passed).
    Ran(Box<TrialReport>),
    /// The trial could not be made; why.
    NotRun { seed: u64, reason: String, elapsed: Duration },
}

/// The summary of one scenario.
#[derive(Debug, Default, Clone)]
pub struct ScenarioSummary {
    pub trials: usize,
    pub passed: usize,
    pub failed: usize,
    pub not_run: usize,
    pub violations: usize,
    pub by_invariant: BTreeMap<Invariant, usize>,
    /// Durations of the trials that ran.
    pub durations: Vec<Duration>,
    pub allocations: usize,
    pub savepoints: usize,
    pub checkpoints: u64,
    pub bytes_dropped: u64,
    /// Seeds of failed trials (and of trials that could not be made).
    pub failed_seeds: Vec<u64>,
}

impl ScenarioSummary {
    pub fn add(&mut self, outcome: &Outcome) {
        self.trials += 1;
        match outcome {
            Outcome::Ran(report) => {
                self.durations.push(report.elapsed);
                self.allocations += report.allocations;
                self.savepoints += report.savepoints;
                self.checkpoints += report.checkpoints;
                self.bytes_dropped += report.bytes_dropped;
                if report.violations.is_empty() {
                    self.passed += 1;
                } else {
                    self.failed += 1;
                    self.violations += report.violations.len();
                    self.failed_seeds.push(report.schedule.seed);
                    for v in &report.violations {
                        *self.by_invariant.entry(v.invariant).or_default() += 1;
                    }
                }
            }
            Outcome::NotRun { seed, .. } => {
                self.not_run += 1;
                self.failed_seeds.push(*seed);
            }
        }
    }

    /// Mean, median and maximum trial time.
    pub fn times(&self) -> Option<(Duration, Duration, Duration)> {
        let mut sorted = self.durations.clone();
        sorted.sort();
        let max = *sorted.last()?;
        let total: Duration = sorted.iter().sum();
        let mean = total / sorted.len() as u32;
        Some((mean, sorted[sorted.len() / 2], max))
    }
}

/// Summaries of every scenario of a run.
#[derive(Debug, Default, Clone)]
pub struct RunSummary {
    pub scenarios: BTreeMap<Scenario, ScenarioSummary>,
}

impl RunSummary {
    pub fn add(&mut self, scenario: Scenario, outcome: &Outcome) {
        self.scenarios.entry(scenario).or_default().add(outcome);
    }

    pub fn clean(&self) -> bool {
        self.scenarios.values().all(|s| s.failed == 0 && s.not_run == 0)
    }

    pub fn any_violation(&self) -> bool {
        self.scenarios.values().any(|s| s.failed > 0)
    }
}

fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

impl fmt::Display for RunSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{:<9} {:>6} {:>6} {:>7} {:>10} {:>24} {:>12} {:>10} {:>12}",
            "scenario",
            "trials",
            "passed",
            "not run",
            "violations",
            "trial time mean/p50/max",
            "allocations",
            "savepoints",
            "checkpoints"
        )?;
        for (scenario, s) in &self.scenarios {
            let times = s.times().map_or_else(
                || "-".to_owned(),
                |(mean, p50, max)| format!("{}/{}/{}", secs(mean), secs(p50), secs(max)),
            );
            writeln!(
                f,
                "{:<9} {:>6} {:>6} {:>7} {:>10} {:>24} {:>12} {:>10} {:>12}",
                scenario.name(),
                s.trials,
                s.passed,
                s.not_run,
                s.violations,
                times,
                s.allocations,
                s.savepoints,
                s.checkpoints
            )?;
            if !s.by_invariant.is_empty() {
                let parts: Vec<String> = s.by_invariant.iter().map(|(i, n)| format!("{i}: {n}")).collect();
                writeln!(f, "          violations by invariant: {}", parts.join(", "))?;
            }
            if !s.failed_seeds.is_empty() {
                let seeds: Vec<String> =
                    s.failed_seeds.iter().take(20).map(|seed| format!("{seed:#018x}")).collect();
                writeln!(
                    f,
                    "          replay: --scenario {} --trial-seed <seed>, seeds: {}{}",
                    scenario.name(),
                    seeds.join(" "),
                    if s.failed_seeds.len() > 20 { " ..." } else { "" }
                )?;
            }
        }
        Ok(())
    }
}
