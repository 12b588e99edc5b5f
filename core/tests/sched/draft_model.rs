//! Speculative decoding with a draft model (method `draft`): the small model samples
//! rounds of guesses for the large one, which verifies them. Whatever the rounds,
//! every output is the sequential reference's token for token (greedy or sampled, with
//! routing, stop ids, a tight pool and panics), and every KV block comes back.

use std::sync::Arc;

use tokenrouter_core::model::sampler::SamplingParams;
use tokenrouter_core::model::{Backend, RowInput};
use tokenrouter_core::policy::query::Always;
use tokenrouter_core::policy::Policy;
use tokenrouter_core::sched::reference::{Reference, ReferenceOutput};
use tokenrouter_core::sched::{BatchingRule, FaultPoint, RequestSpec};
use tokenrouter_core::spec::{Speculation, SpeculationMethod};

use super::{
    assert_all_blocks_back, assert_matches_reference, load, models, near_twin, pair, serve, serve_with_faults,
    TestPolicy,
};

fn drafted(spec: &RequestSpec, max_tokens: usize) -> Arc<RequestSpec> {
    let mut spec = spec.clone();
    spec.speculation = Some(Speculation { method: Some(SpeculationMethod::Draft), max_tokens, prediction: Vec::new() });
    Arc::new(spec)
}

/// Greedy and sampled requests of various lengths; every third stops at a token its
/// plain output holds (so a round may sample the stop, and the target end there), and
/// every fourth has penalties.
fn draft_specs(
    policy: Arc<dyn Policy>,
    n: u64,
    reference: &mut Reference,
) -> (Vec<Arc<RequestSpec>>, Vec<ReferenceOutput>) {
    let mut specs = Vec::new();
    let mut want = Vec::new();
    for id in 0..n {
        let prompt: Vec<u32> = (0..4 + id as u32 % 9).map(|i| (i * 37 + id as u32 * 11 + 5) % 400).collect();
        let temperature = if id % 2 == 0 { 0.0 } else { 0.8 };
        let mut spec = RequestSpec {
            id,
            prompt,
            max_tokens: 14 + id as usize % 11,
            sampling: SamplingParams { temperature, seed: 500 + id, ..SamplingParams::default() },
            stop_ids: vec![],
            policy: policy.clone(),
            constraint: None,
            speculation: None,
        };
        if id % 4 == 3 {
            // Penalties count the guesses a round samples; rejected ones must stop counting.
            spec.sampling.presence_penalty = 0.8;
            spec.sampling.frequency_penalty = 0.5;
            spec.sampling.repetition_penalty = 1.3;
        }
        let plain = reference.run(&spec).unwrap();
        if id % 3 == 2 {
            spec.stop_ids = vec![plain.ids()[plain.tokens.len() * 2 / 3]];
        }
        want.push(reference.run(&spec).unwrap());
        specs.push(drafted(&spec, 2 + id as usize % 7));
    }
    (specs, want)
}

/// The near twin drafts rounds that are partly kept and partly rejected; the unrelated
/// small model's rounds are rejected, and the target soon backs off from asking it.
#[test]
fn draft_model_rounds_equal_the_reference_in_every_batch_composition() {
    let (small, large) = models();
    let twin = near_twin();
    for (drafter_dir, agrees) in [(&twin, true), (&small, false)] {
        let (mut rd, mut rl) = (load(drafter_dir, 1024), load(&large, 1024));
        let mut reference = Reference { models: vec![&mut rd, &mut rl], shared_vocab: 400, max_context: 4096 };
        // Always on the large model: every token after the first may be a round's.
        // TestPolicy starts on the small model and leaves the large one after each token
        // it commits there, so its requests never draft: routing decides first.
        for (policy, drafts) in [(Arc::new(Always::new(1)) as Arc<dyn Policy>, true), (Arc::new(TestPolicy), false)] {
            let (specs, want) = draft_specs(policy.clone(), 10, &mut reference);
            for (thresholds, order) in
                [([1, 1], (0..10).collect::<Vec<_>>()), ([3, 2], vec![3, 1, 4, 9, 5, 0, 2, 6, 8, 7])]
            {
                let mut subs = pair(drafter_dir, &large, 1024, BatchingRule::fixed(&thresholds));
                let got = serve(&mut subs, &specs, &order);
                let context = format!("{}, thresholds {thresholds:?}, agrees {agrees}", policy.name());
                assert_matches_reference(&specs, &want, &got, &context);
                let (target, drafter) = (subs[1].stats(), subs[0].stats());
                assert_eq!(drafter.drafts_sampled, target.drafted_tokens, "{context}");
                match (drafts, agrees) {
                    (false, _) => assert_eq!(target.draft_rounds, 0, "{context}"),
                    (true, true) => {
                        let (kept, guessed) = (target.accepted_draft_tokens, target.drafted_tokens);
                        assert!(target.draft_rounds >= 30, "{context}: {} rounds", target.draft_rounds);
                        assert!(kept >= 30 && guessed >= kept + 10, "{context}: kept {kept} of {guessed}");
                    }
                    (true, false) => assert!(target.draft_rounds >= 8, "{context}: {} rounds", target.draft_rounds),
                }
                assert_all_blocks_back(&subs);
            }
        }
    }
}

