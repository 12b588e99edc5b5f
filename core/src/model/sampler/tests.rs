//! Unit tests of the sampler.

use super::*;

type Params = SamplingParams;

fn draw(logits: &[f32], params: &Params, position: u64) -> u32 {
    sample(logits, params, &TokenCounts::new(), position).token
}

fn histogram(logits: &[f32], params: &Params, draws: u64) -> Vec<u64> {
    let mut sampler = Sampler::new();
    let mut counts = vec![0u64; logits.len()];
    for position in 0..draws {
        counts[sampler.sample(logits, params, &TokenCounts::new(), position).token as usize] += 1;
    }
    counts
}

/// Quantized so that ties occur; seeded so every run sees the same vectors.
fn pseudo_logits(vocab: usize, seed: u64) -> Vec<f32> {
    (0..vocab as u64).map(|i| ((uniform(seed, i) * 16.0 - 8.0) * 4.0).round() as f32 / 4.0).collect()
}

fn ln_probs(probs: &[f32]) -> Vec<f32> {
    probs.iter().map(|p| p.ln()).collect()
}

/// Naive full-sort sampler with the same (seed, position) draw.
fn reference_draw(logits: &[f32], params: &Params, u: f64) -> u32 {
    let scaled: Vec<f32> = logits.iter().map(|&x| sanitize(x * (1.0 / params.temperature))).collect();
    let max = scaled.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut order: Vec<(f32, u32)> = scaled.iter().zip(0..).map(|(&z, id)| (exp_nonpositive(z - max), id)).collect();
    order.sort_by(|a, b| b.0.partial_cmp(&a.0).unwrap().then(a.1.cmp(&b.1)));
    if params.top_k > 0 {
        order.truncate(params.top_k);
    }
    let total: f64 = order.iter().map(|c| c.0 as f64).sum();
    let mut cumulative = 0.0;
    let top_p_len = order.iter().position(|c| {
        cumulative += c.0 as f64 / total;
        cumulative >= params.top_p as f64
    });
    order.truncate(top_p_len.map_or(order.len(), |i| i + 1));
    let threshold = params.min_p * order[0].0;
    order.retain(|c| c.0 >= threshold);
    let target = u * order.iter().map(|c| c.0 as f64).sum::<f64>();
    let mut cumulative = 0.0;
    order
        .iter()
        .find(|c| {
            cumulative += c.0 as f64;
            cumulative > target
        })
        .unwrap()
        .1
}

#[test]
fn exp_nonpositive_matches_std_exp() {
    for i in 0..=200_000 {
        let x = -90.0 * i as f32 / 200_000.0;
        let (fast, exact) = (exp_nonpositive(x) as f64, (x as f64).exp());
        let tolerance = if x > -86.0 { 3e-7 * exact } else { 1e-37 };
        assert!((fast - exact).abs() <= tolerance, "x {x}: {fast} vs {exact}");
    }
    assert_eq!((exp_nonpositive(0.0), exp_nonpositive(f32::NEG_INFINITY)), (1.0, 0.0));
}

#[test]
fn greedy_picks_argmax_with_lowest_id_on_ties() {
    let greedy = Params::greedy();
    assert_eq!(draw(&[0.1, 3.0, -2.0, 2.9], &greedy, 0), 1);
    assert_eq!(draw(&[1.0, 5.0, 2.0, 5.0, 5.0], &greedy, 7), 1);
    let mut wide = pseudo_logits(100, 4);
    (wide[70], wide[20]) = (9.0, 9.0);
    assert_eq!(draw(&wide, &greedy, 0), 20);
    let tiny = Params { temperature: 1e-6, top_k: 2, top_p: 0.1, min_p: 0.9, ..Params::default() };
    assert_eq!(draw(&[1.0, 4.0, 4.0, 2.0], &tiny, 3), 1);
}

