//! A verify step of speculative decoding: the target model fed its last committed
//! token and a draft in one forward; each position's logits now decide one token,
//! exactly as plain decoding would have (the same sampler, seed position, penalties,
//! bias, grammar and policy), and the draft is kept only as far as it agrees.
//! With a draft that is one guess per position (not sampled from a distribution),
//! "sample the target, keep the guess if equal" is the speculative rejection rule:
//! the output is token for token what decoding without a draft would give.

use crate::model::ForwardOutput;
use crate::policy::{Decision, RouteRow};
use crate::spec::{Draft, DraftSource, MAX_ROUND_MISSES};

use super::super::request::{constrained, draft_model, Constrained, FinishReason, RequestEvent};
use super::super::resident::Resident;
use super::{After, StepOutcome, Subserver};

impl Subserver {
    /// Commits the target's tokens over `draft` (outputs from `first_output` on) until
    /// one differs from the guess, the request ends or its policy moves it; rewinds the
    /// K/V of the rejected guesses.
    pub(super) fn verify(
        &mut self,
        mut r: Resident,
        draft: Draft,
        first_output: usize,
        out: &ForwardOutput,
        outcome: &mut StepOutcome,
    ) {
        // The last committed token was fed first; the guesses follow it.
        let fed_from = r.tokens.len() - 1;
        let marker = outcome.events.len();
        let first_index = r.output_len;
        let mut accepted = 0;
        let mut after = After::Stay;
        for (p, guess) in draft.tokens.iter().map(Some).chain([None]).enumerate() {
            let mask = match constrained(&r.spec, &r.tokens[r.spec.prompt.len()..]) {
                Constrained::Sample(mask) => mask,
                Constrained::Complete => {
                    outcome.events.push(RequestEvent::Finished { id: r.spec.id, reason: FinishReason::Stop });
                    after = After::Finished;
                    break;
                }
                Constrained::Failed(message) => {
                    outcome.events.push(RequestEvent::Failed { id: r.spec.id, message });
                    after = After::Finished;
                    break;
                }
            };
            let sampled = self.sample(&r, out.row_logits(first_output + p), mask.as_ref());
            let decision = self.route_one(&mut r, sampled.token, out, first_output + p);
            let guessed = guess == Some(&sampled.token);
            let (committed, next) = self.commit_and_route(&mut r, &sampled, decision, outcome);
            accepted += usize::from(committed && guessed);
            after = next;
            self.take_fault_mid_apply();
            if !guessed || !matches!(after, After::Stay) {
                break;
            }
        }
        let drafted = draft.tokens.len();
        let verdict = RequestEvent::Verified {
            id: r.spec.id,
            model: self.config.model,
            first_index,
            drafted,
            accepted,
            source: draft.source,
        };
        outcome.events.insert(marker, verdict);
        self.stats.record_verify(drafted, accepted);
        if draft.source == DraftSource::Draft {
            if let Some(d) = draft_model(self.config.model) {
                // The draft model holds the kept guesses already: its next leg starts after them.
                r.travel.seen[d] = fed_from + 1 + accepted;
            }
            if let Some(drafter) = r.drafter.as_mut() {
                drafter.record_round(drafted, accepted);
            }
            self.draft_round_misses = match accepted {
                0 => (self.draft_round_misses + 1).min(MAX_ROUND_MISSES),
                _ => 0,
            };
        } else {
            self.keep_table.record(draft.match_len, drafted, accepted);
            if let Some(drafter) = r.drafter.as_mut() {
                drafter.record(draft.source, accepted);
            }
        }
        // Positions past the accepted guesses hold K/V of tokens that were not kept.
        r.kv.truncate(fed_from + 1 + accepted);
        self.settle(r, after, outcome);
    }

    /// The request's policy on one position of a verify step.
    fn route_one(&self, r: &mut Resident, sampled: u32, out: &ForwardOutput, output: usize) -> Decision {
        let vocab = self.config.shared_vocab;
        let prompt_len = r.spec.prompt.len();
        let policy = r.spec.policy.clone();
        let mut rows = [RouteRow {
            request_id: r.spec.id,
            model: self.config.model,
            logits: &out.row_logits(output)[..vocab],
            hidden: out.row_hidden(output),
            sampled,
            output: &r.tokens[prompt_len..],
            state: &mut r.travel.policy_state,
        }];
        policy.route(&mut rows).first().copied().unwrap_or(Decision::Stay)
    }
}
