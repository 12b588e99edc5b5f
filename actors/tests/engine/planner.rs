//! The planner on, as `serve` runs it by default: a start-up profile on each compute
//! thread, a table of thresholds per N planned from it, re-planning from served counters,
//! and thresholds set by hand that win over all of it.

use super::*;
use tokenrouter_core::model::StepCostSource;
use tokenrouter_core::sched::planner::{PlannerStatus, ReplanConfig, RuleSource, WorkloadPrior};

fn planned_config(m: &mut Models) -> EngineConfig {
    for load in &mut m.load {
        load.step_cost = StepCostSource::Measure { max_rows: 64, max_tokens: 1024 };
    }
    let mut config = engine_config(m, random(0.3), &[1, 1]);
    // Re-plan often and on any predicted gain: thresholds change under running requests.
    config.replan = Some(ReplanConfig {
        interval: Duration::from_millis(200),
        margin: 0.0,
        min_steps: 10,
        // What `request` sends: prompts of 2 to 30 tokens, 10 to 20 out.
        workload: WorkloadPrior { prompt_tokens: 16.0, output_tokens: 15.0 },
        ..ReplanConfig::default()
    });
    config
}

async fn status_once(engine: &Engine, done: impl Fn(&PlannerStatus) -> bool) -> PlannerStatus {
    for _ in 0..300 {
        if let Some(status) = engine.planner_status().await.filter(|s| done(s)) {
            return status;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the planner did not get there in 30 s: {:?}", engine.planner_status().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_planner_on_serving_still_equals_the_sequential_reference() {
    let mut m = models(&[48, 64]);
    let want = reference_outputs(&m, random(0.3), 16);
    let engine = Engine::start(planned_config(&mut m)).await.unwrap();
    let status = status_once(&engine, |s| s.source != RuleSource::Configured).await;
    let startup = status.startup.expect("a start-up plan from the measured costs");
    assert!((startup.delegation - 0.3).abs() < 1e-9, "the random policy's p is the routing prior: {startup:?}");
    assert_eq!(startup.table.first().map(|r| (r.0, r.1.clone())), Some((1, vec![1, 1])));
    assert!(status.replanning);
    let orders: [Vec<u64>; 3] =
        [(0..16).collect(), (0..16).rev().collect(), vec![5, 3, 11, 0, 15, 2, 9, 1, 14, 4, 8, 12, 6, 13, 7, 10]];
    for order in orders {
        let tasks: Vec<_> = order
            .iter()
            .map(|&i| {
                let (engine, r) = (engine.clone(), request_in(&m, i));
                tokio::spawn(async move { (i, collect(&engine, r).await) })
            })
            .collect();
        for task in tasks {
            let (i, (tokens, end)) = task.await.unwrap();
            assert!(matches!(end, GenerationEvent::Finished { .. }), "{end:?}");
            want[&i].check(&tokens, m.greedy_gap.unwrap_or(1e-4)).unwrap_or_else(|e| panic!("request {i}: {e}"));
        }
    }
    wait_until_everything_is_freed(&engine).await;
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thresholds_set_by_hand_win_over_the_planner() {
    let mut m = models(&[16, 32]);
    let engine = Engine::start(planned_config(&mut m)).await.unwrap();
    status_once(&engine, |s| s.source == RuleSource::Startup).await;
    engine.set_batching(BatchingRule::fixed(&[1, 3])).unwrap();
    let status = status_once(&engine, |s| s.source == RuleSource::Hand).await;
    assert!(!status.replanning);
    // Eight clients for a few re-planning windows: the hand rule stays in force.
    let clients: Vec<_> = (0..8u64)
        .map(|c| {
            let engine = engine.clone();
            tokio::spawn(async move {
                for i in 0..6 {
                    let (_, end) = collect(&engine, request(c * 100 + i)).await;
                    assert!(matches!(end, GenerationEvent::Finished { .. }), "{end:?}");
                }
            })
        })
        .collect();
    for c in clients {
        c.await.unwrap();
    }
    // At margin 0 and 200 ms windows the re-planner would have switched something.
    let status = engine.planner_status().await.unwrap();
    assert_eq!((status.source, status.last_replan), (RuleSource::Hand, None));
    engine.shutdown().await;
}
