//! One model's scheduler: which resident requests run in the next step, the step
//! itself (one varlen forward, sampling, routing), and what the step sends out.
//!
//! A request's computed tokens (its KV length here) catch up with its known tokens:
//! a new prompt, a return from a peer and a plain decode differ only in how many
//! tokens are behind, so they share one forward. A request that leaves keeps its
//! resident record and KV here (*pending*); when it returns only the suffix it missed
//! arrives, and it resumes with an extend.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::constrain::TokenMask;
use crate::model::sampler::{Sampled, Sampler, TokenCounts};
use crate::model::{Backend, ForwardOutput, ModelError, RowInput};
use crate::policy::{Decision, ModelIndex, RouteRow};
use crate::spec::{Draft, DraftingConfig, KeepTable, SpeculationMethod, SuffixCache};

use super::batching::BatchingRule;
use super::request::{
    constrained, sampling_logits, Arrival, Checkpoint, Constrained, FinishReason, RequestEvent, RequestId, RequestSpec,
    Travel,
};
use super::resident::{Resident, Status};
use super::stats::SubserverStats;

#[path = "draft_model.rs"]
mod draft_model;
#[path = "take_batch.rs"]
mod take_batch;
#[path = "verify.rs"]
mod verify;

/// Serializable: a front sends it to subservers on other hosts.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SubserverConfig {
    pub model: ModelIndex,
    pub num_models: usize,
    /// Vocabulary all models share; logits are sliced to it before sampling/routing.
    pub shared_vocab: usize,
    /// Longest sequence any model of the engine can hold.
    pub max_context: usize,
    pub max_batch_rows: usize,
    /// Most tokens one row feeds in one step (long prompts are chunked).
    pub prefill_chunk: usize,
    /// Most tokens one step feeds in total (at least one row always runs).
    pub step_token_budget: usize,
    pub drafting: DraftingConfig,
}

