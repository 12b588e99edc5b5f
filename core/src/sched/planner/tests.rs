use super::*;
use crate::rng::SplitMix64;

fn close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * a.abs().max(b.abs())
}

fn one_model(latency: LatencyTable) -> PlannerInput {
    PlannerInput {
        latencies: vec![latency],
        route: vec![vec![1.0]],
        commit: vec![vec![1.0]],
        max_batch: 64,
        entry_model: 0,
        delta_ms: None,
        exclusive: false,
    }
}

fn linear(base: f64, per_row: f64) -> LatencyTable {
    LatencyTable::from_points([(1, base + per_row), (64, base + 64.0 * per_row)]).unwrap()
}

#[test]
fn one_model_runs_every_request_in_one_batch() {
    let input = one_model(linear(2.0, 0.5));
    for n in [1, 3, 8] {
        for b in 1..=n {
            let t = predict(&input, n, &[b]).unwrap().tokens_per_sec;
            let expected = n as f64 / (2.0 + 0.5 * n as f64) * 1e3;
            assert!(close(t, expected, 1e-9), "N={n} B={b}: {t} vs {expected}");
        }
    }
}

#[test]
fn without_routing_the_large_model_idles() {
    let input = PlannerInput::delegation(linear(4.75, 0.25), LatencyTable::constant(30.0), 0.0);
    let p = predict(&input, 6, &[1, 3]).unwrap();
    assert!(close(p.tokens_per_sec, 6.0 / 6.25 * 1e3, 1e-9), "{}", p.tokens_per_sec);
    assert_eq!(p.busy_fraction[1], 0.0);
    assert!(close(p.mean_batch[0], 6.0, 1e-12));
}

#[test]
fn one_request_pays_the_small_step_plus_p_large_steps_per_token() {
    // Per token: 1/p small steps, the last one's token replaced by one large step.
    for p in [0.1, 0.35, 0.5] {
        let input = PlannerInput::delegation(LatencyTable::constant(6.0), LatencyTable::constant(27.9), p);
        let t = predict(&input, 1, &[1, 1]).unwrap().tokens_per_sec;
        let expected = 1e3 / (6.0 + p * 27.9);
        assert!(close(t, expected, 1e-8), "p={p}: {t} vs {expected}");
    }
}

#[test]
fn deterministic_alternation_moves_requests_as_one_batch() {
    let input = PlannerInput::delegation(LatencyTable::constant(5.0), LatencyTable::constant(20.0), 1.0);
    for n in [1, 2, 5] {
        let p = predict(&input, n, &[1, 1]).unwrap();
        assert!(close(p.tokens_per_sec, n as f64 / 25.0 * 1e3, 1e-9), "N={n}: {}", p.tokens_per_sec);
        assert!(close(p.busy_fraction[0], 0.2, 1e-9) && close(p.busy_fraction[1], 0.8, 1e-9));
    }
}

#[test]
fn feasible_grid_is_every_vector_under_the_deadlock_bound() {
    for n in 1..10 {
        let grid = search::feasible_thresholds(2, n);
        assert_eq!(grid.len(), n * (n + 1) / 2, "N={n}");
        assert!(grid.iter().all(|b| b[0] + b[1] <= n + 1));
    }
    assert_eq!(search::feasible_thresholds(3, 1), vec![vec![1, 1, 1]]);
}

#[test]
fn bad_inputs_are_refused_with_reasons() {
    let mut input = PlannerInput::delegation(LatencyTable::constant(6.0), LatencyTable::constant(28.0), 0.3);
    assert_eq!(predict(&input, 3, &[3, 2]), Err(PlanError::Deadlock { thresholds: vec![3, 2], n: 3 }));
    assert_eq!(predict(&input, 0, &[1, 1]), Err(PlanError::Concurrency(0)));
    input.route[1] = vec![0.5, 0.4];
    assert!(matches!(predict(&input, 2, &[1, 1]), Err(PlanError::RouteRow { row: 1, .. })));
    input.route[1] = vec![1.0, 0.0];
    input.delta_ms = Some(1e-4);
    assert!(matches!(predict(&input, 2, &[1, 1]), Err(PlanError::LatencyRange { .. })));
}

#[test]
fn a_finer_time_unit_changes_little() {
    let input = PlannerInput::delegation(linear(5.0, 0.3), linear(25.0, 0.9), 0.35);
    let coarse = predict(&input, 6, &[2, 2]).unwrap().tokens_per_sec;
    let fine = predict(&PlannerInput { delta_ms: Some(input.delta_ms() / 3.0), ..input.clone() }, 6, &[2, 2])
        .unwrap()
        .tokens_per_sec;
    assert!(close(coarse, fine, 0.01), "{coarse} vs {fine}");
}

