//! Structure-aware mutation of JSON documents for the `fuzz_*` property tests of every crate
//! (included with `#[path]` next to `harness.rs`; see `docs/FUZZING.md`).
//!
//! A case starts from a VALID encoding of a real value, then changes it the way a broken peer,
//! a damaged disk or a careless operator would: values replaced by values of another type, huge
//! or out-of-range numbers, very long strings, deep nesting, duplicate, unknown and missing
//! keys, and finally raw byte edits (bit flips, inserts, deletes, truncation, splices from a
//! second valid encoding). Fully random bytes are fed too, but they rarely get past the first
//! byte of a decoder; the mutated valid inputs are what reach the deep paths.

#![allow(dead_code, reason = "each fuzz file uses the part of the toolkit its decoders need")]

use proptest::prelude::*;
use proptest::sample::Index;
use serde_json::Value;

use crate::harness::{ByteOp, apply_bytes, byte_ops, few_byte_ops, random_bytes, rarely};

// ---------------------------------------------------------------------------------------------
// JSON values
// ---------------------------------------------------------------------------------------------

/// A value put in place of another one.
#[derive(Debug, Clone)]
pub enum Leaf {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    /// A string of this many characters (up to 64 Ki).
    Long(usize),
    EmptyArray,
    EmptyObject,
    /// A literal JSON cannot hold in a `Value`: numbers beyond every integer type, beyond `f64`,
    /// `-0`, exponents, and nesting deeper than any decoder's recursion limit.
    Raw(String),
}

fn raw_literal() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "18446744073709551615",
            "18446744073709551616",
            "-9223372036854775809",
            "340282366920938463463374607431768211456",
            "1e400",
            "-1e400",
            "4.9e-325",
            "-0",
            "0.0",
            "1.5",
            "1e2",
            "-1",
            "4294967296",
            "65536",
            "32768",
            "true",
            "\"\\ud800\"",
            "\"\\u0000\"",
        ])
        .prop_map(str::to_owned),
        // Deep nesting, up to far past serde_json's limit of 128.
        (1usize..2000, any::<bool>()).prop_map(|(depth, arrays)| if arrays {
            format!("{}{}", "[".repeat(depth), "]".repeat(depth))
        } else {
            format!("{}1{}", "{\"a\":".repeat(depth), "}".repeat(depth))
        }),
    ]
}

pub fn leaf() -> impl Strategy<Value = Leaf> {
    prop_oneof![
        1 => Just(Leaf::Null),
        1 => any::<bool>().prop_map(Leaf::Bool),
        2 => prop_oneof![
            any::<i64>(),
            Just(i64::MIN),
            Just(i64::MAX),
            Just(-1i64),
            Just(0i64),
            Just(u32::MAX as i64),
            Just(u32::MAX as i64 + 1),
        ]
        .prop_map(Leaf::Int),
        1 => prop_oneof![any::<f64>(), Just(f64::MAX), Just(f64::MIN_POSITIVE), Just(0.5), Just(-0.0)]
            .prop_map(Leaf::Float),
        2 => "\\PC{0,24}".prop_map(Leaf::Str),
        1 => prop::sample::select(vec!["", " ", "/", "..", "../x", "/tmp/x", "10ms", "0s", "x:0", ":"])
            .prop_map(|s| Leaf::Str(s.to_owned())),
        1 => (1usize..65_536).prop_map(Leaf::Long),
        1 => Just(Leaf::EmptyArray),
        1 => Just(Leaf::EmptyObject),
        2 => raw_literal().prop_map(Leaf::Raw),
    ]
}

/// Marks a [`Leaf::Raw`] literal inside a `Value` until [`render_json`] writes it out verbatim.
pub const RAW_MARK: &str = "\u{0}raw\u{0}";

