//! `glimprouter` (GlimpRouter): step-level routing. A reasoning step starts at the first
//! output position or right after a committed boundary token (one whose text contains a
//! blank line, say). The small model writes the step's first token; if that token's
//! normalized entropy is above the threshold, the token is discarded and the large model
//! writes the whole step, handing back after it samples the next boundary token.
//! Everything it needs is in the output, so the policy keeps no per-request state.

use std::collections::HashSet;

use super::delegate::ModelPair;
use super::logits::normalized_entropy;
use super::{Decision, EntryRequest, ModelIndex, Policy, RouteRow};

/// Parameters: `threshold` (normalized entropy of a step's first token above which the
/// large model writes the step; default 0.2 — the paper tunes it per task),
/// `boundary_tokens` (ids that end a step) or `boundary_text` (derive them: every token
/// whose decoded text contains it, from the small model's tokenizer; default "\n\n"),
/// `small`, `large`.
#[derive(Debug, Clone)]
pub struct GlimpRouter {
    threshold: f64,
    boundary: HashSet<u32>,
    pair: ModelPair,
}

impl GlimpRouter {
    pub const DEFAULT_THRESHOLD: f64 = 0.2;
    pub const DEFAULT_BOUNDARY_TEXT: &'static str = "\n\n";

    pub fn new(threshold: f64, boundary: impl IntoIterator<Item = u32>, pair: ModelPair) -> Self {
        GlimpRouter { threshold, boundary: boundary.into_iter().collect(), pair }
    }

    pub fn is_boundary(&self, token: u32) -> bool {
        self.boundary.contains(&token)
    }

    /// Whether the sampled token of `row` is the first token of a reasoning step.
    fn at_step_start(&self, row: &RouteRow<'_>) -> bool {
        row.output.last().is_none_or(|&previous| self.is_boundary(previous))
    }

    fn decide(&self, row: &RouteRow<'_>) -> Decision {
        if row.model == self.pair.small {
            if self.at_step_start(row) && normalized_entropy(row.logits) > self.threshold {
                return Decision::Move { to: self.pair.large, commit: false };
            }
        } else if row.model == self.pair.large && self.is_boundary(row.sampled) {
            return Decision::Move { to: self.pair.small, commit: true };
        }
        Decision::Stay
    }
}

impl Policy for GlimpRouter {
    fn name(&self) -> &str {
        "glimprouter"
    }

    fn entry_model(&self, _request: &mut EntryRequest<'_>) -> ModelIndex {
        self.pair.small
    }

    fn route(&self, rows: &mut [RouteRow<'_>]) -> Vec<Decision> {
        rows.iter().map(|row| self.decide(row)).collect()
    }
}

/// Ids of every token whose decoded text contains `text` (e.g. the blank line that
/// separates reasoning steps), from a `tokenizer.json`.
pub fn boundary_tokens_from_tokenizer(tokenizer: &tokenizers::Tokenizer, text: &str) -> Result<Vec<u32>, String> {
    let size = tokenizer.get_vocab_size(true) as u32;
    let mut ids = Vec::new();
    for id in 0..size {
        // Decoding one id (rather than reading the vocab string) undoes byte-level and
        // sentencepiece encodings alike.
        let piece = tokenizer.decode(&[id], false).map_err(|e| format!("cannot decode token {id}: {e}"))?;
        if piece.contains(text) {
            ids.push(id);
        }
    }
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::delegate::tests::{route_all, RowData};

    const BLANK_LINE: u32 = 7;

    fn router() -> GlimpRouter {
        GlimpRouter::new(0.2, [BLANK_LINE], ModelPair::default())
    }

    fn row(model: ModelIndex, output: Vec<u32>, sampled: u32, uncertain: bool) -> RowData {
        let mut logits = vec![0.0f32; 100];
        if !uncertain {
            logits[3] = 50.0;
        }
        let mut data = RowData::new(model, logits);
        data.output = output;
        data.sampled = sampled;
        data
    }

    #[test]
    fn uncertain_first_token_of_a_step_hands_the_step_to_large() {
        let to_large = Decision::Move { to: 1, commit: false };
        let decisions = route_all(
            &router(),
            &mut [row(0, vec![], 4, true), row(0, vec![4, BLANK_LINE], 4, true), row(0, vec![4, BLANK_LINE], 4, false)],
        );
        assert_eq!(decisions, vec![to_large, to_large, Decision::Stay]);
    }

    #[test]
    fn small_model_ignores_entropy_inside_a_step() {
        let decisions = route_all(&router(), &mut [row(0, vec![4], 5, true), row(0, vec![BLANK_LINE, 4], 5, true)]);
        assert_eq!(decisions, vec![Decision::Stay, Decision::Stay]);
    }

    #[test]
    fn large_model_writes_until_the_boundary_and_keeps_it() {
        let decisions = route_all(
            &router(),
            &mut [row(1, vec![], 4, true), row(1, vec![4, 5], 6, false), row(1, vec![4, 5, 6], BLANK_LINE, true)],
        );
        assert_eq!(decisions, vec![Decision::Stay, Decision::Stay, Decision::Move { to: 0, commit: true }]);
    }

    #[test]
    fn a_whole_request_alternates_by_step() {
        // Steps: [uncertain start → large writes "4 5 \n\n"], [confident start → small].
        let policy = router();
        let mut data = row(0, vec![], 4, true);
        let mut trace = Vec::new();
        let script = [(true, 4), (false, 5), (false, BLANK_LINE), (false, 9), (true, 10)];
        let mut step = 0;
        while step < script.len() {
            let (uncertain, token) = script[step];
            let fresh = row(data.model, data.output.clone(), token, uncertain);
            data = fresh;
            let decision = route_all(&policy, std::slice::from_mut(&mut data))[0];
            trace.push((data.model, decision));
            match decision {
                Decision::Move { to, commit: false } => data.model = to, // same position again
                Decision::Move { to, commit: true } => {
                    data.output.push(token);
                    data.model = to;
                    step += 1;
                }
                Decision::Stay => {
                    data.output.push(token);
                    step += 1;
                }
            }
        }
        assert_eq!(data.output, vec![4, 5, BLANK_LINE, 9, 10]);
        let models: Vec<ModelIndex> = trace.iter().map(|t| t.0).collect();
        assert_eq!(models, vec![0, 1, 1, 1, 0, 0]);
    }
}
