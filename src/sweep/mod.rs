//! Threshold sweeps: the real engine under closed-loop load for every (concurrency N,
//! threshold vector B) of a grid, measured in steady state, so that the planner's
//! predictions can be checked against what the engine actually does (DESIGN §6).
//!
//! One engine serves the whole sweep; thresholds change live (`Engine::set_batching`),
//! so models load once. For each N the same N clients keep running across that N's
//! threshold vectors: each point re-warms after the switch and then measures.

pub mod chart;
pub mod check;
pub mod clients;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::Serialize;
use tokenrouter_actors::{Engine, EngineConfig, ModelSpec, StepLimits, SubserverSnapshot};
use tokenrouter_core::policy::Policy;
use tokenrouter_core::sched::planner::feasible;
use tokenrouter_core::sched::{BatchingRule, SubserverStats};

pub use chart::{write_chart, write_csv};
pub use check::PlanCheck;
use clients::{ClosedLoop, RequestShape};

/// What to sweep.
#[derive(Clone)]
pub struct SweepSpec {
    /// In engine order (the first is the entry model).
    pub models: Vec<ModelSpec>,
    pub policy: Arc<dyn Policy>,
    pub concurrencies: Vec<usize>,
    /// Candidate thresholds per model; the sweep takes their product.
    pub grid: Vec<Vec<usize>>,
    pub prompt_tokens: usize,
    pub output_tokens: usize,
    /// Time after each threshold switch before measuring.
    pub warmup: Duration,
    pub measure: Duration,
    pub seed: u64,
    pub temperature: f32,
    pub limits: StepLimits,
    pub exclusive_compute: bool,
    /// After the grid, let the planner choose thresholds from the pooled counters and
    /// measure its choices (see [`check`]).
    pub check_plan: bool,
    /// Fresh windows of the planner's choice and of the grid's best, each, in the check.
    pub check_rounds: usize,
}

/// What a sweep measured.
#[derive(Debug, Clone, Serialize)]
pub struct SweepOutcome {
    pub points: Vec<SweepPoint>,
    pub checks: Vec<PlanCheck>,
}

/// One model over one measurement window.
#[derive(Debug, Clone, Serialize)]
pub struct ModelWindow {
    pub model: String,
    pub steps: u64,
    /// Mean batch.
    pub rows_per_step: f64,
    /// Busy time per step.
    pub ms_per_step: f64,
    pub tokens_fed_per_step: f64,
    pub tokens_committed: u64,
    /// Rows that left for a peer, per row: the routing rate this model observed.
    pub handoffs_per_row: f64,
    /// Share of the window this model spent stepping.
    pub busy_fraction: f64,
    /// The raw counters over the window (what the planner reads its inputs from).
    pub stats: SubserverStats,
}

/// One (N, B) point.
#[derive(Debug, Clone, Serialize)]
pub struct SweepPoint {
    pub concurrency: usize,
    pub thresholds: Vec<usize>,
    /// Tokens the clients received inside the window.
    pub tokens: u64,
    pub seconds: f64,
    pub tokens_per_sec: f64,
    pub predicted_tokens_per_sec: Option<f64>,
    pub models: Vec<ModelWindow>,
}

/// Predicted tokens/s at N with thresholds B, given what was measured there (the
/// planner may take step latencies and routing rates from it).
pub type Predictor<'a> = &'a dyn Fn(usize, &[usize], &SweepPoint) -> Option<f64>;

