//! What the clients were told, and the invariants it must satisfy.

use std::collections::BTreeMap;
use std::time::Instant;

/// One acknowledged checkpoint-ID allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allocation {
    pub client: usize,
    pub id: u64,
    /// When the call was made.
    pub invoked: Instant,
    /// When its reply arrived.
    pub acked: Instant,
}

/// Checks one job's acknowledged allocations: IDs are never handed out twice, and an ID
/// acknowledged before another allocation was invoked is below that allocation's ID (so an
/// acknowledged ID stays below every later one, across any power loss). Returns one line per
/// violation (at most `limit`, then a count).
pub fn check_allocations(job: &str, allocations: &[Allocation], limit: usize) -> Vec<String> {
    let mut problems = Vec::new();
    let mut seen: BTreeMap<u64, usize> = BTreeMap::new();
    for a in allocations {
        *seen.entry(a.id).or_default() += 1;
    }
    for (id, times) in seen.iter().filter(|(_, times)| **times > 1) {
        problems.push(format!("job {job}: id {id} acknowledged {times} times"));
    }
    // Sweep in invocation order, keeping the highest ID acknowledged before each invocation.
    let mut by_ack: Vec<&Allocation> = allocations.iter().collect();
    by_ack.sort_by_key(|a| a.acked);
    let mut by_invoke: Vec<&Allocation> = allocations.iter().collect();
    by_invoke.sort_by_key(|a| a.invoked);
    let mut highest: Option<&Allocation> = None;
    let mut next_ack = 0;
    for later in by_invoke {
        while next_ack < by_ack.len() && by_ack[next_ack].acked < later.invoked {
            let candidate = by_ack[next_ack];
            if highest.is_none_or(|h| candidate.id > h.id) {
                highest = Some(candidate);
            }
            next_ack += 1;
        }
        if let Some(earlier) = highest
            && earlier.id >= later.id
        {
            problems.push(format!(
                "job {job}: id {} was acknowledged (client {}) before client {} asked and got id {} \
                 ({} ms later)",
                earlier.id,
                earlier.client,
                later.client,
                later.id,
                later.invoked.saturating_duration_since(earlier.acked).as_millis()
            ));
        }
    }
    if problems.len() > limit {
        let more = problems.len() - limit;
        problems.truncate(limit);
        problems.push(format!("job {job}: ... and {more} more"));
    }
    problems
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn at(base: Instant, ms: u64) -> Instant {
        base + Duration::from_millis(ms)
    }

    fn alloc(base: Instant, client: usize, id: u64, invoked: u64, acked: u64) -> Allocation {
        Allocation { client, id, invoked: at(base, invoked), acked: at(base, acked) }
    }

    #[test]
    fn increasing_ids_and_overlapping_calls_pass() {
        let t = Instant::now();
        let history = [
            alloc(t, 0, 1, 0, 10),
            alloc(t, 1, 3, 5, 30), // overlaps the next call: any order of ids is fine
            alloc(t, 2, 2, 6, 20),
            alloc(t, 0, 7, 40, 50),
        ];
        assert!(check_allocations("j", &history, 10).is_empty());
    }

    #[test]
    fn an_id_reused_after_a_power_loss_is_reported() {
        let t = Instant::now();
        let history = [alloc(t, 0, 5, 0, 10), alloc(t, 1, 6, 12, 20), alloc(t, 0, 6, 100, 110)];
        let problems = check_allocations("j", &history, 10);
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("id 6 acknowledged 2 times"), "{problems:?}");
        assert!(problems[1].contains("id 6 was acknowledged"), "{problems:?}");
    }

    #[test]
    fn a_lower_id_after_an_acknowledged_one_is_reported_once_per_call() {
        let t = Instant::now();
        let history = [alloc(t, 0, 9, 0, 10), alloc(t, 1, 4, 20, 25), alloc(t, 1, 5, 30, 35)];
        let problems = check_allocations("j", &history, 1);
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("id 9") && problems[0].contains("got id 4"), "{problems:?}");
        assert!(problems[1].contains("1 more"), "{problems:?}");
    }
}
