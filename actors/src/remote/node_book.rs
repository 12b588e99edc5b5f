//! The node's side of the bookkeeping: the specs of the requests it has seen (a spec
//! crosses once, on a request's first visit) and the policies rebuilt from their
//! descriptors (cached, so rows of one policy still batch into one `route` call).

use std::collections::HashMap;
use std::sync::Arc;

use tokenrouter_core::policy::{self, ModelInfo, Policy, PolicyContext, PolicyDescriptor};
use tokenrouter_core::sched::{Arrival, RequestId, RequestSpec, Travel};

use super::wire::{WireArrival, WireSpec};

pub(crate) struct NodeBook {
    specs: HashMap<RequestId, Arc<RequestSpec>>,
    policies: HashMap<String, Arc<dyn Policy>>,
    models: Vec<ModelInfo>,
    ctx: PolicyContext,
}

impl NodeBook {
    pub fn new(models: Vec<ModelInfo>, ctx: PolicyContext) -> Self {
        NodeBook { specs: HashMap::new(), policies: HashMap::new(), models, ctx }
    }

    /// A request arriving from the front, as the local subserver takes it.
    pub fn incoming(&mut self, w: WireArrival) -> Result<Arrival, String> {
        let spec = match w.spec {
            Some(spec) => {
                let built = Arc::new(self.spec(w.id, &w.suffix, spec)?);
                self.specs.insert(w.id, built.clone());
                built
            }
            None => self.specs.get(&w.id).cloned().ok_or_else(|| {
                format!("request {} continues on a node that never saw it (the node restarted?)", w.id)
            })?,
        };
        let travel = Travel { policy_state: w.policy_state, seen: w.seen };
        Ok(Arrival { spec, suffix: w.suffix, start: w.start, output_len: w.output_len, travel, draft: w.draft })
    }

    /// A request leaving the node's model: everything but the spec, which the front has.
    pub fn outgoing(arrival: Arrival) -> WireArrival {
        WireArrival {
            id: arrival.spec.id,
            spec: None,
            start: arrival.start,
            suffix: arrival.suffix,
            output_len: arrival.output_len,
            policy_state: arrival.travel.policy_state,
            seen: arrival.travel.seen,
            draft: arrival.draft,
        }
    }

    pub fn release(&mut self, id: RequestId) {
        self.specs.remove(&id);
    }

    #[cfg(test)]
    pub fn known(&self) -> usize {
        self.specs.len()
    }

    /// Forgets every request (their front left) and returns their ids.
    pub fn take_all(&mut self) -> Vec<RequestId> {
        self.specs.drain().map(|(id, _)| id).collect()
    }

    fn spec(&mut self, id: RequestId, suffix: &[u32], w: WireSpec) -> Result<RequestSpec, String> {
        if w.prompt_len > suffix.len() {
            return Err(format!("request {id}: a first visit must carry the whole prompt"));
        }
        Ok(RequestSpec {
            id,
            prompt: suffix[..w.prompt_len].to_vec(),
            max_tokens: w.max_tokens,
            sampling: w.sampling,
            stop_ids: w.stop_ids,
            policy: self.policy(&w.policy)?,
            constraint: None,
            speculation: w.speculation,
        })
    }

    fn policy(&mut self, d: &PolicyDescriptor) -> Result<Arc<dyn Policy>, String> {
        let key = format!("{}\u{0}{}", d.name, d.params);
        if let Some(found) = self.policies.get(&key) {
            return Ok(found.clone());
        }
        let built = policy::build(&d.name, &d.params, &self.models, &self.ctx)
            .map_err(|e| format!("policy `{}` cannot be built on this node: {e}", d.name))?;
        self.policies.insert(key, built.clone());
        Ok(built)
    }
}
