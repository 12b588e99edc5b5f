//! The planner against the sweep: pool every point's counters into one planner input
//! (step latency by batch rows, routing, commits), let the planner choose thresholds
//! for each N over all of {1..N}^M, measure any choice the grid did not hold, and set
//! the choice beside the best measured point.

use anyhow::Context;
use serde::Serialize;
use tokenrouter_actors::Engine;
use tokenrouter_core::sched::planner::{self, Plan, PlannerInput};
use tokenrouter_core::sched::SubserverStats;

use super::clients::ClosedLoop;
use super::{measure_point, request_shape, SweepEvent, SweepPoint, SweepSpec, DRAIN_PATIENCE};

/// The planner's choice at one N and how it fared.
#[derive(Debug, Clone, Serialize)]
pub struct PlanCheck {
    pub concurrency: usize,
    pub chosen: Vec<usize>,
    /// The planner's prediction at its choice, from the pooled input.
    pub predicted_tokens_per_sec: f64,
    pub measured_tokens_per_sec: f64,
    pub best_thresholds: Vec<usize>,
    pub best_measured_tokens_per_sec: f64,
}

impl PlanCheck {
    /// Measured throughput at the choice over the best measured: ≥ 0.95 is the target.
    pub fn share_of_best(&self) -> f64 {
        self.measured_tokens_per_sec / self.best_measured_tokens_per_sec
    }

    /// (predicted − measured) / measured at the choice.
    pub fn prediction_error(&self) -> f64 {
        (self.predicted_tokens_per_sec - self.measured_tokens_per_sec) / self.measured_tokens_per_sec
    }
}

/// Sums per-model counters over points (engine order).
pub fn pooled_stats(points: &[SweepPoint]) -> Vec<SubserverStats> {
    let models = points.first().map_or(0, |p| p.models.len());
    (0..models).map(|i| points.iter().fold(SubserverStats::default(), |acc, p| acc.plus(&p.models[i].stats))).collect()
}

pub fn pooled_input(points: &[SweepPoint], max_batch: usize) -> anyhow::Result<PlannerInput> {
    // The first model is the entry model (as the sweep's engine order says).
    Ok(planner::input_from_stats(&pooled_stats(points), 0, max_batch)?)
}

/// Plans from the grid's points, measures the choices the grid lacked (appending them
/// to `points`), and returns one check per N.
pub(super) async fn check_plans(
    engine: &Engine,
    spec: &SweepSpec,
    points: &mut Vec<SweepPoint>,
    observe: &mut dyn FnMut(SweepEvent<'_>),
) -> anyhow::Result<Vec<PlanCheck>> {
    let input = pooled_input(points, spec.limits.max_batch_rows)?;
    let concurrencies = spec.concurrencies.clone();
    // No load runs between concurrencies, so the search's CPU time disturbs nothing.
    let plans: Vec<Plan> = tokio::task::spawn_blocking(move || {
        planner::plan_table(&input, &concurrencies, planner::SearchOptions::default())
    })
    .await
    .context("the planner thread failed")??;
    let shape = request_shape(engine, spec);
    for plan in &plans {
        let (n, chosen) = (plan.n, &plan.best.thresholds);
        if points.iter().any(|p| p.concurrency == n && &p.thresholds == chosen) {
            continue;
        }
        let load = ClosedLoop::start(engine, n, shape);
        observe(SweepEvent::Warming { concurrency: n, thresholds: chosen });
        let measured = measure_point(engine, &load, spec, n, chosen).await;
        load.stop(engine, DRAIN_PATIENCE).await.map_err(anyhow::Error::msg)?;
        let point = measured?;
        observe(SweepEvent::Measured(&point));
        points.push(point);
    }
    Ok(plans.iter().map(|plan| check_of(plan, points)).collect())
}

fn check_of(plan: &Plan, points: &[SweepPoint]) -> PlanCheck {
    let at_n: Vec<&SweepPoint> = points.iter().filter(|p| p.concurrency == plan.n).collect();
    let chosen = at_n.iter().find(|p| p.thresholds == plan.best.thresholds).expect("measured above");
    let best = at_n.iter().max_by(|a, b| a.tokens_per_sec.total_cmp(&b.tokens_per_sec)).expect("one point at least");
    PlanCheck {
        concurrency: plan.n,
        chosen: plan.best.thresholds.clone(),
        predicted_tokens_per_sec: plan.best.prediction.tokens_per_sec,
        measured_tokens_per_sec: chosen.tokens_per_sec,
        best_thresholds: best.thresholds.clone(),
        best_measured_tokens_per_sec: best.tokens_per_sec,
    }
}
