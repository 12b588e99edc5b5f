//! Speculative decoding with a draft model: a request on its target leaves for the
//! draft model, which samples a few tokens after the committed ones (a round), and
//! comes back to have them verified in one step of the target (see `verify`).
//!
//! The draft model samples each guess with the request's own seed at the guess's
//! output index, as the target will: where the two distributions agree the two draws
//! agree, so guesses are kept often, and the target's rule "sample, keep the guess if
//! equal" makes the output token for token what the target alone would have written,
//! greedy or sampled. Nothing a round samples is committed, routed or streamed; the
//! request's K/V stays pending on both models between legs, so each leg is an extend.

use crate::policy::ModelIndex;
use crate::spec::{Draft, DraftSource};

use super::super::request::{draft_model, DraftLeg};
use super::super::resident::Resident;
use super::{StepOutcome, Subserver};

impl Subserver {
    /// The draft model and the round's length, when `r` (just settled here after a
    /// committed token) drafts its next tokens there.
    pub(super) fn draft_round(&self, r: &mut Resident) -> Option<(ModelIndex, usize)> {
        if r.drafting.is_some() || r.behind() != 1 {
            return None;
        }
        let drafter = draft_model(self.config.model).filter(|&d| d < self.config.num_models)?;
        let wanted = r.drafter.as_mut()?.next_round()?;
        // The token after a kept round comes free, so a round never reaches the limits.
        let room = r
            .spec
            .max_tokens
            .saturating_sub(r.output_len + 1)
            .min(self.config.max_context.saturating_sub(r.tokens.len() + 1));
        let tokens = wanted.min(room);
        (tokens > 0).then_some((drafter, tokens))
    }

    /// Sends `r` to `drafter` for a round of `tokens`; it waits here, pending.
    pub(super) fn send_to_draft(
        &mut self,
        mut r: Resident,
        drafter: ModelIndex,
        tokens: usize,
        outcome: &mut StepOutcome,
    ) {
        let mut arrival = self.depart(&mut r, drafter);
        arrival.draft = Some(DraftLeg::Ask { target: self.config.model, tokens });
        outcome.handoffs.push((drafter, arrival));
        self.stats.draft_rounds += 1;
        self.keep_pending(r);
    }

    /// On the draft model: one more guess for `r`'s round; the round goes back to its
    /// target when full, at a stop token or at the context's end.
    pub(super) fn extend_draft(&mut self, mut r: Resident, token: u32, outcome: &mut StepOutcome) {
        r.tokens.push(token);
        r.counts.observe_output(token);
        self.stats.drafts_sampled += 1;
        let round = r.drafting.expect("only a drafting request extends a draft");
        let full = r.tokens.len() - round.committed >= round.tokens;
        if full || r.spec.stop_ids.contains(&token) || r.tokens.len() >= self.config.max_context {
            self.return_draft(r, outcome);
        } else {
            self.put_back_ready(r, false);
        }
    }

    /// On the draft model: ends `r`'s round, sending what it sampled to its target. The
    /// drafts stay in `r`'s tokens and K/V here: the target's verdict says how many of
    /// them the next round keeps.
    pub(super) fn return_draft(&mut self, mut r: Resident, outcome: &mut StepOutcome) {
        let round = r.drafting.expect("only a drafting request returns a draft");
        let mut arrival = self.depart(&mut r, round.target);
        arrival.draft = Some(DraftLeg::Answer { tokens: r.tokens[round.committed..].to_vec() });
        r.drafting = None;
        outcome.handoffs.push((round.target, arrival));
        self.keep_pending(r);
    }

    /// On the target: the draft model's guesses for a row feeding `feed` tokens, cut to
    /// `room`; kept for a later step while the row has more than that to catch up.
    pub(super) fn model_draft(&self, r: &mut Resident, feed: usize, room: usize) -> Option<Draft> {
        if feed != r.behind() {
            return None;
        }
        let mut tokens = r.incoming_draft.take()?;
        tokens.truncate(room);
        let mut draft = Draft { tokens, source: DraftSource::Draft, match_len: 0 };
        super::keep_grammatical(r, &mut draft);
        (!draft.tokens.is_empty()).then_some(draft)
    }
}
