//! The exactly-once verifier for the demo pipeline's committed output.
//!
//! It reads every `<out>/committed/*.csv` line `key,count,seq` and checks, per key:
//! - the counts are exactly `1..=n`: no count twice (duplicate processing), none missing (loss);
//! - every line has `count == seq`: the `n`-th count of a key comes from the key's `n`-th source
//!   record, so the committed output is exactly the source's first `n` records of that key;
//! - optionally, the key set and `n` per key match an expectation (all keys `0..keys` present,
//!   `n == records_per_key`, or `n` equal to the source offsets of a completed checkpoint).

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use super::sink::COMMITTED_DIR;

/// What the output must additionally match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Expectation {
    /// Keys are `0..keys`; a key outside is a violation, and so is a missing one.
    pub keys: Option<u64>,
    /// Every key has exactly this many records.
    pub records_per_key: Option<u64>,
    /// Exact count per key (e.g. the source offsets of the last completed checkpoint).
    pub counts: Option<BTreeMap<u64, u64>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    Malformed { file: PathBuf, line: usize, text: String },
    Duplicate { key: u64, count: u64, times: usize },
    Gap { key: u64, missing: u64 },
    SeqMismatch { key: u64, count: u64, seq: u64 },
    UnexpectedKey { key: u64 },
    MissingKey { key: u64 },
    WrongTotal { key: u64, expected: u64, actual: u64 },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::Malformed { file, line, text } => {
                write!(f, "{}:{line}: malformed line {text:?}", file.display())
            }
            Violation::Duplicate { key, count, times } => {
                write!(f, "key {key}: count {count} committed {times} times")
            }
            Violation::Gap { key, missing } => write!(f, "key {key}: count {missing} missing"),
            Violation::SeqMismatch { key, count, seq } => {
                write!(f, "key {key}: count {count} derives from source record {seq}")
            }
            Violation::UnexpectedKey { key } => write!(f, "key {key} was never emitted by the source"),
            Violation::MissingKey { key } => write!(f, "key {key} has no committed record"),
            Violation::WrongTotal { key, expected, actual } => {
                write!(f, "key {key}: {actual} records committed, expected {expected}")
            }
        }
    }
}

/// The verifier's answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verdict {
    pub files: usize,
    pub records: u64,
    /// Key → highest count committed.
    pub per_key: BTreeMap<u64, u64>,
    pub violations: Vec<Violation>,
}

