//! Which worker each deployed job runs on and how many of its slots it takes, with each worker's
//! used slots kept as a running sum: picking a worker for a deployment costs one look per
//! worker, not a walk over every job's lease per worker (which, with a thousand jobs waiting for
//! workers as fifty workers attach, kept the runtime busy for seconds).

use std::collections::{BTreeMap, HashMap};

use cairn_raft::model::JobId;

#[derive(Debug, Default)]
pub(crate) struct Leases {
    by_job: BTreeMap<JobId, (String, u32)>,
    used: HashMap<String, u32>,
}

impl Leases {
    /// Records that `job` takes `slots` slots of `worker`, replacing its earlier lease.
    pub(crate) fn insert(&mut self, job: JobId, worker: String, slots: u32) {
        *self.used.entry(worker.clone()).or_default() += slots;
        if let Some(old) = self.by_job.insert(job, (worker, slots)) {
            self.release(&old);
        }
    }

    /// Forgets the lease of `job`; returns it.
    pub(crate) fn remove(&mut self, job: &JobId) -> Option<(String, u32)> {
        let old = self.by_job.remove(job)?;
        self.release(&old);
        Some(old)
    }

    fn release(&mut self, (worker, slots): &(String, u32)) {
        if let Some(n) = self.used.get_mut(worker) {
            *n = n.saturating_sub(*slots);
            if *n == 0 {
                self.used.remove(worker);
            }
        }
    }

    /// Slots of `worker` taken by leases.
    pub(crate) fn used(&self, worker: &str) -> u32 {
        self.used.get(worker).copied().unwrap_or(0)
    }

    /// The jobs leased on `worker`, sorted.
    pub(crate) fn jobs_on<'a>(&'a self, worker: &'a str) -> impl Iterator<Item = &'a JobId> + 'a {
        self.by_job.iter().filter(move |(_, (w, _))| w == worker).map(|(j, _)| j)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(s: &str) -> JobId {
        JobId::new(s.to_owned()).expect("valid job id")
    }

    #[test]
    fn used_slots_follow_inserts_moves_and_removals() {
        let mut l = Leases::default();
        l.insert(job("a"), "w1".into(), 3);
        l.insert(job("b"), "w1".into(), 2);
        l.insert(job("c"), "w2".into(), 4);
        assert_eq!((l.used("w1"), l.used("w2"), l.used("w3")), (5, 4, 0));
        // A job adopted on another worker moves its slots there.
        l.insert(job("b"), "w2".into(), 2);
        assert_eq!((l.used("w1"), l.used("w2")), (3, 6));
        assert_eq!(l.remove(&job("a")), Some(("w1".into(), 3)));
        assert_eq!(l.remove(&job("a")), None);
        assert_eq!(l.used("w1"), 0);
        let on_w2: Vec<&str> = l.jobs_on("w2").map(|j| j.as_str()).collect();
        assert_eq!(on_w2, vec!["b", "c"]);
    }
}
