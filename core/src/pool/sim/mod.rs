//! The discrete-event simulator that checks the cost model: a request stream is served
//! by a homogeneous fleet (every instance provisioned for the long context) and by a
//! dual-pool fleet (requests routed by the real estimator and dispatcher, spilled when
//! the short pool refuses them), and each pool is sized to the fewest instances that
//! meet a P99 TTFT objective at the stream's rate raised by a headroom.

mod pool;

#[cfg(test)]
mod tests;

use serde::Serialize;

pub use pool::{run_pool, Job, PoolRun, PoolShape};

use super::category::Category;
use super::cost::{CostPlan, InstanceProfile, PoolContexts};
use super::dispatch::{Dispatcher, PoolChoice, RouteTally};
use super::estimator::{BudgetEstimator, ErrorTally, EstimatorConfig};
use super::trace::Arrival;
use crate::rng::SplitMix64;

/// The fleets to compare and the objective they are sized for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FleetConfig {
    pub profile: InstanceProfile,
    pub pools: PoolContexts,
    /// P99 time to first token every pool must meet.
    pub slo_ttft_p99_s: f64,
    /// Pools are sized for the stream sped up by 1 + headroom (room for bursts).
    pub headroom: f64,
    /// Admit by KV actually in use up to the batch cap (vLLM's default, which preempts
    /// when KV runs out) instead of as many sequences as KV holds at full context.
    pub overcommit: bool,
}

impl FleetConfig {
    fn shape(&self, max_context: usize, instances: usize) -> PoolShape {
        let max_seqs = match self.overcommit {
            true => self.profile.max_batch,
            false => self.profile.concurrency(max_context),
        };
        PoolShape { instances, max_seqs, max_context }
    }
}

/// The traces carry token counts but no text: each request gets a byte size from a
/// per-request bytes-per-token ratio (mean `bytes_per_token`, relative spread
/// `ratio_cv`), which the estimator then has to learn.
#[derive(Debug, Clone, PartialEq)]
pub struct RoutingModel {
    pub category: Category,
    pub bytes_per_token: f64,
    pub ratio_cv: f64,
    pub estimator: EstimatorConfig,
    pub seed: u64,
}

/// One pool sized for the objective.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PoolSizing {
    pub instances: usize,
    pub requests: usize,
    /// False when even one instance per request misses the objective.
    pub meets_slo: bool,
    pub p50_ttft_s: f64,
    pub p99_ttft_s: f64,
    pub preemptions: usize,
    pub rejected: usize,
    /// Busy share of the sized pool's instances.
    pub utilization: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FleetReport {
    pub homogeneous: PoolSizing,
    pub short: PoolSizing,
    pub long: PoolSizing,
    pub routes: RouteTally,
    /// Mean absolute percentage error of the estimator's prompt tokens.
    pub estimator_mape: f64,
    /// 1 − (short + long) / homogeneous instances.
    pub simulated_savings: f64,
    /// The closed form on the same stream (at the headroom's rate).
    pub closed_form: CostPlan,
}

/// A stream split between the pools.
#[derive(Debug, Clone, Default)]
pub struct Routed {
    pub short: Vec<Job>,
    pub long: Vec<Job>,
    pub routes: RouteTally,
    pub errors: ErrorTally,
}

/// Routes every request of the stream as the server would: bytes → estimated budget →
/// pool, the exact size deciding spill-over, feedback teaching the estimator.
pub fn route(arrivals: &[Arrival], model: &RoutingModel, short_max_context: usize) -> Routed {
    let dispatcher = Dispatcher { short_max_context };
    let mut estimator = BudgetEstimator::new(model.estimator.clone());
    let mut rng = SplitMix64(model.seed);
    let mut routed = Routed::default();
    for a in arrivals {
        let ratio = (model.bytes_per_token * (1.0 + model.ratio_cv * rng.normal() as f64)).max(1.0);
        let bytes = (a.prompt_tokens as f64 * ratio).round() as usize;
        // The trace's output length stands in for the client's max_tokens.
        let choice = dispatcher.choose(estimator.budget(model.category, bytes, a.output_tokens as usize));
        let outcome = dispatcher.outcome(choice, a.total_tokens());
        routed.routes.add(choice, outcome);
        let job = Job::from(a);
        match outcome.served_by(choice) {
            PoolChoice::Short => routed.short.push(job),
            PoolChoice::Long => routed.long.push(job),
        }
        if let Some(f) = estimator.observe(model.category, bytes, a.prompt_tokens as usize) {
            routed.errors.add(&f);
        }
    }
    routed
}

