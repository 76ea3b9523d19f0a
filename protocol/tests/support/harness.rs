//! The harness of the `fuzz_*` property tests of every crate (each includes the files of this
//! directory with `#[path]`; see `docs/FUZZING.md`): the case count, the runner that reports
//! what a decoder made of its cases, and raw byte edits. `mutate.rs` adds JSON-aware edits,
//! `mutate_toml.rs` TOML-aware ones.
//!
//! Every case count comes from [`cases`]: 256 per property unless `CAIRN_FUZZ_CASES` says
//! otherwise, so `cargo test` stays fast and a long run is one environment variable away.

#![allow(dead_code, reason = "each fuzz file uses the part of the toolkit its decoders need")]

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config as ProptestConfig, TestCaseError};

/// Cases per property: `CAIRN_FUZZ_CASES`, else 256.
pub fn cases() -> u32 {
    std::env::var("CAIRN_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256)
}

/// The proptest configuration of every fuzz property: [`cases`] cases, no forking, and a bounded
/// shrink so a failure is reported in seconds, not minutes.
pub fn config() -> ProptestConfig {
    ProptestConfig { cases: cases(), max_shrink_iters: 2048, ..ProptestConfig::default() }
}

/// Like [`config`] with a fraction of the cases, for properties whose cases are expensive
/// (a database opened, a file synced). At least one case.
pub fn config_divided(by: u32) -> ProptestConfig {
    ProptestConfig { cases: (cases() / by.max(1)).max(1), ..config() }
}

// ---------------------------------------------------------------------------------------------
// Raw bytes
// ---------------------------------------------------------------------------------------------

/// One raw edit of an encoding.
#[derive(Debug, Clone)]
pub enum ByteOp {
    Flip {
        at: Index,
        bit: u8,
    },
    Set {
        at: Index,
        byte: u8,
    },
    Insert {
        at: Index,
        bytes: Vec<u8>,
    },
    Delete {
        at: Index,
        len: usize,
    },
    Truncate {
        at: Index,
    },
    /// Repeats a range right after itself.
    Duplicate {
        at: Index,
        len: usize,
    },
    /// Replaces a range with a range of the donor (a second valid encoding).
    Splice {
        at: Index,
        len: usize,
        from: Index,
        from_len: usize,
    },
    /// Overwrites 2, 4 or 8 bytes with a little-endian count or length (binary formats).
    Word {
        at: Index,
        width: usize,
        value: u64,
    },
}

/// Bytes that mean something to JSON, TOML or a length-prefixed format.
fn interesting_byte() -> impl Strategy<Value = u8> {
    prop_oneof![
        3 => prop::sample::select(b"{}[]\":,\\ \n\t0123456789-+.eE=#'tfn".to_vec()),
        1 => prop::sample::select(vec![0x00u8, 0x01, 0x7f, 0x80, 0xc0, 0xfe, 0xff]),
        1 => any::<u8>(),
    ]
}

pub fn byte_op() -> impl Strategy<Value = ByteOp> {
    prop_oneof![
        3 => (any::<Index>(), 0u8..8).prop_map(|(at, bit)| ByteOp::Flip { at, bit }),
        3 => (any::<Index>(), interesting_byte()).prop_map(|(at, byte)| ByteOp::Set { at, byte }),
        2 => (any::<Index>(), prop::collection::vec(interesting_byte(), 1..8))
            .prop_map(|(at, bytes)| ByteOp::Insert { at, bytes }),
        2 => (any::<Index>(), 1usize..16).prop_map(|(at, len)| ByteOp::Delete { at, len }),
        1 => any::<Index>().prop_map(|at| ByteOp::Truncate { at }),
        1 => (any::<Index>(), 1usize..32).prop_map(|(at, len)| ByteOp::Duplicate { at, len }),
        2 => (any::<Index>(), 0usize..32, any::<Index>(), 1usize..64)
            .prop_map(|(at, len, from, from_len)| ByteOp::Splice { at, len, from, from_len }),
        2 => (
            any::<Index>(),
            prop::sample::select(vec![2usize, 4, 8]),
            prop_oneof![
                prop::sample::select(vec![0u64, 1, 2, 0xff, 0xffff, 0x7fff_ffff, 0xffff_ffff, u64::MAX]),
                0u64..64,
            ],
        )
            .prop_map(|(at, width, value)| ByteOp::Word { at, width, value }),
    ]
}

/// One to five raw edits.
pub fn byte_ops() -> impl Strategy<Value = Vec<ByteOp>> {
    prop::collection::vec(byte_op(), 1..6)
}

/// Zero to three raw edits (after a structural mutation, often none).
pub fn few_byte_ops() -> impl Strategy<Value = Vec<ByteOp>> {
    prop::collection::vec(byte_op(), 0..4)
}

/// No edits two times in three, else what `s` draws: for the edits that follow a structural
/// mutation, which would otherwise break nearly every input at the syntax level.
pub fn rarely<T: Clone + std::fmt::Debug>(s: impl Strategy<Value = Vec<T>>) -> impl Strategy<Value = Vec<T>> {
    prop_oneof![2 => Just(Vec::new()), 1 => s]
}

/// Fully random input: short, and sometimes long.
pub fn random_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => prop::collection::vec(any::<u8>(), 0..64),
        1 => prop::collection::vec(any::<u8>(), 0..4096),
    ]
}

