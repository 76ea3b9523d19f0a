//! Operator kinds as data: the names a job graph may use, which of them are sources or sinks,
//! and the schema of each kind's configuration.
//!
//! The coordinator validates a submitted graph against an [`OperatorCatalog`] without linking
//! any operator code; the task runtime registers one factory per catalogued kind and refuses a
//! factory for a kind the catalog does not describe. [`OperatorCatalog::builtin`] describes the
//! kinds every Cairn worker runs (the demo pipeline's).
//!
//! A configuration is a JSON object (or `null` for "all defaults"); unknown fields are refused,
//! required fields must be present, and every value is checked against its [`FieldType`], so a
//! bad configuration is refused at submission with the field named, not when a task starts.

use std::collections::BTreeMap;
use std::path::{Component, Path};

use serde::Serialize;

/// What part an operator plays in a graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KindRole {
    /// Produces records; only the head of a vertex without inputs.
    Source,
    /// Transforms records.
    Transform,
    /// Consumes records and writes them out (its side effects are committed on checkpoint
    /// completion).
    Sink,
}

/// The type of one configuration value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FieldType {
    /// An integer `>= 1`.
    PositiveInteger,
    /// A non-empty string.
    Text,
    /// `true` or `false`.
    Boolean,
    /// An absolute path without `.` or `..` components (operators write below it, so it must
    /// not depend on a worker's working directory nor climb out of where it points).
    AbsolutePath,
}

/// One field of a kind's configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConfigField {
    pub name: &'static str,
    pub ty: FieldType,
    pub required: bool,
    /// The value used when the field is absent (documentation only: the operator applies it).
    pub default: Option<&'static str>,
    pub doc: &'static str,
}

/// One operator kind a graph may name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OperatorKind {
    pub name: &'static str,
    pub role: KindRole,
    pub doc: &'static str,
    pub fields: Vec<ConfigField>,
}

impl OperatorKind {
    pub fn is_source(&self) -> bool {
        self.role == KindRole::Source
    }

    pub fn is_sink(&self) -> bool {
        self.role == KindRole::Sink
    }

    /// Checks a configuration against the kind's schema; the error names the field.
    pub fn check_config(&self, config: &serde_json::Value) -> Result<(), String> {
        let empty = serde_json::Map::new();
        let object = match config {
            serde_json::Value::Null => &empty,
            serde_json::Value::Object(o) => o,
            other => {
                return Err(format!("the configuration must be a JSON object, not {}", json_type(other)));
            }
        };
        for key in object.keys() {
            if !self.fields.iter().any(|f| f.name == key) {
                let known: Vec<&str> = self.fields.iter().map(|f| f.name).collect();
                return Err(if known.is_empty() {
                    format!("unknown field `{key}`: {} takes no configuration", self.name)
                } else {
                    format!("unknown field `{key}`; expected one of: {}", known.join(", "))
                });
            }
        }
        for field in &self.fields {
            match object.get(field.name) {
                None | Some(serde_json::Value::Null) if field.required => {
                    return Err(format!("missing field `{}` ({})", field.name, field.doc));
                }
                None | Some(serde_json::Value::Null) => {}
                Some(value) => check_value(field, value)?,
            }
        }
        Ok(())
    }
}

