//! Byte format of one key group's segment (all integers little-endian). A keyed-state file is
//! such segments one after another, in key-group order; the handle holds where each one is.
//!
//! ```text
//! "CKG1" key_group:u32
//! value_states:u32 { name_len:u16 name entries:u32 { key:u64 len:u32 bytes } }
//! map_states:u32   { name_len:u16 name keys:u32 { key:u64 entries:u32 { klen:u32 k vlen:u32 v } } }
//! ```
//!
//! Entries are written in sorted order, so equal state gives equal bytes (and equal CRC).
//! Decoding checks every length against the remaining bytes; a short or malformed file is a
//! [`DecodeError`], never a panic.

use std::collections::{BTreeMap, HashMap};

const MAGIC: &[u8; 4] = b"CKG1";

/// The entries of one key's map state (user key → value), ordered.
pub type MapEntries = BTreeMap<Vec<u8>, Vec<u8>>;

/// The keyed state of one key group of one operator.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyGroupData {
    /// Value state name → key → value.
    pub values: BTreeMap<String, HashMap<u64, Vec<u8>>>,
    /// Map state name → key → user key → value.
    pub maps: BTreeMap<String, HashMap<u64, MapEntries>>,
}

impl KeyGroupData {
    pub fn is_empty(&self) -> bool {
        self.values.values().all(HashMap::is_empty) && self.maps.values().all(HashMap::is_empty)
    }

    /// Every key that has some state in this group.
    pub fn keys(&self) -> impl Iterator<Item = u64> + '_ {
        self.values
            .values()
            .flat_map(|m| m.keys().copied())
            .chain(self.maps.values().flat_map(|m| m.keys().copied()))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct DecodeError(pub String);

fn put_u16(out: &mut Vec<u8>, v: u16) {
    out.extend_from_slice(&v.to_le_bytes());
}
fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}
fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}
fn put_name(out: &mut Vec<u8>, name: &str) {
    // State names are validated to at most 64 bytes.
    put_u16(out, name.len() as u16);
    out.extend_from_slice(name.as_bytes());
}
fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_u32(out, b.len() as u32);
    out.extend_from_slice(b);
}

/// Encodes one key group.
pub fn encode(key_group: u32, data: &KeyGroupData) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    encode_into(&mut out, key_group, data);
    out
}

/// Appends the encoding of one key group to `out`.
pub fn encode_into(out: &mut Vec<u8>, key_group: u32, data: &KeyGroupData) {
    out.extend_from_slice(MAGIC);
    put_u32(out, key_group);
    put_u32(out, data.values.len() as u32);
    for (name, entries) in &data.values {
        put_name(out, name);
        put_u32(out, entries.len() as u32);
        let mut keys: Vec<_> = entries.keys().copied().collect();
        keys.sort_unstable();
        for k in keys {
            put_u64(out, k);
            put_bytes(out, &entries[&k]);
        }
    }
    put_u32(out, data.maps.len() as u32);
    for (name, per_key) in &data.maps {
        put_name(out, name);
        put_u32(out, per_key.len() as u32);
        let mut keys: Vec<_> = per_key.keys().copied().collect();
        keys.sort_unstable();
        for k in keys {
            let map = &per_key[&k];
            put_u64(out, k);
            put_u32(out, map.len() as u32);
            for (uk, v) in map {
                put_bytes(out, uk);
                put_bytes(out, v);
            }
        }
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self.pos.checked_add(n).filter(|e| *e <= self.bytes.len()).ok_or_else(|| {
            DecodeError(format!("truncated: need {n} bytes at offset {} of {}", self.pos, self.bytes.len()))
        })?;
        let s = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn u16(&mut self) -> Result<u16, DecodeError> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Result<u64, DecodeError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }
    fn name(&mut self) -> Result<String, DecodeError> {
        let n = self.u16()? as usize;
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| DecodeError("state name is not UTF-8".into()))
    }
    fn bytes(&mut self) -> Result<Vec<u8>, DecodeError> {
        let n = self.u32()? as usize;
        Ok(self.take(n)?.to_vec())
    }
    /// A count of items each at least `min_item` bytes long, checked against what is left.
    fn count(&mut self, min_item: usize) -> Result<usize, DecodeError> {
        let n = self.u32()? as usize;
        if n.saturating_mul(min_item) > self.bytes.len() - self.pos {
            return Err(DecodeError(format!("count {n} exceeds the remaining bytes")));
        }
        Ok(n)
    }
}

/// Decodes one key group's segment; returns the key group it declares and its data.
pub fn decode(bytes: &[u8]) -> Result<(u32, KeyGroupData), DecodeError> {
    let mut r = Reader { bytes, pos: 0 };
    if r.take(4)? != MAGIC {
        return Err(DecodeError("not a key-group state file (bad magic)".into()));
    }
    let key_group = r.u32()?;
    let mut data = KeyGroupData::default();
    for _ in 0..r.count(6)? {
        let name = r.name()?;
        let n = r.count(12)?;
        let mut entries = HashMap::with_capacity(n);
        for _ in 0..n {
            let k = r.u64()?;
            entries.insert(k, r.bytes()?);
        }
        data.values.insert(name, entries);
    }
    for _ in 0..r.count(6)? {
        let name = r.name()?;
        let n = r.count(12)?;
        let mut per_key = HashMap::with_capacity(n);
        for _ in 0..n {
            let k = r.u64()?;
            let mut map = BTreeMap::new();
            for _ in 0..r.count(8)? {
                let uk = r.bytes()?;
                map.insert(uk, r.bytes()?);
            }
            per_key.insert(k, map);
        }
        data.maps.insert(name, per_key);
    }
    if r.pos != bytes.len() {
        return Err(DecodeError(format!("{} trailing bytes", bytes.len() - r.pos)));
    }
    Ok((key_group, data))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> KeyGroupData {
        let mut d = KeyGroupData::default();
        d.values.entry("count".into()).or_default().insert(7, 3u64.to_le_bytes().to_vec());
        d.values.entry("count".into()).or_default().insert(9, vec![]);
        d.maps.entry("seen".into()).or_default().entry(7).or_default().insert(b"a".to_vec(), b"1".to_vec());
        d
    }

    #[test]
    fn round_trip_and_deterministic_bytes() {
        let bytes = encode(5, &sample());
        assert_eq!(decode(&bytes).unwrap(), (5, sample()));
        assert_eq!(bytes, encode(5, &sample().clone()));
    }

    proptest! {
        #[test]
        fn truncated_or_garbled_files_are_errors_not_panics(cut in 0usize..80, flip in 0usize..80) {
            let bytes = encode(5, &sample());
            let _ = decode(&bytes[..cut.min(bytes.len())]);
            let mut garbled = bytes.clone();
            let i = flip % garbled.len();
            garbled[i] ^= 0xff;
            let _ = decode(&garbled);
        }
    }
}
