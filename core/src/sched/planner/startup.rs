//! The thresholds a deployment starts with, before it has served anything: each model's
//! profiled step cost, the routing its policy expects, and the planner's best per N over
//! a grid of concurrencies. Re-planning corrects both from served counters later.

use super::cost::latency_by_rows;
use super::{plan_table, LatencyTable, PlanError, PlannerInput, SearchOptions};
use crate::sched::{BatchingRule, Threshold};

/// The concurrencies planned at start-up. A table entry holds from its N up to the
/// next, and each entry is safe at its own N, so it is safe above it too. Beyond 16 the
/// chains take seconds each (N = 32: about 5 s on two cores), so higher N are left to
/// re-planning at the N the server actually meets.
pub const STARTUP_CONCURRENCIES: &[usize] = &[1, 2, 4, 8, 12, 16];

/// The chain's time unit for plans made while serving: the fastest step / 8 rather than
/// / 20. Measured on a card-like pair (N = 4..32): the same thresholds, predictions within
/// 1%, and N = 32 in 4.7 s instead of 11.7 s.
pub const ONLINE_DELTA_DIVISOR: f64 = 8.0;

/// Most time units the slowest batch-1 step spans in plans made while serving.
pub const ONLINE_MAX_UNITS: f64 = 48.0;

/// Delegation rate assumed for a policy that cannot say its own.
pub const DEFAULT_DELEGATION_PRIOR: f64 = 0.1;

/// What the start-up plan assumes of the requests it will serve, before any was served:
/// their mean prompt and output lengths. Re-planning reads what rows really feed from the
/// served counters; this only sets the first table.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct WorkloadPrior {
    pub prompt_tokens: f64,
    pub output_tokens: f64,
}

impl Default for WorkloadPrior {
    /// The medians of the Azure LLM inference trace's conversation requests (2023): 1,020
    /// prompt tokens, 129 generated.
    fn default() -> Self {
        WorkloadPrior { prompt_tokens: 1020.0, output_tokens: 129.0 }
    }
}

impl WorkloadPrior {
    /// Mean tokens a row feeds on the small model (0) and the large one (1) when the small
    /// model delegates a position with probability `p`. Per request of T output tokens the
    /// small model runs about T rows (one decode each) and prefills the prompt once; the
    /// large one runs pT rows, each catching up on the ~1/p tokens written since its last
    /// visit, and prefills the prompt on its first visit, which a request makes with
    /// probability 1 − (1 − p)^T.
    pub fn tokens_per_row(&self, p: f64) -> [f64; 2] {
        let prompt = self.prompt_tokens.max(0.0);
        let output = self.output_tokens.max(1.0);
        let small = 1.0 + prompt / output;
        let visited = 1.0 - (1.0 - p).powf(output);
        let large = 1.0 / p + prompt * visited / (p * output);
        [small, large]
    }
}

/// What a start-up plan is made for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StartupSpec {
    /// The rate at which the small model delegates a position to the large one.
    pub delegation: f64,
    pub workload: WorkloadPrior,
    pub max_batch: usize,
    /// Concurrencies above this are not planned.
    pub max_active: usize,
    /// The two models take turns on shared compute.
    pub exclusive: bool,
}

/// A start-up plan: what it assumed, and the rule with the best thresholds and prediction
/// at each N.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct StartupPlan {
    pub delegation: f64,
    pub workload: WorkloadPrior,
    /// Mean tokens a row feeds on each model under that workload.
    pub tokens_per_row: [f64; 2],
    pub table: Vec<(usize, Vec<usize>, f64)>,
    #[serde(skip)]
    pub rule: BatchingRule,
}

/// The two-model delegation pattern of `spec` (the small model, 0, hands a position to
/// the large one, 1, which catches up, writes one token and hands back), with each
/// model's rows costing the tokens they feed under the spec's workload.
pub fn startup_input(costs: &[LatencyTable; 2], spec: &StartupSpec) -> PlannerInput {
    let p = delegation_rate(spec.delegation);
    let [small_tokens, large_tokens] = spec.workload.tokens_per_row(p);
    let small = latency_by_rows(&costs[0], small_tokens, spec.max_batch);
    let large = latency_by_rows(&costs[1], large_tokens, spec.max_batch);
    PlannerInput { max_batch: spec.max_batch, exclusive: spec.exclusive, ..PlannerInput::delegation(small, large, p) }
        .with_online_delta()
}

fn delegation_rate(delegation: f64) -> f64 {
    if delegation.is_finite() {
        delegation.clamp(1e-3, 1.0)
    } else {
        DEFAULT_DELEGATION_PRIOR
    }
}

/// The planner's table over [`STARTUP_CONCURRENCIES`] (those up to `max_active`) as a
/// batching rule. Deterministic: the same costs and spec give the same rule.
pub fn startup_plan(costs: &[LatencyTable; 2], spec: &StartupSpec) -> Result<StartupPlan, PlanError> {
    let input = startup_input(costs, spec);
    let concurrencies: Vec<usize> =
        STARTUP_CONCURRENCIES.iter().copied().filter(|&n| n <= spec.max_active.max(1)).collect();
    let plans = plan_table(&input, &concurrencies, SearchOptions::default())?;
    let table: Vec<(usize, Vec<usize>, f64)> =
        plans.into_iter().map(|p| (p.n, p.best.thresholds, p.best.prediction.tokens_per_sec)).collect();
    let rows: Vec<(usize, Vec<usize>)> = table.iter().map(|(n, b, _)| (*n, b.clone())).collect();
    Ok(StartupPlan {
        delegation: input.route[0][1],
        workload: spec.workload,
        tokens_per_row: spec.workload.tokens_per_row(input.route[0][1]),
        rule: table_rule(&rows, 2, None),
        table,
    })
}

