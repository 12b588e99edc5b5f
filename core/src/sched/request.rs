//! What a request is to the scheduler, and the messages that move it between models.

use std::sync::Arc;

use serde::Serialize;

use crate::constrain::{Next, TokenConstraint, TokenMask};
use crate::model::sampler::SamplingParams;
use crate::policy::{ModelIndex, Policy, PolicyState};
use crate::spec::{DraftSource, Speculation, SpeculationMethod};

pub type RequestId = u64;

/// The parts of a request that never change; shared by every model it visits.
#[derive(Clone)]
pub struct RequestSpec {
    pub id: RequestId,
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Token ids that end the request (EOS and user stop ids); empty to ignore them.
    pub stop_ids: Vec<u32>,
    pub policy: Arc<dyn Policy>,
    /// Structured output: the grammar the output must match, and its parse state.
    pub constraint: Option<Arc<TokenConstraint>>,
    /// Speculative decoding: where drafts come from; `None` decodes one token a step.
    pub speculation: Option<Speculation>,
}

impl std::fmt::Debug for RequestSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestSpec")
            .field("id", &self.id)
            .field("prompt_len", &self.prompt.len())
            .field("max_tokens", &self.max_tokens)
            .field("policy", &self.policy.name())
            .field("constrained", &self.constraint.is_some())
            .field("speculation", &self.speculation.as_ref().map(|s| (s.method, s.max_tokens, s.prediction.len())))
            .finish()
    }
}

/// What travels with a request when it moves: its routing state and, per model, how
/// many tokens of its sequence that model has seen.
#[derive(Debug, Clone, PartialEq)]
pub struct Travel {
    pub policy_state: PolicyState,
    /// Per model: length of the sequence prefix that model holds (0 = never visited).
    pub seen: Vec<usize>,
}

/// A request arriving at a subserver: new (from admission) or moving in from a peer.
/// Only the part of the sequence the receiver has not seen crosses.
#[derive(Debug, Clone)]
pub struct Arrival {
    pub spec: Arc<RequestSpec>,
    /// Tokens from position `start` of the full sequence (prompt + committed output).
    pub suffix: Vec<u32>,
    pub start: usize,
    pub output_len: usize,
    pub travel: Travel,
    /// Set on the legs of speculative decoding with a draft model.
    pub draft: Option<DraftLeg>,
}

/// A request's trip for speculative decoding with a draft model: to the draft model
/// and back, its committed tokens unchanged; the request stays pending on its target.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub enum DraftLeg {
    /// To the draft model: sample up to `tokens` tokens after the committed ones, then
    /// return to `target` with them.
    Ask { target: ModelIndex, tokens: usize },
    /// Back to the target: what the draft model sampled, for the target to verify.
    Answer { tokens: Vec<u32> },
}

impl Arrival {
    pub fn sequence_len(&self) -> usize {
        self.start + self.suffix.len()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// A stop token was produced.
    Stop,
    /// max_tokens or the context limit was reached.
    Length,
}

/// What a step tells the world about one request.
#[derive(Debug, Clone, PartialEq)]
pub enum RequestEvent {
    /// A token was committed at output index `index`, produced by `model`.
    Token {
        id: RequestId,
        index: usize,
        token: u32,
        model: ModelIndex,
        logprob: Option<f32>,
        top_logprobs: Vec<(u32, f32)>,
    },
    /// The request left `from` for `to` (after any committed token above).
    Moved {
        id: RequestId,
        from: ModelIndex,
        to: ModelIndex,
    },
    Finished {
        id: RequestId,
        reason: FinishReason,
    },
    /// The request cannot go on (e.g. its context alone exceeds this model's KV).
    Failed {
        id: RequestId,
        message: String,
    },
    /// The model the request needs is out of service: the request cannot go on now,
    /// but the same request may succeed later (a client should retry, not give up).
    OutOfService {
        id: RequestId,
        message: String,
    },
    /// `model` verified a draft of `drafted` tokens and kept the first `accepted`: the
    /// committed tokens from output index `first_index` on, as many as accepted, came
    /// from the draft. Sent before those tokens.
    Verified {
        id: RequestId,
        model: ModelIndex,
        first_index: usize,
        drafted: usize,
        accepted: usize,
        source: DraftSource,
    },
    /// `model` reused `tokens` positions of the request's K/V from its prefix cache.
    CachedPrefix {
        id: RequestId,
        model: ModelIndex,
        tokens: usize,
    },
    /// `model` lost the request in a panic and restarted: rebuild it there from the
    /// committed tokens (all `output_len` of them) with this travel state.
    Resume {
        id: RequestId,
        model: ModelIndex,
        output_len: usize,
        travel: Travel,
    },
}

impl RequestEvent {
    pub fn request_id(&self) -> RequestId {
        match self {
            RequestEvent::Token { id, .. }
            | RequestEvent::Moved { id, .. }
            | RequestEvent::Finished { id, .. }
            | RequestEvent::Failed { id, .. }
            | RequestEvent::OutOfService { id, .. }
            | RequestEvent::Resume { id, .. }
            | RequestEvent::Verified { id, .. }
            | RequestEvent::CachedPrefix { id, .. } => *id,
        }
    }
}

impl RequestSpec {
    /// The seed of the request's policy draws: fixed by its sampling seed, so a seeded
    /// request routes the same way every time.
    pub fn policy_seed(&self) -> u64 {
        policy_seed(self.sampling.seed)
    }
}

/// The policy seed of a request with this sampling seed; external dispatchers use it
/// to route a request exactly as the engine would.
pub fn policy_seed(sampling_seed: u64) -> u64 {
    sampling_seed.wrapping_mul(0xA24B_AED4_963E_E407) ^ 0x5851_F42D_4C95_7F2D
}

/// What a request looked like when work on it began (a step, or a message), so that
/// a panic in that work can be undone by rebuilding the request from its committed
/// tokens, which the request's owner holds.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    pub spec: Arc<RequestSpec>,
    pub output_len: usize,
    pub travel: Travel,
    /// The model the request was drafting for, where it resumes (a draft model only
    /// drafts; the request's own tokens come from its target).
    pub drafting_for: Option<ModelIndex>,
}