/// What the sweep is doing, for progress displays.
pub enum SweepEvent<'a> {
    Warming { concurrency: usize, thresholds: &'a [usize] },
    Measured(&'a SweepPoint),
}

/// Every threshold vector of the grid in lexicographic order (the first model's
/// threshold varies slowest); candidate lists are sorted and deduplicated first, so
/// the order is the same however the grid was written.
pub fn threshold_vectors(grid: &[Vec<usize>]) -> Vec<Vec<usize>> {
    grid.iter().fold(vec![Vec::new()], |prefixes, candidates| {
        let mut candidates = candidates.clone();
        candidates.sort_unstable();
        candidates.dedup();
        prefixes.iter().flat_map(|p| candidates.iter().map(move |&b| p.iter().copied().chain([b]).collect())).collect()
    })
}

/// The points a sweep runs, in order: by N as given, then by threshold vector. Points
/// that break Σ(B_i − 1) < N are left out: there every model could wait for a batch
/// that never fills.
pub fn schedule(concurrencies: &[usize], grid: &[Vec<usize>]) -> Vec<(usize, Vec<usize>)> {
    let vectors = threshold_vectors(grid);
    concurrencies
        .iter()
        .flat_map(|&n| vectors.iter().filter(move |b| feasible(b, n)).map(move |b| (n, b.clone())))
        .collect()
}

impl SweepSpec {
    fn validate(&self) -> anyhow::Result<()> {
        if self.grid.len() != self.models.len() {
            bail!("the grid has {} candidate lists for {} models", self.grid.len(), self.models.len());
        }
        if self.grid.iter().any(|c| c.is_empty() || c.contains(&0)) {
            bail!("every model needs candidate thresholds, all at least 1");
        }
        if self.concurrencies.is_empty() || self.concurrencies.contains(&0) {
            bail!("concurrencies must be given and at least 1");
        }
        if self.prompt_tokens == 0 || self.output_tokens == 0 {
            bail!("prompt and output lengths must be at least 1 token");
        }
        if self.measure.is_zero() {
            bail!("the measurement window must be longer than zero");
        }
        Ok(())
    }

    fn engine_config(&self, first: &[usize]) -> EngineConfig {
        EngineConfig {
            models: self.models.clone(),
            default_policy: self.policy.clone(),
            batching: BatchingRule::fixed(first),
            limits: self.limits.clone(),
            exclusive_compute: self.exclusive_compute,
            replan: None,
            supervision: Default::default(),
            admission: Default::default(),
        }
    }
}

/// Runs the sweep on a fresh engine and shuts it down; points come back in schedule
/// order with `predict`'s answer filled in. Predictions are computed after the engine
/// has stopped, so that the model's own CPU time never disturbs a measurement.
pub async fn run(
    spec: &SweepSpec,
    predict: Predictor<'_>,
    observe: &mut dyn FnMut(SweepEvent<'_>),
) -> anyhow::Result<SweepOutcome> {
    spec.validate()?;
    let plan = schedule(&spec.concurrencies, &spec.grid);
    let Some((_, first)) = plan.first() else {
        bail!("no threshold vector of the grid satisfies Σ(B_i − 1) < N at any of the concurrencies");
    };
    let engine = Engine::start(spec.engine_config(first)).await.context("starting the engine")?;
    let result = sweep_and_check(&engine, spec, &plan, observe).await;
    engine.shutdown().await;
    let (mut points, checks) = result?;
    for point in &mut points {
        let predicted = predict(point.concurrency, &point.thresholds, point);
        point.predicted_tokens_per_sec = predicted;
    }
    Ok(SweepOutcome { points, checks })
}

async fn sweep_and_check(
    engine: &Engine,
    spec: &SweepSpec,
    plan: &[(usize, Vec<usize>)],
    observe: &mut dyn FnMut(SweepEvent<'_>),
) -> anyhow::Result<(Vec<SweepPoint>, Vec<PlanCheck>)> {
    let mut points = sweep_on(engine, spec, plan, observe).await?;
    let checks = match spec.check_plan {
        true => check::check_plans(engine, spec, &mut points, observe).await?,
        false => Vec::new(),
    };
    Ok((points, checks))
}

fn request_shape(engine: &Engine, spec: &SweepSpec) -> RequestShape {
    RequestShape {
        prompt_tokens: spec.prompt_tokens,
        output_tokens: spec.output_tokens,
        vocab: engine.shared_vocab(),
        seed: spec.seed,
        temperature: spec.temperature,
    }
}

async fn sweep_on(
    engine: &Engine,
    spec: &SweepSpec,
    plan: &[(usize, Vec<usize>)],
    observe: &mut dyn FnMut(SweepEvent<'_>),
) -> anyhow::Result<Vec<SweepPoint>> {
    let shape = request_shape(engine, spec);
    let mut points = Vec::with_capacity(plan.len());
    for group in plan.chunk_by(|a, b| a.0 == b.0) {
        let n = group[0].0;
        let load = ClosedLoop::start(engine, n, shape);
        for (_, thresholds) in group {
            observe(SweepEvent::Warming { concurrency: n, thresholds });
            match measure_point(engine, &load, spec, n, thresholds).await {
                Ok(point) => {
                    observe(SweepEvent::Measured(&point));
                    points.push(point);
                }
                Err(e) => {
                    let _ = load.stop(engine, DRAIN_PATIENCE).await;
                    return Err(e);
                }
            }
        }
        load.stop(engine, DRAIN_PATIENCE).await.map_err(anyhow::Error::msg)?;
    }
    Ok(points)
}

/// How long cancelled requests may take to leave the engine between concurrencies.
const DRAIN_PATIENCE: Duration = Duration::from_secs(30);

/// Switches thresholds, lets the load settle, then measures one window.
async fn measure_point(
    engine: &Engine,
    load: &ClosedLoop,
    spec: &SweepSpec,
    n: usize,
    thresholds: &[usize],
) -> anyhow::Result<SweepPoint> {
    engine.set_batching(BatchingRule::fixed(thresholds))?;
    tokio::time::sleep(spec.warmup).await;
    let (before, stats_from) = snapshot(engine).await;
    let (started, tokens_before) = (Instant::now(), load.committed());
    tokio::time::sleep(spec.measure).await;
    let (tokens_after, seconds) = (load.committed(), started.elapsed().as_secs_f64());
    let (after, stats_to) = snapshot(engine).await;
    if let Some(message) = load.failure() {
        bail!("a client failed at N = {n}, B = {thresholds:?}: {message}");
    }
    let tokens = tokens_after - tokens_before;
    Ok(SweepPoint {
        concurrency: n,
        thresholds: thresholds.to_vec(),
        tokens,
        seconds,
        tokens_per_sec: tokens as f64 / seconds,
        predicted_tokens_per_sec: None,
        models: window_stats(&before, &after, (stats_to - stats_from).as_secs_f64()),
    })
}

/// Every model's counters, and when they were read. Each compute thread answers between
/// steps, so a reply can lag the request by a whole step of the slowest model; the
/// middle of the call is the unbiased estimate of when the counters were taken.
async fn snapshot(engine: &Engine) -> (Vec<SubserverSnapshot>, Instant) {
    let asked = Instant::now();
    let stats = engine.stats().await;
    (stats, asked + asked.elapsed() / 2)
}

/// Per-model step statistics over the window: the difference of two snapshots.
fn window_stats(before: &[SubserverSnapshot], after: &[SubserverSnapshot], seconds: f64) -> Vec<ModelWindow> {
    after
        .iter()
        .map(|a| {
            let zero = SubserverStats::default();
            let b = before.iter().find(|b| b.model == a.model).map_or(&zero, |b| &b.stats);
            model_window(&a.model, b, &a.stats, seconds)
        })
        .collect()
}

fn model_window(model: &str, before: &SubserverStats, after: &SubserverStats, seconds: f64) -> ModelWindow {
    let d = after.since(before);
    let per_step = |x: f64| if d.steps == 0 { 0.0 } else { x / d.steps as f64 };
    let busy = d.busy.as_secs_f64();
    ModelWindow {
        model: model.to_string(),
        steps: d.steps,
        rows_per_step: per_step(d.rows as f64),
        ms_per_step: per_step(busy * 1e3),
        tokens_fed_per_step: per_step(d.tokens_fed as f64),
        tokens_committed: d.tokens_committed,
        handoffs_per_row: if d.rows == 0 { 0.0 } else { d.handoffs_out as f64 / d.rows as f64 },
        busy_fraction: busy / seconds,
        stats: d,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vectors_are_the_sorted_product_of_the_candidates() {
        let v = threshold_vectors(&[vec![2, 1, 2], vec![4, 1]]);
        assert_eq!(v, vec![vec![1, 1], vec![1, 4], vec![2, 1], vec![2, 4]]);
        assert_eq!(threshold_vectors(&[vec![3]]), vec![vec![3]]);
    }

    #[test]
    fn the_schedule_keeps_only_feasible_points_grouped_by_n() {
        let plan = schedule(&[2, 3], &[vec![1, 2], vec![1, 2]]);
        let expected: Vec<(usize, Vec<usize>)> = vec![
            (2, vec![1, 1]),
            (2, vec![1, 2]),
            (2, vec![2, 1]),
            (3, vec![1, 1]),
            (3, vec![1, 2]),
            (3, vec![2, 1]),
            (3, vec![2, 2]),
        ];
        assert_eq!(plan, expected);
        assert!(schedule(&[1], &[vec![2], vec![2]]).is_empty());
    }

    #[test]
    fn window_stats_are_differences_per_step() {
        let before = SubserverStats { steps: 10, rows: 20, busy: Duration::from_millis(100), ..Default::default() };
        let after = SubserverStats {
            steps: 30,
            rows: 80,
            tokens_fed: 70,
            tokens_committed: 54,
            handoffs_out: 6,
            busy: Duration::from_millis(500),
            ..Default::default()
        };
        let w = model_window("small", &before, &after, 2.0);
        assert_eq!(w.steps, 20);
        assert!((w.rows_per_step - 3.0).abs() < 1e-9);
        assert!((w.ms_per_step - 20.0).abs() < 1e-9);
        assert!((w.tokens_fed_per_step - 3.5).abs() < 1e-9);
        assert!((w.handoffs_per_row - 0.1).abs() < 1e-9);
        assert!((w.busy_fraction - 0.2).abs() < 1e-9);
        assert_eq!(model_window("idle", &before, &before, 1.0).rows_per_step, 0.0);
    }
}
