//! Which workers each deployed job runs on and how many of their slots it takes, with each
//! worker's used slots kept as a running sum: picking workers for a deployment costs one look per
//! worker, not a walk over every job's lease per worker (which, with a thousand jobs waiting for
//! workers as fifty workers attach, kept the runtime busy for seconds).

use std::collections::{BTreeMap, HashMap};

use cairn_raft::model::JobId;

#[derive(Debug, Default)]
pub(crate) struct Leases {
    /// Per job: (worker, slots) for every worker it runs on.
    by_job: BTreeMap<JobId, Vec<(String, u32)>>,
    used: HashMap<String, u32>,
}

impl Leases {
    /// Records that `job` takes the given slots of each listed worker, replacing its earlier
    /// leases.
    pub(crate) fn set(&mut self, job: JobId, workers: Vec<(String, u32)>) {
        for (worker, slots) in &workers {
            *self.used.entry(worker.clone()).or_default() += slots;
        }
        if let Some(old) = self.by_job.insert(job, workers) {
            self.release(&old);
        }
    }

    /// Forgets the leases of `job`; returns them.
    pub(crate) fn remove(&mut self, job: &JobId) -> Option<Vec<(String, u32)>> {
        let old = self.by_job.remove(job)?;
        self.release(&old);
        Some(old)
    }

    fn release(&mut self, leases: &[(String, u32)]) {
        for (worker, slots) in leases {
            if let Some(n) = self.used.get_mut(worker) {
                *n = n.saturating_sub(*slots);
                if *n == 0 {
                    self.used.remove(worker);
                }
            }
        }
    }

    /// Slots of `worker` taken by leases.
    pub(crate) fn used(&self, worker: &str) -> u32 {
        self.used.get(worker).copied().unwrap_or(0)
    }

    /// The jobs with a lease on `worker`, sorted.
    pub(crate) fn jobs_on<'a>(&'a self, worker: &'a str) -> impl Iterator<Item = &'a JobId> + 'a {
        self.by_job.iter().filter(move |(_, ws)| ws.iter().any(|(w, _)| w == worker)).map(|(j, _)| j)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(s: &str) -> JobId {
        JobId::new(s.to_owned()).expect("valid job id")
    }

    #[test]
    fn used_slots_follow_sets_moves_and_removals() {
        let mut l = Leases::default();
        l.set(job("a"), vec![("w1".into(), 3)]);
        l.set(job("b"), vec![("w1".into(), 2)]);
        l.set(job("c"), vec![("w2".into(), 4)]);
        assert_eq!((l.used("w1"), l.used("w2"), l.used("w3")), (5, 4, 0));
        // A job adopted on another worker moves its slots there.
        l.set(job("b"), vec![("w2".into(), 2)]);
        assert_eq!((l.used("w1"), l.used("w2")), (3, 6));
        assert_eq!(l.remove(&job("a")), Some(vec![("w1".into(), 3)]));
        assert_eq!(l.remove(&job("a")), None);
        assert_eq!(l.used("w1"), 0);
        let on_w2: Vec<&str> = l.jobs_on("w2").map(|j| j.as_str()).collect();
        assert_eq!(on_w2, vec!["b", "c"]);
    }

    #[test]
    fn a_job_spanning_workers_takes_and_returns_slots_on_each() {
        let mut l = Leases::default();
        l.set(job("s"), vec![("w1".into(), 3), ("w2".into(), 2)]);
        assert_eq!((l.used("w1"), l.used("w2")), (3, 2));
        assert_eq!(l.jobs_on("w2").count(), 1);
        assert_eq!(l.remove(&job("s")).map(|v| v.len()), Some(2));
        assert_eq!((l.used("w1"), l.used("w2")), (0, 0));
    }
}
