//! What a client of the engine receives for one request.

use serde::Serialize;
use tokenrouter_core::constrain::GrammarSpec;
use tokenrouter_core::model::sampler::SamplingParams;
use tokenrouter_core::policy::{ModelIndex, Policy};
use tokenrouter_core::sched::FinishReason;
use tokenrouter_core::spec::{DraftSource, Speculation};

use std::sync::Arc;

use crate::error::EngineError;

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
    /// Stop strings, matched on the streamed text across token boundaries; the text
    /// returned ends before the stop string.
    pub stop: Vec<String>,
    /// Drop special tokens from the streamed text.
    pub skip_special_tokens: bool,
    /// The request ends with an error once this much time has passed.
    pub deadline: Option<std::time::Duration>,
    /// Structured output: what the output must match.
    pub grammar: Option<GrammarSpec>,
    /// Speculative decoding: drafts the models verify (the output stays each model's own).
    pub speculation: Option<Speculation>,
}

impl GenerationEvent {
    pub fn error(error: EngineError, usage: Usage) -> Self {
        GenerationEvent::Error { message: error.to_string(), usage, error }
    }
}

impl GenerateRequest {
    pub fn new(prompt: Vec<u32>, max_tokens: usize) -> Self {
        GenerateRequest {
            prompt,
            max_tokens,
            sampling: SamplingParams::default(),
            stop_ids: Vec::new(),
            ignore_eos: false,
            policy: None,
            stop: Vec::new(),
            skip_special_tokens: true,
            deadline: None,
            grammar: None,
            speculation: None,
        }
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
    /// Prompt tokens whose K/V the first model reused from its prefix cache (OpenAI's
    /// `prompt_tokens_details.cached_tokens`).
    pub cached_tokens: usize,
    /// Speculative decoding's drafts and what came of them.
    pub speculation: SpeculationUsage,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct SpeculationUsage {
    /// Rows of verify steps the request took part in.
    pub verify_steps: usize,
    /// Tokens drafted from every source, and those kept (each kept one is a committed
    /// token that cost no step of its own).
    pub drafted_tokens: usize,
    pub accepted_tokens: usize,
    /// The part of them from the client's prediction (OpenAI's
    /// `accepted_prediction_tokens` and, drafted but not kept, `rejected_prediction_tokens`).
    pub prediction_drafted: usize,
    pub prediction_accepted: usize,
}

impl SpeculationUsage {
    pub fn record(&mut self, source: DraftSource, drafted: usize, accepted: usize) {
        self.verify_steps += 1;
        self.drafted_tokens += drafted;
        self.accepted_tokens += accepted;
        if source == DraftSource::Prediction {
            self.prediction_drafted += drafted;
            self.prediction_accepted += accepted;
        }
    }

    pub fn rejected_prediction_tokens(&self) -> usize {
        self.prediction_drafted - self.prediction_accepted
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum GenerationEvent {
    /// A committed token; `text` is the text it completes (empty while a UTF-8
    /// character or a possible stop string is still being held back, and always
    /// empty when the engine has no tokenizer).
    Token {
        index: usize,
        token: u32,
        model: ModelIndex,
        logprob: Option<f32>,
        top_logprobs: Vec<(u32, f32)>,
        text: String,
        /// The token was a draft's guess that `model` verified (speculative decoding).
        drafted: bool,
    },
    /// The end; `text` is whatever was held back until now.
    Finished { reason: FinishReason, usage: Usage, text: String, stop: Option<String> },
    /// The request failed; `message` is `error`'s text.
    Error { message: String, usage: Usage, error: EngineError },
}
