use super::*;
use crate::pool::estimator::CategoryRatios;
use crate::pool::trace::{poisson_stream, QuantileTable};

fn profile(kv_tokens: usize, max_batch: usize) -> InstanceProfile {
    InstanceProfile {
        kv_tokens,
        max_batch,
        step_base_s: 0.02,
        step_per_seq_s: 0.000_5,
        prefill_per_token_s: 0.000_01,
        step_token_budget: 8192,
    }
}

fn job(at_s: f64, prompt: u32, output: u32) -> Job {
    Job { at_s, prompt, output }
}

#[test]
fn one_request_takes_one_step_per_token_and_its_first_step_prefills() {
    let p = profile(4096, 8);
    let run = run_pool(&[job(1.0, 100, 3)], &p, PoolShape { instances: 1, max_seqs: 8, max_context: 4096 });
    assert_eq!((run.completed, run.rejected, run.preemptions), (1, 0, 0));
    let first = 0.02 + 0.000_5 + 100.0 * 0.000_01;
    assert!((run.ttft_s[0] - first).abs() < 1e-12, "{:?}", run.ttft_s);
    assert!((run.end_s - (1.0 + first + 2.0 * 0.020_5)).abs() < 1e-12, "{}", run.end_s);
    assert!((run.busy_s - (first + 2.0 * 0.020_5)).abs() < 1e-12);
}

#[test]
fn requests_beyond_the_context_are_rejected_and_the_batch_cap_queues_the_rest() {
    let p = profile(4096, 2);
    let jobs = [job(0.0, 10, 5), job(0.0, 10, 5), job(0.0, 10, 5), job(0.0, 3000, 10)];
    let run = run_pool(&jobs, &p, PoolShape { instances: 1, max_seqs: 2, max_context: 2048 });
    assert_eq!((run.completed, run.rejected), (3, 1));
    let mut ttft = run.ttft_s.clone();
    ttft.sort_by(f64::total_cmp);
    assert!(ttft[2] > 5.0 * 0.02, "the third waits for a slot: {ttft:?}");
}

#[test]
fn kv_exhaustion_preempts_the_newest_and_it_still_finishes() {
    // Two sequences of 60 + 60 tokens cannot both grow to 120 in 200 KV slots.
    let p = profile(200, 8);
    let jobs = [job(0.0, 60, 60), job(0.001, 60, 60)];
    let run = run_pool(&jobs, &p, PoolShape { instances: 1, max_seqs: 8, max_context: 200 });
    assert_eq!(run.completed, 2);
    assert!(run.preemptions >= 1, "{run:?}");
}

#[test]
fn more_instances_lower_the_tail_latency() {
    let p = profile(16_384, 16);
    let t = QuantileTable::new(vec![(0.0, 20.0), (1.0, 400.0)]).unwrap();
    let stream = poisson_stream(40.0, 2000, &t, &t, 9);
    let jobs: Vec<Job> = stream.iter().map(Job::from).collect();
    let p99 = |n| run_pool(&jobs, &p, PoolShape { instances: n, max_seqs: 16, max_context: 4096 }).ttft_quantile(0.99);
    assert!(p99(4) > p99(8) && p99(8) >= p99(16), "{} {} {}", p99(4), p99(8), p99(16));
}

/// The check: on a stationary Poisson stream the simulated fleets' savings
/// agree with α(1 − 1/ρ) within 2 percentage points.
#[test]
fn simulated_savings_agree_with_the_closed_form_on_a_stationary_poisson_stream() {
    let prompt = QuantileTable::new(vec![(0.0, 50.0), (0.75, 700.0), (0.9, 3000.0), (1.0, 6000.0)]).unwrap();
    let output = QuantileTable::new(vec![(0.0, 10.0), (0.5, 60.0), (1.0, 250.0)]).unwrap();
    // Large pools (hundreds of sequence slots each), so that the queueing headroom an
    // objective needs and the rounding to whole instances stay small beside the savings.
    let stream = poisson_stream(600.0, 24_000, &prompt, &output, 42);
    let fleet = FleetConfig {
        profile: profile(131_072, 128),
        pools: PoolContexts { short: 1024, long: 8192 },
        slo_ttft_p99_s: 2.0,
        headroom: 0.0,
        overcommit: false,
    };
    let routing = RoutingModel {
        category: Category::Prose,
        bytes_per_token: 4.0,
        ratio_cv: 0.02,
        estimator: EstimatorConfig {
            prior_bytes_per_token: CategoryRatios { prose: 4.0, code: 3.3, cjk: 2.0 },
            ..EstimatorConfig::default()
        },
        seed: 7,
    };
    let report = compare(&stream, &fleet, &routing);
    let closed = report.closed_form.savings;
    assert!(report.homogeneous.instances >= 80, "a fleet large enough for rounding not to matter: {report:?}");
    assert!(report.homogeneous.meets_slo && report.short.meets_slo && report.long.meets_slo);
    assert!(
        (report.simulated_savings - closed).abs() < 0.02,
        "simulated {:.3} vs closed form {closed:.3}: {report:#?}",
        report.simulated_savings
    );
    assert!(report.routes.misroute_rate() < 0.02, "{:?}", report.routes);
}
