//! Which ready requests a step takes, and what each feeds: short rows (decodes,
//! extends) before prompt chunks, within the step's token budget, with a prefix-cache
//! lookup for a request that holds no K/V and a draft, cut to what pays, for a
//! speculating row.

use crate::spec::{best_draft_length, Draft, StepCost};

use super::super::request::{RequestEvent, RequestId};
use super::super::resident::Resident;
use super::{keep_grammatical, Row, Subserver};

impl Subserver {
    /// Takes ready requests in arrival order: short rows (decodes, extends) first so a
    /// long prompt never holds them back, then prompt chunks while the budget lasts.
    pub(super) fn take_batch(&mut self, events: &mut Vec<RequestEvent>) -> Vec<Row> {
        let chunk = self.config.prefill_chunk.max(1);
        let (mut short, mut long): (Vec<RequestId>, Vec<RequestId>) =
            self.ready.iter().partition(|id| self.residents[id].behind() <= chunk.min(16));
        short.append(&mut long);
        let mut budget = self.config.step_token_budget.max(1);
        let mut rows = Vec::new();
        let step_rows = short.len().min(self.config.max_batch_rows);
        let cost = short.iter().any(|id| self.residents[id].drafter.is_some()).then(|| self.step_cost()).flatten();
        for id in short {
            if rows.len() == self.config.max_batch_rows || (budget == 0 && !rows.is_empty()) {
                break;
            }
            self.ready.retain(|r| *r != id);
            let mut resident = self.residents.remove(&id).expect("ready requests are resident");
            if resident.kv.is_empty() {
                self.reuse_cached_prefix(&mut resident, events);
            }
            let feed = resident.behind().min(chunk).min(budget.max(1));
            budget = budget.saturating_sub(feed);
            let draft = self.draft_for(&mut resident, feed, budget, step_rows, cost.as_ref());
            budget = budget.saturating_sub(draft.as_ref().map_or(0, |d| d.tokens.len()));
            rows.push(Row { resident, feed, draft, verify_tokens: Vec::new() });
        }
        rows
    }

    /// A draft for a decoding row, within what the step's budget, the request's
    /// max_tokens and the context leave (the token after a draft comes free).
    /// Cut to the length that saves the most time in a step of `step_rows` rows at this
    /// model's measured `cost` (uncut until two step sizes have been measured).
    fn draft_for(
        &self,
        r: &mut Resident,
        feed: usize,
        budget: usize,
        step_rows: usize,
        cost: Option<&StepCost>,
    ) -> Option<Draft> {
        let room = r
            .spec
            .max_tokens
            .saturating_sub(r.output_len + 1)
            .min(self.config.max_context.saturating_sub(r.tokens.len() + 1))
            .min(budget);
        if r.incoming_draft.is_some() {
            return self.model_draft(r, feed, room);
        }
        if r.drafting.is_some() {
            // A draft model's own guesses are samples, never verified here.
            return None;
        }
        if feed != 1 || r.behind() != 1 {
            return None;
        }
        let drafter = r.drafter.as_mut()?;
        let mut draft = drafter.propose(&r.tokens, r.spec.prompt.len(), room, self.suffix_cache.as_ref())?;
        keep_grammatical(r, &mut draft);
        if let Some(cost) = cost {
            let table = &self.keep_table;
            let chance = |i: usize| table.chance(draft.match_len + i - 1);
            let paying = best_draft_length(draft.tokens.len(), chance, step_rows, cost);
            draft.tokens.truncate(paying);
        }
        (!draft.tokens.is_empty()).then_some(draft)
    }

    /// This model's step cost against the tokens a step feeds, from its served steps.
    fn step_cost(&self) -> Option<StepCost> {
        if self.config.drafting.step_cost.is_some() {
            return self.config.drafting.step_cost;
        }
        let s = &self.stats;
        let points: Vec<(f64, f64, u64)> = (0..s.steps_by_tokens.len())
            .filter(|&b| s.steps_by_tokens[b] > 0)
            .map(|b| {
                let steps = s.steps_by_tokens[b];
                (s.tokens_by_bucket[b] as f64 / steps as f64, s.seconds_by_tokens[b] / steps as f64, steps)
            })
            .collect();
        StepCost::fit(&points)
    }

    /// A request with no K/V here (new, evicted, preempted or restarted) takes what
    /// the prefix cache holds of its tokens and computes only the rest.
    fn reuse_cached_prefix(&mut self, r: &mut Resident, events: &mut Vec<RequestEvent>) {
        let pool = self.backend.kv_pool();
        if !pool.caches_prefixes() {
            return;
        }
        let whole_blocks = r.tokens.len().saturating_sub(1) / pool.block_size();
        self.stats.prefix_lookup_tokens += (whole_blocks * pool.block_size()) as u64;
        let reused = r.kv.attach_cached_prefix(&r.tokens);
        if reused > 0 {
            self.stats.prefix_hit_tokens += reused as u64;
            events.push(RequestEvent::CachedPrefix { id: r.spec.id, model: self.config.model, tokens: reused });
        }
    }
}