/// A draft model with the target's own weights guesses what the target samples, greedy
/// or sampled, since both draw with the request's seed at the same output index: its
/// rounds are kept (nearly) whole, and the target steps a fraction of the tokens.
#[test]
fn a_draft_model_that_agrees_with_the_target_is_kept_greedy_or_sampled() {
    let (_, large) = models();
    let (mut twin, mut rl) = (load(&large, 1024), load(&large, 1024));
    let mut reference = Reference { models: vec![&mut twin, &mut rl], shared_vocab: 400, max_context: 4096 };
    let (specs, want) = draft_specs(Arc::new(Always::new(1)), 8, &mut reference);
    let specs: Vec<Arc<RequestSpec>> = specs.iter().map(|s| drafted(s, 8)).collect();
    let mut subs = pair(&large, &large, 1024, BatchingRule::eager(2));
    let got = serve(&mut subs, &specs, &(0..8).collect::<Vec<_>>());
    assert_matches_reference(&specs, &want, &got, "a twin drafts");
    let target = subs[1].stats();
    assert!(
        target.accepted_draft_tokens * 10 >= target.drafted_tokens * 9,
        "kept {} of {} guesses",
        target.accepted_draft_tokens,
        target.drafted_tokens
    );
    let tokens: usize = want.iter().map(|w| w.tokens.len()).sum();
    assert!((target.rows as usize) * 3 < tokens, "{} target rows for {tokens} tokens", target.rows);
    assert_all_blocks_back(&subs);
}

/// A pool too small for both models' K/V, and steps that panic on either model (a
/// draft model's round resumes on its target): every output still matches.
#[test]
fn tight_pools_and_panicking_rounds_still_match() {
    let (small, large) = models();
    let (mut rs, mut rl) = (load(&small, 1024), load(&large, 1024));
    let mut reference = Reference { models: vec![&mut rs, &mut rl], shared_vocab: 400, max_context: 4096 };
    let (specs, want) = draft_specs(Arc::new(TestPolicy), 6, &mut reference);
    let order: Vec<usize> = (0..6).collect();
    let mut subs = pair(&small, &large, 14, BatchingRule::eager(2));
    let got = serve(&mut subs, &specs, &order);
    assert_matches_reference(&specs, &want, &got, "in a tight pool");
    assert!(subs.iter().map(|s| s.stats().evictions).sum::<u64>() > 0, "the pool was tight enough to evict");
    assert_all_blocks_back(&subs);
    let mut subs = pair(&small, &large, 1024, BatchingRule::eager(2));
    let faults: Vec<(usize, usize, FaultPoint)> = (0..12)
        .map(|k| {
            let point = if k % 3 == 0 { FaultPoint::BeforeForward } else { FaultPoint::MidApply };
            (3 + k * 5, k % 2, point)
        })
        .collect();
    let (got, resumed) = serve_with_faults(&mut subs, &specs, &order, &faults);
    assert_matches_reference(&specs, &want, &got, "after faults");
    assert!(resumed >= 4, "{resumed} resumed");
    assert_all_blocks_back(&subs);
}

