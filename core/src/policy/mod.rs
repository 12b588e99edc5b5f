//! Routing policies: after every step, per request, which model produces the next token.
//!
//! A policy is written from one request's point of view but called once per step over
//! the batch of rows it owns on one model (rows of other policies are routed by theirs).
//! Everything a policy remembers about a request lives in its [`PolicyState`], which
//! travels with the request between models, so a policy object itself is shared and
//! immutable. Randomness comes from counter-based draws keyed by the request's policy
//! seed and position, so batching, timing and arrival order never change a decision.

use serde::{Deserialize, Serialize};

pub mod citer;
pub mod colm;
pub mod delegate;
mod described;
pub mod ensemble;
pub mod error;
pub mod glimprouter;
pub mod logits;
mod params;
pub mod query;
pub mod r2r;
pub mod random;
pub mod registry;
pub mod rstitch;
pub mod shared_weights;
pub mod weights;

pub use citer::{CiterDelegate, CiterRouter};
pub use colm::ColmDelegate;
pub use delegate::{BinaryAdapter, DelegatePolicy, ModelPair};
pub use described::PolicyDescriptor;
pub use ensemble::Ensemble;
pub use error::PolicyError;
pub use glimprouter::GlimpRouter;
pub use query::{Always, QueryLevel, QueryRule};
pub use r2r::{R2rDelegate, R2rRouter, R2rShape};
pub use random::RandomDelegate;
pub use registry::{build, build_shared, PolicyContext, POLICY_NAMES};
pub use rstitch::RStitch;
pub use shared_weights::SharedWeights;

/// Index of a model in the engine's model list (the order of the config).
pub type ModelIndex = usize;

/// What a policy knows of the engine's models.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelInfo {
    pub name: String,
    pub hidden_size: usize,
    /// Vocabulary shared by all models of the engine (logits are sliced to it).
    pub vocab_size: usize,
}

/// Per-request state owned by the policy; it moves with the request between models
/// and across hosts, so it is plain serializable data.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PolicyState {
    /// Seed for the policy's own random draws (distinct from the sampling seed).
    pub seed: u64,
    /// Small policy-defined counters/flags (e.g. tokens produced on the current model).
    pub counters: Vec<u64>,
    /// Policy-defined values.
    pub values: Vec<f32>,
}

/// One row of a finished step, as the policy sees it.
pub struct RouteRow<'a> {
    pub request_id: u64,
    /// The model that ran this step.
    pub model: ModelIndex,
    /// Last-position logits over the shared vocabulary, before any sampling transform.
    pub logits: &'a [f32],
    /// Final hidden state of the last position, when `needs_hidden(model)`.
    pub hidden: Option<&'a [f32]>,
    /// The token the sampler drew from `logits` for this position.
    pub sampled: u32,
    /// Output tokens committed so far (the sampled one is not among them).
    pub output: &'a [u32],
    pub state: &'a mut PolicyState,
}

impl RouteRow<'_> {
    /// Index of the sampled token in the output.
    pub fn position(&self) -> usize {
        self.output.len()
    }
}

/// What happens after a step, per row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Decision {
    /// Commit the sampled token and keep decoding on this model.
    Stay,
    /// Leave for model `to`. With `commit`, the sampled token is committed and `to`
    /// continues after it; without, it is discarded and `to` produces this position.
    Move { to: ModelIndex, commit: bool },
}

/// What a policy may use to pick the entry model of a new request.
pub struct EntryRequest<'a> {
    pub request_id: u64,
    pub prompt: &'a [u32],
    pub max_tokens: usize,
    pub state: &'a mut PolicyState,
}

pub trait Policy: Send + Sync {
    /// The policy's name as configs and requests spell it (e.g. "rstitch").
    fn name(&self) -> &str;

    /// State for a new request; `seed` is derived from the request's seed.
    fn new_state(&self, seed: u64) -> PolicyState {
        PolicyState { seed, ..PolicyState::default() }
    }

    /// The model a new request starts on.
    fn entry_model(&self, request: &mut EntryRequest<'_>) -> ModelIndex;

    /// Whether a request never leaves its entry model (whole-request policies): then
    /// admission reserves KV on that model only.
    fn stays_on_entry_model(&self) -> bool {
        false
    }

    /// Whether rows on `model` must carry their last hidden state.
    fn needs_hidden(&self, _model: ModelIndex) -> bool {
        false
    }

    /// A logit index of `model` that is not a token, so the sampler must never draw it
    /// (Co-LLM's `<|defer|>` slot). Default: none.
    fn reserved_logit(&self, _model: ModelIndex) -> Option<usize> {
        None
    }

    /// One decision per row, in order. Rows all ran on the same model in one step.
    fn route(&self, rows: &mut [RouteRow<'_>]) -> Vec<Decision>;

    /// The name and parameters that build this policy again (on another host); set by
    /// [`build`] for every built-in policy, `None` for policies made in code.
    fn descriptor(&self) -> Option<PolicyDescriptor> {
        None
    }
}

/// A uniform draw in [0, 1) that depends only on (seed, position, salt): the same
/// decision whatever the batch, the step or a retry.
pub fn policy_uniform(seed: u64, position: usize, salt: u64) -> f64 {
    let key = seed ^ (position as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ salt.wrapping_mul(0xD1B5_4A32_D192_ED03);
    crate::rng::unit_f64(crate::rng::mix64(key))
}

/// The share of the entry model's positions a policy is expected to hand to the other
/// model, where its parameters say (`random`'s `p`); the start-up plan's routing prior.
pub fn expected_delegation(policy: &dyn Policy) -> Option<f64> {
    let descriptor = policy.descriptor()?;
    match descriptor.name.as_str() {
        "random" => {
            Some(descriptor.params.get("p").and_then(|p| p.as_f64()).unwrap_or(random::RandomDelegate::DEFAULT_P))
        }
        _ => None,
    }
}
