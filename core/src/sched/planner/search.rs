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
    /// Threshold vectors evaluated.
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

/// The best thresholds at N. Ties (within a part in a million) go to the smaller
/// thresholds, which add less waiting.
pub fn search(input: &PlannerInput, n: usize) -> Result<Plan, PlanError> {
    input.validate()?;
    let grid = feasible_thresholds(input.models(), n);
    let mut candidates: Vec<Candidate> = grid
        .into_par_iter()
        .map(|thresholds| predict(input, n, &thresholds).map(|prediction| Candidate { thresholds, prediction }))
        .collect::<Result<_, _>>()?;
    let evaluated = candidates.len();
    candidates.sort_by(|a, b| {
        let (ta, tb) = (a.prediction.tokens_per_sec, b.prediction.tokens_per_sec);
        if (ta - tb).abs() <= 1e-6 * ta.max(tb) {
            a.thresholds.iter().sum::<usize>().cmp(&b.thresholds.iter().sum()).then(a.thresholds.cmp(&b.thresholds))
        } else {
            tb.total_cmp(&ta)
        }
    });
    let mut ranked = candidates.into_iter();
    let best = ranked.next().ok_or(PlanError::Concurrency(n))?;
    Ok(Plan { n, best, runner_up: ranked.next(), evaluated })
}

/// The best thresholds for each N.
pub fn plan_table(input: &PlannerInput, concurrencies: &[usize]) -> Result<Vec<Plan>, PlanError> {
    concurrencies.iter().map(|&n| search(input, n)).collect()
}