impl Leaf {
    pub fn to_json(&self) -> Value {
        match self {
            Leaf::Null => Value::Null,
            Leaf::Bool(b) => Value::Bool(*b),
            Leaf::Int(i) => Value::from(*i),
            // NaN and infinities have no JSON form: they become null, as serde_json writes them.
            Leaf::Float(f) => serde_json::Number::from_f64(*f).map_or(Value::Null, Value::Number),
            Leaf::Str(s) => Value::String(s.clone()),
            Leaf::Long(n) => Value::String("é1/.".chars().cycle().take(*n).collect()),
            Leaf::EmptyArray => Value::Array(Vec::new()),
            Leaf::EmptyObject => Value::Object(serde_json::Map::new()),
            Leaf::Raw(raw) => Value::String(format!("{RAW_MARK}{raw}")),
        }
    }
}

/// One structural edit of a JSON document. Nodes are addressed by pre-order position.
#[derive(Debug, Clone)]
pub enum JsonOp {
    /// Changes a node's value but not its type: a boundary number (0, -1, `u32::MAX` + 1,
    /// `u64::MAX`, ...), an empty, very long, non-ASCII or path-like string, a flipped boolean,
    /// an array with an element repeated or its elements dropped. What decodes and reaches the
    /// checks behind the decoder.
    Tweak { at: Index, how: Index },
    /// Replaces a node with a value of any type.
    Replace { at: Index, with: Leaf },
    /// Replaces a node with a copy of another node of the same document (the right kind of
    /// value in the wrong place: an id where a number goes, a whole object where a string goes).
    Transplant { at: Index, from: Index },
    /// Removes a key of an object (or an element of an array).
    Remove { at: Index, which: Index },
    /// Adds a key no decoder knows to an object (or appends to an array).
    Add { at: Index, key: String, with: Leaf },
    /// Wraps a node in arrays or objects.
    Nest { at: Index, depth: usize, arrays: bool },
    /// Writes one key of an object twice (the second time with another value).
    DuplicateKey { at: Index, which: Index, with: Leaf },
}

fn unknown_key() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec!["type", "cmd", "id", "job", "version", "graph", "", "\u{0}", "zz"])
            .prop_map(str::to_owned),
        "[a-z_]{1,12}",
    ]
}

pub fn json_op() -> impl Strategy<Value = JsonOp> {
    prop_oneof![
        8 => (any::<Index>(), any::<Index>()).prop_map(|(at, how)| JsonOp::Tweak { at, how }),
        4 => (any::<Index>(), leaf()).prop_map(|(at, with)| JsonOp::Replace { at, with }),
        2 => (any::<Index>(), any::<Index>()).prop_map(|(at, from)| JsonOp::Transplant { at, from }),
        3 => (any::<Index>(), any::<Index>()).prop_map(|(at, which)| JsonOp::Remove { at, which }),
        2 => (any::<Index>(), unknown_key(), leaf())
            .prop_map(|(at, key, with)| JsonOp::Add { at, key, with }),
        1 => (any::<Index>(), 1usize..300, any::<bool>())
            .prop_map(|(at, depth, arrays)| JsonOp::Nest { at, depth, arrays }),
        2 => (any::<Index>(), any::<Index>(), leaf())
            .prop_map(|(at, which, with)| JsonOp::DuplicateKey { at, which, with }),
    ]
}

/// One to four structural edits.
pub fn json_ops() -> impl Strategy<Value = Vec<JsonOp>> {
    prop::collection::vec(json_op(), 1..5)
}

fn count_nodes(v: &Value) -> usize {
    1 + match v {
        Value::Array(a) => a.iter().map(count_nodes).sum(),
        Value::Object(o) => o.values().map(count_nodes).sum(),
        _ => 0,
    }
}

/// The node at pre-order position `n` (0 is the root).
fn node_mut(v: &mut Value, n: usize) -> Option<&mut Value> {
    if n == 0 {
        return Some(v);
    }
    let mut rest = n - 1;
    let children: Vec<&mut Value> = match v {
        Value::Array(a) => a.iter_mut().collect(),
        Value::Object(o) => o.values_mut().collect(),
        _ => return None,
    };
    for child in children {
        let size = count_nodes(child);
        if rest < size {
            return node_mut(child, rest);
        }
        rest -= size;
    }
    None
}