impl Checkpoint {
    pub fn of_arrival(arrival: &Arrival) -> Self {
        let drafting_for = match arrival.draft {
            Some(DraftLeg::Ask { target, .. }) => Some(target),
            _ => None,
        };
        Checkpoint {
            spec: arrival.spec.clone(),
            output_len: arrival.output_len,
            travel: arrival.travel.clone(),
            drafting_for,
        }
    }

    /// Where a request lost on `lost_on` resumes, and its travel state there: `lost_on`
    /// holds nothing of it now.
    pub fn resume_at(mut self, lost_on: ModelIndex) -> (ModelIndex, Travel) {
        if let Some(seen) = self.travel.seen.get_mut(lost_on) {
            *seen = 0;
        }
        (self.drafting_for.unwrap_or(lost_on), self.travel)
    }

    /// The event that asks the request's owner to resume it (lost on `lost_on`).
    pub fn resume_event(self, lost_on: ModelIndex) -> RequestEvent {
        let (id, output_len) = (self.spec.id, self.output_len);
        let (model, travel) = self.resume_at(lost_on);
        RequestEvent::Resume { id, model, output_len, travel }
    }
}

/// The whole request from position 0, for a model that holds nothing of it: the
/// prompt and the committed output, with the travel state it had.
pub fn rebuild(spec: Arc<RequestSpec>, output: &[u32], mut travel: Travel, model: ModelIndex) -> Arrival {
    let mut suffix = spec.prompt.clone();
    suffix.extend_from_slice(output);
    if let Some(seen) = travel.seen.get_mut(model) {
        *seen = 0;
    }
    Arrival { spec, suffix, start: 0, output_len: output.len(), travel, draft: None }
}

/// A new request's entry model (the policy's choice) and its first arrival there.
pub fn admit(spec: Arc<RequestSpec>, num_models: usize) -> (ModelIndex, Arrival) {
    let mut policy_state = spec.policy.new_state(spec.policy_seed());
    let entry = spec.policy.entry_model(&mut crate::policy::EntryRequest {
        request_id: spec.id,
        prompt: &spec.prompt,
        max_tokens: spec.max_tokens,
        state: &mut policy_state,
    });
    let entry = entry.min(num_models.saturating_sub(1));
    let arrival = Arrival {
        suffix: spec.prompt.clone(),
        start: 0,
        output_len: 0,
        travel: Travel { policy_state, seen: vec![0; num_models] },
        spec,
        draft: None,
    };
    (entry, arrival)
}

/// The only model a request can visit, when its policy never moves it (see
/// [`Policy::stays_on_entry_model`](crate::policy::Policy::stays_on_entry_model)):
/// admission then reserves KV there alone.
pub fn only_model(spec: &Arc<RequestSpec>, num_models: usize) -> Option<ModelIndex> {
    let drafts_elsewhere = spec.speculation.as_ref().is_some_and(|s| s.method == Some(SpeculationMethod::Draft));
    if drafts_elsewhere && num_models > 1 {
        return None;
    }
    spec.policy.stays_on_entry_model().then(|| admit(spec.clone(), num_models).0)
}

/// The model that drafts for `target` with method `draft`: the engine's first (its
/// smallest), unless that is the target itself.
pub fn draft_model(target: ModelIndex) -> Option<ModelIndex> {
    (target > 0).then_some(0)
}

/// The logits the sampler draws from: the raw ones, unless a policy reserves a logit
/// that is not a token (Co-LLM's defer slot, never drawn), the request biases tokens
/// (`logit_bias`) or a grammar allows only some (`mask`).
pub fn sampling_logits<'a>(
    logits: &'a [f32],
    reserved: Option<usize>,
    sampling: &SamplingParams,
    mask: Option<&TokenMask>,
    scratch: &'a mut Vec<f32>,
) -> &'a [f32] {
    let reserved = reserved.filter(|&i| i < logits.len());
    if reserved.is_none() && sampling.logit_bias.is_empty() && mask.is_none() {
        return logits;
    }
    scratch.clear();
    scratch.extend_from_slice(logits);
    for &(token, bias) in &sampling.logit_bias {
        if let Some(x) = scratch.get_mut(token as usize) {
            *x += bias;
        }
    }
    if let Some(mask) = mask {
        mask.apply(scratch);
    }
    if let Some(i) = reserved {
        scratch[i] = f32::NEG_INFINITY;
    }
    scratch
}

/// Where a constrained request stands before sampling on one model.
pub enum Constrained {
    /// Unconstrained, or the grammar allows these tokens.
    Sample(Option<TokenMask>),
    /// The grammar is complete: the request ends here.
    Complete,
    Failed(String),
}

/// The grammar's verdict after `output` (the request's committed output).
pub fn constrained(spec: &RequestSpec, output: &[u32]) -> Constrained {
    match spec.constraint.as_deref().map(|c| c.next(output)) {
        None => Constrained::Sample(None),
        Some(Next::Allowed(mask)) => Constrained::Sample(Some(mask)),
        Some(Next::Complete) => Constrained::Complete,
        Some(Next::Failed(message)) => Constrained::Failed(format!("structured output: {message}")),
    }
}
