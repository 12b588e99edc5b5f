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

/// A start-up plan: the rule, and the best thresholds and prediction at each N.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct StartupPlan {
    pub delegation: f64,
    pub table: Vec<(usize, Vec<usize>, f64)>,
    #[serde(skip)]
    pub rule: BatchingRule,
}

/// The two-model delegation pattern at rate `delegation` (the small model, 0, hands a
/// position to the large one, 1, which catches up on the ~1/p tokens written since it
/// last saw the request, writes one and hands back), from profiled costs by tokens.
/// `exclusive`: the two models take turns on shared compute.
pub fn startup_input(costs: &[LatencyTable; 2], delegation: f64, max_batch: usize, exclusive: bool) -> PlannerInput {
    let p = if delegation.is_finite() { delegation.clamp(1e-3, 1.0) } else { DEFAULT_DELEGATION_PRIOR };
    let small = latency_by_rows(&costs[0], 1.0, max_batch);
    let large = latency_by_rows(&costs[1], 1.0 / p, max_batch);
    PlannerInput { max_batch, exclusive, ..PlannerInput::delegation(small, large, p) }.with_online_delta()
}

/// The planner's table over [`STARTUP_CONCURRENCIES`] (those up to `max_active`) as a
/// batching rule. Deterministic: the same costs and rate give the same rule.
pub fn startup_plan(
    costs: &[LatencyTable; 2],
    delegation: f64,
    max_batch: usize,
    max_active: usize,
    exclusive: bool,
) -> Result<StartupPlan, PlanError> {
    let input = startup_input(costs, delegation, max_batch, exclusive);
    let concurrencies: Vec<usize> = STARTUP_CONCURRENCIES.iter().copied().filter(|&n| n <= max_active.max(1)).collect();
    let plans = plan_table(&input, &concurrencies, SearchOptions::default())?;
    let table: Vec<(usize, Vec<usize>, f64)> =
        plans.into_iter().map(|p| (p.n, p.best.thresholds, p.best.prediction.tokens_per_sec)).collect();
    let rows: Vec<(usize, Vec<usize>)> = table.iter().map(|(n, b, _)| (*n, b.clone())).collect();
    Ok(StartupPlan { delegation: input.route[0][1], rule: table_rule(&rows, 2, None), table })
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

    /// A card-like pair: steps cost nearly the same up to many tokens (weights are read
    /// once a step), so batching the large model's extends pays as N grows.
    fn bandwidth_bound() -> [LatencyTable; 2] {
        [
            LatencyTable::from_points([(1, 2.0), (64, 2.5), (512, 8.0)]).unwrap(),
            LatencyTable::from_points([(1, 20.0), (64, 22.0), (512, 60.0)]).unwrap(),
        ]
    }

    /// Predicted tok/s of eager launching at N from the same start-up input.
    fn eager(costs: &[LatencyTable; 2], n: usize) -> f64 {
        crate::sched::planner::predict(&startup_input(costs, 0.1, 64, false), n, &[1, 1]).unwrap().tokens_per_sec
    }

    #[test]
    fn the_plan_from_a_profile_is_deterministic_safe_and_batches_where_it_pays() {
        let plan = startup_plan(&bandwidth_bound(), 0.1, 64, 16, false).unwrap();
        assert_eq!(plan, startup_plan(&bandwidth_bound(), 0.1, 64, 16, false).unwrap());
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
            assert!(*predicted >= eager(&bandwidth_bound(), *n) * 0.999, "N = {n}: {b:?} predicted below eager");
        }
    }

    #[test]
    fn waiting_buys_little_where_cost_grows_with_every_token() {
        let linear = [
            LatencyTable::from_points([(1, 1.0), (512, 512.0)]).unwrap(),
            LatencyTable::from_points([(1, 4.0), (512, 2048.0)]).unwrap(),
        ];
        let plan = startup_plan(&linear, 0.1, 64, 8, false).unwrap();
        for (n, b, predicted) in &plan.table {
            let gain = predicted / eager(&linear, *n);
            assert!(gain < 1.03, "N = {n}: {b:?} predicted {gain:.3}× eager");
        }
        assert_eq!(plan.table.last().unwrap().0, 8, "no N above max_active is planned");
    }
}
