//! The delayed-batching planner: a discrete-time Markov model of M subservers sharing
//! N closed-loop requests, solved for its stationary throughput, and a search over the
//! thresholds B that maximizes it (DESIGN §6).
//!
//! State per model: queued requests k_i, running batch b_i (0 = idle) and the residual
//! time r_i of the running step in units of δ. The chain is embedded at batch
//! completions: every step that ends releases its b_i requests to their next models
//! (multinomial over row i of the routing matrix P), idle models whose queue reached
//! B_i launch, and the time to the next completion is the holding time τ. Throughput
//! is expected committed tokens per completion over expected holding time.

mod chain;
pub mod cost;
mod latency;
mod observed;
mod replan;
mod search;
mod solve;
mod startup;
#[cfg(test)]
mod tests;

pub use latency::LatencyTable;
pub use observed::input_from_stats;
pub use replan::{PendingSwitch, PlannerStatus, Replan, ReplanConfig, Replanner, RuleSource, WindowEstimate};
pub use search::{feasible_thresholds, plan_table, search, search_with, Candidate, Plan, SearchOptions};
pub use solve::Prediction;
pub use startup::{
    startup_input, startup_plan, table_rule, StartupPlan, StartupSpec, WorkloadPrior, DEFAULT_DELEGATION_PRIOR,
    ONLINE_DELTA_DIVISOR, ONLINE_MAX_UNITS, STARTUP_CONCURRENCIES,
};

/// Most models the chain represents (state keys pack four models).
pub const MAX_MODELS: usize = 4;
/// Most concurrent requests the chain represents (queue lengths pack in a byte).
pub const MAX_REQUESTS: usize = 255;

