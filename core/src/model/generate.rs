//! Plain one-request generation: the simplest correct use of a backend, used by the
//! `generate` command and as the sequential reference that batched serving must match.

use std::time::{Duration, Instant};

use super::backend::{Backend, RowInput};
use super::error::Result;
use super::sampler::{sample, Sampled, SamplingParams, TokenCounts};

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    Length,
    Stop,
}

#[derive(Debug, Clone)]
pub struct Generation {
    pub tokens: Vec<Sampled>,
    pub finish: FinishReason,
    pub prefill_time: Duration,
    pub decode_time: Duration,
}

impl Generation {
    pub fn token_ids(&self) -> Vec<u32> {
        self.tokens.iter().map(|s| s.token).collect()
    }

    /// Decode tokens per second, not counting the first token (it comes from prefill).
    pub fn decode_tokens_per_sec(&self) -> f64 {
        let steps = self.tokens.len().saturating_sub(1);
        if steps == 0 {
            return 0.0;
        }
        steps as f64 / self.decode_time.as_secs_f64()
    }
}

/// Generates up to `max_tokens` after `prompt`, stopping after any of `stop_ids`.
pub fn generate(
    backend: &mut dyn Backend,
    prompt: &[u32],
    max_tokens: usize,
    params: &SamplingParams,
    stop_ids: &[u32],
) -> Result<Generation> {
    let mut kv = backend.new_sequence();
    let mut counts = TokenCounts::default();
    counts.observe_prompt(prompt);
    let mut out = Vec::with_capacity(max_tokens);
    let started = Instant::now();
    let mut logits = backend.forward(&mut [RowInput { kv: &mut kv, tokens: prompt, start: 0 }], false)?;
    let prefill_time = started.elapsed();
    let decode_start = Instant::now();
    let mut finish = FinishReason::Length;
    while out.len() < max_tokens {
        let picked = sample(logits.row_logits(0), params, &counts, out.len() as u64);
        counts.observe_output(picked.token);
        let token = picked.token;
        out.push(picked);
        if stop_ids.contains(&token) {
            finish = FinishReason::Stop;
            break;
        }
        if out.len() == max_tokens {
            break;
        }
        let start = prompt.len() + out.len() - 1;
        logits = backend.forward(&mut [RowInput { kv: &mut kv, tokens: &[token], start }], false)?;
    }
    Ok(Generation { tokens: out, finish, prefill_time, decode_time: decode_start.elapsed() })
}