/// The fewest instances with which `jobs` meet the P99 TTFT objective.
pub fn size_pool(jobs: &[Job], fleet: &FleetConfig, max_context: usize) -> PoolSizing {
    if jobs.is_empty() {
        return PoolSizing::default();
    }
    let attempt = |n: usize| {
        let run = run_pool(jobs, &fleet.profile, fleet.shape(max_context, n));
        let p99 = run.ttft_quantile(0.99);
        (p99 <= fleet.slo_ttft_p99_s, run)
    };
    // Start from the load the stream puts on instances of this shape, grow until the
    // objective holds, then bisect down to the fewest.
    let duration = jobs.last().map_or(1.0, |j| j.at_s).max(1e-9);
    let batch = fleet.shape(max_context, 1).max_seqs;
    let work: f64 = jobs.iter().map(|j| fleet.profile.request_seconds(batch, j.prompt as f64, j.output as f64)).sum();
    let (mut low, mut high) = (0usize, ((work / duration).ceil() as usize).max(1));
    // One instance per request removes all queueing: if that misses, no count meets it.
    let most = jobs.len().max(high);
    let mut best = loop {
        match attempt(high) {
            (true, run) => break run,
            (false, run) if high >= most => return sizing(run, most, jobs.len(), duration, false),
            (false, _) => (low, high) = (high, (high + high / 4 + 1).min(most)),
        }
    };
    while high - low > 1 {
        let mid = (low + high) / 2;
        match attempt(mid) {
            (true, run) => (high, best) = (mid, run),
            (false, _) => low = mid,
        }
    }
    sizing(best, high, jobs.len(), duration, true)
}

fn sizing(run: PoolRun, instances: usize, requests: usize, duration: f64, meets_slo: bool) -> PoolSizing {
    let span = run.end_s.max(duration);
    PoolSizing {
        instances,
        requests,
        meets_slo,
        p50_ttft_s: run.ttft_quantile(0.5),
        p99_ttft_s: run.ttft_quantile(0.99),
        preemptions: run.preemptions,
        rejected: run.rejected,
        utilization: run.busy_s / (span * instances as f64),
    }
}

/// Sizes both fleets for the stream and sets their savings beside the closed form's.
pub fn compare(arrivals: &[Arrival], fleet: &FleetConfig, routing: &RoutingModel) -> FleetReport {
    let speedup = 1.0 + fleet.headroom;
    let stream: Vec<Arrival> = arrivals.iter().map(|a| Arrival { at_s: a.at_s / speedup, ..*a }).collect();
    let all: Vec<Job> = stream.iter().map(Job::from).collect();
    let routed = route(&stream, routing, fleet.pools.short);
    let homogeneous = size_pool(&all, fleet, fleet.pools.long);
    let short = size_pool(&routed.short, fleet, fleet.pools.short);
    let long = size_pool(&routed.long, fleet, fleet.pools.long);
    let dual = (short.instances + long.instances) as f64;
    FleetReport {
        simulated_savings: 1.0 - dual / homogeneous.instances.max(1) as f64,
        estimator_mape: routed.errors.mape(routing.category).unwrap_or(0.0),
        closed_form: CostPlan::new(&stream, &fleet.profile, fleet.pools, 1.0),
        homogeneous,
        short,
        long,
        routes: routed.routes,
    }
}