#[test]
fn same_seed_and_position_give_same_token_and_positions_spread() {
    let logits = vec![0.0; 16];
    let params = Params { seed: 42, ..Params::default() };
    let counts = histogram(&logits, &params, 1600);
    assert!(counts.iter().all(|&c| (60..=140).contains(&c)), "{counts:?}");
    for position in 0..50 {
        assert_eq!(draw(&logits, &params, position), draw(&logits, &params, position));
    }
    let mut reused = Sampler::new();
    reused.sample(&pseudo_logits(500, 1), &Params { top_k: 7, ..Params::default() }, &TokenCounts::new(), 3);
    let row = pseudo_logits(64, 2);
    assert_eq!(reused.sample(&row, &params, &TokenCounts::new(), 9), sample(&row, &params, &TokenCounts::new(), 9));
    let other_seed = Params { seed: 43, ..Params::default() };
    let differing = (0..50).filter(|&t| draw(&logits, &params, t) != draw(&logits, &other_seed, t)).count();
    assert!(differing > 30, "{differing}");
}

#[test]
fn frequencies_match_softmax_of_scaled_logits() {
    let logits = [1.0f32, 0.5, 0.0, -0.5, 2.0, 1.0];
    let params = Params { temperature: 0.7, seed: 9, ..Params::default() };
    let draws = 60_000;
    let weights: Vec<f64> = logits.iter().map(|&x| (x as f64 / 0.7).exp()).collect();
    let total: f64 = weights.iter().sum();
    let observed = histogram(&logits, &params, draws);
    let chi_square: f64 = observed
        .iter()
        .zip(&weights)
        .map(|(&o, w)| {
            let expected = w / total * draws as f64;
            (o as f64 - expected).powi(2) / expected
        })
        .sum();
    assert!(chi_square < 20.5, "chi-square {chi_square} (df 5, p = 0.001 at 20.5), {observed:?}");
}

#[test]
fn matches_naive_full_sort_sampler() {
    let configs = [
        Params { temperature: 1.0, ..Params::default() },
        Params { temperature: 0.8, top_p: 0.95, ..Params::default() },
        Params { temperature: 0.5, top_p: 0.5, ..Params::default() },
        Params { temperature: 1.3, min_p: 0.05, ..Params::default() },
        Params { top_k: 50, top_p: 0.9, min_p: 0.01, ..Params::default() },
        Params { top_k: 3, ..Params::default() },
    ];
    let mut sampler = Sampler::new();
    for (vector, vocab) in [(1, 3000), (2, 5000), (3, 40), (4, 4000)] {
        let mut logits = pseudo_logits(vocab, vector);
        if vector == 4 {
            // A heavy tail: most draws land outside the first histogram window.
            logits.iter_mut().for_each(|x| *x /= 2.0);
            logits[17] = 10.0;
        }
        for params in &configs {
            for position in 0..200 {
                let got = sampler.sample(&logits, params, &TokenCounts::new(), position).token;
                let want = reference_draw(&logits, params, uniform(params.seed, position));
                assert_eq!(got, want, "vocab {vocab} position {position} {params:?}");
            }
        }
    }
}

#[test]
fn find_key_matches_naive_scan_across_windows() {
    for (first_octave, octaves) in [(0.0, 30.0), (40.0, 30.0), (90.0, 30.0)] {
        let weights: Vec<f32> = (0..3000).map(|i| (-(first_octave + octaves * uniform(8, i)) as f32).exp2()).collect();
        let mut sorted = weights.clone();
        sorted.sort_by(|a, b| b.partial_cmp(a).unwrap());
        let first_window = window_histogram(&weights, 0);
        let mut cumulative = 0.0f64;
        for &w in &sorted {
            let target = cumulative + w as f64 / 2.0;
            cumulative += w as f64;
            let (key, mass_before) = find_key(&weights, first_window, |mass| mass > target);
            let heavier: f64 = weights.iter().filter(|&&v| key_of(v) < key_of(w)).map(|&v| v as f64).sum();
            assert_eq!(key, key_of(w), "target {target}");
            assert!((mass_before - heavier).abs() <= 1e-9 * heavier, "{mass_before} vs {heavier}");
        }
        let (last, _) = find_key(&weights, first_window, |_| false);
        assert_eq!(last, key_of(sorted[2999]), "unreachable target falls back to the last key with mass");
    }
}

