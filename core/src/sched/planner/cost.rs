//! A model's step cost against the tokens the step feeds, and the step latency by rows
//! that the chain needs, derived from it and the tokens a row feeds on that model.
//!
//! Rows alone mislead: a large model that catches up on what the small one wrote feeds
//! about 1/p tokens a row (ten at p = 0.1), a plain decode one. Served steps bucketed by
//! rows mix both, and the few steps at high rows make the last segment, which the chain
//! extrapolates, steep or flat by chance. Cost by tokens has points over a wide range even
//! at threshold 1 (extends are many tokens), and a start-up profile fills in the rest.

use super::LatencyTable;
use crate::model::profile::{profile_points, Profile};
use crate::sched::SubserverStats;

/// A token bucket needs this many observed steps before its cost is trusted.
const MIN_STEPS_PER_POINT: u64 = 3;

/// Cost by tokens fed (milliseconds at each mean bucket size) from served steps.
pub fn served_cost(stats: &SubserverStats) -> Option<LatencyTable> {
    let points = (0..stats.steps_by_tokens.len()).filter_map(|bucket| {
        let steps = stats.steps_by_tokens[bucket];
        let seconds = stats.seconds_by_tokens.get(bucket).copied().unwrap_or(0.0);
        let tokens = stats.tokens_by_bucket.get(bucket).copied().unwrap_or(0);
        (steps >= MIN_STEPS_PER_POINT && tokens > 0)
            .then(|| ((tokens as f64 / steps as f64).round() as usize, seconds * 1e3 / steps as f64))
    });
    LatencyTable::from_points(points)
}

/// Cost by tokens fed from a profile (see [`profile_points`]).
pub fn profile_cost(profile: &Profile) -> Option<LatencyTable> {
    LatencyTable::from_points(profile_points(profile))
}

/// What was served, where it was measured; elsewhere the prior (a profile), scaled by how
/// the served steps compare with it (the machine under load runs slower than it profiled).
pub fn corrected(prior: Option<&LatencyTable>, served: Option<LatencyTable>) -> Option<LatencyTable> {
    let (prior, served) = match (prior, served) {
        (None, served) => return served,
        (Some(prior), None) => return Some(prior.clone()),
        (Some(prior), Some(served)) => (prior, served),
    };
    let mut ratios: Vec<f64> = served.points().iter().map(|&(tokens, ms)| ms / prior.at(tokens)).collect();
    ratios.sort_by(f64::total_cmp);
    let scale = ratios[ratios.len() / 2];
    let (low, high) = (served.points()[0].0, served.points()[served.points().len() - 1].0);
    let outside = prior.points().iter().filter(|(tokens, _)| *tokens < low || *tokens > high);
    let points = served.points().iter().copied().chain(outside.map(|&(tokens, ms)| (tokens, ms * scale)));
    LatencyTable::from_points(points)
}

/// Step latency by rows for a model whose rows feed `tokens_per_row` tokens on average.
pub fn latency_by_rows(cost: &LatencyTable, tokens_per_row: f64, max_batch: usize) -> LatencyTable {
    let per_row = if tokens_per_row.is_finite() { tokens_per_row.max(1.0) } else { 1.0 };
    let points = (1..=max_batch.max(1)).map(|rows| (rows, cost.at((rows as f64 * per_row).round() as usize)));
    LatencyTable::from_points(points).unwrap_or_else(|| LatencyTable::constant(cost.at(1)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn served_cost_reads_mean_tokens_and_drops_thin_buckets() {
        let mut stats = SubserverStats::default();
        for _ in 0..4 {
            stats.record_step(1, 10, Duration::from_millis(20));
            stats.record_step(1, 11, Duration::from_millis(22));
            stats.record_step(3, 1, Duration::from_millis(5));
        }
        stats.record_step(8, 90, Duration::from_millis(200));
        let cost = served_cost(&stats).unwrap();
        // 1 token: 5 ms; 10 and 11 share a bucket: mean 10.5 tokens (rounds to 11), 21 ms.
        let points: Vec<(usize, f64)> = cost.points().iter().map(|&(t, ms)| (t, (ms * 1e6).round() / 1e6)).collect();
        assert_eq!(points, vec![(1, 5.0), (11, 21.0)]);
    }

    #[test]
    fn the_prior_fills_in_beyond_what_was_served_at_the_served_scale() {
        let prior = LatencyTable::from_points([(1, 10.0), (8, 12.0), (64, 40.0), (256, 150.0)]).unwrap();
        let served = LatencyTable::from_points([(1, 20.0), (8, 24.0)]).unwrap();
        let both = corrected(Some(&prior), Some(served.clone())).unwrap();
        assert_eq!(both.points(), &[(1, 20.0), (8, 24.0), (64, 80.0), (256, 300.0)]);
        assert_eq!(corrected(None, Some(served.clone())), Some(served));
        assert_eq!(corrected(Some(&prior), None), Some(prior));
    }

    #[test]
    fn rows_cost_their_tokens() {
        let cost = LatencyTable::from_points([(1, 10.0), (100, 109.0)]).unwrap();
        let decodes = latency_by_rows(&cost, 1.0, 8);
        let extends = latency_by_rows(&cost, 10.0, 8);
        assert_eq!((decodes.at(4), extends.at(4)), (13.0, 49.0));
        assert_eq!(decodes.at(1), 10.0);
        assert_eq!(latency_by_rows(&cost, f64::NAN, 2).at(2), 11.0);
    }
}
