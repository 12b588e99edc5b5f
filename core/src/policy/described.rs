//! A built-in policy together with the name and parameters it was built from, so that a
//! host that never saw the object can build the same policy (subservers on other hosts
//! run the routing of their own rows).

use std::sync::Arc;

use serde_json::Value;

use super::Decision;
use super::{EntryRequest, ModelIndex, Policy, PolicyState, RouteRow};

/// How to build a policy again: `policy::build(name, params, ...)`.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyDescriptor {
    pub name: String,
    pub params: Value,
}

/// Delegates everything to the built policy; only adds its descriptor.
pub(crate) struct Described {
    inner: Arc<dyn Policy>,
    descriptor: PolicyDescriptor,
}

impl Described {
    pub fn wrap(inner: Arc<dyn Policy>, name: &str, params: &Value) -> Arc<dyn Policy> {
        Arc::new(Described { inner, descriptor: PolicyDescriptor { name: name.to_string(), params: params.clone() } })
    }
}

impl Policy for Described {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn new_state(&self, seed: u64) -> PolicyState {
        self.inner.new_state(seed)
    }

    fn entry_model(&self, request: &mut EntryRequest<'_>) -> ModelIndex {
        self.inner.entry_model(request)
    }

    fn stays_on_entry_model(&self) -> bool {
        self.inner.stays_on_entry_model()
    }

    fn needs_hidden(&self, model: ModelIndex) -> bool {
        self.inner.needs_hidden(model)
    }

    fn reserved_logit(&self, model: ModelIndex) -> Option<usize> {
        self.inner.reserved_logit(model)
    }

    fn route(&self, rows: &mut [RouteRow<'_>]) -> Vec<Decision> {
        self.inner.route(rows)
    }

    fn descriptor(&self) -> Option<PolicyDescriptor> {
        Some(self.descriptor.clone())
    }
}