impl SubserverConfig {
    pub fn new(model: ModelIndex, num_models: usize, shared_vocab: usize, max_context: usize) -> Self {
        SubserverConfig {
            model,
            num_models,
            shared_vocab,
            max_context,
            max_batch_rows: 64,
            prefill_chunk: 512,
            step_token_budget: 1024,
            drafting: DraftingConfig::default(),
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ArrivalError {
    #[error("request {0} is already ready on this model")]
    AlreadyReady(RequestId),
    #[error("request {id} arrives from position {start}, but this model holds only {held} of its tokens")]
    MissingPrefix { id: RequestId, start: usize, held: usize },
}

/// Where a test makes the next step panic, as a bug in model or scheduling code would.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultPoint {
    /// Before the forward: nothing of the step has happened.
    BeforeForward,
    /// After the first row's decision was applied: some rows have committed, moved or
    /// finished, and none of it has left the step.
    MidApply,
}

/// Everything a step produced.
#[derive(Debug, Default)]
pub struct StepOutcome {
    pub events: Vec<RequestEvent>,
    /// Requests leaving for peers.
    pub handoffs: Vec<(ModelIndex, Arrival)>,
    pub rows: usize,
    pub tokens_fed: usize,
    pub elapsed: Duration,
}

pub struct Subserver {
    config: SubserverConfig,
    backend: Box<dyn Backend>,
    rule: BatchingRule,
    residents: HashMap<RequestId, Resident>,
    /// Ready requests, oldest first.
    ready: VecDeque<RequestId>,
    /// Engine-wide number of active requests (N), which thresholds depend on.
    active: usize,
    sampler: Sampler,
    stats: SubserverStats,
    pending_clock: u64,
    /// The requests of the step in progress as they were before it, to rebuild them
    /// from their committed tokens if it panics.
    in_flight: Vec<Checkpoint>,
    fault: Option<FaultPoint>,
    /// How often this model kept drafts, by match length (speculative decoding).
    keep_table: KeepTable,
    /// Recent outputs for suffix drafts, from the first request that asks for them.
    suffix_cache: Option<SuffixCache>,
    /// Draft-model rounds in a row, over every request, that kept nothing.
    draft_round_misses: u32,
}

struct Row {
    resident: Resident,
    feed: usize,
    /// Tokens guessed to follow; the step verifies them (see `verify`).
    draft: Option<Draft>,
    /// What a verifying row feeds: its last committed token, then the draft.
    verify_tokens: Vec<u32>,
}

impl Row {
    fn fed(&self) -> usize {
        self.feed + self.draft.as_ref().map_or(0, |d| d.tokens.len())
    }

    /// Positions whose logits the step needs: the last, or every verified one.
    fn outputs(&self) -> usize {
        1 + self.draft.as_ref().map_or(0, |d| d.tokens.len())
    }
}

/// What became of a request after one committed (or declined) token.
enum After {
    Stay,
    Finished,
    Moves(ModelIndex),
}

impl Subserver {
    pub fn new(config: SubserverConfig, backend: Box<dyn Backend>, rule: BatchingRule) -> Self {
        Subserver {
            config,
            backend,
            rule,
            residents: HashMap::new(),
            ready: VecDeque::new(),
            active: 0,
            sampler: Sampler::default(),
            stats: SubserverStats::default(),
            pending_clock: 0,
            in_flight: Vec::new(),
            fault: None,
            keep_table: KeepTable::default(),
            suffix_cache: None,
            draft_round_misses: 0,
        }
    }

    /// Forgets every request and returns their ids (for a model that gives up: they
    /// end with an error); their KV returns to the pool. The model stays loaded.
    pub fn reset(&mut self) -> Vec<RequestId> {
        let ids = self.resident_ids();
        self.residents.clear();
        self.ready.clear();
        self.in_flight.clear();
        ids
    }

    /// After a panic: the requests of the interrupted step are taken out (their state
    /// here may be half-updated; their owners rebuild them from the committed tokens,
    /// see [`Checkpoint`]) and every other request keeps its record but recomputes
    /// its KV, since the cache the panic left cannot be trusted either.
    pub fn recover(&mut self) -> Vec<Checkpoint> {
        let lost = std::mem::take(&mut self.in_flight);
        for checkpoint in &lost {
            self.residents.remove(&checkpoint.spec.id);
        }
        for resident in self.residents.values_mut() {
            resident.kv.clear();
        }
        let residents = &self.residents;
        self.ready.retain(|id| residents.get(id).is_some_and(|r| r.status == Status::Ready));
        let mut missing: Vec<(Instant, RequestId)> = residents
            .iter()
            .filter(|(id, r)| r.status == Status::Ready && !self.ready.contains(id))
            .map(|(id, r)| (r.ready_since, *id))
            .collect();
        missing.sort_unstable();
        self.ready.extend(missing.into_iter().map(|(_, id)| id));
        lost
    }

    /// Test hook: the next step panics at `point`.
    #[doc(hidden)]
    pub fn inject_fault(&mut self, point: FaultPoint) {
        self.fault = Some(point);
    }

    pub fn config(&self) -> &SubserverConfig {
        &self.config
    }

    pub fn rule(&self) -> &BatchingRule {
        &self.rule
    }

    pub fn model(&self) -> ModelIndex {
        self.config.model
    }

    pub fn backend(&self) -> &dyn Backend {
        self.backend.as_ref()
    }

    pub fn stats(&self) -> &SubserverStats {
        &self.stats
    }

    pub fn ready_count(&self) -> usize {
        self.ready.len()
    }

    pub fn pending_count(&self) -> usize {
        self.residents.len() - self.ready.len()
    }

    pub fn holds(&self, id: RequestId) -> bool {
        self.residents.contains_key(&id)
    }

    pub fn set_active(&mut self, active: usize) {
        self.active = active;
    }

    pub fn set_rule(&mut self, rule: BatchingRule) {
        self.rule = rule;
    }

    pub fn threshold(&self) -> usize {
        self.rule.effective(self.active.max(1)).get(self.config.model).copied().unwrap_or(1)
    }

    /// A new request or one moving in from a peer.
    pub fn arrive(&mut self, arrival: Arrival) -> Result<(), ArrivalError> {
        let id = arrival.spec.id;
        let now = Instant::now();
        match self.residents.get_mut(&id) {
            Some(r) if r.status == Status::Ready => return Err(ArrivalError::AlreadyReady(id)),
            Some(r) => {
                if r.tokens.len() < arrival.start {
                    return Err(ArrivalError::MissingPrefix { id, start: arrival.start, held: r.tokens.len() });
                }
                // A draft model's legs are speculation, not routing.
                self.stats.handoffs_in += u64::from(arrival.draft.is_none());
                r.absorb(arrival, now);
            }
            None if arrival.start > 0 => {
                return Err(ArrivalError::MissingPrefix { id, start: arrival.start, held: 0 });
            }
            None => {
                let wants_suffixes =
                    arrival.spec.speculation.as_ref().and_then(|s| s.method) == Some(SpeculationMethod::Suffix);
                if wants_suffixes && self.suffix_cache.is_none() {
                    self.suffix_cache = Some(SuffixCache::new(self.config.drafting.suffix_cache_nodes));
                }
                let kv = self.backend.new_sequence();
                let mut resident = Resident::new(arrival, kv, now);
                if let Some(drafter) = resident.drafter.as_mut().filter(|d| d.uses_draft_model()) {
                    // One miss fewer than the record, which the newcomer also lowers: new
                    // requests keep probing, so the record follows the draft model's agreement.
                    self.draft_round_misses = self.draft_round_misses.saturating_sub(1);
                    drafter.start_backed_off(self.draft_round_misses);
                }
                self.residents.insert(id, resident);
            }
        }
        self.ready.push_back(id);
        Ok(())
    }

    /// The request ended (finished elsewhere, cancelled, failed): free its KV here.
    pub fn release(&mut self, id: RequestId) -> bool {
        self.ready.retain(|r| *r != id);
        self.residents.remove(&id).is_some()
    }

    /// Ids of every request held here, including any taken out by a step that did
    /// not complete (to end or resume them when this model fails).
    pub fn resident_ids(&self) -> Vec<RequestId> {
        let mut ids: Vec<RequestId> =
            self.residents.keys().copied().chain(self.in_flight.iter().map(|c| c.spec.id)).collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// Whether delayed batching lets a step start now.
    pub fn should_launch(&self, now: Instant) -> bool {
        if self.ready.is_empty() {
            return false;
        }
        self.ready.len() >= self.threshold() || self.deadline().is_some_and(|d| now >= d)
    }

    /// When the oldest ready request's max wait runs out, if a max wait is set.
    pub fn deadline(&self) -> Option<Instant> {
        let wait = self.rule.max_wait?;
        let oldest = self.ready.iter().filter_map(|id| self.residents.get(id)).map(|r| r.ready_since).min()?;
        Some(oldest + wait)
    }

    /// Frees the KV of pending requests, oldest first, until `blocks` are free.
    /// They keep their tokens and recompute when they return.
    pub fn evict_pending(&mut self, blocks: usize) -> usize {
        let mut pending: Vec<(u64, RequestId)> = self
            .residents
            .iter()
            .filter(|(_, r)| r.status == Status::Pending && !r.kv.is_empty())
            .map(|(id, r)| (r.pending_since, *id))
            .collect();
        pending.sort_unstable();
        let mut evicted = 0;
        for (_, id) in pending {
            if self.backend.kv_capacity().free_blocks >= blocks {
                break;
            }
            if let Some(r) = self.residents.get_mut(&id) {
                r.kv.clear();
                evicted += 1;
            }
        }
        self.stats.evictions += evicted as u64;
        evicted
    }

    /// Frees the KV of ready requests that are not in the running step, newest first
    /// (as vLLM preempts): they recompute when their turn comes.
    fn preempt_waiting(&mut self, blocks: usize) -> usize {
        let mut preempted = 0;
        for id in self.ready.iter().rev() {
            if self.backend.kv_capacity().free_blocks >= blocks {
                break;
            }
            if let Some(r) = self.residents.get_mut(id).filter(|r| !r.kv.is_empty()) {
                r.kv.clear();
                preempted += 1;
            }
        }
        self.stats.evictions += preempted as u64;
        preempted
    }

    /// Runs one step over the ready requests.
    pub fn step(&mut self) -> StepOutcome {
        let started = Instant::now();
        let mut outcome = StepOutcome::default();
        let mut rows = self.take_batch(&mut outcome.events);
        self.in_flight = rows.iter().map(|r| r.resident.checkpoint()).collect();
        if self.fault == Some(FaultPoint::BeforeForward) {
            self.fault = None;
            panic!("injected fault before the forward");
        }
        let logits = loop {
            match self.forward(&mut rows) {
                Ok(out) => break out,
                Err(ModelError::OutOfBlocks { needed, .. }) => {
                    if drop_drafts(&mut rows) || self.evict_pending(needed) > 0 || self.preempt_waiting(needed) > 0 {
                        continue;
                    }
                    if rows.len() > 1 {
                        let last = rows.pop().expect("more than one row");
                        self.put_back_ready(last.resident, true);
                        continue;
                    }
                    let row = rows.pop().expect("one row");
                    if row.resident.drafting.is_some() {
                        // Out of room for guesses: the target decides with what it has.
                        self.return_draft(row.resident, &mut outcome);
                    } else {
                        outcome.events.push(self.out_of_room(row.resident));
                    }
                    break None;
                }
                Err(e) => {
                    let message = format!("model step failed: {e}");
                    for row in rows.drain(..) {
                        outcome.events.push(self.fail(row.resident, &message));
                    }
                    break None;
                }
            }
        };
        if let Some(out) = logits {
            outcome.rows = rows.len();
            outcome.tokens_fed = rows.iter().map(Row::fed).sum();
            self.finish_rows(rows, &out, &mut outcome);
        }
        self.in_flight.clear();
        outcome.elapsed = started.elapsed();
        self.stats.steps += 1;
        self.stats.rows += outcome.rows as u64;
        self.stats.tokens_fed += outcome.tokens_fed as u64;
        self.stats.busy += outcome.elapsed;
        self.stats.record_step(outcome.rows, outcome.tokens_fed, outcome.elapsed);
        outcome
    }

    fn forward(&mut self, rows: &mut [Row]) -> crate::model::Result<Option<ForwardOutput>> {
        let want_hidden = rows.iter().any(|r| r.resident.spec.policy.needs_hidden(self.config.model));
        let outputs: Vec<usize> = rows.iter().map(Row::outputs).collect();
        let mut inputs: Vec<RowInput> = rows
            .iter_mut()
            .map(|row| {
                let Row { resident: r, feed, draft, verify_tokens } = row;
                let start = r.kv.len();
                let known = &r.tokens[start..start + *feed];
                let tokens = match draft {
                    Some(draft) => {
                        verify_tokens.clear();
                        verify_tokens.extend_from_slice(known);
                        verify_tokens.extend_from_slice(&draft.tokens);
                        &verify_tokens[..]
                    }
                    None => known,
                };
                RowInput { tokens, start, kv: &mut r.kv }
            })
            .collect();
        self.backend.forward_at(&mut inputs, &outputs, want_hidden).map(Some)
    }

    fn finish_rows(&mut self, rows: Vec<Row>, out: &ForwardOutput, outcome: &mut StepOutcome) {
        let mut to_sample: Vec<(usize, Resident)> = Vec::new();
        let mut next_output = 0;
        for row in rows {
            let (first_output, outputs) = (next_output, row.outputs());
            next_output += outputs;
            let mut r = row.resident;
            // Only committed tokens are sealed: a draft's positions lie past them.
            let committed = r.committed_len();
            r.kv.seal_full_blocks(&r.tokens[..committed]);
            if let Some(draft) = row.draft {
                self.verify(r, draft, first_output, out, outcome);
                continue;
            }
            if r.behind() > 0 {
                // A prompt chunk: more of it to feed before anything is sampled.
                self.put_back_ready(r, false);
                continue;
            }
            to_sample.push((first_output, r));
        }
        let verdicts = grammar_verdicts(&to_sample);
        let mut complete: Vec<(usize, Resident, crate::model::sampler::Sampled)> = Vec::new();
        for ((i, r), verdict) in to_sample.into_iter().zip(verdicts) {
            let mask = match verdict {
                Constrained::Sample(mask) => mask,
                // The grammar ends the output here: the target decides that, not a draft.
                _ if r.drafting.is_some() => {
                    self.return_draft(r, outcome);
                    continue;
                }
                Constrained::Complete => {
                    outcome.events.push(RequestEvent::Finished { id: r.spec.id, reason: FinishReason::Stop });
                    continue; // dropping the resident frees its KV here
                }
                Constrained::Failed(message) => {
                    outcome.events.push(self.fail(r, &message));
                    continue;
                }
            };
            let sampled = self.sample(&r, out.row_logits(i), mask.as_ref());
            complete.push((i, r, sampled));
        }
        for (_, r, sampled) in complete.extract_if(.., |(_, r, _)| r.drafting.is_some()) {
            self.extend_draft(r, sampled.token, outcome);
        }
        let decisions = self.route(&mut complete, out);
        for ((_, r, sampled), decision) in complete.into_iter().zip(decisions) {
            self.apply(r, sampled, decision, outcome);
            self.take_fault_mid_apply();
        }
    }

    fn take_fault_mid_apply(&mut self) {
        if self.fault == Some(FaultPoint::MidApply) {
            self.fault = None;
            panic!("injected fault in the middle of applying decisions");
        }
    }

    /// The request's next token from the logits at one of its output positions.
    fn sample(&mut self, r: &Resident, raw: &[f32], mask: Option<&TokenMask>) -> Sampled {
        let reserved = r.spec.policy.reserved_logit(self.config.model);
        let mut scratch = Vec::new();
        let logits = sampling_logits(&raw[..self.config.shared_vocab], reserved, &r.spec.sampling, mask, &mut scratch);
        self.sampler.sample(logits, &r.spec.sampling, &r.counts, r.next_index() as u64)
    }

    /// Asks each request's policy, one call per policy over its rows.
    fn route(&self, rows: &mut [(usize, Resident, Sampled)], out: &ForwardOutput) -> Vec<Decision> {
        let vocab = self.config.shared_vocab;
        let mut decisions = vec![Decision::Stay; rows.len()];
        let mut groups: Vec<(Arc<RequestSpec>, Vec<usize>)> = Vec::new();
        for (k, (_, r, _)) in rows.iter().enumerate() {
            match groups.iter_mut().find(|(spec, _)| same_policy(spec, &r.spec)) {
                Some((_, members)) => members.push(k),
                None => groups.push((r.spec.clone(), vec![k])),
            }
        }
        for (spec, members) in groups {
            let mut route_rows: Vec<RouteRow> = Vec::with_capacity(members.len());
            // Split borrows: each member row is visited once.
            let mut slots: Vec<Option<&mut (usize, Resident, Sampled)>> = rows.iter_mut().map(Some).collect();
            for &k in &members {
                let (i, r, sampled) = slots[k].take().expect("each row once");
                let prompt_len = r.spec.prompt.len();
                route_rows.push(RouteRow {
                    request_id: r.spec.id,
                    model: self.config.model,
                    logits: &out.row_logits(*i)[..vocab],
                    hidden: out.row_hidden(*i),
                    sampled: sampled.token,
                    output: &r.tokens[prompt_len..],
                    state: &mut r.travel.policy_state,
                });
            }
            let answer = spec.policy.route(&mut route_rows);
            for (pos, &k) in members.iter().enumerate() {
                decisions[k] = answer.get(pos).copied().unwrap_or(Decision::Stay);
            }
        }
        decisions
    }

    fn apply(&mut self, mut r: Resident, sampled: Sampled, decision: Decision, outcome: &mut StepOutcome) {
        let (_, after) = self.commit_and_route(&mut r, &sampled, decision, outcome);
        self.settle(r, after, outcome);
    }

    /// Commits the sampled token unless the policy moves the request without it;
    /// returns whether it committed, and where the request goes.
    fn commit_and_route(
        &mut self,
        r: &mut Resident,
        sampled: &Sampled,
        decision: Decision,
        outcome: &mut StepOutcome,
    ) -> (bool, After) {
        let me = self.config.model;
        let (to, commit) = match decision {
            Decision::Move { to, commit } if to != me && to < self.config.num_models => (Some(to), commit),
            _ => (None, true),
        };
        if commit {
            outcome.events.push(r.commit(me, sampled));
            self.stats.tokens_committed += 1;
            if let Some(reason) = r.finish_reason(self.config.max_context) {
                outcome.events.push(RequestEvent::Finished { id: r.spec.id, reason });
                return (true, After::Finished);
            }
        }
        (commit, to.map_or(After::Stay, After::Moves))
    }

    fn settle(&mut self, mut r: Resident, after: After, outcome: &mut StepOutcome) {
        let me = self.config.model;
        match after {
            After::Finished => {
                // Dropping the resident frees its KV here.
                if let Some(cache) = self.suffix_cache.as_mut() {
                    cache.add(&r.tokens[r.spec.prompt.len().min(r.tokens.len())..]);
                }
            }
            After::Stay => match self.draft_round(&mut r) {
                Some((drafter, tokens)) => self.send_to_draft(r, drafter, tokens, outcome),
                None => self.put_back_ready(r, false),
            },
            After::Moves(to) => {
                outcome.events.push(RequestEvent::Moved { id: r.spec.id, from: me, to });
                outcome.handoffs.push((to, self.depart(&mut r, to)));
                self.stats.handoffs_out += 1;
                if self.stats.handoffs_to.len() <= to {
                    self.stats.handoffs_to.resize(self.config.num_models.max(to + 1), 0);
                }
                self.stats.handoffs_to[to] += 1;
                self.keep_pending(r);
            }
        }
    }

    /// What the peer `to` needs: the committed tokens it has not seen, and the travel state.
    fn depart(&self, r: &mut Resident, to: ModelIndex) -> Arrival {
        let committed = r.committed_len();
        r.travel.seen[self.config.model] = committed;
        let start = r.travel.seen[to].min(committed);
        Arrival {
            spec: r.spec.clone(),
            suffix: r.tokens[start..committed].to_vec(),
            start,
            output_len: r.output_len,
            travel: Travel { policy_state: r.travel.policy_state.clone(), seen: r.travel.seen.clone() },
            draft: None,
        }
    }

    /// Leaves `r` here pending (its K/V kept for its return).
    fn keep_pending(&mut self, mut r: Resident) {
        self.pending_clock += 1;
        r.status = Status::Pending;
        r.pending_since = self.pending_clock;
        self.residents.insert(r.spec.id, r);
    }

    fn put_back_ready(&mut self, r: Resident, front: bool) {
        let id = r.spec.id;
        self.residents.insert(id, r);
        if front {
            self.ready.push_front(id);
        } else {
            self.ready.push_back(id);
        }
    }

    fn fail(&mut self, r: Resident, message: &str) -> RequestEvent {
        RequestEvent::Failed { id: r.spec.id, message: message.to_string() }
    }

    /// A request alone in a step, with every other request's KV here freed, still does
    /// not fit: its output ends at this model's capacity (as at the context's end),
    /// and a prompt that cannot fit fails.
    fn out_of_room(&mut self, r: Resident) -> RequestEvent {
        if r.output_len > 0 {
            RequestEvent::Finished { id: r.spec.id, reason: FinishReason::Length }
        } else {
            self.fail(r, "its prompt does not fit this model's KV cache")
        }
    }
}

/// Each row's grammar verdict; the masks of constrained rows are computed in parallel,
/// since each walks the vocabulary (see docs/structured-outputs.md for their cost).
fn grammar_verdicts(rows: &[(usize, Resident)]) -> Vec<Constrained> {
    use rayon::prelude::*;
    let verdict = |(_, r): &(usize, Resident)| constrained(&r.spec, &r.tokens[r.spec.prompt.len()..]);
    if rows.iter().filter(|(_, r)| r.spec.constraint.is_some()).count() > 1 {
        rows.par_iter().map(verdict).collect()
    } else {
        rows.iter().map(verdict).collect()
    }
}

/// Cuts a draft at its first guess the request's grammar does not allow.
fn keep_grammatical(r: &Resident, draft: &mut Draft) {
    if let Some(grammar) = r.spec.constraint.as_deref() {
        let valid = grammar.valid_prefix(&r.tokens[r.spec.prompt.len()..], &draft.tokens);
        draft.tokens.truncate(valid);
    }
}

/// Sends every row's draft away (a step that does not fit tries without them first).
fn drop_drafts(rows: &mut [Row]) -> bool {
    let mut dropped = false;
    for row in rows.iter_mut() {
        dropped |= row.draft.take().is_some();
    }
    dropped
}

fn same_policy(a: &Arc<RequestSpec>, b: &Arc<RequestSpec>) -> bool {
    std::ptr::addr_eq(Arc::as_ptr(&a.policy), Arc::as_ptr(&b.policy))
}

/// Counts for penalties from a sequence, as a new resident rebuilds them.
pub(crate) fn counts_for(tokens: &[u32], prompt_len: usize) -> TokenCounts {
    let mut counts = TokenCounts::default();
    counts.observe_prompt(&tokens[..prompt_len.min(tokens.len())]);
    for &t in tokens.iter().skip(prompt_len) {
        counts.observe_output(t);
    }
    counts
}
