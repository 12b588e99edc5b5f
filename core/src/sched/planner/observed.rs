//! Planner inputs from what the engine measured while serving: each model's step cost
//! against the tokens it fed (corrected toward a start-up profile where one exists),
//! the tokens a row feeds there, where requests went after each step, and what those
//! steps committed.

use super::cost::{corrected, latency_by_rows, served_cost};
use super::{LatencyTable, PlanError, PlannerInput};
use crate::sched::request::draft_model;
use crate::sched::SubserverStats;

/// A batch size needs this many observed steps before its latency is trusted.
const MIN_STEPS_PER_POINT: u64 = 3;

/// Builds the planner's view of a deployment from per-model statistics (in engine
/// order), usually the difference of two snapshots over a recent window. `priors` holds
/// each model's profiled cost by tokens where known (missing entries: none). Models
/// never stepped in the window take the fastest observed latency: no request reaches
/// them, so it only has to be a valid number.
pub fn input_from_stats(
    stats: &[SubserverStats],
    priors: &[Option<LatencyTable>],
    entry_model: usize,
    max_batch: usize,
) -> Result<PlannerInput, PlanError> {
    let models = stats.len();
    let legs: Vec<DraftLegs> = (0..models).map(|i| DraftLegs::of(i, stats)).collect();
    let measured: Vec<Option<LatencyTable>> = stats
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let per_row = match corrected(priors.get(i).and_then(Option::as_ref), served_cost(s)) {
                Some(cost) => Some(latency_by_rows(&cost, s.tokens_per_row().unwrap_or(1.0), max_batch)),
                None => latency_by_rows_served(s),
            };
            per_row.map(|t| t.scaled(legs[i].steps_per_visit(s)))
        })
        .collect();
    let fastest = stats
        .iter()
        .zip(&measured)
        .filter(|(s, _)| s.steps > 0)
        .filter_map(|(_, t)| t.as_ref())
        .map(|t| t.at(1))
        .fold(f64::INFINITY, f64::min);
    if !fastest.is_finite() {
        return Err(PlanError::NoObservations);
    }
    let latencies = measured.into_iter().map(|t| t.unwrap_or_else(|| LatencyTable::constant(fastest))).collect();
    let (route, commit) = (0..models).map(|i| routing_of(i, &stats[i], &legs[i])).unzip();
    Ok(PlannerInput { latencies, route, commit, max_batch, entry_model, delta_ms: None, exclusive: false })
}

/// Counters written before steps were kept by tokens (saved sweeps, older servers):
/// latency by the rows steps ran.
fn latency_by_rows_served(stats: &SubserverStats) -> Option<LatencyTable> {
    let points = stats
        .steps_by_rows
        .iter()
        .zip(&stats.seconds_by_rows)
        .enumerate()
        .filter(|(_, (steps, _))| **steps >= MIN_STEPS_PER_POINT)
        .map(|(rows, (steps, seconds))| (rows, seconds * 1e3 / *steps as f64));
    LatencyTable::from_points(points)
}

/// Row i of the routing and commit matrices. A row that stays commits its token and the
/// draft tokens its verify step kept (speculative decoding: a verify row commits up to
/// k + 1); of the rest, the tokens committed beyond the stays belong to the rows that moved.
///
/// Draft-model rounds are legs of the chain too: a target's row that asks its draft model
/// for guesses moves there having committed its token (and the guesses it kept), and the
/// round on the draft model, one visit of several steps, commits nothing and goes back.
fn routing_of(model: usize, s: &SubserverStats, legs: &DraftLegs) -> (Vec<f64>, Vec<f64>) {
    let models = legs.asks.len();
    let routed: Vec<f64> = (0..models).map(|j| s.handoffs_to.get(j).copied().unwrap_or(0) as f64).collect();
    let moved: Vec<f64> = (0..models).map(|j| routed[j] + legs.asks[j] + legs.returns[j]).collect();
    let total_moved: f64 = moved.iter().sum();
    let rows = legs.visits(s).max(total_moved);
    let mut route = vec![0.0; models];
    let mut commit = vec![1.0; models];
    if rows == 0.0 {
        route[model] = 1.0;
        return (route, commit);
    }
    for j in (0..models).filter(|&j| j != model) {
        route[j] = moved[j] / rows;
    }
    route[model] = (1.0 - route.iter().sum::<f64>()).max(0.0);
    let stays = rows - total_moved;
    let asks: f64 = legs.asks.iter().sum();
    let kept_drafts = s.accepted_draft_tokens as f64;
    let total_routed: f64 = routed.iter().sum();
    let own_tokens = (s.tokens_committed as f64 - kept_drafts).max(0.0);
    let per_routed = match total_routed > 0.0 {
        true => ((own_tokens - stays - asks) / total_routed).clamp(0.0, 1.0),
        false => 0.0,
    };
    // Kept guesses go with the rows that verified them: on to the next round when the
    // request drafts with a model, else (suffix and n-gram drafts) staying here.
    let kept_per_ask = if asks > 0.0 { kept_drafts / asks } else { 0.0 };
    for j in (0..models).filter(|&j| j != model && moved[j] > 0.0) {
        commit[j] = (routed[j] * per_routed + legs.asks[j] * (1.0 + kept_per_ask)) / moved[j];
    }
    if stays > 0.0 && asks == 0.0 {
        commit[model] = 1.0 + kept_drafts / stays;
    }
    (route, commit)
}

