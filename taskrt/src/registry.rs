//! Operator kinds: the map from a graph's `kind` strings to factories.
//!
//! [`OperatorRegistry::with_builtins`] knows the demo pipeline's kinds; tests and embedders add
//! their own with [`OperatorRegistry::register`]. The registry is the [`KindCatalog`] used by
//! graph validation, so a graph naming an unknown kind or carrying a bad config is rejected
//! before anything is deployed.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use crate::graph::KindCatalog;
use crate::operator::{Operator, TaskInfo};

/// Builds operators of one kind. `create` must be free of side effects (validation calls it).
pub trait OperatorFactory: Send + Sync {
    fn is_source(&self) -> bool;
    fn create(&self, config: &serde_json::Value, info: &TaskInfo) -> Result<Box<dyn Operator>, String>;
}

/// A factory from a closure.
pub struct FnFactory<F> {
    source: bool,
    f: F,
}

impl<F> FnFactory<F>
where
    F: Fn(&serde_json::Value, &TaskInfo) -> Result<Box<dyn Operator>, String> + Send + Sync,
{
    pub fn new(source: bool, f: F) -> Self {
        Self { source, f }
    }
}

impl<F> OperatorFactory for FnFactory<F>
where
    F: Fn(&serde_json::Value, &TaskInfo) -> Result<Box<dyn Operator>, String> + Send + Sync,
{
    fn is_source(&self) -> bool {
        self.source
    }
    fn create(&self, config: &serde_json::Value, info: &TaskInfo) -> Result<Box<dyn Operator>, String> {
        (self.f)(config, info)
    }
}

#[derive(Clone, Default)]
pub struct OperatorRegistry {
    factories: BTreeMap<String, Arc<dyn OperatorFactory>>,
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

    /// The demo pipeline's kinds: `sequence_source`, `keyed_counter`, `two_phase_file_sink`.
    pub fn with_builtins() -> Self {
        let mut r = Self::empty();
        crate::demo::register(&mut r);
        r
    }

    pub fn register(&mut self, kind: &str, factory: Arc<dyn OperatorFactory>) -> &mut Self {
        self.factories.insert(kind.to_owned(), factory);
        self
    }

    pub fn get(&self, kind: &str) -> Option<&Arc<dyn OperatorFactory>> {
        self.factories.get(kind)
    }
}

fn probe_info() -> TaskInfo {
    TaskInfo {
        job: "validation".into(),
        vertex: "validation".into(),
        subtask: 0,
        parallelism: 1,
        max_parallelism: 1,
        attempt: 0,
    }
}

impl KindCatalog for OperatorRegistry {
    fn is_source_kind(&self, kind: &str) -> Option<bool> {
        self.factories.get(kind).map(|f| f.is_source())
    }

    fn check_config(&self, kind: &str, config: &serde_json::Value) -> Result<(), String> {
        match self.factories.get(kind) {
            Some(f) => f.create(config, &probe_info()).map(|_| ()),
            None => Err(format!("unknown kind {kind:?}")),
        }
    }
}