/// Sampled speculation keeps the target's distribution: over many seeds, the token at
/// output index 1 (the first a round guesses, verified by the target: kept where the
/// near twin guessed it, the target's own where not) is distributed as the target's own
/// probabilities say, marginal over the first token (chi-square).
#[test]
fn sampled_draft_speculation_keeps_the_targets_distribution() {
    const SEEDS: u64 = 3000;
    const TEMPERATURE: f32 = 0.6;
    let (_, large) = models();
    let twin = near_twin();
    let prompt: Vec<u32> = vec![17, 230, 45, 301, 9];
    let mut target = load(&large, 256);
    let expected = second_token_marginal(&mut target, &prompt, TEMPERATURE);
    let specs: Vec<Arc<RequestSpec>> = (0..SEEDS)
        .map(|id| {
            let spec = RequestSpec {
                id,
                prompt: prompt.clone(),
                max_tokens: 3,
                sampling: SamplingParams { temperature: TEMPERATURE, seed: 9_000 + id, ..SamplingParams::default() },
                stop_ids: vec![],
                policy: Arc::new(Always::new(1)),
                constraint: None,
                speculation: None,
            };
            drafted(&spec, 4)
        })
        .collect();
    let mut subs = pair(&twin, &large, 4096, BatchingRule::eager(2));
    let got = serve(&mut subs, &specs, &(0..SEEDS as usize).collect::<Vec<_>>());
    let target = subs[1].stats();
    // Runs of rounds that keep nothing make later requests decode index 1 plainly (the
    // target backs off); those draws must follow the same distribution.
    assert!(target.verify_rows >= SEEDS / 3, "index 1 came from a verify step: {} of {SEEDS}", target.verify_rows);
    let (kept, guessed) = (target.accepted_draft_tokens, target.drafted_tokens);
    assert!(kept >= SEEDS / 4 && guessed >= kept + SEEDS / 10, "guesses kept and rejected: {kept} of {guessed}");
    let mut counts = vec![0u64; 400];
    for output in got.values() {
        counts[output[1].0 as usize] += 1;
    }
    let (chi2, dof) = chi_square(&counts, &expected, SEEDS as f64);
    // The 0.001 upper quantile, by the Wilson–Hilferty approximation.
    let z = 3.09;
    let h = 2.0 / (9.0 * dof);
    let critical = dof * (1.0 - h + z * h.sqrt()).powi(3);
    assert!(chi2 < critical, "chi-square {chi2:.1} over {dof} degrees of freedom (critical {critical:.1})");
}

/// P(token at output index 1) = Σ_t0 P(t0) P(t1 | t0), from the target's logits.
fn second_token_marginal(target: &mut dyn Backend, prompt: &[u32], temperature: f32) -> Vec<f64> {
    let first = softmax(&last_logits(target, prompt), temperature);
    let mut marginal = vec![0.0; first.len()];
    for (t0, &p0) in first.iter().enumerate().filter(|(_, &p)| p > 1e-6) {
        let mut extended = prompt.to_vec();
        extended.push(t0 as u32);
        for (m, p1) in marginal.iter_mut().zip(softmax(&last_logits(target, &extended), temperature)) {
            *m += p0 * p1;
        }
    }
    marginal
}

fn last_logits(backend: &mut dyn Backend, tokens: &[u32]) -> Vec<f32> {
    let mut kv = backend.new_sequence();
    let out = backend.forward(&mut [RowInput { kv: &mut kv, tokens, start: 0 }], false).unwrap();
    out.row_logits(0)[..400].to_vec()
}

fn softmax(logits: &[f32], temperature: f32) -> Vec<f64> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let weights: Vec<f64> = logits.iter().map(|&x| ((x as f64 - max) / temperature as f64).exp()).collect();
    let total: f64 = weights.iter().sum();
    weights.iter().map(|w| w / total).collect()
}

/// Pearson's statistic over bins of at least 5 expected draws (the lighter tokens are
/// pooled into one bin), and its degrees of freedom.
fn chi_square(counts: &[u64], probabilities: &[f64], draws: f64) -> (f64, f64) {
    let (mut chi2, mut bins) = (0.0, 0usize);
    let (mut pooled_count, mut pooled_expected) = (0.0, 0.0);
    for (&count, &p) in counts.iter().zip(probabilities) {
        let expected = p * draws;
        if expected >= 5.0 {
            chi2 += (count as f64 - expected).powi(2) / expected;
            bins += 1;
        } else {
            pooled_count += count as f64;
            pooled_expected += expected;
        }
    }
    if pooled_expected > 0.0 {
        chi2 += (pooled_count - pooled_expected).powi(2) / pooled_expected;
        bins += 1;
    }
    (chi2, (bins - 1) as f64)
}
