//! What a client of the engine receives for one request.

use serde::Serialize;
use tokenrouter_core::model::sampler::SamplingParams;
use tokenrouter_core::policy::{ModelIndex, Policy};
use tokenrouter_core::sched::FinishReason;

use std::sync::Arc;

/// A generation request in token space (text and chat templates are the tokenizer's).
#[derive(Clone)]
pub struct GenerateRequest {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Token ids that end the request besides the models' EOS ids.
    pub stop_ids: Vec<u32>,
    pub ignore_eos: bool,
    /// This request's policy; the engine's default when `None`.
    pub policy: Option<Arc<dyn Policy>>,
}

impl GenerateRequest {
    pub fn new(prompt: Vec<u32>, max_tokens: usize) -> Self {
        GenerateRequest { prompt, max_tokens, sampling: SamplingParams::default(), stop_ids: Vec::new(), ignore_eos: false, policy: None }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Committed tokens per model, in the engine's model order.
    pub tokens_per_model: Vec<usize>,
    /// How many times the request moved between models.
    pub switches: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub enum GenerationEvent {
    Token { index: usize, token: u32, model: ModelIndex, logprob: Option<f32>, top_logprobs: Vec<(u32, f32)> },
    Finished { reason: FinishReason, usage: Usage },
    Error { message: String, usage: Usage },
}
