//! A request as one subserver holds it: its tokens as this model knows them, its KV
//! here, and the state that travels with it.

use std::sync::Arc;
use std::time::Instant;

use crate::model::sampler::{Sampled, TokenCounts};
use crate::model::KvSeq;
use crate::policy::ModelIndex;
use crate::spec::Drafter;

use super::request::{Arrival, Checkpoint, DraftLeg, FinishReason, RequestEvent, RequestSpec, Travel};
use super::subserver::counts_for;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Ready,
    /// Away on a peer; its KV stays here for when it returns.
    Pending,
}

pub struct Resident {
    pub spec: Arc<RequestSpec>,
    /// Prompt and committed output, as far as this model knows.
    pub tokens: Vec<u32>,
    pub output_len: usize,
    pub kv: KvSeq,
    pub travel: Travel,
    pub counts: TokenCounts,
    pub status: Status,
    pub ready_since: Instant,
    pub pending_since: u64,
    /// Speculative decoding's state on this model, when the request speculates.
    pub drafter: Option<Drafter>,
    /// On a draft model: the round in progress (its drafts follow the committed tokens).
    pub drafting: Option<DraftRound>,
    /// On a target: what its draft model sampled, to verify in the next step.
    pub incoming_draft: Option<Vec<u32>>,
}

/// A draft model's round for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DraftRound {
    /// The model the drafts go back to.
    pub target: ModelIndex,
    /// Most tokens to sample.
    pub tokens: usize,
    /// Length of the committed sequence; `tokens` past it are drafts.
    pub committed: usize,
}

impl Resident {
    pub fn new(arrival: Arrival, kv: KvSeq, now: Instant) -> Self {
        let counts = counts_for(&arrival.suffix, arrival.spec.prompt.len());
        let drafter = arrival.spec.speculation.clone().map(Drafter::new);
        let committed = arrival.suffix.len();
        let mut resident = Resident {
            spec: arrival.spec,
            tokens: arrival.suffix,
            output_len: arrival.output_len,
            kv,
            travel: arrival.travel,
            counts,
            status: Status::Ready,
            ready_since: now,
            pending_since: 0,
            drafter,
            drafting: None,
            incoming_draft: None,
        };
        resident.take_draft_leg(arrival.draft, committed);
        resident
    }

    fn take_draft_leg(&mut self, leg: Option<DraftLeg>, committed: usize) {
        match leg {
            Some(DraftLeg::Ask { target, tokens }) => {
                self.drafting = Some(DraftRound { target, tokens, committed });
            }
            Some(DraftLeg::Answer { tokens }) => self.incoming_draft = Some(tokens),
            None => {}
        }
    }

    /// The committed sequence's length (a draft model's drafts lie past it).
    pub fn committed_len(&self) -> usize {
        self.drafting.map_or(self.tokens.len(), |round| round.committed)
    }

    /// Output index of the next token sampled here (a draft's, on a draft model).
    pub fn next_index(&self) -> usize {
        self.tokens.len().saturating_sub(self.spec.prompt.len())
    }

    /// Takes in a returning request: the tokens it produced elsewhere, its travel state.
    pub fn absorb(&mut self, arrival: Arrival, now: Instant) {
        let prompt_len = self.spec.prompt.len();
        // Tokens dropped here (a draft model's rejected guesses) no longer count for penalties.
        if arrival.start < prompt_len {
            // The whole output comes again: only the prompt's counts stay.
            self.counts = counts_for(&self.spec.prompt, prompt_len);
        } else {
            for &t in self.tokens.get(arrival.start..).unwrap_or_default() {
                self.counts.forget_output(t);
            }
        }
        self.tokens.truncate(arrival.start);
        self.kv.truncate(arrival.start);
        if let Some(drafter) = self.drafter.as_mut() {
            drafter.rewind(arrival.start);
        }
        for (offset, &t) in arrival.suffix.iter().enumerate() {
            if arrival.start + offset >= prompt_len {
                self.counts.observe_output(t);
            }
        }
        self.tokens.extend_from_slice(&arrival.suffix);
        self.drafting = None;
        self.incoming_draft = None;
        let committed = self.tokens.len();
        self.take_draft_leg(arrival.draft, committed);
        // The next step needs the logits after the last token: when this model already
        // computed it (a kept draft before leaving, or a return with nothing new), it
        // computes that position again.
        if self.kv.len() >= self.tokens.len() {
            self.kv.truncate(self.tokens.len().saturating_sub(1));
        }
        self.output_len = arrival.output_len;
        self.travel = arrival.travel;
        self.status = Status::Ready;
        self.ready_since = now;
    }

    pub fn checkpoint(&self) -> Checkpoint {
        Checkpoint {
            spec: self.spec.clone(),
            output_len: self.output_len,
            travel: self.travel.clone(),
            drafting_for: self.drafting.map(|round| round.target),
        }
    }

    /// Tokens known but not yet computed here.
    pub fn behind(&self) -> usize {
        self.tokens.len() - self.kv.len()
    }

    pub fn commit(&mut self, model: ModelIndex, sampled: &Sampled) -> RequestEvent {
        self.tokens.push(sampled.token);
        self.output_len += 1;
        self.counts.observe_output(sampled.token);
        RequestEvent::Token {
            id: self.spec.id,
            index: self.output_len - 1,
            token: sampled.token,
            model,
            logprob: sampled.logprob,
            top_logprobs: sampled.top_logprobs.clone(),
        }
    }

    pub fn finish_reason(&self, max_context: usize) -> Option<FinishReason> {
        let last = *self.tokens.last()?;
        if self.output_len > 0 && self.spec.stop_ids.contains(&last) {
            Some(FinishReason::Stop)
        } else if self.output_len >= self.spec.max_tokens || self.tokens.len() >= max_context {
            Some(FinishReason::Length)
        } else {
            None
        }
    }
}
