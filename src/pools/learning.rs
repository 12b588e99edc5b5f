//! The dispatcher's shared, learning state: the estimator, the running estimator
//! error per category and the tally of routing decisions, with their metrics. One
//! short lock per request at dispatch and one at finish; nothing is tokenized.

use std::sync::{Mutex, MutexGuard};

use serde::Serialize;
use tokenrouter_core::pool::{
    BudgetEstimator, Calibration, Category, ErrorTally, EstimatorConfig, PoolChoice, RouteOutcome, RouteTally,
};

pub struct Learning {
    state: Mutex<State>,
}

struct State {
    estimator: BudgetEstimator,
    errors: ErrorTally,
    routes: RouteTally,
}

/// A copy of the state, for tests and reports.
#[derive(Debug, Clone, Serialize)]
pub struct LearningSnapshot {
    pub routes: RouteTally,
    /// Per category: calibration, c*, MAPE of the point estimate (None before feedback).
    pub categories: Vec<(Category, Calibration, f64, Option<f64>)>,
}

impl Learning {
    pub fn new(config: EstimatorConfig) -> Self {
        let state = State {
            estimator: BudgetEstimator::new(config),
            errors: ErrorTally::default(),
            routes: RouteTally::default(),
        };
        Learning { state: Mutex::new(state) }
    }

    /// The state, even after a panic elsewhere: every update leaves it consistent.
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn budget(&self, category: Category, bytes: usize, max_tokens: usize) -> usize {
        self.state().estimator.budget(category, bytes, max_tokens)
    }

    pub fn record_route(&self, choice: PoolChoice, outcome: RouteOutcome) {
        let rate = {
            let mut s = self.state();
            s.routes.add(choice, outcome);
            s.routes.misroute_rate()
        };
        metrics::counter!("tokenrouter_pool_routed_total", "pool" => choice.as_str(), "outcome" => outcome.as_str())
            .increment(1);
        metrics::gauge!("tokenrouter_pool_misroute_rate").set(rate);
    }

    /// A finished request's exact prompt size calibrates its category.
    pub fn observe(&self, category: Category, bytes: usize, prompt_tokens: usize) {
        let (calibration, conservative, mape) = {
            let mut s = self.state();
            let Some(feedback) = s.estimator.observe(category, bytes, prompt_tokens) else { return };
            s.errors.add(&feedback);
            let c = s.estimator.calibration(category);
            (c, s.estimator.conservative_ratio(category), s.errors.mape(category).unwrap_or(0.0))
        };
        let label = category.as_str();
        metrics::counter!("tokenrouter_pool_feedback_total", "category" => label).increment(1);
        metrics::gauge!("tokenrouter_pool_estimator_mape", "category" => label).set(mape);
        metrics::gauge!("tokenrouter_pool_bytes_per_token", "category" => label).set(calibration.ratio);
        metrics::gauge!("tokenrouter_pool_bytes_per_token_conservative", "category" => label).set(conservative);
    }

    pub fn snapshot(&self) -> LearningSnapshot {
        let s = self.state();
        let categories = Category::ALL
            .iter()
            .map(|&c| (c, s.estimator.calibration(c), s.estimator.conservative_ratio(c), s.errors.mape(c)))
            .collect();
        LearningSnapshot { routes: s.routes, categories }
    }
}
