//! The demo pipeline that proves exactly-once end to end:
//!
//! ```text
//! sequence_source ──hash──▶ keyed_counter ──forward──▶ two_phase_file_sink
//! (key, seq per key)        (count per key)            (pending per checkpoint, committed on notify)
//! ```
//!
//! The source emits, for every key it owns, records with per-key sequence numbers 1, 2, 3, …;
//! its offsets are operator list state. The counter keeps a count per key in keyed value state
//! and emits `(key, count, seq)`. The sink writes what arrived before a barrier to a pending file
//! in the barrier's synchronous snapshot, and renames it into `committed/` only when the
//! checkpoint is notified complete. So, with exactly-once processing, every committed line has
//! `count == seq`, and per key the counts are exactly `1..=n` ([`verify`]).

pub mod counter;
pub mod sink;
pub mod source;
pub mod verify;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use cairn_protocol::checkpoint::CheckpointMetadata;

use cairn_protocol::graph::{Edge, JobGraph, OperatorSpec, Partitioning, Vertex};
use cairn_protocol::operators::{OperatorCatalog, OperatorKind};

use crate::operator::{FnFactory, OperatorFactory};
use crate::state::StateError;
use crate::state::storage::read_verified;

pub use cairn_protocol::operators::builtin::{
    KEYED_COUNTER as COUNTER_KIND, SEQUENCE_SOURCE as SOURCE_KIND, TWO_PHASE_FILE_SINK as SINK_KIND,
};

/// The demo kinds: the built-in catalog's, each with its factory.
pub fn factories() -> Vec<(OperatorKind, Arc<dyn OperatorFactory>)> {
    let catalog = OperatorCatalog::builtin();
    let kind = |name: &str| catalog.get(name).cloned();
    let (Some(source), Some(counter), Some(sink)) = (kind(SOURCE_KIND), kind(COUNTER_KIND), kind(SINK_KIND))
    else {
        // The built-in catalog names these kinds (tested): nothing to offer without them.
        return Vec::new();
    };
    vec![
        (
            source,
            Arc::new(FnFactory::new(|config, info| {
                Ok(Box::new(source::SequenceSource::new(source::SourceConfig::parse(config)?, info)) as _)
            })),
        ),
        (
            counter,
            Arc::new(FnFactory::new(|config, _info| {
                if !config.is_null() && config.as_object().is_none_or(|o| !o.is_empty()) {
                    return Err("keyed_counter takes no configuration".into());
                }
                Ok(Box::new(counter::KeyedCounter) as _)
            })),
        ),
        (
            sink,
            Arc::new(FnFactory::new(|config, info| {
                Ok(Box::new(sink::TwoPhaseFileSink::new(sink::SinkConfig::parse(config)?, info)) as _)
            })),
        ),
    ]
}

/// Shape of the demo job.
#[derive(Debug, Clone, PartialEq)]
pub struct DemoJob {
    pub source: source::SourceConfig,
    pub output_dir: String,
    pub source_parallelism: u32,
    /// Parallelism of the counter and the sink (forward-connected).
    pub parallelism: u32,
    pub max_parallelism: u32,
}

impl DemoJob {
    pub fn graph(&self) -> JobGraph {
        let vertex = |id: &str, p: u32, kind: &str, config: serde_json::Value| Vertex {
            id: id.into(),
            name: id.into(),
            parallelism: p,
            max_parallelism: self.max_parallelism,
            operator: OperatorSpec { kind: kind.into(), config },
            chain: vec![],
        };
        JobGraph {
            vertices: vec![
                vertex("source", self.source_parallelism, SOURCE_KIND, self.source.to_json()),
                vertex("count", self.parallelism, COUNTER_KIND, serde_json::Value::Null),
                vertex(
                    "sink",
                    self.parallelism,
                    SINK_KIND,
                    serde_json::json!({ "output_dir": self.output_dir }),
                ),
            ],
            edges: vec![
                Edge { from: "source".into(), to: "count".into(), partitioning: Partitioning::Hash },
                Edge { from: "count".into(), to: "sink".into(), partitioning: Partitioning::Forward },
            ],
        }
    }
}

/// The source offsets (`key → records emitted`) recorded in a completed checkpoint, read and
/// verified from its list-state files. Used to check the sink output against the source.
pub fn source_offsets(
    meta: &CheckpointMetadata,
    base_dir: &Path,
    source_vertex: &str,
) -> Result<BTreeMap<u64, u64>, StateError> {
    let mut offsets = BTreeMap::new();
    for (key, st) in &meta.subtasks {
        if !key.starts_with(&format!("{source_vertex}/")) {
            continue;
        }
        let Some(op) = st.operators.get(source_vertex) else { continue };
        for list in op.list_states.iter().filter(|l| l.name == source::OFFSETS_STATE) {
            let bytes = read_verified(base_dir, &list.file)?;
            for (j, start) in list.offsets.iter().enumerate() {
                let end = list.offsets.get(j + 1).copied().unwrap_or(list.file.size);
                let element = bytes.get(*start as usize..end as usize).ok_or_else(|| {
                    StateError::ElementOutOfBounds {
                        path: base_dir.join(&list.file.path),
                        start: *start,
                        end,
                        len: bytes.len() as u64,
                    }
                })?;
                let (k, n) = source::decode_offset(element)
                    .map_err(|reason| StateError::Corrupt { path: base_dir.join(&list.file.path), reason })?;
                offsets.insert(k, n);
            }
        }
    }
    Ok(offsets)
}
