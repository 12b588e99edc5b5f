//! The embedded chain: reachable states by breadth-first search from "every request
//! queued at the entry model", and their transitions as a sparse row-major matrix.

use std::collections::hash_map::Entry;

use super::{PlanError, PlannerInput, MAX_MODELS};

/// Beyond this many states a solve no longer takes seconds.
pub(super) const STATE_LIMIT: usize = 3_000_000;
/// Multinomial outcomes less likely than this are dropped (and the rest renormalized).
const NEGLIGIBLE: f64 = 1e-15;

/// One model's part: queued requests, running batch (0 = idle), residual time units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct State {
    pub queued: [u8; MAX_MODELS],
    pub batch: [u8; MAX_MODELS],
    pub residual: [u16; MAX_MODELS],
}

impl State {
    fn key(&self) -> u128 {
        let mut key = 0u128;
        for i in 0..MAX_MODELS {
            let part = (self.queued[i] as u128) << 24 | (self.batch[i] as u128) << 16 | self.residual[i] as u128;
            key |= part << (32 * i);
        }
        key
    }
}

/// Arrivals per destination model and their probability.
type Outcome = ([u8; MAX_MODELS], f64);

/// The chain's fixed parts for one threshold vector.
pub(super) struct ChainModel {
    models: usize,
    exclusive: bool,
    thresholds: Vec<usize>,
    max_batch: usize,
    entry: usize,
    /// `units[i][b]`: a step of b rows on model i, in time units.
    units: Vec<Vec<u16>>,
    tokens_per_row: Vec<f64>,
    route: Vec<Vec<f64>>,
    /// `outcomes[i][b]`: where b rows leaving model i go, filled on first use.
    outcomes: Vec<Vec<Option<Vec<Outcome>>>>,
}

/// Reachable states and the sparse transition matrix between them.
pub(super) struct Chain {
    pub states: Vec<State>,
    pub row_start: Vec<usize>,
    pub target: Vec<u32>,
    pub probability: Vec<f64>,
    /// Expected tokens committed by the steps completing at a state's exit.
    pub reward: Vec<f64>,
    /// Time units until the next completion.
    pub holding: Vec<u16>,
}

impl ChainModel {
    pub fn new(input: &PlannerInput, thresholds: &[usize]) -> Result<Self, PlanError> {
        let delta = input.delta_ms();
        let max_batch = input.max_batch.clamp(1, u8::MAX as usize);
        let units = input
            .latencies
            .iter()
            .map(|table| {
                (0..=max_batch)
                    .map(|b| {
                        let ms = table.at(b);
                        let units = (ms / delta).round().max(1.0);
                        if units > u16::MAX as f64 || !units.is_finite() {
                            return Err(PlanError::LatencyRange { ms, units, delta_ms: delta });
                        }
                        Ok(units as u16)
                    })
                    .collect::<Result<Vec<u16>, PlanError>>()
            })
            .collect::<Result<Vec<_>, _>>()?;
        let models = input.models();
        Ok(ChainModel {
            models,
            exclusive: input.exclusive,
            thresholds: thresholds.to_vec(),
            max_batch,
            entry: input.entry_model,
            units,
            tokens_per_row: (0..models).map(|i| input.tokens_per_row(i)).collect(),
            route: input.route.clone(),
            outcomes: vec![vec![None; max_batch + 1]; models],
        })
    }

    /// Breadth-first search over the states reachable with `n` requests.
    pub fn build(mut self, n: usize, limit: usize) -> Result<Chain, PlanError> {
        let mut start = State::default();
        start.queued[self.entry] = n as u8;
        self.launch(&mut start, None);
        let mut index: foldhash::HashMap<u128, u32> = foldhash::HashMap::default();
        index.insert(start.key(), 0);
        let mut chain = Chain {
            states: vec![start],
            row_start: vec![0],
            target: Vec::new(),
            probability: Vec::new(),
            reward: Vec::new(),
            holding: Vec::new(),
        };
        let mut row: Vec<(u32, f64)> = Vec::new();
        let mut next = 0;
        while next < chain.states.len() {
            let state = chain.states[next];
            let (holding, reward, successors) = self.transitions(state);
            row.clear();
            for (successor, p) in successors {
                let id = match index.entry(successor.key()) {
                    Entry::Occupied(e) => *e.get(),
                    Entry::Vacant(e) => {
                        if chain.states.len() >= limit {
                            return Err(PlanError::TooManyStates { limit });
                        }
                        chain.states.push(successor);
                        *e.insert(chain.states.len() as u32 - 1)
                    }
                };
                row.push((id, p));
            }
            merge_duplicates(&mut row);
            chain.target.extend(row.iter().map(|(t, _)| *t));
            chain.probability.extend(row.iter().map(|(_, p)| *p));
            chain.row_start.push(chain.target.len());
            chain.reward.push(reward);
            chain.holding.push(holding);
            next += 1;
        }
        Ok(chain)
    }