#[test]
fn top_k_never_returns_tokens_outside_the_top_k() {
    let logits = pseudo_logits(100, 5);
    let mut ranked: Vec<u32> = (0..100).collect();
    ranked.sort_by(|&a, &b| logits[b as usize].partial_cmp(&logits[a as usize]).unwrap().then(a.cmp(&b)));
    let counts = histogram(&logits, &Params { top_k: 5, temperature: 5.0, ..Params::default() }, 3000);
    let hit: Vec<u32> = (0..100).filter(|&t| counts[t as usize] > 0).collect();
    let mut top5 = ranked[..5].to_vec();
    top5.sort();
    assert_eq!(hit, top5);
}

#[test]
fn top_p_keeps_only_the_smallest_set_reaching_p() {
    let logits = ln_probs(&[0.15, 0.5, 0.05, 0.3]);
    let counts = histogram(&logits, &Params { top_p: 0.75, ..Params::default() }, 2000);
    assert_eq!((counts[0], counts[2]), (0, 0), "{counts:?}");
    assert!(counts[1] > counts[3] && counts[3] > 500, "{counts:?}");
}

#[test]
fn min_p_drops_tokens_below_fraction_of_the_best() {
    let logits = ln_probs(&[0.5, 0.3, 0.15, 0.05]);
    let counts = histogram(&logits, &Params { min_p: 0.2, ..Params::default() }, 3000);
    assert_eq!(counts[3], 0, "{counts:?}");
    assert!(counts[2] > 200, "{counts:?}");
}

#[test]
fn repetition_penalty_flips_choice_for_positive_and_negative_logits() {
    let penalised = Params { repetition_penalty: 2.0, ..Params::greedy() };
    let encouraging = Params { repetition_penalty: 0.5, ..Params::greedy() };
    let mut prompt_seen = TokenCounts::new();
    prompt_seen.observe_prompt(&[0, 0, 7]);
    let mut output_seen = TokenCounts::new();
    output_seen.observe_output(0);
    let pick = |logits: [f32; 2], params: &Params, counts: &TokenCounts| sample(&logits, params, counts, 0).token;
    assert_eq!(pick([2.0, 1.5], &Params::greedy(), &prompt_seen), 0);
    assert_eq!(pick([2.0, 1.5], &penalised, &prompt_seen), 1, "2.0 / 2 < 1.5");
    assert_eq!(pick([-1.0, -1.5], &penalised, &output_seen), 1, "-1.0 * 2 < -1.5");
    assert_eq!(pick([1.5, 2.0], &encouraging, &output_seen), 0, "1.5 / 0.5 > 2.0");
}

#[test]
fn penalties_apply_to_raw_logits_before_temperature() {
    let logits = pseudo_logits(300, 6);
    let mut counts = TokenCounts::new();
    counts.observe_prompt(&[3, 5, 8, 13, 21]);
    [5, 7, 7, 9, 9, 9, 250].into_iter().for_each(|t| counts.observe_output(t));
    let penalties =
        Params { repetition_penalty: 1.3, presence_penalty: 0.5, frequency_penalty: 0.25, ..Params::default() };
    let mut penalised = logits.clone();
    for (token, x) in penalised.iter_mut().enumerate() {
        let token = token as u32;
        if counts.in_prompt(token) || counts.output_count(token) > 0 {
            *x = if *x > 0.0 { *x / 1.3 } else { *x * 1.3 };
        }
        let count = counts.output_count(token);
        *x -= if count > 0 { 0.5 + 0.25 * count as f32 } else { 0.0 };
    }
    // Temperature 0.5 scales exactly, so both orders of operations round alike.
    for extra in [Params { temperature: 0.5, ..penalties.clone() }, Params { temperature: 0.5, top_k: 20, ..penalties }]
    {
        for position in 0..300 {
            let got = sample(&logits, &extra, &counts, position).token;
            let want = reference_draw(&penalised, &extra, uniform(extra.seed, position));
            assert_eq!(got, want, "position {position}");
        }
    }
}

