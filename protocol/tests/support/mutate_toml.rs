//! TOML configuration files for the structure-aware fuzz tests: a valid configuration (given as
//! its JSON form) is edited structurally with [`super::mutate`]'s JSON edits, written as TOML, then
//! edited textually the ways only TOML allows (duplicate keys and tables, stray headers, dotted
//! keys, dates, `nan`). Included with `#[path]` next to `mutate.rs` by the crates that parse TOML.

#![allow(dead_code, reason = "each fuzz file uses the part of the toolkit its decoders need")]

use proptest::prelude::*;
use proptest::sample::Index;
use serde_json::Value;

use crate::mutate::{DUP_KEY, JsonOp, RAW_MARK, mutate_value};

/// Converts a (mutated) JSON document to TOML. TOML has no null: null values are left out.
/// Raw literals stay marked strings until [`unmark`]; integers beyond `i64` become raw literals.
fn json_to_toml(v: &Value) -> Option<toml::Value> {
    Some(match v {
        Value::Null => return None,
        Value::Bool(b) => toml::Value::Boolean(*b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => toml::Value::Integer(i),
            None if n.is_u64() => toml::Value::String(format!("{RAW_MARK}{n}")),
            None => toml::Value::Float(n.as_f64()?),
        },
        Value::String(s) => toml::Value::String(s.clone()),
        Value::Array(a) => toml::Value::Array(a.iter().filter_map(json_to_toml).collect()),
        Value::Object(o) => toml::Value::Table(
            o.iter()
                .filter(|(k, _)| k.as_str() != DUP_KEY)
                .filter_map(|(k, v)| Some((k.clone(), json_to_toml(v)?)))
                .collect(),
        ),
    })
}

/// Applies structural edits to a configuration (given as its JSON form) and writes it as TOML,
/// raw literals (huge integers, deep nesting, odd literals) written verbatim. `None` when the
/// edits left no table at the top (a TOML file always is one).
pub fn mutate_toml(doc: &Value, ops: &[JsonOp]) -> Option<String> {
    let table = match json_to_toml(&mutate_value(doc, ops))? {
        toml::Value::Table(t) => t,
        _ => return None,
    };
    let text = toml::to_string(&table).ok()?;
    Some(unmark(&text))
}

/// Replaces each basic string TOML wrote for a raw marker (`"\u0000raw\u0000<literal>"`) by the
/// literal itself, unescaped.
fn unmark(text: &str) -> String {
    let marker = "\"\\u0000raw\\u0000";
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find(marker) {
        out.push_str(&rest[..start]);
        let after = &rest[start + marker.len()..];
        let mut end = after.len();
        let mut chars = after.char_indices();
        while let Some((i, c)) = chars.next() {
            match c {
                '"' => {
                    end = i + 1;
                    break;
                }
                '\\' => match chars.next() {
                    Some((_, 'u')) => {
                        let hex: String = chars.by_ref().take(4).map(|(_, c)| c).collect();
                        let decoded = u32::from_str_radix(&hex, 16).ok().and_then(char::from_u32);
                        out.push(decoded.unwrap_or('\u{fffd}'));
                    }
                    Some((_, 'n')) => out.push('\n'),
                    Some((_, 't')) => out.push('\t'),
                    Some((_, escaped)) => out.push(escaped),
                    None => {}
                },
                c => out.push(c),
            }
        }
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// A TOML-only textual edit.
#[derive(Debug, Clone)]
pub enum TomlOp {
    /// Repeats one `key = value` line (TOML forbids duplicate keys).
    DuplicateLine { which: Index },
    /// Repeats a `[table]` header at the end (TOML forbids defining a table twice).
    DuplicateHeader { which: Index },
    /// Inserts a line: a stray or repeated table header, an array of tables, an inline table, a
    /// dotted key, a duration past `Duration::MAX`, a date, `nan`, an unterminated string.
    InsertLine { at: Index, line: String },
}

/// Lines that are valid TOML on their own but wrong (or dangerous) in a configuration.
pub const HOSTILE_LINES: &[&str] = &[
    "[raft]",
    "[[peers]]",
    "[workers]",
    "[tls]",
    "[restart_strategy]",
    "raft = 1",
    "raft.heartbeat_interval = \"1ms\"",
    "peers = [{ id = 1, addr = \"a:1\" }, { id = 1, addr = \"b:1\" }]",
    "x = { y = { z = [[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]] } }",
    "heartbeat_interval = \"18446744073709551615s\"",
    "heartbeat_interval = \"18446744073709551615s 999999999ns\"",
    "heartbeat_timeout = \"584542046090years\"",
    "election_timeout_max = \"584542046090years\"",
    "cancel_timeout = \"18446744073709551615s\"",
    "register_timeout = \"584542046090years\"",
    "slots = 4294967296",
    "node_id = -1",
    "snapshot_concurrency = 18446744073709551615",
    "type = \"fixed-delay\"",
    "coordinators = []",
    "date = 1979-05-27T07:32:00Z",
    "f = nan",
    "f = inf",
    "s = '''",
    "s = \"\"\"",
];

pub fn toml_op() -> impl Strategy<Value = TomlOp> {
    prop_oneof![
        any::<Index>().prop_map(|which| TomlOp::DuplicateLine { which }),
        any::<Index>().prop_map(|which| TomlOp::DuplicateHeader { which }),
        (any::<Index>(), prop::sample::select(HOSTILE_LINES))
            .prop_map(|(at, line)| TomlOp::InsertLine { at, line: line.to_owned() }),
    ]
}

/// Zero to three TOML edits.
pub fn toml_ops() -> impl Strategy<Value = Vec<TomlOp>> {
    prop::collection::vec(toml_op(), 0..4)
}

pub fn apply_toml_ops(text: &str, ops: &[TomlOp]) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    for op in ops {
        match op {
            TomlOp::DuplicateLine { which } => {
                let values: Vec<usize> = (0..lines.len()).filter(|i| lines[*i].contains(" = ")).collect();
                if !values.is_empty() {
                    let i = values[which.index(values.len())];
                    let copy = lines[i].clone();
                    lines.insert(i + 1, copy);
                }
            }
            TomlOp::DuplicateHeader { which } => {
                let headers: Vec<usize> = (0..lines.len()).filter(|i| lines[*i].starts_with('[')).collect();
                if !headers.is_empty() {
                    let copy = lines[headers[which.index(headers.len())]].clone();
                    lines.push(copy);
                }
            }
            TomlOp::InsertLine { at, line } => {
                let i = at.index(lines.len() + 1);
                lines.insert(i, line.clone());
            }
        }
    }
    let mut out = lines.join("\n");
    out.push('\n');
    out
}
