//! The re-planning actor: on a timer it reads every subserver's counters, lets the
//! core `Replanner` decide, and sends a new batching rule to the subservers when it
//! switches. The search runs on a blocking thread so no async worker stalls.

use std::sync::Weak;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokenrouter_core::sched::planner::Replanner;
use tokenrouter_core::sched::BatchingRule;

use crate::engine::EngineShared;

pub enum ReplanMsg {
    Tick,
    /// The thresholds were set by hand.
    SetRule(BatchingRule),
}

// Local only: ractor's `cluster` feature drops the blanket impl (see remote/).
impl ractor::Message for ReplanMsg {}

pub struct ReplanActor;

pub struct ReplanState {
    replanner: Option<Replanner>,
    engine: Weak<EngineShared>,
}

pub struct ReplanArgs {
    pub(crate) replanner: Replanner,
    pub(crate) engine: Weak<EngineShared>,
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
        myself.send_interval(args.replanner.config().interval, || ReplanMsg::Tick);
        Ok(ReplanState { replanner: Some(args.replanner), engine: args.engine })
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
                    r.set_rule(rule);
                }
            }
            ReplanMsg::Tick => tick(state).await,
        }
        Ok(())
    }
}

async fn tick(state: &mut ReplanState) {
    let (Some(engine), Some(mut replanner)) = (state.engine.upgrade(), state.replanner.take()) else { return };
    let snapshots = engine.snapshots().await;
    if snapshots.len() != engine.model_count() {
        state.replanner = Some(replanner);
        return; // a subserver is restarting: its counters are not comparable
    }
    let stats: Vec<_> = snapshots.into_iter().map(|s| s.stats).collect();
    let active = engine.active_count();
    let decided = tokio::task::spawn_blocking(move || {
        let outcome = replanner.observe(&stats, active);
        (replanner, outcome)
    })
    .await;
    let Ok((replanner, outcome)) = decided else { return };
    match outcome {
        Ok(Some(replan)) => {
            tracing::info!(active = replan.active, from = ?replan.from, to = ?replan.to,
                predicted_from = replan.predicted_from, predicted_to = replan.predicted_to, "re-planned thresholds");
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
    state.replanner = Some(replanner);
}
