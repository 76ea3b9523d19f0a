//! Idempotent operator requests: a bounded table of recent request ids per job.
//!
//! A mutating operator call carries a client-chosen request id. The proposer wraps its command in
//! [`Command::Deduplicated`](super::Command::Deduplicated) with the id and a fingerprint of the
//! call's arguments; the state machine records the outcome in the table of the job the command
//! acts on. A retry with the same id and fingerprint, on this or any later leader, gets
//! [`Outcome::Repeated`](super::Outcome::Repeated) with the first outcome and changes nothing
//! else; the same id with another fingerprint is refused
//! ([`CommandError::RequestIdReused`](super::CommandError::RequestIdReused)).
//!
//! Why per job: every mutating call acts on exactly one job, and the store persists exactly the
//! row of the job a command touches, so the table lives in that row and is written in the same
//! transaction as the change it guards. Request ids are therefore scoped to their job.
//!
//! Bound: [`MAX_REQUESTS_PER_JOB`] entries per job; beyond it the oldest entry is evicted, so a
//! retry is recognised as long as fewer than that many later requests were made on the job.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use super::Outcome;

/// Request ids remembered per job (oldest evicted first).
pub const MAX_REQUESTS_PER_JOB: usize = 1000;

/// Longest accepted request id.
pub const MAX_REQUEST_ID_LEN: usize = 128;

/// Why a string is not a usable request id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestIdError {
    #[error("request_id is {0} bytes long; at most 128 are allowed")]
    TooLong(usize),
    #[error("request_id {0:?} may only contain letters, digits, '.', '_', ':' and '-'")]
    BadChar(String),
}

/// Checks a request id: 1 to 128 bytes of `[A-Za-z0-9._:-]` (the empty id means "none" and is
/// handled by callers).
pub fn validate_request_id(id: &str) -> Result<(), RequestIdError> {
    if id.len() > MAX_REQUEST_ID_LEN {
        return Err(RequestIdError::TooLong(id.len()));
    }
    if !id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-')) {
        return Err(RequestIdError::BadChar(id.to_owned()));
    }
    Ok(())
}

/// A stable 64-bit fingerprint (FNV-1a) of a request's canonical argument bytes. Stable across
/// processes and versions, unlike `std`'s hasher, so every leader computes the same value.
pub fn fingerprint(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        // Length-prefix each part so ("ab", "c") and ("a", "bc") differ.
        for b in (part.len() as u64).to_le_bytes().iter().chain(part.iter()) {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

/// One remembered request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestEntry {
    pub id: String,
    pub fingerprint: u64,
    /// What the first execution returned.
    pub outcome: Outcome,
}

/// What the table says about a request id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup<'a> {
    /// Never seen (or evicted).
    New,
    /// Seen with the same arguments: the first outcome.
    Repeat(&'a Outcome),
    /// Seen with other arguments.
    Conflict,
}

/// The recent requests of one job, oldest first, at most [`MAX_REQUESTS_PER_JOB`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RequestTable(VecDeque<RequestEntry>);

impl RequestTable {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn lookup(&self, id: &str, fingerprint: u64) -> Lookup<'_> {
        match self.0.iter().find(|e| e.id == id) {
            None => Lookup::New,
            Some(e) if e.fingerprint == fingerprint => Lookup::Repeat(&e.outcome),
            Some(_) => Lookup::Conflict,
        }
    }

    /// The outcome recorded for `id`, whatever its fingerprint.
    pub fn outcome(&self, id: &str) -> Option<&Outcome> {
        self.0.iter().find(|e| e.id == id).map(|e| &e.outcome)
    }

    /// Records a new request, evicting the oldest beyond the bound.
    pub fn record(&mut self, entry: RequestEntry) {
        self.0.retain(|e| e.id != entry.id);
        self.0.push_back(entry);
        while self.0.len() > MAX_REQUESTS_PER_JOB {
            self.0.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: &str, fp: u64, n: u64) -> RequestEntry {
        RequestEntry { id: id.to_owned(), fingerprint: fp, outcome: Outcome::CheckpointId { id: n } }
    }

    #[test]
    fn repeat_conflict_and_new_are_told_apart() {
        let mut t = RequestTable::default();
        assert_eq!(t.lookup("r1", 7), Lookup::New);
        t.record(entry("r1", 7, 3));
        assert_eq!(t.lookup("r1", 7), Lookup::Repeat(&Outcome::CheckpointId { id: 3 }));
        assert_eq!(t.lookup("r1", 8), Lookup::Conflict);
        assert_eq!(t.lookup("r2", 7), Lookup::New);
    }

    #[test]
    fn the_oldest_entries_are_evicted_beyond_the_bound() {
        let mut t = RequestTable::default();
        for i in 0..(MAX_REQUESTS_PER_JOB as u64 + 5) {
            t.record(entry(&format!("r{i}"), i, i));
        }
        assert_eq!(t.len(), MAX_REQUESTS_PER_JOB);
        for i in 0..5 {
            assert_eq!(t.lookup(&format!("r{i}"), i), Lookup::New, "r{i} should be evicted");
        }
        assert!(matches!(t.lookup("r5", 5), Lookup::Repeat(_)));
        let last = MAX_REQUESTS_PER_JOB as u64 + 4;
        assert!(matches!(t.lookup(&format!("r{last}"), last), Lookup::Repeat(_)));
    }

    #[test]
    fn request_ids_are_validated() {
        assert!(validate_request_id("cli-1.2:abc_X").is_ok());
        assert_eq!(validate_request_id(&"x".repeat(129)), Err(RequestIdError::TooLong(129)));
        assert!(validate_request_id(&"x".repeat(128)).is_ok());
        assert!(matches!(validate_request_id("a b"), Err(RequestIdError::BadChar(_))));
        assert!(matches!(validate_request_id("a/b"), Err(RequestIdError::BadChar(_))));
    }

    #[test]
    fn fingerprints_are_stable_and_separate_parts() {
        assert_eq!(fingerprint(&[b"submit", b"job"]), fingerprint(&[b"submit", b"job"]));
        assert_ne!(fingerprint(&[b"ab", b"c"]), fingerprint(&[b"a", b"bc"]));
        // Pinned: the value must never change between versions (retries span upgrades).
        assert_eq!(fingerprint(&[]), 0xcbf2_9ce4_8422_2325);
    }
}