fn node(v: &Value, n: usize) -> Option<&Value> {
    if n == 0 {
        return Some(v);
    }
    let mut rest = n - 1;
    let children: Vec<&Value> = match v {
        Value::Array(a) => a.iter().collect(),
        Value::Object(o) => o.values().collect(),
        _ => return None,
    };
    for child in children {
        let size = count_nodes(child);
        if rest < size {
            return node(child, rest);
        }
        rest -= size;
    }
    None
}

/// Marks an object entry that [`render_json`] writes twice: `(entry key, second value)`.
pub const DUP_KEY: &str = "\u{0}dup\u{0}";

/// Applies structural edits to a JSON document, returning its text.
pub fn mutate_json(doc: &Value, ops: &[JsonOp]) -> String {
    render_json(&mutate_value(doc, ops))
}

/// Applies structural edits to a JSON document. Raw literals and duplicate keys stay marked
/// until the document is rendered ([`render_json`]).
pub fn mutate_value(doc: &Value, ops: &[JsonOp]) -> Value {
    let mut v = doc.clone();
    for op in ops {
        let total = count_nodes(&v);
        match op {
            JsonOp::Tweak { at, how } => {
                if let Some(n) = node_mut(&mut v, at.index(total)) {
                    tweak(n, how);
                }
            }
            JsonOp::Replace { at, with } => {
                if let Some(n) = node_mut(&mut v, at.index(total)) {
                    *n = with.to_json();
                }
            }
            JsonOp::Transplant { at, from } => {
                let copy = node(&v, from.index(total)).cloned();
                if let (Some(copy), Some(n)) = (copy, node_mut(&mut v, at.index(total))) {
                    *n = copy;
                }
            }
            JsonOp::Remove { at, which } => match node_mut(&mut v, at.index(total)) {
                Some(Value::Object(o)) if !o.is_empty() => {
                    let key = o.keys().nth(which.index(o.len())).cloned();
                    if let Some(key) = key {
                        o.remove(&key);
                    }
                }
                Some(Value::Array(a)) if !a.is_empty() => {
                    a.remove(which.index(a.len()));
                }
                _ => {}
            },
            JsonOp::Add { at, key, with } => match node_mut(&mut v, at.index(total)) {
                Some(Value::Object(o)) => {
                    o.insert(key.clone(), with.to_json());
                }
                Some(Value::Array(a)) => a.push(with.to_json()),
                _ => {}
            },
            JsonOp::Nest { at, depth, arrays } => {
                if let Some(n) = node_mut(&mut v, at.index(total)) {
                    let mut inner = n.take();
                    for _ in 0..*depth {
                        inner = if *arrays {
                            Value::Array(vec![inner])
                        } else {
                            Value::Object(serde_json::Map::from_iter([("n".to_owned(), inner)]))
                        };
                    }
                    *n = inner;
                }
            }
            JsonOp::DuplicateKey { at, which, with } => {
                if let Some(Value::Object(o)) = node_mut(&mut v, at.index(total))
                    && !o.is_empty()
                {
                    let key = o.keys().nth(which.index(o.len())).cloned().unwrap_or_default();
                    o.insert(DUP_KEY.to_owned(), Value::Array(vec![Value::String(key), with.to_json()]));
                }
            }
        }
    }
    v
}

/// Numbers a decoder's integer fields must survive, and strings its text and path fields must.
const NUMBERS: &[&str] = &[
    "0",
    "1",
    "-1",
    "2",
    "255",
    "65535",
    "65536",
    "2147483647",
    "2147483648",
    "4294967295",
    "4294967296",
    "9223372036854775807",
    "18446744073709551615",
    "-9223372036854775808",
    "0.5",
    "1e3",
    "1e-320",
];
const STRINGS: &[&str] = &[
    "",
    " ",
    "a",
    "é",
    "\u{1F980}",
    "..",
    "../x",
    "/abs",
    "chk-1/../../x",
    "shared/x",
    "a/b",
    "a\\b",
    "\u{0}",
    "10ms",
    "0s",
    "1h",
    "584542046090years",
    "18446744073709551615s",
    "checkpoint",
    "savepoint",
    "sync_savepoint",
];

