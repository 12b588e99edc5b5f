//! The re-planning actor: at start it plans the thresholds per N from the models'
//! start-up costs and the policy's expected routing; then on a timer it reads every
//! subserver's counters, lets the core `Replanner` decide, and sends a new batching rule
//! to the subservers when it switches. Searches run on a blocking thread so no async
//! worker stalls; what the planner did is published in a [`PlannerStatusCell`] that
//! readers take without asking the actor (which may be waiting on a search).

use std::sync::{Arc, Weak};

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokenrouter_core::model::threads;
use tokenrouter_core::sched::planner::{
    startup_plan, LatencyTable, PlannerStatus, Replanner, StartupSpec, STARTUP_CONCURRENCIES,
};

use crate::handles::EngineLinks;
use crate::messages::ReplanMsg;

pub struct ReplanActor;

/// What the planner did and why, as of its last decision: written by the actor, read
/// by `/v1/stats` at any time.
#[derive(Clone)]
pub struct PlannerStatusCell(Arc<parking_lot::Mutex<PlannerStatus>>);

impl PlannerStatusCell {
    pub fn new(status: PlannerStatus) -> Self {
        PlannerStatusCell(Arc::new(parking_lot::Mutex::new(status)))
    }

    pub fn get(&self) -> PlannerStatus {
        self.0.lock().clone()
    }

    fn set(&self, status: PlannerStatus) {
        *self.0.lock() = status;
    }
}

pub struct ReplanState {
    /// `None` while a search runs on a blocking thread.
    replanner: Option<Replanner>,
    status: PlannerStatusCell,
    engine: Weak<EngineLinks>,
    /// Ticks that queued while a slow search ran are dropped until then.
    next_look: std::time::Instant,
}

pub struct ReplanArgs {
    pub(crate) replanner: Replanner,
    pub(crate) engine: Weak<EngineLinks>,
    /// Plan at start at this delegation rate (two models with start-up costs).
    pub(crate) plan_at_start: Option<f64>,
    pub(crate) status: PlannerStatusCell,
}

impl Actor for ReplanActor {
    type Msg = ReplanMsg;
    type State = ReplanState;
    type Arguments = ReplanArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<ReplanMsg>,
        args: ReplanArgs,
    ) -> Result<ReplanState, ActorProcessingErr> {
        if let Some(delegation) = args.plan_at_start {
            myself.send_message(ReplanMsg::PlanAtStart(delegation))?;
        }
        myself.send_interval(args.replanner.config().interval, || ReplanMsg::Tick);
        args.status.set(args.replanner.status());
        let next_look = std::time::Instant::now();
        Ok(ReplanState { replanner: Some(args.replanner), status: args.status, engine: args.engine, next_look })
    }

    async fn handle(
        &self,
        _: ActorRef<ReplanMsg>,
        msg: ReplanMsg,
        state: &mut ReplanState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ReplanMsg::SetRule(rule) => {
                if let Some(r) = state.replanner.as_mut() {
                    r.set_rule(rule.clone());
                    state.status.set(r.status());
                }
                // Again, after anything this actor broadcast since the engine did: the
                // hand rule is the last the subservers hear.
                if let Some(engine) = state.engine.upgrade() {
                    engine.broadcast_rule(rule);
                }
            }
            ReplanMsg::PlanAtStart(delegation) => plan_at_start(state, delegation).await,
            ReplanMsg::Tick => tick(state).await,
        }
        Ok(())
    }
}

/// The start-up table over [`STARTUP_CONCURRENCIES`], adopted unless thresholds were
/// set by hand while it was searched.
async fn plan_at_start(state: &mut ReplanState, delegation: f64) {
    let (Some(engine), Some(mut replanner)) = (state.engine.upgrade(), state.replanner.take()) else { return };
    let costs: Option<[LatencyTable; 2]> = match replanner.priors() {
        [Some(small), Some(large)] => Some([small.clone(), large.clone()]),
        _ => None,
    };
    let Some(costs) = costs else {
        state.replanner = Some(replanner);
        return;
    };
    let config = replanner.config();
    let spec = StartupSpec {
        delegation,
        workload: config.workload,
        max_batch: config.max_batch,
        max_active: STARTUP_CONCURRENCIES.last().copied().unwrap_or(1),
        exclusive: config.exclusive_compute,
    };
    let started = std::time::Instant::now();
    let planned = tokio::task::spawn_blocking(move || in_background(|| startup_plan(&costs, &spec))).await;
    match planned {
        Ok(Ok(plan)) => {
            tracing::info!(delegation, tokens_per_row = ?plan.tokens_per_row, table = ?plan.table,
                seconds = started.elapsed().as_secs_f64(),
                "planned thresholds at start-up (N, thresholds, predicted tok/s)");
            if replanner.adopt_startup(plan) {
                engine.broadcast_rule(replanner.rule().clone());
            }
        }
        Ok(Err(e)) => tracing::warn!(error = %e, "no start-up plan; thresholds stay as configured"),
        Err(e) => tracing::warn!(error = %e, "the start-up plan's search failed"),
    }
    state.status.set(replanner.status());
    state.replanner = Some(replanner);
}

/// Searches run on one low-priority thread: they use the cycles the models leave.
fn in_background<T: Send>(search: impl FnOnce() -> T + Send) -> T {
    match threads::background_pool() {
        Some(pool) => pool.install(search),
        None => search(),
    }
}

async fn tick(state: &mut ReplanState) {
    if std::time::Instant::now() < state.next_look {
        return;
    }
    let (Some(engine), Some(mut replanner)) = (state.engine.upgrade(), state.replanner.take()) else { return };
    let interval = replanner.config().interval;
    let snapshots = engine.snapshots().await;
    if snapshots.len() != engine.model_count() {
        state.replanner = Some(replanner);
        return; // a subserver is restarting: its counters are not comparable
    }
    let stats: Vec<_> = snapshots.into_iter().map(|s| s.stats).collect();
    let active = engine.active_count();
    let decided = tokio::task::spawn_blocking(move || {
        let outcome = in_background(|| replanner.observe(&stats, active));
        (replanner, outcome)
    })
    .await;
    let Ok((replanner, outcome)) = decided else { return };
    match outcome {
        Ok(Some(replan)) => {
            tracing::info!(active = replan.active, from = ?replan.from, to = ?replan.to,
                predicted_from = replan.predicted_from, predicted_to = replan.predicted_to,
                route = ?replan.route, tokens_per_row = ?replan.tokens_per_row, "re-planned thresholds");
            metrics::counter!("tokenrouter_replans_total").increment(1);
            for (i, b) in replan.to.iter().enumerate() {
                metrics::gauge!("tokenrouter_planned_threshold", "model" => engine.model_name(i).to_string())
                    .set(*b as f64);
            }
            engine.broadcast_rule(replanner.rule().clone());
        }
        Ok(None) => {}
        Err(e) => tracing::debug!(error = %e, "re-planning skipped"),
    }
    state.status.set(replanner.status());
    state.replanner = Some(replanner);
    state.next_look = std::time::Instant::now() + interval / 2;
}
