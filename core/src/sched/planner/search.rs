//! The threshold search: every B ∈ {1..N}^M with Σ(B_i − 1) < N, best predicted
//! throughput first.

use rayon::prelude::*;
use serde::Serialize;

use super::{feasible, predict, PlanError, PlannerInput, Prediction};

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Candidate {
    pub thresholds: Vec<usize>,
    pub prediction: Prediction,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plan {
    pub n: usize,
    pub best: Candidate,
    pub runner_up: Option<Candidate>,
    /// Chains solved (screening and refinement).
    pub evaluated: usize,
}

/// Every feasible threshold vector for M models at N requests, in lexicographic order.
pub fn feasible_thresholds(models: usize, n: usize) -> Vec<Vec<usize>> {
    let mut all = Vec::new();
    let mut current = vec![1usize; models];
    loop {
        if feasible(&current, n) {
            all.push(current.clone());
        }
        // Odometer over {1..N}^M; the sum bound prunes nothing here but keeps it simple.
        let Some(digit) = (0..models).rev().find(|&i| current[i] < n) else { return all };
        current[digit] += 1;
        current[digit + 1..].iter_mut().for_each(|b| *b = 1);
    }
}

/// How a search spends its time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SearchOptions {
    /// Screen every vector with a time unit this many times coarser than the input's,
    /// then solve only the best `refine` at the input's own (1 = no screening).
    pub coarsen: f64,
    pub refine: usize,
    /// Candidates predicted within this fraction of the best count as ties, and the
    /// smallest thresholds among them win: a threshold above 1 makes requests wait,
    /// and a gain below the model's own error is no reason to.
    pub tie_tolerance: f64,
}

impl Default for SearchOptions {
    /// Screening at 4δ keeps the ranking (tests compare it with exhaustive search)
    /// while cutting the states of a large-N chain about fourfold.
    fn default() -> Self {
        SearchOptions { coarsen: 4.0, refine: 8, tie_tolerance: 0.01 }
    }
}

impl SearchOptions {
    pub fn exhaustive() -> Self {
        SearchOptions { coarsen: 1.0, refine: usize::MAX, tie_tolerance: 0.01 }
    }
}

/// The best thresholds at N. Ties (within a part in a million) go to the smaller
/// thresholds, which add less waiting.
pub fn search(input: &PlannerInput, n: usize) -> Result<Plan, PlanError> {
    search_with(input, n, SearchOptions::default())
}

pub fn search_with(input: &PlannerInput, n: usize, options: SearchOptions) -> Result<Plan, PlanError> {
    input.validate()?;
    let mut grid = feasible_thresholds(input.models(), n);
    let mut evaluated = 0;
    if options.coarsen > 1.0 && grid.len() > options.refine {
        let coarse = PlannerInput { delta_ms: Some(input.delta_ms() * options.coarsen), ..input.clone() };
        let mut screened = evaluate(&coarse, n, grid)?;
        evaluated += screened.len();
        rank(&mut screened, 0.0);
        grid = screened.into_iter().take(options.refine).map(|c| c.thresholds).collect();
        // Eager launching is the tie-breaker's favourite: always solve it exactly.
        let eager = vec![1; input.models()];
        if !grid.contains(&eager) {
            grid.push(eager);
        }
    }
    let mut candidates = evaluate(input, n, grid)?;
    evaluated += candidates.len();
    rank(&mut candidates, options.tie_tolerance);
    let mut ranked = candidates.into_iter();
    let best = ranked.next().ok_or(PlanError::Concurrency(n))?;
    Ok(Plan { n, best, runner_up: ranked.next(), evaluated })
}

fn evaluate(input: &PlannerInput, n: usize, grid: Vec<Vec<usize>>) -> Result<Vec<Candidate>, PlanError> {
    grid.into_par_iter()
        .map(|thresholds| predict(input, n, &thresholds).map(|prediction| Candidate { thresholds, prediction }))
        .collect()
}

/// Best predicted first, except that the smallest thresholds within `tolerance` of the
/// best move to the front.
fn rank(candidates: &mut [Candidate], tolerance: f64) {
    sort_by_throughput(candidates);
    let Some(top) = candidates.first().map(|c| c.prediction.tokens_per_sec) else { return };
    let tied = candidates.iter().take_while(|c| c.prediction.tokens_per_sec >= top * (1.0 - tolerance)).count();
    let smallest = (0..tied)
        .min_by(|&a, &b| {
            let (x, y) = (&candidates[a].thresholds, &candidates[b].thresholds);
            x.iter().sum::<usize>().cmp(&y.iter().sum()).then(x.cmp(y))
        })
        .unwrap_or(0);
    candidates[..=smallest].rotate_right(1);
}

fn sort_by_throughput(candidates: &mut [Candidate]) {
    candidates.sort_by(|a, b| {
        let (ta, tb) = (a.prediction.tokens_per_sec, b.prediction.tokens_per_sec);
        if (ta - tb).abs() <= 1e-6 * ta.max(tb) {
            a.thresholds.iter().sum::<usize>().cmp(&b.thresholds.iter().sum()).then(a.thresholds.cmp(&b.thresholds))
        } else {
            tb.total_cmp(&ta)
        }
    });
}

/// The best thresholds for each N.
pub fn plan_table(
    input: &PlannerInput,
    concurrencies: &[usize],
    options: SearchOptions,
) -> Result<Vec<Plan>, PlanError> {
    concurrencies.iter().map(|&n| search_with(input, n, options)).collect()
}
