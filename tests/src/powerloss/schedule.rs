//! Scenarios and the seeded schedule of one trial.
//!
//! Everything a trial decides by chance is drawn here, from the trial's seed, before the trial
//! starts: which replicas lose power (by role, resolved when the power goes), when, the
//! workload's rates and the torn-write seeds. Running a trial again with the same seed replays
//! the same schedule; the processes' own timing (elections, scheduling) is not replayed.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Which machines lose power.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scenario {
    /// One replica (the leader or a follower).
    One,
    /// Two of the three replicas (the leader and a follower, or both followers).
    Majority,
    /// All three replicas, the worker, the checkpoint storage and the sink's output.
    All,
}

impl Scenario {
    pub const ALL: [Scenario; 3] = [Scenario::One, Scenario::Majority, Scenario::All];

    pub fn name(self) -> &'static str {
        match self {
            Scenario::One => "one",
            Scenario::Majority => "majority",
            Scenario::All => "all",
        }
    }

    fn index(self) -> u64 {
        match self {
            Scenario::One => 1,
            Scenario::Majority => 2,
            Scenario::All => 3,
        }
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Scenario {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "one" => Ok(Scenario::One),
            "majority" => Ok(Scenario::Majority),
            "all" => Ok(Scenario::All),
            other => Err(format!("unknown scenario {other:?}; expected one, majority or all")),
        }
    }
}

/// A replica chosen by its role when the power goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pick {
    Leader,
    /// The `n`-th follower (by node id, modulo the number of followers).
    Follower(usize),
}

impl fmt::Display for Pick {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Pick::Leader => f.write_str("leader"),
            Pick::Follower(n) => write!(f, "follower#{n}"),
        }
    }
}

/// The replicas that lose power, as node ids, given the leader (if known) and all node ids.
pub fn resolve(picks: &[Pick], leader: Option<u64>, nodes: &[u64]) -> Vec<u64> {
    let followers: Vec<u64> = nodes.iter().copied().filter(|n| Some(*n) != leader).collect();
    let mut out: Vec<u64> = Vec::new();
    for pick in picks {
        let candidate = match (pick, leader) {
            (Pick::Leader, Some(leader)) => Some(leader),
            (Pick::Leader, None) | (Pick::Follower(_), _) => {
                let n = match pick {
                    Pick::Follower(n) => *n,
                    Pick::Leader => 0,
                };
                // The n-th follower not taken yet.
                let free: Vec<u64> = followers.iter().copied().filter(|f| !out.contains(f)).collect();
                (!free.is_empty()).then(|| free[n % free.len()])
            }
        };
        if let Some(node) = candidate
            && !out.contains(&node)
        {
            out.push(node);
        }
    }
    out.sort_unstable();
    out
}

/// Torn writes for one trial: each mount draws from its own generator.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Torn {
    pub seed: u64,
    pub keep_probability: f64,
}

/// Everything a trial decides by chance.
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    pub seed: u64,
    pub scenario: Scenario,
    /// Replicas that lose power (all of them for [`Scenario::All`]).
    pub picks: Vec<Pick>,
    /// When the power goes: the first cut this long after the demo job's first completed
    /// checkpoint; a second one (in half the trials) this long after the machines came back
    /// from the first, while the cluster recovers.
    pub cuts: Vec<Duration>,
    /// The demo job's checkpoint interval.
    pub checkpoint_interval: Duration,
    /// Pause between two savepoints.
    pub savepoint_every: Duration,
    /// Concurrent ID-allocation clients.
    pub clients: usize,
    /// Pause of each client between two allocations.
    pub client_pause: Duration,
    /// Torn writes at the power loss (`--torn`).
    pub torn: Option<Torn>,
}

