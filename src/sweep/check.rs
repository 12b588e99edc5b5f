//! The planner against the sweep: pool every point's counters into one planner input
//! (step latency by batch rows, routing, commits), let the planner choose thresholds
//! for each N over all of {1..N}^M, and measure its choice beside the grid's best point.
//!
//! The grid's best is the maximum of many noisy windows and so flatters itself (where
//! throughput is flat in B, the best of 18 windows sits a few percent above its true
//! mean). So both are measured again, interleaved, and compared on those fresh windows.

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
    /// What the grid pass measured at its best point (before the fresh windows).
    pub grid_best_tokens_per_sec: f64,
    /// Fresh windows per point behind the two measured figures (0: the grid's own
    /// window, when the planner chose the grid's best).
    pub confirm_rounds: usize,
    /// Each fresh window's tok/s at the choice and at the grid's best, round by round:
    /// the spread behind the two means.
    pub measured_rounds: Vec<f64>,
    pub best_rounds: Vec<f64>,
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

/// `exclusive`: the sweep's models took turns on the compute, so the planner's chain
/// must let one step at a time.
pub fn pooled_input(points: &[SweepPoint], max_batch: usize, exclusive: bool) -> anyhow::Result<PlannerInput> {
    // The first model is the entry model (as the sweep's engine order says).
    let input = planner::input_from_stats(&pooled_stats(points), &[], 0, max_batch)?;
    Ok(PlannerInput { exclusive, ..input })
}

/// Plans from the grid's points, measures each choice against the grid's best (adding
/// choices the grid lacked to `points`), and returns one check per N.
pub(super) async fn check_plans(
    engine: &Engine,
    spec: &SweepSpec,
    points: &mut Vec<SweepPoint>,
    observe: &mut dyn FnMut(SweepEvent<'_>),
) -> anyhow::Result<Vec<PlanCheck>> {
    let input = pooled_input(points, spec.limits.max_batch_rows, spec.exclusive_compute)?;
    let concurrencies = spec.concurrencies.clone();
    // No load runs between concurrencies, so the search's CPU time disturbs nothing.
    let plans: Vec<Plan> = tokio::task::spawn_blocking(move || {
        planner::plan_table(&input, &concurrencies, planner::SearchOptions::default())
    })
    .await
    .context("the planner thread failed")??;
    let mut checks = Vec::with_capacity(plans.len());
    for plan in &plans {
        checks.push(check_one(engine, spec, plan, points, observe).await?);
    }
    Ok(checks)
}

async fn check_one(
    engine: &Engine,
    spec: &SweepSpec,
    plan: &Plan,
    points: &mut Vec<SweepPoint>,
    observe: &mut dyn FnMut(SweepEvent<'_>),
) -> anyhow::Result<PlanCheck> {
    let (n, chosen) = (plan.n, plan.best.thresholds.clone());
    let grid_best = grid_best(points, n).context("no grid point at this N")?;
    let mut check = PlanCheck {
        concurrency: n,
        chosen: chosen.clone(),
        predicted_tokens_per_sec: plan.best.prediction.tokens_per_sec,
        measured_tokens_per_sec: grid_best.tokens_per_sec,
        best_thresholds: grid_best.thresholds.clone(),
        best_measured_tokens_per_sec: grid_best.tokens_per_sec,
        grid_best_tokens_per_sec: grid_best.tokens_per_sec,
        confirm_rounds: 0,
        measured_rounds: Vec::new(),
        best_rounds: Vec::new(),
    };
    if chosen == check.best_thresholds {
        return Ok(check);
    }
    let contenders = [chosen.clone(), check.best_thresholds.clone()];
    let windows = measure_interleaved(engine, spec, n, &contenders, observe).await?;
    let rates = |i: usize| windows[i].iter().map(|p| p.tokens_per_sec).collect::<Vec<f64>>();
    (check.measured_rounds, check.best_rounds) = (rates(0), rates(1));
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    (check.measured_tokens_per_sec, check.best_measured_tokens_per_sec) =
        (mean(&check.measured_rounds), mean(&check.best_rounds));
    check.confirm_rounds = check.measured_rounds.len();
    if !points.iter().any(|p| p.concurrency == n && p.thresholds == chosen) {
        points.push(windows[0][0].clone());
    }
    Ok(check)
}

fn grid_best(points: &[SweepPoint], n: usize) -> Option<SweepPoint> {
    points.iter().filter(|p| p.concurrency == n).max_by(|a, b| a.tokens_per_sec.total_cmp(&b.tokens_per_sec)).cloned()
}

/// `spec.check_rounds` windows of each contender under one closed loop, the order
/// reversed every other round so that neither always measures after the other.
async fn measure_interleaved(
    engine: &Engine,
    spec: &SweepSpec,
    n: usize,
    contenders: &[Vec<usize>],
    observe: &mut dyn FnMut(SweepEvent<'_>),
) -> anyhow::Result<Vec<Vec<SweepPoint>>> {
    let load = ClosedLoop::start(engine, n, request_shape(engine, spec));
    let mut windows = vec![Vec::new(); contenders.len()];
    let mut failure = None;
    'rounds: for round in 0..spec.check_rounds.max(1) {
        for k in 0..contenders.len() {
            let i = if round % 2 == 0 { k } else { contenders.len() - 1 - k };
            let thresholds = &contenders[i];
            observe(SweepEvent::Warming { concurrency: n, thresholds });
            match measure_point(engine, &load, spec, n, thresholds).await {
                Ok(point) => {
                    observe(SweepEvent::Measured(&point));
                    windows[i].push(point);
                }
                Err(e) => {
                    failure = Some(e);
                    break 'rounds;
                }
            }
        }
    }
    load.stop(engine, DRAIN_PATIENCE).await.map_err(anyhow::Error::msg)?;
    match failure {
        Some(e) => Err(e),
        None => Ok(windows),
    }
}
