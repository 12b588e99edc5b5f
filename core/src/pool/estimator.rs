//! The token-budget estimator: budget = ceil(bytes / c*) + max_tokens, without a
//! tokenizer. Each category keeps an EMA ĉ of bytes per prompt token, learned from the
//! `usage.prompt_tokens` of finished requests, and an EMA σ̂ of its absolute error;
//! c* = ĉ − γ·σ̂ is the ratio dispatch uses, so the estimate errs long: an estimate too
//! short sends a request to a pool that must refuse it, one too long only costs a
//! little efficiency.

use serde::{Deserialize, Serialize};

use super::category::Category;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EstimatorConfig {
    /// Starting bytes per token, per category (prose, code, CJK), until feedback arrives.
    pub prior_bytes_per_token: CategoryRatios,
    /// EMA weight of the old value: ĉ ← β·ĉ + (1 − β)·bytes/tokens.
    pub beta: f64,
    /// Margin in units of σ̂: c* = ĉ − γ·σ̂.
    pub gamma: f64,
    /// c* never goes below this (one byte per token is UTF-8's floor for text).
    pub min_bytes_per_token: f64,
}

/// One value per category.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CategoryRatios {
    pub prose: f64,
    pub code: f64,
    pub cjk: f64,
}

impl CategoryRatios {
    pub fn get(&self, category: Category) -> f64 {
        match category {
            Category::Prose => self.prose,
            Category::Code => self.code,
            Category::Cjk => self.cjk,
        }
    }
}

impl Default for CategoryRatios {
    /// Measured with the Qwen3 and Llama-3 tokenizers (`tokenrouter pools estimate`,
    /// docs/pools.md): English 4.4, source code 4.2–4.3, Chinese technical text 3.8–4.2,
    /// rounded down so the prior errs long; feedback replaces them within tens of requests.
    fn default() -> Self {
        CategoryRatios { prose: 4.2, code: 4.0, cjk: 3.6 }
    }
}

impl Default for EstimatorConfig {
    fn default() -> Self {
        EstimatorConfig {
            prior_bytes_per_token: CategoryRatios::default(),
            beta: 0.95,
            gamma: 1.0,
            min_bytes_per_token: 1.0,
        }
    }
}

impl EstimatorConfig {
    /// What is wrong with the values, if anything (config validation).
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        let mut p = Vec::new();
        if !(0.0..1.0).contains(&self.beta) {
            p.push(("beta", format!("must be in [0, 1), got {}", self.beta)));
        }
        if !(self.gamma >= 0.0 && self.gamma.is_finite()) {
            p.push(("gamma", format!("must be a finite number ≥ 0, got {}", self.gamma)));
        }
        if !(self.min_bytes_per_token > 0.0) {
            p.push(("min_bytes_per_token", format!("must be > 0, got {}", self.min_bytes_per_token)));
        }
        for c in Category::ALL {
            let v = self.prior_bytes_per_token.get(c);
            if !(v > 0.0 && v.is_finite()) {
                p.push(("prior_bytes_per_token", format!("{} must be > 0, got {v}", c.as_str())));
            }
        }
        p
    }
}

/// One category's calibration state.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Calibration {
    /// ĉ: EMA of bytes per token.
    pub ratio: f64,
    /// σ̂: EMA of |observed ratio − ĉ|.
    pub abs_error: f64,
    pub observations: u64,
}

/// What one feedback taught: the prompt tokens estimated before it, and the truth.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Feedback {
    pub category: Category,
    /// From ĉ alone (the calibration's accuracy).
    pub point_estimate: usize,
    /// From c* (what dispatch used).
    pub conservative_estimate: usize,
    pub actual: usize,
}

impl Feedback {
    /// |point − actual| / actual.
    pub fn abs_pct_error(&self) -> f64 {
        (self.point_estimate as f64 - self.actual as f64).abs() / self.actual.max(1) as f64
    }
}

#[derive(Debug, Clone)]
pub struct BudgetEstimator {
    config: EstimatorConfig,
    calibrations: [Calibration; 3],
}

impl BudgetEstimator {
    pub fn new(config: EstimatorConfig) -> Self {
        let start = |c: Category| {
            let ratio = config.prior_bytes_per_token.get(c);
            // A prior is a guess: start with a tenth of it as error, so c* keeps a margin
            // until feedback measures the real spread.
            Calibration { ratio, abs_error: 0.1 * ratio, observations: 0 }
        };
        let calibrations = Category::ALL.map(start);
        BudgetEstimator { config, calibrations }
    }

    pub fn config(&self) -> &EstimatorConfig {
        &self.config
    }

    pub fn calibration(&self, category: Category) -> Calibration {
        self.calibrations[category.index()]
    }

    /// c* = max(ĉ − γ·σ̂, floor).
    pub fn conservative_ratio(&self, category: Category) -> f64 {
        let c = self.calibration(category);
        (c.ratio - self.config.gamma * c.abs_error).max(self.config.min_bytes_per_token)
    }

    /// Estimated prompt tokens: ceil(bytes / c*).
    pub fn prompt_tokens(&self, category: Category, bytes: usize) -> usize {
        (bytes as f64 / self.conservative_ratio(category)).ceil() as usize
    }