impl Schedule {
    /// The schedule of trial seed `seed`.
    pub fn from_seed(seed: u64, scenario: Scenario, torn: bool) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let picks = match scenario {
            Scenario::One if rng.gen_bool(0.5) => vec![Pick::Leader],
            Scenario::One => vec![Pick::Follower(rng.gen_range(0..2))],
            Scenario::Majority if rng.gen_bool(0.5) => {
                vec![Pick::Leader, Pick::Follower(rng.gen_range(0..2))]
            }
            Scenario::Majority => vec![Pick::Follower(0), Pick::Follower(1)],
            Scenario::All => vec![Pick::Leader, Pick::Follower(0), Pick::Follower(1)],
        };
        Schedule {
            seed,
            scenario,
            picks,
            cuts: {
                let mut cuts = vec![Duration::from_millis(rng.gen_range(0..=3_500))];
                if rng.gen_bool(0.5) {
                    cuts.push(Duration::from_millis(rng.gen_range(0..=2_500)));
                }
                cuts
            },
            checkpoint_interval: Duration::from_millis(rng.gen_range(200..=500)),
            savepoint_every: Duration::from_millis(rng.gen_range(400..=1_500)),
            clients: rng.gen_range(3..=5),
            client_pause: Duration::from_millis(rng.gen_range(5..=30)),
            torn: torn.then(|| Torn { seed: rng.r#gen(), keep_probability: rng.gen_range(0.2..=0.8) }),
        }
    }

    /// The torn-write seed of mount number `mount` (a different generator per mount).
    pub fn torn_for(&self, mount: u64) -> Option<Torn> {
        self.torn.map(|t| Torn { seed: splitmix(t.seed ^ mount.wrapping_mul(0x9e37_79b9)), ..t })
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let picks: Vec<String> = self.picks.iter().map(Pick::to_string).collect();
        let cuts: Vec<String> = self.cuts.iter().map(|c| format!("{} ms", c.as_millis())).collect();
        write!(
            f,
            "power loss on [{}] {} after the first checkpoint{}; checkpoints every {} ms, savepoints every {} ms, \
             {} clients",
            picks.join(", "),
            cuts.first().map_or("never", String::as_str),
            if cuts.len() > 1 {
                format!(" and again {} after the restart", cuts[1..].join(", "))
            } else {
                String::new()
            },
            self.checkpoint_interval.as_millis(),
            self.savepoint_every.as_millis(),
            self.clients,
        )?;
        if let Some(torn) = self.torn {
            write!(f, ", torn writes (keep {:.2})", torn.keep_probability)?;
        }
        Ok(())
    }
}

/// The seed of trial `index` of `scenario` in a run seeded with `run_seed`.
pub fn trial_seed(run_seed: u64, scenario: Scenario, index: u64) -> u64 {
    splitmix(run_seed ^ splitmix(scenario.index() << 40 ^ index))
}

/// SplitMix64: a well-mixed 64-bit hash, so nearby run seeds give unrelated trial seeds.
fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_seed_determines_the_schedule() {
        for scenario in Scenario::ALL {
            for index in 0..50 {
                let seed = trial_seed(42, scenario, index);
                assert_eq!(
                    Schedule::from_seed(seed, scenario, true),
                    Schedule::from_seed(seed, scenario, true)
                );
            }
        }
        assert_ne!(trial_seed(42, Scenario::One, 0), trial_seed(42, Scenario::One, 1));
        assert_ne!(trial_seed(42, Scenario::One, 0), trial_seed(42, Scenario::All, 0));
        assert_ne!(trial_seed(42, Scenario::One, 0), trial_seed(43, Scenario::One, 0));
    }

    #[test]
    fn picks_resolve_to_distinct_replicas_of_the_right_count() {
        let nodes = [1, 2, 3];
        for seed in 0..200 {
            for scenario in Scenario::ALL {
                let schedule = Schedule::from_seed(seed, scenario, false);
                for leader in [None, Some(1), Some(2), Some(3)] {
                    let victims = resolve(&schedule.picks, leader, &nodes);
                    let want = match scenario {
                        Scenario::One => 1,
                        Scenario::Majority => 2,
                        Scenario::All => 3,
                    };
                    assert_eq!(victims.len(), want, "{schedule:?} leader {leader:?}: {victims:?}");
                    if schedule.picks.contains(&Pick::Leader)
                        && let Some(leader) = leader
                    {
                        assert!(victims.contains(&leader));
                    }
                    if scenario != Scenario::All && !schedule.picks.contains(&Pick::Leader) {
                        assert!(leader.is_none_or(|l| !victims.contains(&l)), "{victims:?} {leader:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn scenarios_parse_by_name() {
        for scenario in Scenario::ALL {
            assert_eq!(scenario.name().parse::<Scenario>(), Ok(scenario));
        }
        assert!("most".parse::<Scenario>().is_err());
    }

    #[test]
    fn torn_seeds_differ_per_mount() {
        let schedule = Schedule::from_seed(7, Scenario::All, true);
        assert_ne!(schedule.torn_for(1).map(|t| t.seed), schedule.torn_for(2).map(|t| t.seed));
        assert!(Schedule::from_seed(7, Scenario::All, false).torn_for(1).is_none());
    }
}