/// What the planner knows about a deployment.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannerInput {
    /// Step latency of each model against its batch size.
    pub latencies: Vec<LatencyTable>,
    /// `route[i][j]`: probability that a request finishing a step on model i runs its
    /// next step on model j (rows sum to 1).
    pub route: Vec<Vec<f64>>,
    /// `commit[i][j]`: tokens a step on model i commits when the request goes on to j
    /// (a small-model token that a delegation replaces commits nothing).
    pub commit: Vec<Vec<f64>>,
    /// Largest batch one step takes (the engine's max batch rows).
    pub max_batch: usize,
    /// Where new requests start.
    pub entry_model: usize,
    /// Time unit of the chain; `None` takes the fastest step / 20.
    pub delta_ms: Option<f64>,
    /// The models take turns on one compute (shared cores or card): one steps at a
    /// time, and a model that waited gets the next turn.
    pub exclusive: bool,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PlanError {
    #[error("the planner needs 1 to {MAX_MODELS} models, got {0}")]
    ModelCount(usize),
    #[error("{what} has {got} rows or columns; the models are {models}")]
    Shape { what: &'static str, got: usize, models: usize },
    #[error("routing row {row} sums to {sum}, not 1")]
    RouteRow { row: usize, sum: f64 },
    #[error("{what} holds {value}, which is negative or not a number")]
    BadValue { what: &'static str, value: f64 },
    #[error("N = {0} is outside 1..={MAX_REQUESTS}")]
    Concurrency(usize),
    #[error("thresholds {thresholds:?} at N = {n} break Σ(B_i − 1) < N")]
    Deadlock { thresholds: Vec<usize>, n: usize },
    #[error("the chain grew past {limit} states; use a coarser time unit (delta) or fewer requests")]
    TooManyStates { limit: usize },
    #[error("no step has been observed on any model yet")]
    NoObservations,
    #[error("step latency {ms} ms spans {units} time units of δ = {delta_ms} ms; use a coarser δ")]
    LatencyRange { ms: f64, units: f64, delta_ms: f64 },
}

impl PlannerInput {
    /// Two models where the small one (0) delegates a position to the large one (1)
    /// with probability `p` and the large one writes that token and hands back: the
    /// `random` policy's pattern (and R2R's, R-Stitch's at their measured rates).
    pub fn delegation(small: LatencyTable, large: LatencyTable, p: f64) -> Self {
        PlannerInput {
            latencies: vec![small, large],
            route: vec![vec![1.0 - p, p], vec![1.0, 0.0]],
            commit: vec![vec![1.0, 0.0], vec![1.0, 1.0]],
            max_batch: 64,
            entry_model: 0,
            delta_ms: None,
            exclusive: false,
        }
    }

    pub fn models(&self) -> usize {
        self.latencies.len()
    }

    pub fn validate(&self) -> Result<(), PlanError> {
        let m = self.models();
        if m == 0 || m > MAX_MODELS {
            return Err(PlanError::ModelCount(m));
        }
        for (what, matrix) in [("route", &self.route), ("commit", &self.commit)] {
            if matrix.len() != m || matrix.iter().any(|row| row.len() != m) {
                let got = matrix.iter().map(Vec::len).find(|&l| l != m).unwrap_or(matrix.len());
                return Err(PlanError::Shape { what, got, models: m });
            }
            if let Some(&value) = matrix.iter().flatten().find(|v| !(**v >= 0.0)) {
                return Err(PlanError::BadValue { what, value });
            }
        }
        for (row, probs) in self.route.iter().enumerate() {
            let sum: f64 = probs.iter().sum();
            if (sum - 1.0).abs() > 1e-6 {
                return Err(PlanError::RouteRow { row, sum });
            }
        }
        if self.entry_model >= m {
            return Err(PlanError::Shape { what: "entry model", got: self.entry_model, models: m });
        }
        Ok(())
    }

    /// The same input on the coarser time unit used while serving (see
    /// [`ONLINE_DELTA_DIVISOR`]).
    /// The unit is also at least the slowest batch-1 step / [`ONLINE_MAX_UNITS`]: models
    /// far apart in speed (a 3M-parameter draft beside a 135M model) would otherwise make
    /// every chain millions of states, and a start-up search run for minutes.
    pub fn with_online_delta(self) -> Self {
        let at_one = self.latencies.iter().map(|l| l.at(1));
        let fastest = at_one.clone().fold(f64::INFINITY, f64::min);
        let slowest = at_one.fold(0.0, f64::max);
        PlannerInput { delta_ms: Some((fastest / ONLINE_DELTA_DIVISOR).max(slowest / ONLINE_MAX_UNITS)), ..self }
    }

    /// The chain's time unit in milliseconds.
    pub fn delta_ms(&self) -> f64 {
        self.delta_ms.unwrap_or_else(|| {
            let fastest = self.latencies.iter().map(|l| l.at(1)).fold(f64::INFINITY, f64::min);
            fastest / 20.0
        })
    }

    /// Expected tokens committed per request-step on model i.
    fn tokens_per_row(&self, model: usize) -> f64 {
        self.route[model].iter().zip(&self.commit[model]).map(|(p, c)| p * c).sum()
    }
}

/// Σ(B_i − 1) < N: some model can always launch.
pub fn feasible(thresholds: &[usize], n: usize) -> bool {
    thresholds.iter().all(|&b| b >= 1) && thresholds.iter().map(|b| b - 1).sum::<usize>() < n
}

/// Predicted tokens/s of the engine at N concurrent requests under thresholds B.
pub fn predict(input: &PlannerInput, n: usize, thresholds: &[usize]) -> Result<Prediction, PlanError> {
    input.validate()?;
    if n == 0 || n > MAX_REQUESTS {
        return Err(PlanError::Concurrency(n));
    }
    if thresholds.len() != input.models() {
        return Err(PlanError::Shape { what: "thresholds", got: thresholds.len(), models: input.models() });
    }
    if !feasible(thresholds, n) {
        return Err(PlanError::Deadlock { thresholds: thresholds.to_vec(), n });
    }
    let model = chain::ChainModel::new(input, thresholds)?;
    let chain = model.build(n, chain::STATE_LIMIT)?;
    Ok(solve::stationary_throughput(&chain, input))
}
