//! Operator factories: the code behind the operator kinds a graph may name.
//!
//! The kinds themselves (names, roles, configuration schemas) are data in the contract crate's
//! [`OperatorCatalog`]; the registry pairs each catalogued kind with a factory. A factory is
//! registered together with its [`OperatorKind`], so the catalog a worker validates deployments
//! against is always the one its factories implement. [`OperatorRegistry::with_builtins`] has the
//! built-in kinds ([`OperatorCatalog::builtin`]); tests and embedders add their own with
//! [`OperatorRegistry::register`].

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use cairn_protocol::operators::{OperatorCatalog, OperatorKind};

use crate::operator::OperatorFactory;

/// The kinds this process can run: a catalog and one factory per catalogued kind.
#[derive(Clone, Default)]
pub struct OperatorRegistry {
    catalog: OperatorCatalog,
    factories: BTreeMap<&'static str, Arc<dyn OperatorFactory>>,
}

impl fmt::Debug for OperatorRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.factories.keys()).finish()
    }
}

impl OperatorRegistry {
    pub fn empty() -> Self {
        Self::default()
    }

    /// The built-in kinds ([`OperatorCatalog::builtin`]) with their factories.
    pub fn with_builtins() -> Self {
        let mut r = Self::empty();
        for (kind, factory) in crate::demo::factories() {
            r.register(kind, factory);
        }
        r
    }

    /// Adds a kind and the factory that implements it.
    pub fn register(&mut self, kind: OperatorKind, factory: Arc<dyn OperatorFactory>) -> &mut Self {
        self.factories.insert(kind.name, factory);
        self.catalog.add(kind);
        self
    }

    /// The kinds this registry runs, for graph validation.
    pub fn catalog(&self) -> &OperatorCatalog {
        &self.catalog
    }

    pub fn get(&self, kind: &str) -> Option<&Arc<dyn OperatorFactory>> {
        self.factories.get(kind)
    }
}

#[cfg(test)]
mod tests {
    use cairn_protocol::graph::{JobGraph, is_valid_id};

    use super::*;
    use crate::demo::DemoJob;
    use crate::operator::TaskInfo;

    #[test]
    fn builtins_implement_exactly_the_builtin_catalog() {
        let r = OperatorRegistry::with_builtins();
        assert_eq!(r.catalog(), &OperatorCatalog::builtin());
        for kind in OperatorCatalog::builtin().kinds() {
            assert!(r.get(kind.name).is_some(), "no factory for {}", kind.name);
        }
    }

    #[test]
    fn schema_and_factories_agree_on_configs() {
        let r = OperatorRegistry::with_builtins();
        let info = TaskInfo {
            job: "j".into(),
            vertex: "v".into(),
            subtask: 0,
            parallelism: 1,
            max_parallelism: 1,
            attempt: 0,
        };
        let samples: Vec<(&str, serde_json::Value)> = vec![
            ("sequence_source", serde_json::json!(null)),
            ("sequence_source", serde_json::json!({"keys": 3, "records_per_key": 10})),
            ("sequence_source", serde_json::json!({"keys": 0})),
            ("sequence_source", serde_json::json!({"rate_per_sec": 0})),
            ("sequence_source", serde_json::json!({"nope": 1})),
            ("keyed_counter", serde_json::json!(null)),
            ("keyed_counter", serde_json::json!({})),
            ("keyed_counter", serde_json::json!({"a": 1})),
            ("two_phase_file_sink", serde_json::json!({"output_dir": "/tmp/cairn-out"})),
            ("two_phase_file_sink", serde_json::json!({})),
            ("two_phase_file_sink", serde_json::json!({"output_dir": ""})),
            ("two_phase_file_sink", serde_json::json!({"output_dir": "../../escape"})),
            ("two_phase_file_sink", serde_json::json!({"output_dir": "/tmp/../etc"})),
        ];
        for (kind, config) in samples {
            let by_schema = r.catalog().check_config(kind, &config).is_ok();
            let by_factory = r.get(kind).map(|f| f.create(&config, &info).is_ok());
            assert_eq!(Some(by_schema), by_factory, "{kind} {config}");
        }
        // The demo graph validates against the catalog.
        let g: JobGraph = DemoJob {
            source: Default::default(),
            output_dir: "/tmp/cairn-out".into(),
            source_parallelism: 1,
            parallelism: 2,
            max_parallelism: 8,
        }
        .graph();
        g.validate(r.catalog()).unwrap();
        assert!(g.vertices.iter().all(|v| is_valid_id(&v.id)));
    }
}