    /// Idle models whose queue reached their threshold start a step. Models that take
    /// turns start only when none runs, one at a time: one that waited before the one
    /// whose step just `ended` (the engine hands its turn over fairly).
    fn launch(&self, state: &mut State, ended: Option<usize>) {
        let eligible = |s: &State, i: usize| {
            let queued = s.queued[i] as usize;
            s.batch[i] == 0 && queued > 0 && queued >= self.thresholds[i]
        };
        if !self.exclusive {
            for i in 0..self.models {
                if eligible(state, i) {
                    self.start(state, i);
                }
            }
            return;
        }
        if (0..self.models).any(|i| state.batch[i] > 0) {
            return;
        }
        let waited = (0..self.models).find(|&i| Some(i) != ended && eligible(state, i));
        if let Some(i) = waited.or(ended.filter(|&i| eligible(state, i))) {
            self.start(state, i);
        }
    }

    fn start(&self, state: &mut State, model: usize) {
        let batch = (state.queued[model] as usize).min(self.max_batch);
        state.queued[model] -= batch as u8;
        state.batch[model] = batch as u8;
        state.residual[model] = self.units[model][batch];
    }

    /// From a state: the holding time, the expected tokens committed at its end, and
    /// the distribution of the next state.
    fn transitions(&mut self, state: State) -> (u16, f64, Vec<(State, f64)>) {
        let running = (0..self.models).filter(|&i| state.batch[i] > 0);
        let holding = running.map(|i| state.residual[i]).min().expect("Σ(B_i − 1) < N keeps some model running");
        let mut after = state;
        let mut reward = 0.0;
        let mut arrivals: Vec<Outcome> = vec![([0; MAX_MODELS], 1.0)];
        let mut ended = None;
        for i in 0..self.models {
            if state.batch[i] == 0 {
                continue;
            }
            if state.residual[i] > holding {
                after.residual[i] -= holding;
                continue;
            }
            let batch = state.batch[i] as usize;
            reward += batch as f64 * self.tokens_per_row[i];
            after.batch[i] = 0;
            after.residual[i] = 0;
            ended = Some(i);
            arrivals = combine(&arrivals, self.outcomes_of(i, batch));
        }
        let successors = arrivals
            .into_iter()
            .map(|(added, p)| {
                let mut s = after;
                for j in 0..self.models {
                    s.queued[j] += added[j];
                }
                self.launch(&mut s, ended);
                (s, p)
            })
            .collect();
        (holding, reward, successors)
    }

    fn outcomes_of(&mut self, model: usize, batch: usize) -> &[Outcome] {
        if self.outcomes[model][batch].is_none() {
            self.outcomes[model][batch] = Some(multinomial(&self.route[model], batch));
        }
        self.outcomes[model][batch].as_deref().expect("filled above")
    }
}

/// Every way `rows` requests split over destinations with probabilities `probs`.
fn multinomial(probs: &[f64], rows: usize) -> Vec<Outcome> {
    let ln_fact: Vec<f64> = (0..=rows)
        .scan(0.0, |acc, k| {
            if k > 0 {
                *acc += (k as f64).ln();
            }
            Some(*acc)
        })
        .collect();
    let destinations: Vec<usize> = (0..probs.len()).filter(|&j| probs[j] > 0.0).collect();
    let mut out = Vec::new();
    let mut counts = [0u8; MAX_MODELS];
    split(&destinations, rows, &mut counts, &mut |counts| {
        let ln_p: f64 = ln_fact[rows]
            + destinations.iter().map(|&j| counts[j] as f64 * probs[j].ln() - ln_fact[counts[j] as usize]).sum::<f64>();
        let p = ln_p.exp();
        if p >= NEGLIGIBLE {
            out.push((*counts, p));
        }
    });
    let total: f64 = out.iter().map(|(_, p)| p).sum();
    out.iter_mut().for_each(|(_, p)| *p /= total);
    out
}

fn split(destinations: &[usize], rows: usize, counts: &mut [u8; MAX_MODELS], emit: &mut dyn FnMut(&[u8; MAX_MODELS])) {
    match destinations {
        [] => {}
        [last] => {
            counts[*last] = rows as u8;
            emit(counts);
            counts[*last] = 0;
        }
        [first, rest @ ..] => {
            for here in 0..=rows {
                counts[*first] = here as u8;
                split(rest, rows - here, counts, emit);
            }
            counts[*first] = 0;
        }
    }
}

/// Arrivals from two independent groups of completing steps.
fn combine(a: &[Outcome], b: &[Outcome]) -> Vec<Outcome> {
    let mut out = Vec::with_capacity(a.len() * b.len());
    for (x, p) in a {
        for (y, q) in b {
            let mut sum = *x;
            sum.iter_mut().zip(y).for_each(|(s, y)| *s += y);
            out.push((sum, p * q));
        }
    }
    out
}

fn merge_duplicates(row: &mut Vec<(u32, f64)>) {
    row.sort_unstable_by_key(|(t, _)| *t);
    row.dedup_by(|later, kept| {
        if later.0 == kept.0 {
            kept.1 += later.1;
            true
        } else {
            false
        }
    });
}