fn tweak(node: &mut Value, how: &Index) {
    match node {
        Value::Number(n) => {
            let choices: Vec<String> = NUMBERS
                .iter()
                .map(|s| (*s).to_owned())
                .chain(n.as_u64().map(|x| x.wrapping_add(1).to_string()))
                .chain(n.as_u64().map(|x| x.wrapping_sub(1).to_string()))
                .collect();
            let pick = &choices[how.index(choices.len())];
            *node = match serde_json::from_str::<Value>(pick) {
                Ok(v) => v,
                Err(_) => Value::String(format!("{RAW_MARK}{pick}")),
            };
        }
        Value::String(s) => {
            let i = how.index(STRINGS.len() + 2);
            *s = match i {
                i if i < STRINGS.len() => STRINGS[i].to_owned(),
                i if i == STRINGS.len() => s.repeat(1 + 4096 / (s.len() + 1)),
                _ => format!("{s}x"),
            };
        }
        Value::Bool(b) => *b = !*b,
        Value::Array(a) if !a.is_empty() => match how.index(3) {
            0 => {
                let copy = a[how.index(a.len())].clone();
                a.push(copy);
            }
            1 => a.truncate(a.len() / 2),
            _ => a.reverse(),
        },
        Value::Object(o) if !o.is_empty() => {
            let key = o.keys().nth(how.index(o.len())).cloned().unwrap_or_default();
            if let Some(child) = o.get_mut(&key) {
                tweak(child, how);
            }
        }
        _ => {}
    }
}

/// Writes a document, turning the markers of [`Leaf::Raw`] and [`JsonOp::DuplicateKey`] into
/// what a `Value` cannot hold: raw literals and repeated keys.
pub fn render_json(v: &Value) -> String {
    let mut out = String::new();
    write_json(v, &mut out);
    out
}

fn write_json(v: &Value, out: &mut String) {
    match v {
        Value::String(s) => match s.strip_prefix(RAW_MARK) {
            Some(raw) => out.push_str(raw),
            None => out.push_str(&Value::String(s.clone()).to_string()),
        },
        Value::Array(a) => {
            out.push('[');
            for (i, e) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_json(e, out);
            }
            out.push(']');
        }
        Value::Object(o) => {
            out.push('{');
            let mut first = true;
            let mut entry = |k: &str, val: &Value, out: &mut String| {
                if !first {
                    out.push(',');
                }
                first = false;
                out.push_str(&Value::String(k.to_owned()).to_string());
                out.push(':');
                write_json(val, out);
            };
            for (k, val) in o {
                if k == DUP_KEY {
                    continue;
                }
                entry(k, val, out);
            }
            if let Some(Value::Array(dup)) = o.get(DUP_KEY)
                && let [Value::String(k), val] = dup.as_slice()
            {
                entry(k, val, out);
            }
            out.push('}');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// A mutated JSON document: structural edits, then a few raw byte edits.
pub fn mutated_json(doc: &Value, ops: &[JsonOp], bytes: &[ByteOp], donor: &[u8]) -> Vec<u8> {
    apply_bytes(mutate_json(doc, ops).as_bytes(), bytes, donor)
}

// ---------------------------------------------------------------------------------------------
// Round trips
// ---------------------------------------------------------------------------------------------

/// For a JSON decoder: an input that decoded to `value` must re-encode to bytes that decode to
/// an equal value and re-encode to the same bytes (the encoding is a fixed point after one
/// decode). Returns the re-encoded bytes.
pub fn assert_json_round_trip<T>(value: &T) -> Vec<u8>
where
    T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    let bytes = serde_json::to_vec(value).unwrap_or_else(|e| panic!("a decoded value must encode: {e}"));
    let again: T = serde_json::from_slice(&bytes).unwrap_or_else(|e| {
        panic!("re-encoded value does not decode: {e}\n{}", String::from_utf8_lossy(&bytes))
    });
    assert_eq!(&again, value, "round trip changed the value: {}", String::from_utf8_lossy(&bytes));
    let bytes_again = serde_json::to_vec(&again).unwrap_or_else(|e| panic!("encode: {e}"));
    assert_eq!(bytes_again, bytes, "the encoding is not stable");
    bytes
}

/// Like [`assert_json_round_trip`] for types without `PartialEq` (openraft's messages): the
/// re-encoded bytes must be a fixed point.
pub fn assert_json_bytes_stable<T>(value: &T) -> Vec<u8>
where
    T: serde::Serialize + serde::de::DeserializeOwned,
{
    let bytes = serde_json::to_vec(value).unwrap_or_else(|e| panic!("a decoded value must encode: {e}"));
    let again: T = serde_json::from_slice(&bytes).unwrap_or_else(|e| {
        panic!("re-encoded value does not decode: {e}\n{}", String::from_utf8_lossy(&bytes))
    });
    let bytes_again = serde_json::to_vec(&again).unwrap_or_else(|e| panic!("encode: {e}"));
    assert_eq!(
        String::from_utf8_lossy(&bytes_again),
        String::from_utf8_lossy(&bytes),
        "the encoding is not stable"
    );
    bytes
}

// ---------------------------------------------------------------------------------------------
// Cases and the runner
// ---------------------------------------------------------------------------------------------

/// How one case damages a valid encoding.
#[derive(Debug, Clone)]
pub enum Mutation {
    /// Structural JSON edits, then a few raw byte edits.
    Json(Vec<JsonOp>, Vec<ByteOp>),
    /// Raw byte edits only.
    Bytes(Vec<ByteOp>),
    /// The valid encoding ignored: random bytes.
    Random(Vec<u8>),
}

/// Mostly structural edits; some byte edits; a few fully random inputs.
pub fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        6 => (json_ops(), rarely(few_byte_ops())).prop_map(|(j, b)| Mutation::Json(j, b)),
        3 => byte_ops().prop_map(Mutation::Bytes),
        1 => random_bytes().prop_map(Mutation::Random),
    ]
}