/// A rule with one table per model from per-N threshold vectors.
pub fn table_rule(rows: &[(usize, Vec<usize>)], models: usize, max_wait: Option<std::time::Duration>) -> BatchingRule {
    BatchingRule {
        thresholds: (0..models).map(|i| Threshold::ByActive(rows.iter().map(|(n, b)| (*n, b[i])).collect())).collect(),
        max_wait,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sched::planner::predict;

    /// A card-like pair: steps cost nearly the same up to many tokens (weights are read
    /// once a step), so batching the large model's extends pays as N grows.
    fn bandwidth_bound() -> [LatencyTable; 2] {
        [
            LatencyTable::from_points([(1, 2.0), (64, 2.5), (512, 8.0)]).unwrap(),
            LatencyTable::from_points([(1, 20.0), (64, 22.0), (512, 60.0)]).unwrap(),
        ]
    }

    /// The default workload's plan over N up to `max_active`.
    fn spec(max_active: usize) -> StartupSpec {
        StartupSpec { delegation: 0.1, workload: WorkloadPrior::default(), max_batch: 64, max_active, exclusive: false }
    }

    /// Predicted tok/s of eager launching at N from the same start-up input.
    fn eager(costs: &[LatencyTable; 2], n: usize) -> f64 {
        predict(&startup_input(costs, &spec(16)), n, &[1, 1]).unwrap().tokens_per_sec
    }

    #[test]
    fn rows_feed_their_decodes_catch_ups_and_a_share_of_the_prompt() {
        let decodes_only = WorkloadPrior { prompt_tokens: 0.0, output_tokens: 64.0 };
        assert_eq!(decodes_only.tokens_per_row(0.1), [1.0, 10.0]);
        let [small, large] = WorkloadPrior { prompt_tokens: 128.0, output_tokens: 64.0 }.tokens_per_row(0.1);
        assert!((small - 3.0).abs() < 1e-12, "{small}");
        // 6.4 large rows a request; nearly every request visits (1 − 0.9^64 ≈ 0.9988).
        let expected = 10.0 + 128.0 * (1.0 - 0.9f64.powi(64)) / 6.4;
        assert!((large - expected).abs() < 1e-9 && large > 29.9, "{large}");
        // A rare delegation: few requests visit, but each visit prefills the whole prompt.
        let [_, rare] = WorkloadPrior { prompt_tokens: 1000.0, output_tokens: 10.0 }.tokens_per_row(0.001);
        assert!(rare > 1000.0 + 990.0 && rare < 1000.0 + 1001.0, "{rare}");
    }

    #[test]
    fn prompts_cost_the_plan_throughput_where_prefill_costs_time() {
        let linear = [
            LatencyTable::from_points([(1, 1.0), (512, 512.0)]).unwrap(),
            LatencyTable::from_points([(1, 4.0), (512, 2048.0)]).unwrap(),
        ];
        let with =
            |prompt_tokens| StartupSpec { workload: WorkloadPrior { prompt_tokens, output_tokens: 64.0 }, ..spec(4) };
        let short = startup_plan(&linear, &with(0.0)).unwrap();
        let long = startup_plan(&linear, &with(512.0)).unwrap();
        assert_eq!(long.tokens_per_row, long.workload.tokens_per_row(0.1));
        for ((n, _, fast), (_, _, slow)) in short.table.iter().zip(&long.table) {
            assert!(*slow < fast * 0.5, "N = {n}: {slow} tok/s with 512-token prompts, {fast} without");
        }
    }

    #[test]
    fn the_plan_from_a_profile_is_deterministic_safe_and_batches_where_it_pays() {
        // Short prompts: rows stay far below the tokens where a step's cost starts to grow.
        let spec = StartupSpec { workload: WorkloadPrior { prompt_tokens: 64.0, output_tokens: 64.0 }, ..spec(16) };
        let plan = startup_plan(&bandwidth_bound(), &spec).unwrap();
        assert_eq!(plan, startup_plan(&bandwidth_bound(), &spec).unwrap());
        assert_eq!(plan.table.iter().map(|r| r.0).collect::<Vec<_>>(), STARTUP_CONCURRENCIES);
        assert!(plan.table.iter().all(|(_, b, _)| b.len() == 2));
        plan.rule.validate(2).unwrap();
        for n in 1..=40 {
            let b = plan.rule.effective(n);
            assert!(b.iter().map(|x| x - 1).sum::<usize>() < n, "N = {n}: {b:?}");
        }
        assert_eq!(plan.rule.effective(1), vec![1, 1]);
        assert!(
            plan.table.iter().any(|(_, b, _)| b[1] > 1),
            "a nearly free large step should wait for company at some N: {plan:?}"
        );
        for (n, b, predicted) in &plan.table {
            let eager = predict(&startup_input(&bandwidth_bound(), &spec), *n, &[1, 1]).unwrap().tokens_per_sec;
            assert!(*predicted >= eager * 0.999, "N = {n}: {b:?} predicted below eager");
        }
    }

    #[test]
    fn waiting_buys_little_where_cost_grows_with_every_token() {
        let linear = [
            LatencyTable::from_points([(1, 1.0), (512, 512.0)]).unwrap(),
            LatencyTable::from_points([(1, 4.0), (512, 2048.0)]).unwrap(),
        ];
        let plan = startup_plan(&linear, &spec(8)).unwrap();
        for (n, b, predicted) in &plan.table {
            let gain = predicted / eager(&linear, *n);
            assert!(gain < 1.03, "N = {n}: {b:?} predicted {gain:.3}× eager");
        }
        assert_eq!(plan.table.last().unwrap().0, 8, "no N above max_active is planned");
    }
}