    /// The total token budget: estimated prompt tokens + the output cap.
    pub fn budget(&self, category: Category, bytes: usize, max_tokens: usize) -> usize {
        self.prompt_tokens(category, bytes) + max_tokens
    }

    /// Learns from a finished request's exact prompt token count. Zero-sized
    /// observations teach nothing and are skipped.
    pub fn observe(&mut self, category: Category, bytes: usize, prompt_tokens: usize) -> Option<Feedback> {
        if bytes == 0 || prompt_tokens == 0 {
            return None;
        }
        let feedback = Feedback {
            category,
            point_estimate: (bytes as f64 / self.calibration(category).ratio).round() as usize,
            conservative_estimate: self.prompt_tokens(category, bytes),
            actual: prompt_tokens,
        };
        let beta = self.config.beta;
        let observed = bytes as f64 / prompt_tokens as f64;
        let c = &mut self.calibrations[category.index()];
        c.abs_error = beta * c.abs_error + (1.0 - beta) * (observed - c.ratio).abs();
        c.ratio = beta * c.ratio + (1.0 - beta) * observed;
        c.observations += 1;
        Some(feedback)
    }
}

/// Running mean absolute percentage error per category (for metrics and reports).
#[derive(Debug, Clone, Default)]
pub struct ErrorTally {
    sums: [f64; 3],
    counts: [u64; 3],
}

impl ErrorTally {
    pub fn add(&mut self, feedback: &Feedback) {
        self.sums[feedback.category.index()] += feedback.abs_pct_error();
        self.counts[feedback.category.index()] += 1;
    }

    /// Mean |point − actual| / actual, or `None` without observations.
    pub fn mape(&self, category: Category) -> Option<f64> {
        let i = category.index();
        (self.counts[i] > 0).then(|| self.sums[i] / self.counts[i] as f64)
    }

    pub fn count(&self, category: Category) -> u64 {
        self.counts[category.index()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;

    /// Feedback from a source whose true ratio is `ratio` with relative noise `cv`.
    fn feed(e: &mut BudgetEstimator, category: Category, ratio: f64, cv: f64, n: usize, seed: u64) -> ErrorTally {
        let mut rng = SplitMix64(seed);
        let mut tally = ErrorTally::default();
        for _ in 0..n {
            let tokens = 50 + rng.below(2000) as usize;
            let per_token = ratio * (1.0 + cv * rng.normal() as f64);
            let bytes = (tokens as f64 * per_token).round() as usize;
            if let Some(f) = e.observe(category, bytes, tokens) {
                tally.add(&f);
            }
        }
        tally
    }

    #[test]
    fn calibration_converges_to_the_true_ratio_from_a_wrong_prior() {
        let mut e = BudgetEstimator::new(EstimatorConfig::default());
        feed(&mut e, Category::Code, 2.6, 0.05, 400, 1);
        let c = e.calibration(Category::Code);
        assert!((c.ratio - 2.6).abs() < 0.05, "ĉ = {}", c.ratio);
        // |x − ĉ| of a normal with sd 0.13 averages 0.10.
        assert!((c.abs_error - 0.104).abs() < 0.04, "σ̂ = {}", c.abs_error);
        assert_eq!(e.calibration(Category::Prose).observations, 0, "other categories untouched");
    }

    #[test]
    fn the_margin_makes_estimates_err_long() {
        let mut e = BudgetEstimator::new(EstimatorConfig { gamma: 1.5, ..EstimatorConfig::default() });
        feed(&mut e, Category::Prose, 4.0, 0.08, 300, 2);
        let mut rng = SplitMix64(3);
        let (mut under, n) = (0, 2000);
        for _ in 0..n {
            let tokens = 100 + rng.below(3000) as usize;
            let bytes = (tokens as f64 * 4.0 * (1.0 + 0.08 * rng.normal() as f64)).round() as usize;
            under += usize::from(e.prompt_tokens(Category::Prose, bytes) < tokens);
        }
        // γ = 1.5 mean absolute deviations ≈ 1.2 σ: about 11% of a normal lies beyond.
        assert!((under as f64 / n as f64) < 0.16, "{under} of {n} under-estimated");
        assert!(e.conservative_ratio(Category::Prose) < e.calibration(Category::Prose).ratio);
    }

    #[test]
    fn mape_after_convergence_reflects_the_noise_only() {
        let mut e = BudgetEstimator::new(EstimatorConfig::default());
        feed(&mut e, Category::Cjk, 2.4, 0.05, 300, 4);
        let tally = feed(&mut e, Category::Cjk, 2.4, 0.05, 1000, 5);
        let mape = tally.mape(Category::Cjk).unwrap();
        assert!(mape > 0.02 && mape < 0.06, "MAPE {mape}");
        assert_eq!(tally.mape(Category::Code), None);
    }

    #[test]
    fn budget_adds_the_output_cap_and_respects_the_floor() {
        let config = EstimatorConfig { gamma: 100.0, ..EstimatorConfig::default() };
        let e = BudgetEstimator::new(config);
        assert_eq!(e.conservative_ratio(Category::Prose), 1.0, "the floor holds");
        assert_eq!(e.budget(Category::Prose, 1000, 24), 1024);
        assert!(EstimatorConfig::default().problems().is_empty());
        assert_eq!(EstimatorConfig { beta: 1.0, ..EstimatorConfig::default() }.problems().len(), 1);
    }
}