#[test]
fn presence_and_frequency_penalties_use_output_counts_only() {
    let mut counts = TokenCounts::new();
    counts.observe_prompt(&[1]);
    (0..3).for_each(|_| counts.observe_output(0));
    assert_eq!((counts.output_count(0), counts.in_prompt(1), counts.in_prompt(0)), (3, true, false));
    let pick = |params: Params, logits: [f32; 2]| sample(&logits, &params, &counts, 0).token;
    assert_eq!(pick(Params { frequency_penalty: 0.4, ..Params::greedy() }, [3.0, 2.0]), 1, "3 - 3 * 0.4 < 2");
    assert_eq!(pick(Params { frequency_penalty: 0.3, ..Params::greedy() }, [3.0, 2.0]), 0, "3 - 3 * 0.3 > 2");
    assert_eq!(pick(Params { presence_penalty: 1.5, ..Params::greedy() }, [3.0, 2.0]), 1, "3 - 1.5 < 2");
    assert_eq!(pick(Params { presence_penalty: 0.9, ..Params::greedy() }, [3.0, 2.0]), 0, "3 - 0.9 > 2");
    let prompt_only = Params { presence_penalty: 2.0, frequency_penalty: 2.0, ..Params::greedy() };
    assert_eq!(pick(prompt_only, [2.0, 2.5]), 1, "token 1 is only in the prompt: untouched");
}

#[test]
fn logprobs_are_normalized_raw_and_sorted() {
    let mut logits = pseudo_logits(20, 11);
    logits[4] = 9.0;
    logits[2] = 9.0;
    let mut counts = TokenCounts::new();
    counts.observe_output(2);
    let params = Params { temperature: 0.3, presence_penalty: 1.0, logprobs: Some(20), seed: 3, ..Params::default() };
    let sampled = sample(&logits, &params, &counts, 5);
    let top = &sampled.top_logprobs;
    let mass: f64 = top.iter().map(|&(_, lp)| (lp as f64).exp()).sum();
    assert!((mass - 1.0).abs() < 1e-5, "{mass}");
    assert_eq!((top[0].0, top[1].0), (2, 4), "ties by id, raw logits before penalties");
    assert!(top.windows(2).all(|w| w[0].1 > w[1].1 || (w[0].1 == w[1].1 && w[0].0 < w[1].0)));
    let chosen = top.iter().find(|&&(t, _)| t == sampled.token).unwrap().1;
    assert_eq!(sampled.logprob, Some(chosen));
    let two = sample(&logits, &Params { logprobs: Some(2), ..Params::default() }, &counts, 5).top_logprobs;
    assert_eq!(two, top[..2]);
    assert_eq!(sample(&logits, &params, &counts, 5), sampled, "a retry gives the same result");
    assert_eq!(sample(&logits, &Params::default(), &counts, 5).logprob, None);
}

#[test]
fn validate_rejects_bad_params_with_clear_messages() {
    assert_eq!(Params::default().validate(), Ok(()));
    assert_eq!(Params::greedy().validate(), Ok(()));
    let cases: [(Params, &str); 10] = [
        (Params { temperature: -0.1, ..Params::default() }, "temperature must be >= 0"),
        (Params { top_p: 0.0, ..Params::default() }, "top_p must be in (0, 1]"),
        (Params { top_p: 1.01, ..Params::default() }, "top_p"),
        (Params { min_p: -0.1, ..Params::default() }, "min_p must be in [0, 1]"),
        (Params { repetition_penalty: 0.0, ..Params::default() }, "repetition_penalty must be > 0"),
        (Params { presence_penalty: 2.5, ..Params::default() }, "presence_penalty must be in [-2, 2]"),
        (Params { frequency_penalty: -2.1, ..Params::default() }, "frequency_penalty"),
        (Params { logprobs: Some(21), ..Params::default() }, "logprobs must be at most 20, got 21"),
        (Params { min_p: f32::NAN, ..Params::default() }, "min_p must be a finite number"),
        (Params { temperature: f32::INFINITY, ..Params::default() }, "temperature must be a finite number"),
    ];
    for (params, message) in cases {
        let error = params.validate().expect_err(message);
        assert!(error.to_string().contains(message), "{error} vs {message}");
    }
    let _: &dyn std::error::Error = &SamplingError::TooManyLogprobs(30);
}

