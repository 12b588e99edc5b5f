//! The stationary distribution of the embedded chain (Gauss–Seidel on π = πP, sparse)
//! and the throughput it implies: T = Σ π·reward / Σ π·τ.

use serde::Serialize;

use super::chain::Chain;
use super::PlannerInput;

const MAX_SWEEPS: usize = 20_000;
/// Stop when a sweep moves the distribution by less than this (L1).
const TOLERANCE: f64 = 1e-11;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Prediction {
    pub tokens_per_sec: f64,
    /// Per model: mean rows of a step.
    pub mean_batch: Vec<f64>,
    /// Per model: fraction of time a step is running.
    pub busy_fraction: Vec<f64>,
    /// Per model: steps per second.
    pub steps_per_sec: Vec<f64>,
    pub states: usize,
    pub sweeps: usize,
    pub converged: bool,
}

/// Incoming transitions per state, the self-loop kept apart for Gauss–Seidel.
struct Incoming {
    start: Vec<usize>,
    source: Vec<u32>,
    probability: Vec<f64>,
    self_loop: Vec<f64>,
}

fn transpose(chain: &Chain) -> Incoming {
    let n = chain.states.len();
    let mut counts = vec![0usize; n + 1];
    let mut self_loop = vec![0.0; n];
    for from in 0..n {
        for e in chain.row_start[from]..chain.row_start[from + 1] {
            let to = chain.target[e] as usize;
            if to == from {
                self_loop[from] += chain.probability[e];
            } else {
                counts[to + 1] += 1;
            }
        }
    }
    for i in 0..n {
        counts[i + 1] += counts[i];
    }
    let mut fill = counts.clone();
    let mut source = vec![0u32; counts[n]];
    let mut probability = vec![0.0; counts[n]];
    for from in 0..n {
        for e in chain.row_start[from]..chain.row_start[from + 1] {
            let to = chain.target[e] as usize;
            if to != from {
                source[fill[to]] = from as u32;
                probability[fill[to]] = chain.probability[e];
                fill[to] += 1;
            }
        }
    }
    Incoming { start: counts, source, probability, self_loop }
}

/// π of the embedded chain; transient states end with (near) zero mass.
fn stationary(chain: &Chain) -> (Vec<f64>, usize, bool) {
    let n = chain.states.len();
    let incoming = transpose(chain);
    let mut pi = vec![1.0 / n as f64; n];
    for sweep in 1..=MAX_SWEEPS {
        let mut change = 0.0;
        for j in 0..n {
            let stay = incoming.self_loop[j];
            if stay >= 1.0 - 1e-12 {
                continue; // absorbing: its mass only grows from its inflow, kept as is
            }
            let inflow: f64 = (incoming.start[j]..incoming.start[j + 1])
                .map(|e| pi[incoming.source[e] as usize] * incoming.probability[e])
                .sum();
            let updated = inflow / (1.0 - stay);
            change += (updated - pi[j]).abs();
            pi[j] = updated;
        }
        let total: f64 = pi.iter().sum();
        pi.iter_mut().for_each(|p| *p /= total);
        if change / total < TOLERANCE {
            return (pi, sweep, true);
        }
    }
    (pi, MAX_SWEEPS, false)
}

pub(super) fn stationary_throughput(chain: &Chain, input: &PlannerInput) -> Prediction {
    let (pi, sweeps, converged) = stationary(chain);
    let models = input.models();
    let delta_s = input.delta_ms() / 1e3;
    let mut tokens = 0.0;
    let mut time = 0.0;
    let mut busy = vec![0.0; models];
    let mut steps = vec![0.0; models];
    let mut rows = vec![0.0; models];
    for (s, state) in chain.states.iter().enumerate() {
        let (p, holding) = (pi[s], chain.holding[s] as f64);
        tokens += p * chain.reward[s];
        time += p * holding;
        for i in 0..models {
            if state.batch[i] == 0 {
                continue;
            }
            busy[i] += p * holding;
            if state.residual[i] == chain.holding[s] {
                steps[i] += p;
                rows[i] += p * state.batch[i] as f64;
            }
        }
    }
    let seconds = time * delta_s;
    Prediction {
        tokens_per_sec: tokens / seconds,
        mean_batch: rows.iter().zip(&steps).map(|(r, s)| if *s > 0.0 { r / s } else { 0.0 }).collect(),
        busy_fraction: busy.iter().map(|b| b / time).collect(),
        steps_per_sec: steps.iter().map(|s| s / seconds).collect(),
        states: chain.states.len(),
        sweeps,
        converged,
    }
}