fn json_type(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

fn check_value(field: &ConfigField, value: &serde_json::Value) -> Result<(), String> {
    let name = field.name;
    match field.ty {
        FieldType::PositiveInteger => match value.as_u64() {
            Some(n) if n >= 1 => Ok(()),
            _ => Err(format!("`{name}` must be an integer of at least 1, not {value}")),
        },
        FieldType::Text => match value.as_str() {
            Some(s) if !s.is_empty() => Ok(()),
            _ => Err(format!("`{name}` must be a non-empty string, not {value}")),
        },
        FieldType::Boolean => match value {
            serde_json::Value::Bool(_) => Ok(()),
            _ => Err(format!("`{name}` must be true or false, not {value}")),
        },
        FieldType::AbsolutePath => {
            let Some(s) = value.as_str() else {
                return Err(format!("`{name}` must be a path string, not {}", json_type(value)));
            };
            check_absolute_path(s).map_err(|reason| format!("`{name}` {reason}"))
        }
    }
}

/// Checks a path that an operator or the coordinator writes below: it must be absolute and free
/// of `.` and `..` components. The error says what is wrong and how to fix it.
pub fn check_absolute_path(s: &str) -> Result<(), String> {
    if s.trim().is_empty() {
        return Err("must not be empty".into());
    }
    if s.contains('\0') {
        return Err("must not contain NUL bytes".into());
    }
    let path = Path::new(s);
    if !path.is_absolute() {
        return Err(format!("must be an absolute path (got {s:?}; write it as /full/path)"));
    }
    // `Path::components` drops interior `.`: look at the raw segments too.
    if s.split('/').any(|seg| seg == "." || seg == "..")
        || path.components().any(|c| matches!(c, Component::ParentDir | Component::CurDir))
    {
        return Err(format!("must not contain `.` or `..` components (got {s:?})"));
    }
    Ok(())
}

/// The first of `paths` (a configuration key and its path, if set) that climbs out with a `..`
/// component, with the reason; relative paths are allowed. For the replica's and the worker's
/// own configuration, which may be relative to their working directory.
pub fn first_climbing_path<'a>(paths: &[(&'a str, Option<&Path>)]) -> Option<(&'a str, String)> {
    paths.iter().find_map(|(key, path)| {
        path.filter(|p| p.components().any(|c| c == Component::ParentDir))
            .map(|p| (*key, format!("{} must not contain `..`: name the path itself", p.display())))
    })
}

/// The kinds a graph may name, by name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct OperatorCatalog {
    kinds: BTreeMap<&'static str, OperatorKind>,
}

/// Names of the built-in kinds.
pub mod builtin {
    /// Emits `(key, sequence number)` for each of `keys` keys, its offsets in list state.
    pub const SEQUENCE_SOURCE: &str = "sequence_source";
    /// Counts records per key in keyed state.
    pub const KEYED_COUNTER: &str = "keyed_counter";
    /// Writes records to a pending file per checkpoint and commits it on completion.
    pub const TWO_PHASE_FILE_SINK: &str = "two_phase_file_sink";
}

impl OperatorCatalog {
    pub fn empty() -> Self {
        Self::default()
    }

    /// The kinds every Cairn worker runs: the demo pipeline's source, counter and sink.
    pub fn builtin() -> Self {
        let mut c = Self::empty();
        c.add(OperatorKind {
            name: builtin::SEQUENCE_SOURCE,
            role: KindRole::Source,
            doc: "emits, for every key it owns, records with per-key sequence numbers 1, 2, 3, ...",
            fields: vec![
                ConfigField {
                    name: "keys",
                    ty: FieldType::PositiveInteger,
                    required: false,
                    default: Some("16"),
                    doc: "number of distinct keys",
                },
                ConfigField {
                    name: "records_per_key",
                    ty: FieldType::PositiveInteger,
                    required: false,
                    default: None,
                    doc: "records per key, after which the source finishes (absent: unbounded)",
                },
                ConfigField {
                    name: "idle_after_limit",
                    ty: FieldType::Boolean,
                    required: false,
                    default: Some("false"),
                    doc: "with records_per_key: stay running, idle, after the last record instead of finishing",
                },
                ConfigField {
                    name: "rate_per_sec",
                    ty: FieldType::PositiveInteger,
                    required: false,
                    default: None,
                    doc: "records per second per subtask (absent: as fast as downstream takes them)",
                },
                ConfigField {
                    name: "batch",
                    ty: FieldType::PositiveInteger,
                    required: false,
                    default: Some("64"),
                    doc: "records per poll, at most",
                },
            ],
        });
        c.add(OperatorKind {
            name: builtin::KEYED_COUNTER,
            role: KindRole::Transform,
            doc: "counts records per key (keyed value state) and emits (key, count, seq)",
            fields: vec![],
        });
        c.add(OperatorKind {
            name: builtin::TWO_PHASE_FILE_SINK,
            role: KindRole::Sink,
            doc: "writes records to a pending file per checkpoint, committed when the checkpoint completes",
            fields: vec![
                ConfigField {
                    name: "output_dir",
                    ty: FieldType::AbsolutePath,
                    required: true,
                    default: None,
                    doc: "directory of the pending/ and committed/ files",
                },
                ConfigField {
                    name: "max_records_per_sec",
                    ty: FieldType::PositiveInteger,
                    required: false,
                    default: None,
                    doc: "records per second per subtask, at most: a slow sink, to see backpressure (absent: no limit)",
                },
            ],
        });
        c
    }