#[test]
fn nan_and_infinite_logits_never_panic() {
    let nan = f32::NAN;
    let (inf, neg) = (f32::INFINITY, f32::NEG_INFINITY);
    let sampling = Params { top_p: 0.9, logprobs: Some(3), ..Params::default() };
    let greedy = Params { logprobs: Some(3), ..Params::greedy() };
    for params in [&sampling, &greedy, &Params { top_k: 2, ..Params::default() }, &Params::default()] {
        for position in 0..20 {
            assert_eq!(draw(&[nan, 1.0, nan, 0.5], params, position) % 2, 1, "NaN must never be drawn");
            assert_eq!(draw(&[nan, 1.0, inf, neg], params, position), 2, "+inf dominates");
        }
        assert_eq!(draw(&[nan, nan, nan], params, 1), FALLBACK_TOKEN);
        assert_eq!(draw(&[neg, neg], params, 1), FALLBACK_TOKEN);
        assert_eq!(draw(&[], params, 1), FALLBACK_TOKEN);
    }
    let dead = sample(&[nan, neg], &greedy, &TokenCounts::new(), 0);
    assert_eq!(dead.logprob, Some(neg));
    let spiked = sample(&[nan, 1.0, inf], &sampling, &TokenCounts::new(), 0);
    assert_eq!((spiked.token, spiked.logprob), (2, Some(0.0)));
}

#[test]
#[ignore]
fn bench_vocab_151936() {
    use std::time::Instant;
    let vocab = 151_936;
    // Peaked like a language model's: a few tokens 10-20 nats above a broad bulk.
    let logits: Vec<f32> = (0..vocab as u64)
        .map(|i| if i % 7919 == 0 { 12.0 + 6.0 * uniform(2, i) as f32 } else { (4.0 * uniform(1, i) - 2.0) as f32 })
        .collect();
    let flat: Vec<f32> = (0..vocab as u64).map(|i| uniform(3, i) as f32).collect();
    let cases = [
        ("greedy", &logits, Params::greedy()),
        ("temperature 0.8 + top_p 0.95", &logits, Params { temperature: 0.8, top_p: 0.95, ..Params::default() }),
        ("top_k 50", &logits, Params { top_k: 50, ..Params::default() }),
        ("temperature 1.0, no filter", &logits, Params::default()),
        ("top_p 0.95 on flat logits (worst case)", &flat, Params { top_p: 0.95, ..Params::default() }),
        ("greedy + logprobs 5", &logits, Params { logprobs: Some(5), ..Params::greedy() }),
    ];
    let mut sampler = Sampler::new();
    for (name, logits, params) in cases {
        let runs = 200;
        let start = Instant::now();
        for position in 0..runs {
            std::hint::black_box(sampler.sample(logits, &params, &TokenCounts::new(), position));
        }
        let per_sample = start.elapsed() / runs as u32;
        println!("{name:45} {per_sample:>10.1?} per sample, {:>8.2?} per 64-row step", per_sample * 64);
    }
}

#[test]
fn forgetting_an_output_token_undoes_observing_it() {
    let mut counts = TokenCounts::default();
    counts.observe_prompt(&[7]);
    for t in [3, 3, 7] {
        counts.observe_output(t);
    }
    counts.forget_output(3);
    counts.forget_output(7);
    counts.forget_output(9);
    assert_eq!((counts.output_count(3), counts.output_count(7), counts.output_count(9)), (1, 0, 0));
    assert!(counts.in_prompt(7), "the prompt's counts stay");
    counts.forget_output(3);
    let mut fresh = TokenCounts::default();
    fresh.observe_prompt(&[7]);
    assert_eq!(counts, fresh, "nothing of the output is left");
}
