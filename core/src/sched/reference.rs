//! The sequential reference: one request at a time, one model step at a time, no
//! batching, no concurrency — the plainest reading of a routing policy. Batched
//! serving must produce the same tokens (the engine's tests compare them).
//!
//! Deliberately written apart from the subserver so that a shared bug cannot hide.

use crate::model::sampler::{sample, TokenCounts};
use crate::model::{Backend, KvSeq, Result, RowInput};
use crate::policy::{Decision, EntryRequest, ModelIndex, RouteRow};

use super::request::{constrained, sampling_logits, Constrained, FinishReason, RequestSpec};

#[derive(Debug, Clone)]
pub struct ReferenceToken {
    pub token: u32,
    pub model: ModelIndex,
    /// Gap between the two largest logits that produced this token: where it is below
    /// float noise, another correct implementation may pick differently.
    pub top2_gap: f32,
}

#[derive(Debug, Clone)]
pub struct ReferenceOutput {
    pub tokens: Vec<ReferenceToken>,
    pub finish: FinishReason,
    pub switches: usize,
}

impl ReferenceOutput {
    pub fn ids(&self) -> Vec<u32> {
        self.tokens.iter().map(|t| t.token).collect()
    }

    /// Whether `got` (token, model) is this output: equal token for token, or equal up
    /// to a token where the reference's top-2 gap is under `gap` — float noise there
    /// lets another correct implementation pick differently, and the rest then differs.
    pub fn check(&self, got: &[(u32, ModelIndex)], gap: f32) -> std::result::Result<(), String> {
        if got.len() != self.tokens.len() {
            return Err(format!("{} tokens where the reference has {}", got.len(), self.tokens.len()));
        }
        let first_difference = got.iter().zip(&self.tokens).position(|(g, w)| *g != (w.token, w.model));
        match first_difference {
            Some(k) if self.tokens[k].top2_gap >= gap => Err(format!(
                "token {k} differs ({:?} vs the reference's ({}, {})) with top-2 gap {}",
                got[k], self.tokens[k].token, self.tokens[k].model, self.tokens[k].top2_gap
            )),
            _ => Ok(()),
        }
    }
}

pub struct Reference<'a> {
    pub models: Vec<&'a mut dyn Backend>,
    pub shared_vocab: usize,
    pub max_context: usize,
}

impl Reference<'_> {
    pub fn run(&mut self, spec: &RequestSpec) -> Result<ReferenceOutput> {
        let mut state = spec.policy.new_state(spec.policy_seed());
        let mut model = spec.policy.entry_model(&mut EntryRequest {
            request_id: spec.id,
            prompt: &spec.prompt,
            max_tokens: spec.max_tokens,
            state: &mut state,
        });
        let mut kvs: Vec<KvSeq> = self.models.iter().map(|m| m.new_sequence()).collect();
        let mut sequence = spec.prompt.clone();
        let mut out: Vec<ReferenceToken> = Vec::new();
        let mut counts = TokenCounts::default();
        counts.observe_prompt(&spec.prompt);
        let mut switches = 0;
        loop {
            let want_hidden = spec.policy.needs_hidden(model);
            let (logits, hidden) = self.step(model, &mut kvs[model], &sequence, want_hidden)?;
            let logits = &logits[..self.shared_vocab];
            let output: Vec<u32> = out.iter().map(|t| t.token).collect();
            let mask = match constrained(spec, &output) {
                Constrained::Sample(mask) => mask,
                Constrained::Complete => {
                    return Ok(ReferenceOutput { tokens: out, finish: FinishReason::Stop, switches })
                }
                Constrained::Failed(message) => return Err(crate::model::ModelError::Constraint(message)),
            };
            let mut scratch = Vec::new();
            let reserved = spec.policy.reserved_logit(model);
            let drawable = sampling_logits(logits, reserved, &spec.sampling, mask.as_ref(), &mut scratch);
            let sampled = sample(drawable, &spec.sampling, &counts, out.len() as u64);
            let decision = spec.policy.route(&mut [RouteRow {
                request_id: spec.id,
                model,
                logits,
                hidden: hidden.as_deref(),
                sampled: sampled.token,
                output: &output,
                state: &mut state,
            }]);
            let (next, commit) = match decision.first() {
                Some(Decision::Move { to, commit }) if *to != model && *to < self.models.len() => (*to, *commit),
                _ => (model, true),
            };
            if commit {
                sequence.push(sampled.token);
                counts.observe_output(sampled.token);
                out.push(ReferenceToken { token: sampled.token, model, top2_gap: top2_gap(logits) });
                if let Some(finish) = finished(spec, &sequence, out.len(), self.max_context) {
                    return Ok(ReferenceOutput { tokens: out, finish, switches });
                }
            }
            if next != model {
                switches += 1;
            }
            model = next;
        }
    }

    /// Feeds `model` every token of `sequence` it has not computed; last logits.
    fn step(
        &mut self,
        model: ModelIndex,
        kv: &mut KvSeq,
        sequence: &[u32],
        want_hidden: bool,
    ) -> Result<(Vec<f32>, Option<Vec<f32>>)> {
        let start = kv.len();
        let out = self.models[model].forward(&mut [RowInput { kv, tokens: &sequence[start..], start }], want_hidden)?;
        Ok((out.row_logits(0).to_vec(), out.row_hidden(0).map(|h| h.to_vec())))
    }
}

fn finished(spec: &RequestSpec, sequence: &[u32], produced: usize, max_context: usize) -> Option<FinishReason> {
    let last = *sequence.last()?;
    if spec.stop_ids.contains(&last) {
        Some(FinishReason::Stop)
    } else if produced >= spec.max_tokens || sequence.len() >= max_context {
        Some(FinishReason::Length)
    } else {
        None
    }
}

pub fn top2_gap(logits: &[f32]) -> f32 {
    let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &x in logits {
        if x > a {
            b = a;
            a = x;
        } else if x > b {
            b = x;
        }
    }
    a - b
}

#[cfg(test)]
mod tests {
    use super::*;

    fn output(tokens: &[(u32, ModelIndex, f32)]) -> ReferenceOutput {
        let tokens = tokens.iter().map(|&(token, model, top2_gap)| ReferenceToken { token, model, top2_gap }).collect();
        ReferenceOutput { tokens, finish: FinishReason::Length, switches: 0 }
    }

    #[test]
    fn outputs_may_part_only_where_the_reference_was_a_near_tie() {
        let want = output(&[(5, 0, 1.0), (6, 1, 1e-6), (7, 1, 1.0)]);
        assert_eq!(want.check(&[(5, 0), (6, 1), (7, 1)], 1e-4), Ok(()));
        assert_eq!(want.check(&[(5, 0), (9, 1), (2, 0)], 1e-4), Ok(()), "parted at the near tie");
        assert!(want.check(&[(5, 0), (6, 1), (8, 1)], 1e-4).unwrap_err().contains("token 2"));
        assert!(want.check(&[(5, 1), (6, 1), (7, 1)], 1e-4).is_err(), "the same token from another model");
        assert!(want.check(&[(5, 0), (6, 1)], 1e-4).unwrap_err().contains("2 tokens"));
    }
}