/// A value, a second one whose encoding feeds splices, and how the case damages the first.
pub fn case<S: Strategy>(strategy: impl Fn() -> S) -> impl Strategy<Value = (S::Value, S::Value, Mutation)> {
    (strategy(), strategy(), mutation())
}

/// The input a case feeds to a JSON decoder: `value`'s encoding damaged by `m`, with `donor`'s
/// encoding as the source of splices.
pub fn mutated<T: serde::Serialize>(value: &T, donor: &T, m: &Mutation) -> Vec<u8> {
    let doc = serde_json::to_value(value).unwrap_or_else(|e| panic!("valid values encode: {e}"));
    let donor = serde_json::to_vec(donor).unwrap_or_else(|e| panic!("valid values encode: {e}"));
    match m {
        Mutation::Json(ops, bytes) => mutated_json(&doc, ops, bytes, &donor),
        Mutation::Bytes(ops) => apply_bytes(doc.to_string().as_bytes(), ops, &donor),
        Mutation::Random(bytes) => bytes.clone(),
    }
}

/// For a JSON decoder: valid bytes decode to the value they encode; any input either decodes to
/// a value whose encoding round-trips ([`assert_json_round_trip`]) or is refused with a
/// `serde_json::Error` (whose message renders). Returns the decoded value.
pub fn check_json<T>(valid: &T, input: &[u8]) -> Option<T>
where
    T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    let bytes = serde_json::to_vec(valid).unwrap_or_else(|e| panic!("valid values encode: {e}"));
    match serde_json::from_slice::<T>(&bytes) {
        Ok(back) => assert_eq!(&back, valid, "a valid encoding decoded to another value"),
        Err(e) => panic!("a valid encoding was refused: {e}\n{}", String::from_utf8_lossy(&bytes)),
    }
    match serde_json::from_slice::<T>(input) {
        Ok(decoded) => {
            assert_json_round_trip(&decoded);
            Some(decoded)
        }
        Err(e) => {
            assert!(!e.to_string().is_empty());
            None
        }
    }
}
