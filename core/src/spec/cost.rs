//! Whether a draft pays: a verify step feeds more tokens, and where a model's step
//! cost grows with them (a CPU, where even small steps are compute-bound) a guess
//! that is likely rejected costs more than it saves. The cost comes from the
//! subserver's own measured steps; the chance a guess is kept from the request's record.

/// A step's seconds as `intercept + per_token · tokens fed`, fitted to measured steps.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StepCost {
    pub intercept: f64,
    pub per_token: f64,
}

/// Steps longer than this (prompt chunks) say little about the short steps drafts make.
const SHORT_STEP_TOKENS: f64 = 64.0;

impl StepCost {
    /// The weighted least-squares line through (mean tokens fed, mean seconds, steps)
    /// points, from short steps where two or more sizes were measured, else from all;
    /// `None` until two sizes are known.
    pub fn fit(points: &[(f64, f64, u64)]) -> Option<StepCost> {
        let short: Vec<(f64, f64, u64)> =
            points.iter().copied().filter(|p| p.0 <= SHORT_STEP_TOKENS && p.2 > 0).collect();
        let points: Vec<(f64, f64, u64)> =
            if short.len() >= 2 { short } else { points.iter().copied().filter(|p| p.2 > 0).collect() };
        if points.len() < 2 {
            return None;
        }
        let w: f64 = points.iter().map(|p| p.2 as f64).sum();
        let mean_x = points.iter().map(|p| p.0 * p.2 as f64).sum::<f64>() / w;
        let mean_y = points.iter().map(|p| p.1 * p.2 as f64).sum::<f64>() / w;
        let sxx: f64 = points.iter().map(|p| p.2 as f64 * (p.0 - mean_x).powi(2)).sum();
        if sxx <= 0.0 {
            return None;
        }
        let sxy: f64 = points.iter().map(|p| p.2 as f64 * (p.0 - mean_x) * (p.1 - mean_y)).sum();
        let per_token = (sxy / sxx).max(0.0);
        Some(StepCost { intercept: (mean_y - per_token * mean_x).max(0.0), per_token })
    }

    pub fn seconds(&self, tokens: f64) -> f64 {
        self.intercept + self.per_token * tokens
    }
}

/// The draft length, up to `longest`, that saves the most time in a step of `step_tokens`
/// tokens without drafts: each guess kept saves a row what a token costs it in such a
/// step, and each guess fed costs `per_token`; guess `i` (from 1) is kept with chance
/// `kept(i)` given the ones before it were. Zero when no length saves anything.
pub fn best_draft_length(longest: usize, kept: impl Fn(usize) -> f64, step_tokens: usize, cost: &StepCost) -> usize {
    let step_tokens = step_tokens.max(1) as f64;
    let token_value = cost.seconds(step_tokens) / step_tokens;
    let (mut best, mut best_saving) = (0, 0.0);
    let (mut chance, mut expected_kept) = (1.0, 0.0);
    for k in 1..=longest {
        chance *= kept(k);
        expected_kept += chance;
        let saving = expected_kept * token_value - k as f64 * cost.per_token;
        if saving > best_saving {
            (best, best_saving) = (k, saving);
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Measured on SmolLM2-135M Q4_1, llama.cpp, 2 cores: 24.8 ms for 1 token, 35 for 2,
    /// 68 for 4.3, 125 for 8.9; prompt chunks of 215 and 306 tokens, 1.68 and 2.28 s.
    fn cpu() -> Vec<(f64, f64, u64)> {
        vec![
            (1.0, 0.0248, 2235),
            (2.0, 0.035, 12),
            (4.3, 0.0677, 59),
            (8.9, 0.1252, 104),
            (215.0, 1.68, 4),
            (306.0, 2.28, 2),
        ]
    }

    #[test]
    fn the_fit_follows_short_steps_when_they_are_measured() {
        let cost = StepCost::fit(&cpu()).unwrap();
        assert!((cost.per_token - 0.0128).abs() < 0.002, "{cost:?}");
        assert!((cost.seconds(1.0) - 0.0248).abs() < 0.003, "{cost:?}");
        // Only decodes and prompt chunks: the line through all of them.
        let cost = StepCost::fit(&[(1.0, 0.025, 100), (300.0, 2.3, 3)]).unwrap();
        assert!((cost.per_token - 0.0076).abs() < 0.001, "{cost:?}");
        assert_eq!(StepCost::fit(&[(1.0, 0.025, 100)]), None);
    }

    #[test]
    fn drafts_are_as_long_as_they_pay_and_none_where_nothing_does() {
        let cpu = StepCost::fit(&cpu()).unwrap();
        // A copied file: guesses nearly always kept, long drafts pay even on a CPU.
        assert!(best_draft_length(32, |_| 0.97, 1, &cpu) >= 12);
        // Three in four kept: short drafts.
        assert!((1..=4).contains(&best_draft_length(32, |_| 0.75, 1, &cpu)));
        // Rarely kept: none.
        assert_eq!(best_draft_length(32, |_| 0.3, 1, &cpu), 0);
        // At 16 rows a token is cheaper to a row than a guess is to the step: fewer or none.
        assert!(best_draft_length(32, |_| 0.75, 16, &cpu) < best_draft_length(32, |_| 0.75, 1, &cpu));
        // A card, where a step's tokens cost little beside its fixed part: long drafts even at 3 in 4.
        let card = StepCost { intercept: 0.010, per_token: 0.00005 };
        assert!(best_draft_length(32, |_| 0.75, 16, &card) >= 8);
        assert_eq!(best_draft_length(0, |_| 0.99, 1, &card), 0);
    }
}