/// Applies `ops` in order to a copy of `input`; `donor` feeds splices.
pub fn apply_bytes(input: &[u8], ops: &[ByteOp], donor: &[u8]) -> Vec<u8> {
    let mut out = input.to_vec();
    for op in ops {
        // Positions are taken modulo the current length (+1 where the end is a valid position).
        let pos = |at: &Index, len: usize| if len == 0 { 0 } else { at.index(len + 1) };
        match op {
            ByteOp::Flip { at, bit } => {
                if !out.is_empty() {
                    let i = at.index(out.len());
                    out[i] ^= 1 << bit;
                }
            }
            ByteOp::Set { at, byte } => {
                if !out.is_empty() {
                    let i = at.index(out.len());
                    out[i] = *byte;
                }
            }
            ByteOp::Insert { at, bytes } => {
                let i = pos(at, out.len());
                out.splice(i..i, bytes.iter().copied());
            }
            ByteOp::Delete { at, len } => {
                let i = pos(at, out.len());
                let end = (i + len).min(out.len());
                out.drain(i..end);
            }
            ByteOp::Truncate { at } => {
                let i = pos(at, out.len());
                out.truncate(i);
            }
            ByteOp::Duplicate { at, len } => {
                let i = pos(at, out.len());
                let end = (i + len).min(out.len());
                let copy = out[i..end].to_vec();
                out.splice(end..end, copy);
            }
            ByteOp::Word { at, width, value } => {
                if out.len() >= *width {
                    let i = at.index(out.len() - width + 1);
                    out[i..i + width].copy_from_slice(&value.to_le_bytes()[..*width]);
                }
            }
            ByteOp::Splice { at, len, from, from_len } => {
                let i = pos(at, out.len());
                let end = (i + len).min(out.len());
                let j = pos(from, donor.len()).min(donor.len());
                let donor_end = (j + from_len).min(donor.len());
                out.splice(i..end, donor[j..donor_end].iter().copied());
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// The runner
// ---------------------------------------------------------------------------------------------

/// What a decoder made of one case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Decoded (and passed every check that applies to a decoded value).
    Accepted,
    /// Refused with a typed error.
    Refused,
    /// Decoded, but the checks after decoding were not run: the input hits a known defect that
    /// cannot be fixed in this change (named where the verdict is given, and in `docs/FUZZING.md`).
    Skipped,
}

/// Accepted when the decoder returned a value.
pub fn verdict<T>(decoded: &Option<T>) -> Verdict {
    if decoded.is_some() { Verdict::Accepted } else { Verdict::Refused }
}

fn seed() -> u64 {
    if let Some(seed) = std::env::var("CAIRN_FUZZ_SEED").ok().and_then(|v| v.parse().ok()) {
        return seed;
    }
    use std::hash::{BuildHasher, Hasher};
    std::collections::hash_map::RandomState::new().build_hasher().finish()
}

/// Runs `test` on [`config`]'s number of cases drawn from `strategy` (a random seed, printed; set
/// `CAIRN_FUZZ_SEED` to replay one), and prints what the decoder made of them. A failure (an
/// assertion, or a panic anywhere in the decoder) is shrunk and reported with the seed.
pub fn fuzz<S: Strategy>(
    name: &str,
    config: ProptestConfig,
    strategy: S,
    test: impl Fn(S::Value) -> Result<Verdict, TestCaseError>,
) {
    use std::sync::atomic::{AtomicU64, Ordering};

    let seed = seed();
    let mut key = [0u8; 32];
    for chunk in key.chunks_mut(8) {
        chunk.copy_from_slice(&seed.to_le_bytes());
    }
    let rng = proptest::test_runner::TestRng::from_seed(proptest::test_runner::RngAlgorithm::ChaCha, &key);
    let cases = config.cases;
    let config = ProptestConfig { failure_persistence: None, ..config };
    let mut runner = proptest::test_runner::TestRunner::new_with_rng(config, rng);
    let (accepted, refused, skipped) = (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
    let started = std::time::Instant::now();
    let result = runner.run(&strategy, |value| {
        match test(value)? {
            Verdict::Accepted => accepted.fetch_add(1, Ordering::Relaxed),
            Verdict::Refused => refused.fetch_add(1, Ordering::Relaxed),
            Verdict::Skipped => skipped.fetch_add(1, Ordering::Relaxed),
        };
        Ok(())
    });
    let elapsed = started.elapsed();
    if let Err(e) = result {
        panic!("fuzz {name} failed (replay with CAIRN_FUZZ_SEED={seed}): {e}");
    }
    let skipped = match skipped.load(Ordering::Relaxed) {
        0 => String::new(),
        n => format!(", {n} skipped (known defect)"),
    };
    eprintln!(
        "fuzz {name}: {cases} cases, {} accepted, {} refused{skipped}, 0 panics, {:.2} s (seed {seed})",
        accepted.load(Ordering::Relaxed),
        refused.load(Ordering::Relaxed),
        elapsed.as_secs_f64(),
    );
}