/// A model's draft-model legs in a window, by peer: rounds it asked of a draft model, and
/// rounds it answered for a target (each ends with one row going back).
struct DraftLegs {
    asks: Vec<f64>,
    returns: Vec<f64>,
}

impl DraftLegs {
    fn of(model: usize, stats: &[SubserverStats]) -> Self {
        let models = stats.len();
        let asks = (0..models)
            .map(|j| match draft_model(model) == Some(j) && j != model {
                true => stats[model].draft_rounds as f64,
                false => 0.0,
            })
            .collect();
        let returns = (0..models)
            .map(|j| match draft_model(j) == Some(model) && j != model {
                true => stats[j].draft_rounds as f64,
                false => 0.0,
            })
            .collect();
        DraftLegs { asks, returns }
    }

    /// Visits of requests to this model: its rows, with each round it answered counted
    /// once. A round's guesses are steps in a row for the same requests, so the chain
    /// takes a round as one visit that costs its steps: requests that asked together
    /// come back together, as they do in the engine.
    fn visits(&self, s: &SubserverStats) -> f64 {
        let guesses = (s.drafts_sampled as f64).min(s.rows as f64);
        s.rows as f64 - guesses + self.returns.iter().sum::<f64>()
    }

    fn steps_per_visit(&self, s: &SubserverStats) -> f64 {
        match self.visits(s) {
            visits if visits > 0.0 && s.drafts_sampled > 0 => (s.rows as f64 / visits).max(1.0),
            _ => 1.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sched::planner::predict;
    use std::time::Duration;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-6
    }

    /// Stats from steps given as (rows, tokens fed, how many, milliseconds each).
    fn stats(rows: u64, committed: u64, handoffs_to: Vec<u64>, steps: &[(usize, usize, u64, f64)]) -> SubserverStats {
        let mut s = SubserverStats { rows, tokens_committed: committed, handoffs_to, ..Default::default() };
        for &(step_rows, tokens, count, ms) in steps {
            for _ in 0..count {
                s.record_step(step_rows, tokens, Duration::from_secs_f64(ms / 1e3));
                s.steps += 1;
                s.tokens_fed += tokens as u64;
            }
        }
        s
    }

    #[test]
    fn delegation_is_read_back_from_the_counts() {
        // Small: 1000 rows, 300 delegated (their tokens dropped); large: 300 rows, all back.
        let small = stats(1000, 700, vec![0, 300], &[(2, 2, 100, 6.0), (4, 4, 200, 7.0), (9, 9, 1, 50.0)]);
        let large = stats(300, 300, vec![300, 0], &[(1, 1, 50, 28.0), (3, 3, 80, 31.0)]);
        let input = input_from_stats(&[small, large], &[], 0, 64).unwrap();
        assert!((input.route[0][1] - 0.3).abs() < 1e-12 && (input.route[0][0] - 0.7).abs() < 1e-12);
        assert_eq!(input.route[1], vec![1.0, 0.0]);
        assert_eq!(input.commit[0][1], 0.0);
        assert_eq!(input.commit[1][0], 1.0);
        // The single step of 9 tokens is too few to trust: the 4-token cost goes on.
        assert!(close(input.latencies[0].at(2), 6.0) && close(input.latencies[0].at(9), 7.0 + 0.5 * 5.0));
        input.validate().unwrap();
    }

    #[test]
    fn a_verify_row_commits_the_drafts_it_kept_and_costs_the_tokens_it_fed() {
        // 100 rows, 40 of them verifying 4 guesses each (160 guesses fed, 90 kept).
        let mut large = stats(100, 190, vec![0, 0], &[(1, 1, 60, 25.0), (1, 5, 40, 75.0)]);
        large.accepted_draft_tokens = 90;
        let small = stats(10, 10, vec![0, 0], &[(1, 1, 10, 5.0)]);
        let input = input_from_stats(&[small.clone(), large.clone()], &[], 1, 64).unwrap();
        assert!(close(input.commit[1][1], 1.9), "{:?}", input.commit);
        // The row's cost is that of the tokens rows feed on average (2.6 here).
        assert!(input.latencies[1].at(1) > 25.0 && input.latencies[1].at(1) < 75.0, "{:?}", input.latencies[1]);
        // With moves: the moved rows' commit is read from the tokens the verify steps did not add.
        large.handoffs_to = vec![20, 0];
        let input = input_from_stats(&[small, large], &[], 1, 64).unwrap();
        assert!(close(input.commit[1][0], 1.0) && close(input.commit[1][1], 1.0 + 90.0 / 80.0), "{:?}", input.commit);
        input.validate().unwrap();
    }

    #[test]
    fn a_draft_model_round_is_a_leg_whose_guesses_commit_nothing() {
        // The target (model 1): 90 verify rows of 5 tokens, each committing its token and
        // then asking the draft model for 4 guesses; 150 guesses were kept in all.
        let mut large = stats(90, 240, vec![0, 0], &[(1, 5, 90, 30.0)]);
        (large.accepted_draft_tokens, large.draft_rounds) = (150, 90);
        // The draft model (model 0): 360 rows, one guess each, no routing of its own.
        let mut small = stats(360, 0, vec![0, 0], &[(1, 1, 360, 5.0)]);
        small.drafts_sampled = 360;
        let input = input_from_stats(&[small, large], &[], 1, 64).unwrap();
        assert_eq!(input.route[1], vec![1.0, 0.0]);
        assert!(close(input.commit[1][0], 1.0 + 150.0 / 90.0), "{:?}", input.commit);
        // A round is one visit of four steps, and it goes back.
        assert_eq!(input.route[0], vec![0.0, 1.0]);
        assert_eq!(input.commit[0][1], 0.0);
        assert!(close(input.latencies[0].at(1), 20.0), "{:?}", input.latencies[0]);
        input.validate().unwrap();
        // A 30-ms verify step and four 5-ms guesses a round: 240 tokens in 90 rounds. The
        // requests that ask together draft together (a geometric number of guesses each
        // would scatter them), so N = 4 runs every step with four rows.
        for n in [1, 4] {
            let served = n as f64 * 240.0 / (90.0 * 0.050);
            let predicted = predict(&input, n, &[1, 1]).unwrap().tokens_per_sec;
            assert!((predicted - served).abs() < 1e-6 * served, "N = {n}: {predicted} vs {served}");
        }
    }

    #[test]
    fn a_row_of_the_large_model_costs_the_tokens_it_catches_up() {
        // The large model's rows each feed 10 tokens (extends after delegations).
        let small = stats(1000, 900, vec![0, 100], &[(1, 1, 400, 5.0), (2, 2, 300, 5.5)]);
        let large = stats(100, 100, vec![100, 0], &[(1, 10, 80, 20.0), (2, 20, 10, 30.0)]);
        let input = input_from_stats(&[small, large], &[], 0, 64).unwrap();
        assert!(close(input.latencies[1].at(1), 20.0) && close(input.latencies[1].at(2), 30.0));
        // Four rows feed 40 tokens: the last segment, 1 ms a token.
        assert!(close(input.latencies[1].at(4), 50.0));
        // A profile says 40 tokens cost twice 20: the served scale (1×) keeps it.
        let prior = LatencyTable::from_points([(10, 20.0), (20, 30.0), (40, 40.0)]).unwrap();
        let large = stats(100, 100, vec![100, 0], &[(1, 10, 80, 20.0), (2, 20, 10, 30.0)]);
        let small = stats(1000, 900, vec![0, 100], &[(1, 1, 400, 5.0)]);
        let input = input_from_stats(&[small, large], &[None, Some(prior)], 0, 64).unwrap();
        assert!(close(input.latencies[1].at(4), 40.0));
    }

    #[test]
    fn an_unused_model_gets_a_harmless_latency_and_nothing_observed_is_an_error() {
        let small = stats(500, 500, vec![0, 0], &[(1, 1, 500, 5.0)]);
        let input = input_from_stats(&[small, SubserverStats::default()], &[], 0, 64).unwrap();
        assert!(close(input.latencies[1].at(1), 5.0));
        assert_eq!(input.route[1], vec![0.0, 1.0]);
        assert_eq!(
            input_from_stats(&[SubserverStats::default(), SubserverStats::default()], &[], 0, 64),
            Err(PlanError::NoObservations)
        );
    }
}