/// Discrete-event simulation of the same system, request by request.
fn simulate(input: &PlannerInput, n: usize, thresholds: &[usize], steps: usize, seed: u64) -> f64 {
    let m = input.models();
    let mut rng = SplitMix64(seed);
    let mut queued = vec![0usize; m];
    let mut running: Vec<Option<(usize, f64)>> = vec![None; m]; // (rows, end time)
    queued[input.entry_model] = n;
    let (mut now, mut tokens, mut done) = (0.0, 0.0, 0);
    let launch = |queued: &mut Vec<usize>, running: &mut Vec<Option<(usize, f64)>>, now: f64, ended: Option<usize>| {
        // Taking turns: the first model that waited, else the one whose step just ended.
        let order: Vec<usize> = (0..m).filter(|&i| Some(i) != ended).chain(ended).collect();
        for i in order {
            if input.exclusive && running.iter().any(Option::is_some) {
                return;
            }
            if running[i].is_none() && queued[i] > 0 && queued[i] >= thresholds[i] {
                let rows = queued[i].min(input.max_batch);
                queued[i] -= rows;
                running[i] = Some((rows, now + input.latencies[i].at(rows)));
            }
        }
    };
    launch(&mut queued, &mut running, now, None);
    let warmup = steps / 10;
    let mut start_time = 0.0;
    while done < steps {
        let (i, (rows, end)) = running
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.map(|r| (i, r)))
            .min_by(|a, b| a.1 .1.total_cmp(&b.1 .1))
            .unwrap();
        now = end;
        running[i] = None;
        for _ in 0..rows {
            let u = rng.open_unit();
            let mut acc = 0.0;
            let j = (0..m).find(|&j| {
                acc += input.route[i][j];
                u < acc
            });
            let j = j.unwrap_or(m - 1);
            if done >= warmup {
                tokens += input.commit[i][j];
            }
            queued[j] += 1;
        }
        done += 1;
        if done == warmup {
            start_time = now;
        }
        launch(&mut queued, &mut running, now, Some(i));
    }
    tokens / (now - start_time) * 1e3
}

#[test]
fn the_chain_agrees_with_a_simulation_of_the_same_system() {
    let input = PlannerInput::delegation(linear(5.0, 0.3), linear(24.0, 1.1), 0.35);
    for (n, b) in [(4, [2, 1]), (6, [1, 3]), (8, [3, 2])] {
        let predicted = predict(&input, n, &b).unwrap();
        assert!(predicted.converged);
        let simulated = simulate(&input, n, &b, 400_000, 7);
        assert!(close(predicted.tokens_per_sec, simulated, 0.01), "N={n} B={b:?}: {predicted:?} vs {simulated}");
    }
}

/// Models that take turns on shared compute: the chain still agrees with the simulation;
/// one request never overlaps itself, so N = 1 predicts what side-by-side models do, and
/// more requests are predicted slower than side by side.
#[test]
fn models_taking_turns_agree_with_a_simulation_and_never_overlap() {
    let side_by_side = PlannerInput::delegation(linear(5.0, 0.3), linear(24.0, 1.1), 0.35);
    let turns = PlannerInput { exclusive: true, ..side_by_side.clone() };
    for (n, b) in [(4, [2, 1]), (6, [1, 3]), (8, [3, 2])] {
        let predicted = predict(&turns, n, &b).unwrap();
        assert!(predicted.converged);
        let simulated = simulate(&turns, n, &b, 400_000, 11);
        assert!(close(predicted.tokens_per_sec, simulated, 0.01), "N={n} B={b:?}: {predicted:?} vs {simulated}");
        let parallel = predict(&side_by_side, n, &b).unwrap().tokens_per_sec;
        assert!(predicted.tokens_per_sec < parallel * 0.97, "N={n}: {} vs {parallel}", predicted.tokens_per_sec);
    }
    let one = |input: &PlannerInput| predict(input, 1, &[1, 1]).unwrap().tokens_per_sec;
    assert!(close(one(&turns), one(&side_by_side), 1e-9));
}

#[test]
fn search_prefers_batching_the_large_model_when_it_is_batch_friendly() {
    // The large model's step costs nearly the same for 1 or many rows, so holding it
    // until several requests are ready must beat launching it at once.
    let input = PlannerInput::delegation(linear(5.0, 0.2), linear(30.0, 0.1), 0.35);
    let plan = search_with(&input, 8, SearchOptions::exhaustive()).unwrap();
    assert_eq!(plan.evaluated, 36);
    let eager = predict(&input, 8, &[1, 1]).unwrap().tokens_per_sec;
    assert!(plan.best.prediction.tokens_per_sec > eager * 1.02, "{plan:?} vs eager {eager}");
    assert!(plan.best.thresholds[1] > 1, "{:?}", plan.best.thresholds);
    let runner_up = plan.runner_up.unwrap();
    assert!(runner_up.prediction.tokens_per_sec <= plan.best.prediction.tokens_per_sec);
}

#[test]
fn screening_at_a_coarser_unit_finds_what_exhaustive_search_finds() {
    for (p, n) in [(0.1, 8), (0.35, 12), (0.5, 6)] {
        let input = PlannerInput::delegation(linear(5.0, 0.4), linear(27.0, 0.6), p);
        let screened = search(&input, n).unwrap();
        let exhaustive = search_with(&input, n, SearchOptions::exhaustive()).unwrap();
        let (a, b) = (screened.best.prediction.tokens_per_sec, exhaustive.best.prediction.tokens_per_sec);
        assert!(close(a, b, 1e-9), "p={p} N={n}: {:?} vs {:?}", screened.best.thresholds, exhaustive.best.thresholds);
        assert!((exhaustive.evaluated + 8..=exhaustive.evaluated + 9).contains(&screened.evaluated));
    }
}

#[test]
fn near_ties_go_to_the_smaller_thresholds() {
    // A large model whose step cost grows in proportion to its rows gains nothing from
    // waiting: eager thresholds tie with the best and must be chosen.
    let input = PlannerInput::delegation(linear(4.0, 1.0), linear(0.0, 20.0), 0.3);
    let exhaustive =
        search_with(&input, 8, SearchOptions { tie_tolerance: 0.0, ..SearchOptions::exhaustive() }).unwrap();
    let tolerant = search_with(&input, 8, SearchOptions::exhaustive()).unwrap();
    let best = exhaustive.best.prediction.tokens_per_sec;
    assert!(tolerant.best.prediction.tokens_per_sec >= best * 0.99);
    assert!(
        tolerant.best.thresholds.iter().sum::<usize>() <= exhaustive.best.thresholds.iter().sum::<usize>(),
        "{:?} vs {:?}",
        tolerant.best.thresholds,
        exhaustive.best.thresholds
    );
}