    /// Adds (or replaces) a kind.
    pub fn add(&mut self, kind: OperatorKind) -> &mut Self {
        self.kinds.insert(kind.name, kind);
        self
    }

    pub fn get(&self, name: &str) -> Option<&OperatorKind> {
        self.kinds.get(name)
    }

    pub fn kinds(&self) -> impl Iterator<Item = &OperatorKind> {
        self.kinds.values()
    }

    /// `None` when the kind is unknown; otherwise whether it is a source.
    pub fn is_source_kind(&self, kind: &str) -> Option<bool> {
        self.get(kind).map(OperatorKind::is_source)
    }

    /// Checks a kind's configuration against its schema.
    pub fn check_config(&self, kind: &str, config: &serde_json::Value) -> Result<(), String> {
        match self.get(kind) {
            Some(k) => k.check_config(config),
            None => Err(format!("unknown kind {kind:?}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn builtin_kinds_and_roles() {
        let c = OperatorCatalog::builtin();
        assert_eq!(c.is_source_kind(builtin::SEQUENCE_SOURCE), Some(true));
        assert_eq!(c.is_source_kind(builtin::KEYED_COUNTER), Some(false));
        assert!(c.get(builtin::TWO_PHASE_FILE_SINK).is_some_and(OperatorKind::is_sink));
        assert_eq!(c.is_source_kind("nope"), None);
    }

    #[test]
    fn configs_are_checked_against_the_schema_naming_the_field() {
        let c = OperatorCatalog::builtin();
        assert!(c.check_config(builtin::SEQUENCE_SOURCE, &json!(null)).is_ok());
        assert!(c.check_config(builtin::SEQUENCE_SOURCE, &json!({"keys": 10, "batch": 3})).is_ok());
        let e = c.check_config(builtin::SEQUENCE_SOURCE, &json!({"keys": 0})).unwrap_err();
        assert!(e.contains("`keys`"), "{e}");
        let e = c.check_config(builtin::SEQUENCE_SOURCE, &json!({"key": 3})).unwrap_err();
        assert!(e.contains("unknown field `key`") && e.contains("keys"), "{e}");
        let e = c.check_config(builtin::KEYED_COUNTER, &json!({"x": 1})).unwrap_err();
        assert!(e.contains("takes no configuration"), "{e}");
        assert!(c.check_config(builtin::KEYED_COUNTER, &json!({})).is_ok());
        let e = c.check_config(builtin::TWO_PHASE_FILE_SINK, &json!({})).unwrap_err();
        assert!(e.contains("missing field `output_dir`"), "{e}");
        let e = c.check_config(builtin::SEQUENCE_SOURCE, &json!([1])).unwrap_err();
        assert!(e.contains("JSON object"), "{e}");
        let idle = |v: serde_json::Value| {
            c.check_config(builtin::SEQUENCE_SOURCE, &json!({ "idle_after_limit": v }))
        };
        assert!(idle(json!(true)).is_ok());
        let e = idle(json!("yes")).unwrap_err();
        assert!(e.contains("`idle_after_limit` must be true or false"), "{e}");
    }

    #[test]
    fn paths_must_be_absolute_without_dot_segments() {
        let c = OperatorCatalog::builtin();
        let sink = |d: &str| c.check_config(builtin::TWO_PHASE_FILE_SINK, &json!({ "output_dir": d }));
        assert!(sink("/data/out").is_ok());
        assert!(sink("../../escape").unwrap_err().contains("absolute"));
        assert!(sink("/data/../etc").unwrap_err().contains(".."));
        assert!(sink("/data/./x").unwrap_err().contains(".."));
        assert!(sink("relative/out").unwrap_err().contains("absolute"));
        assert!(sink("").unwrap_err().contains("empty"));
        let e = c.check_config(builtin::TWO_PHASE_FILE_SINK, &json!({ "output_dir": 3 })).unwrap_err();
        assert!(e.contains("path string"), "{e}");
    }
}
