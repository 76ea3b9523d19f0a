//! Keys → key groups → subtasks.
//!
//! Keyed state and hash partitioning agree on one mapping, owned here: a key is hashed to one of
//! `max_parallelism` key groups, and key group `g` belongs to subtask `g * p / max_parallelism`,
//! which is exactly the subtask whose [`KeyGroupRange::for_subtask`] contains `g`. So records
//! always reach the subtask holding their state, whatever the parallelism.

use crate::checkpoint::KeyGroupRange;

/// Stable 64-bit mix of a key (MurmurHash3's finalizer); stable across builds and platforms.
fn mix(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^= k >> 33;
    k
}

/// The key group of `key` for `max_parallelism` key groups (`max_parallelism` ≥ 1).
pub fn key_group_of(key: u64, max_parallelism: u32) -> u32 {
    (mix(key) % u64::from(max_parallelism.max(1))) as u32
}

/// The subtask (of `parallelism`) owning `key_group`.
pub fn subtask_for_key_group(max_parallelism: u32, parallelism: u32, key_group: u32) -> u32 {
    (u64::from(key_group) * u64::from(parallelism) / u64::from(max_parallelism.max(1))) as u32
}

/// The subtask (of `parallelism`) owning `key`.
pub fn subtask_for_key(key: u64, max_parallelism: u32, parallelism: u32) -> u32 {
    subtask_for_key_group(max_parallelism, parallelism, key_group_of(key, max_parallelism))
}

/// Convenience: the range of a subtask, or `None` when out of bounds.
pub fn range_of(max_parallelism: u32, parallelism: u32, subtask: u32) -> Option<KeyGroupRange> {
    KeyGroupRange::for_subtask(max_parallelism, parallelism, subtask)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn owner_of_a_key_group_is_the_subtask_whose_range_contains_it(
            max in 1u32..512, p_seed in 0u32..512, kg_seed in 0u32..512,
        ) {
            let p = 1 + p_seed % max;
            let kg = kg_seed % max;
            let owner = subtask_for_key_group(max, p, kg);
            prop_assert!(owner < p);
            let range = range_of(max, p, owner).unwrap();
            prop_assert!(range.contains(kg), "max={} p={} kg={} owner={} range={:?}", max, p, kg, owner, range);
        }

        #[test]
        fn key_groups_are_in_bounds(key in any::<u64>(), max in 1u32..40_000) {
            prop_assert!(key_group_of(key, max) < max);
        }
    }

    #[test]
    fn mapping_is_stable() {
        // Golden values: changing the hash would silently misroute restored state.
        assert_eq!(key_group_of(0, 128), 0);
        let golden: Vec<u32> = (1..6).map(|k| key_group_of(k, 128)).collect();
        assert_eq!(golden, vec![44, 103, 78, 117, 117]);
        assert_eq!(mix(1), 0xb456_bcfc_34c2_cb2c);
    }
}