impl Verdict {
    pub fn is_exactly_once(&self) -> bool {
        self.violations.is_empty()
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_exactly_once() {
            write!(
                f,
                "EXACTLY ONCE: {} records over {} keys in {} files",
                self.records,
                self.per_key.len(),
                self.files
            )
        } else {
            writeln!(
                f,
                "VIOLATED: {} problem(s) in {} records over {} files",
                self.violations.len(),
                self.records,
                self.files
            )?;
            for v in self.violations.iter().take(50) {
                writeln!(f, "  - {v}")?;
            }
            if self.violations.len() > 50 {
                writeln!(f, "  ... and {} more", self.violations.len() - 50)?;
            }
            Ok(())
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

fn parse_line(line: &str) -> Option<(u64, u64, u64)> {
    let mut it = line.split(',');
    let r =
        (it.next()?.trim().parse().ok()?, it.next()?.trim().parse().ok()?, it.next()?.trim().parse().ok()?);
    if it.next().is_some() { None } else { Some(r) }
}

/// Reads `<output>/committed/` and checks exactly-once delivery.
pub fn verify_output(output: &Path, expect: &Expectation) -> Result<Verdict, VerifyError> {
    let dir = output.join(COMMITTED_DIR);
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| VerifyError::Io { path, source }
    };
    let mut verdict = Verdict::default();
    let mut counts: BTreeMap<u64, BTreeMap<u64, usize>> = BTreeMap::new();
    let mut files: Vec<PathBuf> = match std::fs::read_dir(&dir) {
        Ok(entries) => entries
            .map(|e| e.map(|e| e.path()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(io(&dir))?
            .into_iter()
            .filter(|p| p.extension().is_some_and(|e| e == "csv"))
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(io(&dir)(e)),
    };
    files.sort();
    for file in &files {
        let text = std::fs::read_to_string(file).map_err(io(file))?;
        verdict.files += 1;
        for (i, line) in text.lines().enumerate() {
            let Some((key, count, seq)) = parse_line(line) else {
                verdict.violations.push(Violation::Malformed {
                    file: file.clone(),
                    line: i + 1,
                    text: line.to_owned(),
                });
                continue;
            };
            verdict.records += 1;
            if count != seq {
                verdict.violations.push(Violation::SeqMismatch { key, count, seq });
            }
            *counts.entry(key).or_default().entry(count).or_default() += 1;
        }
    }
    for (key, seen) in &counts {
        let n = seen.keys().next_back().copied().unwrap_or(0);
        verdict.per_key.insert(*key, n);
        for (count, times) in seen {
            if *times > 1 {
                verdict.violations.push(Violation::Duplicate { key: *key, count: *count, times: *times });
            }
        }
        let mut missing = (1..=n).filter(|c| !seen.contains_key(c));
        if let Some(first) = missing.next() {
            verdict.violations.push(Violation::Gap { key: *key, missing: first });
        }
        if seen.contains_key(&0) {
            verdict.violations.push(Violation::Gap { key: *key, missing: 0 });
        }
    }
    if let Some(keys) = expect.keys {
        for key in verdict.per_key.keys().filter(|k| **k >= keys) {
            verdict.violations.push(Violation::UnexpectedKey { key: *key });
        }
        for key in (0..keys).filter(|k| !verdict.per_key.contains_key(k)) {
            verdict.violations.push(Violation::MissingKey { key });
        }
    }
    if let Some(expected) = expect.records_per_key {
        for (key, actual) in &verdict.per_key {
            if *actual != expected {
                verdict.violations.push(Violation::WrongTotal { key: *key, expected, actual: *actual });
            }
        }
    }
    if let Some(exact) = &expect.counts {
        for (key, expected) in exact {
            let actual = verdict.per_key.get(key).copied().unwrap_or(0);
            if actual != *expected {
                verdict.violations.push(Violation::WrongTotal { key: *key, expected: *expected, actual });
            }
        }
        for key in verdict.per_key.keys().filter(|k| !exact.contains_key(k)) {
            verdict.violations.push(Violation::UnexpectedKey { key: *key });
        }
    }
    Ok(verdict)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, body: &str) {
        std::fs::create_dir_all(dir.join(COMMITTED_DIR)).unwrap();
        std::fs::write(dir.join(COMMITTED_DIR).join(name), body).unwrap();
    }

    #[test]
    fn accepts_exactly_once_and_flags_duplicates_gaps_and_mismatches() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "a.csv", "0,1,1\n1,1,1\n0,2,2\n");
        write(dir.path(), "b.csv", "1,2,2\n");
        let v =
            verify_output(dir.path(), &Expectation { keys: Some(2), records_per_key: Some(2), counts: None })
                .unwrap();
        assert!(v.is_exactly_once(), "{v}");

        write(dir.path(), "c.csv", "0,2,2\n1,4,4\n0,5,3\nbad\n");
        let v = verify_output(dir.path(), &Expectation::default()).unwrap();
        assert!(v.violations.contains(&Violation::Duplicate { key: 0, count: 2, times: 2 }));
        assert!(v.violations.contains(&Violation::Gap { key: 1, missing: 3 }));
        assert!(v.violations.contains(&Violation::SeqMismatch { key: 0, count: 5, seq: 3 }));
        assert!(v.violations.iter().any(|x| matches!(x, Violation::Malformed { .. })));
        assert!(!v.to_string().is_empty());
    }
}
