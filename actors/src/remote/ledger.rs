//! What the front knows of the requests a remote node holds, so that a lost node costs
//! no request: each one resumes on a replacement from the sequence the node had (or
//! ends with a clear error). Plain data, driven by the link actor and by tests.
//!
//! Per request the ledger mirrors the node's copy of the sequence: the tokens sent to
//! it, plus the tokens it committed (seen as events on their way to the request
//! actor). A request is *on the node* from the arrival sent until the node hands it
//! back; only those need resuming. A node that never saw a request (a replacement)
//! gets it from position 0 with its spec, whatever the arrival's own start.

use std::collections::HashMap;
use std::sync::Arc;

use tokenrouter_core::sched::{Arrival, DraftLeg, RequestEvent, RequestId, RequestSpec, Travel};

use super::wire::{WireArrival, WireSpec};

struct Held {
    spec: Arc<RequestSpec>,
    /// The node's copy of the sequence (prompt and output).
    tokens: Vec<u32>,
    output_len: usize,
    travel: Travel,
    /// Ready (or running) on the node: sent there and not handed back.
    on_node: bool,
    /// The node in this session has the spec and a prefix of `tokens`.
    known: bool,
    /// The leg of draft-model speculation it is on, sent again if it must be resent.
    draft: Option<DraftLeg>,
}

#[derive(Default)]
pub(crate) struct FrontLedger {
    held: HashMap<RequestId, Held>,
}

impl FrontLedger {
    /// Records an arrival leaving for the node and returns what to send.
    pub fn outgoing(&mut self, arrival: Arrival) -> Result<WireArrival, String> {
        let id = arrival.spec.id;
        let spec = wire_spec(&arrival.spec)?;
        let held = self.held.entry(id).or_insert_with(|| Held {
            spec: arrival.spec.clone(),
            tokens: Vec::new(),
            output_len: 0,
            travel: arrival.travel.clone(),
            on_node: false,
            known: false,
            draft: None,
        });
        if arrival.start > held.tokens.len() {
            return Err(format!("request {id}: the front lost track of its tokens before position {}", arrival.start));
        }
        held.tokens.truncate(arrival.start);
        held.tokens.extend_from_slice(&arrival.suffix);
        held.output_len = arrival.output_len;
        held.travel = arrival.travel;
        held.on_node = true;
        held.draft = arrival.draft.clone();
        let first_visit = !std::mem::replace(&mut held.known, true);
        Ok(match first_visit {
            true => full_arrival(id, held, spec, arrival.draft),
            false => WireArrival {
                id,
                spec: None,
                start: arrival.start,
                suffix: arrival.suffix,
                output_len: held.output_len,
                policy_state: held.travel.policy_state.clone(),
                seen: held.travel.seen.clone(),
                draft: arrival.draft,
            },
        })
    }

    /// An event the node sent about one of its requests.
    pub fn event(&mut self, event: &RequestEvent) {
        match event {
            RequestEvent::Token { id, index, token, .. } => {
                if let Some(h) = self.held.get_mut(id).filter(|h| h.output_len == *index) {
                    h.tokens.push(*token);
                    h.output_len += 1;
                }
            }
            RequestEvent::Finished { id, .. }
            | RequestEvent::Failed { id, .. }
            | RequestEvent::OutOfService { id, .. } => {
                if let Some(h) = self.held.get_mut(id) {
                    h.on_node = false;
                }
            }
            // The node lost it: the request's owner sends it again from position 0.
            RequestEvent::Resume { id, .. } => {
                if let Some(h) = self.held.get_mut(id) {
                    h.on_node = false;
                }
            }
            RequestEvent::Moved { .. } | RequestEvent::CachedPrefix { .. } | RequestEvent::Verified { .. } => {}
        }
    }

    /// The node handed a request back for model `to`: the arrival to deliver there.
    pub fn handed_back(&mut self, w: WireArrival) -> Result<Arrival, String> {
        let held = self.held.get_mut(&w.id).ok_or_else(|| format!("request {} is unknown to the front", w.id))?;
        held.on_node = false;
        let travel = Travel { policy_state: w.policy_state, seen: w.seen };
        held.travel = travel.clone();
        Ok(Arrival {
            spec: held.spec.clone(),
            suffix: w.suffix,
            start: w.start,
            output_len: w.output_len,
            travel,
            draft: w.draft,
        })
    }

    pub fn release(&mut self, id: RequestId) {
        self.held.remove(&id);
    }

    /// The node is gone: nothing it held is known anywhere now. Returns the requests
    /// that were on it (to resume or fail), oldest id first.
    pub fn node_lost(&mut self) -> Vec<RequestId> {
        let mut stranded: Vec<RequestId> = Vec::new();
        for (id, h) in &mut self.held {
            h.known = false;
            if h.on_node {
                stranded.push(*id);
            }
        }
        stranded.sort_unstable();
        stranded
    }

    /// Requests on the node (sent there while it was down, or stranded by its loss).
    pub fn on_node(&self) -> Vec<RequestId> {
        let mut ids: Vec<RequestId> = self.held.iter().filter(|(_, h)| h.on_node).map(|(id, _)| *id).collect();
        ids.sort_unstable();
        ids
    }

    /// The whole request, from position 0, for a node that never saw it.
    pub fn resume(&mut self, id: RequestId) -> Result<WireArrival, String> {
        let held = self.held.get_mut(&id).ok_or_else(|| format!("request {id} is unknown to the front"))?;
        let spec = wire_spec(&held.spec)?;
        held.known = true;
        Ok(full_arrival(id, held, spec, held.draft.clone()))
    }

    /// Forgets a request that will not run on this node (it ends with an error).
    pub fn drop_request(&mut self, id: RequestId) {
        self.held.remove(&id);
    }
}

fn full_arrival(id: RequestId, held: &Held, spec: WireSpec, draft: Option<DraftLeg>) -> WireArrival {
    WireArrival {
        id,
        spec: Some(spec),
        start: 0,
        suffix: held.tokens.clone(),
        output_len: held.output_len,
        policy_state: held.travel.policy_state.clone(),
        seen: held.travel.seen.clone(),
        draft,
    }
}

/// The spec as it crosses hosts; the policy must be one `policy::build` made.
pub(crate) fn wire_spec(spec: &RequestSpec) -> Result<WireSpec, String> {
    if spec.constraint.is_some() {
        return Err(
            "structured outputs (response_format) run only on models in this process, not on another host".into()
        );
    }
    let policy = spec.policy.descriptor().ok_or_else(|| {
        format!(
            "policy `{}` was made in code, not by name and parameters, so it cannot run on another host",
            spec.policy.name()
        )
    })?;
    Ok(WireSpec {
        prompt_len: spec.prompt.len(),
        max_tokens: spec.max_tokens,
        sampling: spec.sampling.clone(),
        stop_ids: spec.stop_ids.clone(),
        policy,
        speculation: spec.speculation.clone(),
    })
}

#[cfg(test)]
#[path = "ledger_tests.rs"]
mod tests;
