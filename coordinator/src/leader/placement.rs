//! Choosing workers for a job's subtasks. A job is a list of slot-sharing groups (group `i`:
//! subtask `i` of every vertex with more than `i` subtasks); a group always runs on one worker,
//! so forward edges stay in-process. A group takes one slot (Flink's slot sharing): callers pass
//! the slots each group needs, 1 for every group today.

use cairn_raft::model::PlacementStrategy;

/// A worker that could take groups: its id, its free slots, and whether it announced a data
/// exchange address (without one it can only run whole jobs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Candidate {
    pub worker_id: String,
    pub free: u32,
    pub exchange: bool,
}

/// The groups each chosen worker runs, by group index; `None` when the free slots cannot hold
/// every group right now.
pub(crate) fn place(
    groups: &[u32],
    candidates: &[Candidate],
    strategy: PlacementStrategy,
) -> Option<Vec<(String, Vec<usize>)>> {
    let total: u64 = groups.iter().map(|g| u64::from(*g)).sum();
    // Most free slots first; ties by id, so the choice is deterministic.
    let mut order: Vec<&Candidate> = candidates.iter().filter(|c| c.free > 0).collect();
    order.sort_by(|a, b| b.free.cmp(&a.free).then_with(|| a.worker_id.cmp(&b.worker_id)));
    if strategy == PlacementStrategy::Pack
        && let Some(whole) = order.first().filter(|c| u64::from(c.free) >= total)
    {
        return Some(vec![(whole.worker_id.clone(), (0..groups.len()).collect())]);
    }
    // Across workers: only those that can exchange data with the others.
    let mut free: Vec<(String, u32, Vec<usize>)> =
        order.iter().filter(|c| c.exchange).map(|c| (c.worker_id.clone(), c.free, Vec::new())).collect();
    // Largest groups first, so the big ones still find room.
    let mut by_size: Vec<usize> = (0..groups.len()).collect();
    by_size.sort_by(|a, b| groups[*b].cmp(&groups[*a]).then(a.cmp(b)));
    for g in by_size {
        let need = groups[g];
        let slot = match strategy {
            // The worker with the most free slots left.
            PlacementStrategy::Spread => free
                .iter_mut()
                .filter(|w| w.1 >= need)
                .max_by(|a, b| a.1.cmp(&b.1).then_with(|| b.0.cmp(&a.0))),
            // The first worker (most free slots at the start) that still has room.
            PlacementStrategy::Pack => free.iter_mut().find(|w| w.1 >= need),
        }?;
        slot.1 -= need;
        slot.2.push(g);
    }
    let mut chosen: Vec<(String, Vec<usize>)> = free
        .into_iter()
        .filter(|w| !w.2.is_empty())
        .map(|(id, _, mut g)| {
            g.sort_unstable();
            (id, g)
        })
        .collect();
    chosen.sort();
    Some(chosen)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(id: &str, free: u32) -> Candidate {
        Candidate { worker_id: id.into(), free, exchange: true }
    }

    #[test]
    fn pack_keeps_a_job_whole_where_it_fits() {
        let placed = place(&[3, 3, 2], &[c("a", 4), c("b", 9), c("c", 8)], PlacementStrategy::Pack).unwrap();
        assert_eq!(placed, vec![("b".into(), vec![0, 1, 2])]);
    }

    #[test]
    fn pack_fills_the_emptiest_worker_first_when_none_fits_alone() {
        let placed = place(&[3, 3, 2], &[c("a", 4), c("b", 6)], PlacementStrategy::Pack).unwrap();
        assert_eq!(placed, vec![("a".into(), vec![2]), ("b".into(), vec![0, 1])]);
    }

    #[test]
    fn spread_uses_every_worker_with_room() {
        let placed =
            place(&[3, 3, 3, 3], &[c("a", 8), c("b", 8), c("c", 8)], PlacementStrategy::Spread).unwrap();
        assert_eq!(placed.len(), 3, "{placed:?}");
        let groups: usize = placed.iter().map(|(_, g)| g.len()).sum();
        assert_eq!(groups, 4);
        assert!(placed.iter().all(|(_, g)| g.len() <= 2), "{placed:?}");
    }

    #[test]
    fn a_job_that_does_not_fit_waits() {
        assert_eq!(place(&[3, 3], &[c("a", 5)], PlacementStrategy::Pack), None);
        assert_eq!(place(&[4], &[c("a", 3), c("b", 3)], PlacementStrategy::Spread), None);
        assert_eq!(place(&[1], &[], PlacementStrategy::Pack), None);
    }

    #[test]
    fn workers_without_a_data_exchange_only_take_whole_jobs() {
        let mut old = c("old", 10);
        old.exchange = false;
        assert_eq!(
            place(&[3, 3], &[old.clone(), c("new", 4)], PlacementStrategy::Pack),
            Some(vec![("old".into(), vec![0, 1])])
        );
        assert_eq!(place(&[3, 3], &[old, c("new", 4)], PlacementStrategy::Spread), None);
    }

    #[test]
    fn every_group_is_placed_once_within_the_free_slots() {
        // A small exhaustive sweep instead of a sampler: every shape up to 4 groups of 1..=3
        // subtasks over 3 workers with 0..=5 free slots.
        for shape in 0..81u32 {
            let groups: Vec<u32> = (0..4).map(|i| shape / 3u32.pow(i) % 3 + 1).collect();
            for frees in 0..216u32 {
                let ws: Vec<Candidate> =
                    (0..3).map(|i| c(&format!("w{i}"), frees / 6u32.pow(i) % 6)).collect();
                for strategy in [PlacementStrategy::Pack, PlacementStrategy::Spread] {
                    let Some(placed) = place(&groups, &ws, strategy) else { continue };
                    let mut seen: Vec<usize> = placed.iter().flat_map(|(_, g)| g.clone()).collect();
                    seen.sort_unstable();
                    assert_eq!(seen, (0..groups.len()).collect::<Vec<_>>());
                    for (w, g) in &placed {
                        let used: u32 = g.iter().map(|i| groups[*i]).sum();
                        let free = ws.iter().find(|c| &c.worker_id == w).map_or(0, |c| c.free);
                        assert!(used <= free, "{w} over its {free} free slots: {placed:?}");
                    }
                }
            }
        }
    }
}
