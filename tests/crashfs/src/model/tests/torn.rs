//! Torn writes: at a power loss, unsynced sectors survive or not, whole sectors at a time.

use rand::SeedableRng;
use rand::rngs::StdRng;

use super::Sim;
use crate::model::{PowerLossReport, SECTOR_SIZE, Tear};

/// Four synced sectors of `a`, then `b` written over them and over two more sectors (the last
/// one partial), none of it synced.
fn overwritten(seed: u64, keep_probability: f64) -> (Vec<u8>, PowerLossReport) {
    let mut sim = Sim::new();
    sim.durable_file("f", &[b'a'; 4 * SECTOR_SIZE]);
    sim.write("f", 0, &[b'b'; 5 * SECTOR_SIZE + 100]);
    let mut rng = StdRng::seed_from_u64(seed);
    let report = sim.model.power_loss(Tear::Sectors { rng: &mut rng, keep_probability });
    (sim.read("f").unwrap_or_default(), report)
}

#[test]
fn torn_writes_keep_only_whole_unsynced_sectors() {
    for seed in 0..20 {
        let (data, report) = overwritten(seed, 0.5);
        assert_eq!(report.sectors_torn_kept + report.sectors_torn_dropped, 6, "seed {seed}");
        assert!(data.len() >= 4 * SECTOR_SIZE, "a torn file never shrinks");
        for (index, sector) in data.chunks(SECTOR_SIZE).enumerate() {
            let first = sector[0];
            assert!(sector.iter().all(|byte| *byte == first), "seed {seed}: sector {index} is mixed");
            if index >= 4 {
                // Past the synced size: a kept sector, or zeros before a later kept one.
                assert!(first == b'b' || first == 0, "seed {seed}: sector {index}");
            }
        }
        let kept = data.chunks(SECTOR_SIZE).filter(|sector| sector[0] == b'b').count() as u64;
        assert_eq!(kept, report.sectors_torn_kept, "seed {seed}");
    }
}

#[test]
fn torn_writes_vary_with_the_seed_and_repeat_with_the_same_seed() {
    let outcomes: Vec<Vec<u8>> = (0..8).map(|seed| overwritten(seed, 0.5).0).collect();
    assert!(outcomes.iter().any(|data| *data != outcomes[0]), "different seeds tear differently");
    assert_eq!(overwritten(3, 0.5), overwritten(3, 0.5));
}

#[test]
fn keep_probability_one_keeps_all_and_zero_keeps_none() {
    let (all, report) = overwritten(1, 1.0);
    assert_eq!(all, vec![b'b'; 5 * SECTOR_SIZE + 100]);
    assert_eq!(report.sectors_torn_kept, 6);
    assert_eq!(report.bytes_dropped, 0);

    let (none, report) = overwritten(1, 0.0);
    assert_eq!(none, vec![b'a'; 4 * SECTOR_SIZE]);
    assert_eq!(report.sectors_torn_dropped, 6);
    assert_eq!(report.bytes_dropped, (5 * SECTOR_SIZE + 100) as u64);
}

#[test]
fn synced_sectors_are_never_torn() {
    let mut sim = Sim::new();
    sim.durable_file("f", &[b'a'; 3 * SECTOR_SIZE]);
    sim.write("f", SECTOR_SIZE as u64, &[b'c'; SECTOR_SIZE]);
    sim.fsync("f");
    let mut rng = StdRng::seed_from_u64(7);
    let report = sim.model.power_loss(Tear::Sectors { rng: &mut rng, keep_probability: 0.5 });
    assert_eq!(report.sectors_torn_kept + report.sectors_torn_dropped, 0);
    let mut expected = vec![b'a'; 3 * SECTOR_SIZE];
    expected[SECTOR_SIZE..2 * SECTOR_SIZE].fill(b'c');
    assert_eq!(sim.read("f"), Some(expected));
}

#[test]
fn torn_writes_do_not_resurrect_files_without_a_durable_name() {
    let mut sim = Sim::new();
    sim.put("unnamed", &[b'x'; SECTOR_SIZE]);
    let mut rng = StdRng::seed_from_u64(0);
    sim.model.power_loss(Tear::Sectors { rng: &mut rng, keep_probability: 1.0 });
    assert!(!sim.exists("unnamed"));
}

#[test]
fn torn_sectors_of_a_file_named_durably_but_never_synced_may_survive() {
    let mut sim = Sim::new();
    sim.put("f", &[b'x'; 2 * SECTOR_SIZE]);
    sim.fsync_dir("");
    let mut rng = StdRng::seed_from_u64(0);
    sim.model.power_loss(Tear::Sectors { rng: &mut rng, keep_probability: 1.0 });
    assert_eq!(sim.read("f"), Some(vec![b'x'; 2 * SECTOR_SIZE]));
}
