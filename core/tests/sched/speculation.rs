//! Speculative decoding in the subserver: whatever the drafts, every output is the
//! plain sequential reference's, token for token and model for model; drafts that
//! agree are kept, and every KV block still comes back.

use std::sync::Arc;

use tokenrouter_core::model::sampler::SamplingParams;
use tokenrouter_core::policy::query::Always;
use tokenrouter_core::policy::Policy;
use tokenrouter_core::sched::reference::{Reference, ReferenceOutput};
use tokenrouter_core::sched::{BatchingRule, FaultPoint, RequestSpec, Subserver, SubserverConfig};
use tokenrouter_core::spec::{Speculation, SpeculationMethod, StepCost};

use super::{assert_all_blocks_back, assert_matches_reference, load, models, serve, serve_with_faults, TestPolicy};

/// Prompts that repeat a phrase (as code and transcripts do), greedy and sampled.
fn repeating_specs(policy: Arc<dyn Policy>, n: u64) -> Vec<Arc<RequestSpec>> {
    (0..n)
        .map(|id| {
            let phrase: Vec<u32> = (0..5 + id as u32 % 4).map(|i| (i * 41 + id as u32 * 7 + 3) % 400).collect();
            let prompt: Vec<u32> = phrase.iter().cycle().take(phrase.len() * 3 + 2).copied().collect();
            let temperature = if id % 3 == 2 { 0.8 } else { 0.0 };
            Arc::new(RequestSpec {
                id,
                prompt,
                max_tokens: 30 + id as usize % 9,
                sampling: SamplingParams { temperature, seed: 31 + id, ..SamplingParams::default() },
                stop_ids: vec![],
                policy: policy.clone(),
                constraint: None,
                speculation: None,
            })
        })
        .collect()
}

/// Every other request speculates by n-gram lookup and with a prediction that is its
/// reference output with a token changed every 7 and one dropped (so drafts are kept,
/// rejected and picked up again after the gap); of the rest, every other one by suffix
/// drafts (its own text and the outputs of requests that finished before it).
fn speculating(specs: &[Arc<RequestSpec>], want: &[ReferenceOutput]) -> Vec<Arc<RequestSpec>> {
    specs
        .iter()
        .zip(want)
        .map(|(s, want)| {
            let mut spec = RequestSpec::clone(s);
            if s.id % 2 == 0 {
                let mut prediction: Vec<u32> =
                    want.ids().iter().enumerate().map(|(i, &t)| if i % 7 == 6 { (t + 1) % 400 } else { t }).collect();
                prediction.remove(prediction.len() / 2);
                let method = Some(SpeculationMethod::Ngram);
                spec.speculation = Some(Speculation { method, max_tokens: 4 + s.id as usize % 5, prediction });
            } else if s.id % 4 == 1 {
                let method = Some(SpeculationMethod::Suffix);
                spec.speculation = Some(Speculation { method, max_tokens: 6, prediction: vec![] });
            }
            Arc::new(spec)
        })
        .collect()
}

/// The routed pair, with a card-like step cost pinned (a guess costs little beside a
/// step) so that how many guesses are drafted never depends on the machine's load.
fn pair(small: &tempfile::TempDir, large: &tempfile::TempDir, blocks: usize, rule: BatchingRule) -> Vec<Subserver> {
    [small, large]
        .iter()
        .enumerate()
        .map(|(m, dir)| {
            let mut config = SubserverConfig::new(m, 2, 400, 4096);
            config.drafting.step_cost = Some(StepCost { intercept: 0.01, per_token: 0.0001 });
            Subserver::new(config, Box::new(load(dir, blocks)), rule.clone())
        })
        .collect()
}

fn reference_outputs(specs: &[Arc<RequestSpec>]) -> Vec<ReferenceOutput> {
    let (small, large) = models();
    let (mut rs, mut rl) = (load(&small, 1024), load(&large, 1024));
    let mut reference = Reference { models: vec![&mut rs, &mut rl], shared_vocab: 400, max_context: 4096 };
    specs.iter().map(|s| reference.run(s).unwrap()).collect()
}

fn accepted(subs: &[Subserver]) -> u64 {
    subs.iter().map(|s| s.stats().accepted_draft_tokens).sum()
}

#[test]
fn speculative_serving_equals_the_reference_in_every_batch_composition() {
    for policy in [Arc::new(TestPolicy) as Arc<dyn Policy>, Arc::new(Always::new(1))] {
        let plain = repeating_specs(policy.clone(), 10);
        let want = reference_outputs(&plain);
        let specs = speculating(&plain, &want);
        let (small, large) = models();
        for (thresholds, order) in [([1, 1], (0..10).collect::<Vec<_>>()), ([3, 2], vec![3, 1, 4, 9, 5, 0, 2, 6, 8, 7])]
        {
            let mut subs = pair(&small, &large, 1024, BatchingRule::fixed(&thresholds));
            let got = serve(&mut subs, &specs, &order);
            let context = format!("{}, thresholds {thresholds:?}", policy.name());
            assert_matches_reference(&specs, &want, &got, &context);
            assert!(accepted(&subs) > 20, "drafts were kept: {}", accepted(&subs));
            assert_all_blocks_back(&subs);
        }
    }
}

/// The client's predicted output, when right, is kept whole: the request takes a
/// fraction of the steps, and a stop token or max_tokens inside a kept draft ends it
/// exactly where plain decoding does.
#[test]
fn a_right_prediction_is_kept_and_ends_where_plain_decoding_does() {
    let policy: Arc<dyn Policy> = Arc::new(Always::new(1));
    let mut plain = repeating_specs(policy.clone(), 1)[0].as_ref().clone();
    plain.max_tokens = 40;
    plain.sampling = SamplingParams::greedy();
    plain.speculation = None;
    let expected = reference_outputs(&[Arc::new(plain.clone())])[0].ids();
    let stop = expected[17];
    let stop_at = expected.iter().position(|&t| t == stop).unwrap();
    for (stop_ids, max_tokens, end) in [(vec![], 40, 40), (vec![], 23, 23), (vec![stop], 40, stop_at + 1)] {
        let mut spec = plain.clone();
        spec.stop_ids = stop_ids;
        spec.max_tokens = max_tokens;
        spec.speculation = Some(Speculation { method: None, max_tokens: 8, prediction: expected.clone() });
        let (small, large) = models();
        let mut subs = pair(&small, &large, 1024, BatchingRule::eager(2));
        let got = serve(&mut subs, &[Arc::new(spec)], &[0]);
        let ids: Vec<u32> = got[&0].iter().map(|t| t.0).collect();
        assert_eq!(ids, expected[..end], "stop ids / max_tokens {max_tokens}");
        let steps = subs[1].stats().steps;
        assert!(steps <= 1 + end.div_ceil(8) as u64 + 1, "{steps} steps for {end} tokens");
        // The prompt's step commits the first token; each verify step its kept drafts and
        // one token of its own, unless a kept draft ended the request.
        let own_tokens = end - accepted(&subs) as usize;
        let verify_rows = subs[1].stats().verify_rows as usize;
        assert!(own_tokens == verify_rows + 1 || own_tokens == verify_rows, "{own_tokens} own, {verify_rows} verifies");
        assert_all_blocks_back(&subs);
    }
}

/// A pool too small for every draft drops drafts before it evicts anything, a step
/// that panics in the middle of verifying loses nothing, and outputs still match.
#[test]
fn tight_pools_and_panicking_verify_steps_still_match() {
    let plain = repeating_specs(Arc::new(TestPolicy), 6);
    let want = reference_outputs(&plain);
    let specs = speculating(&plain, &want);
    let (small, large) = models();
    let mut subs = pair(&small, &large, 30, BatchingRule::eager(2));
    let got = serve(&mut subs, &specs, &[0, 1, 2, 3, 4, 5]);
    assert_matches_reference(&specs, &want, &got, "in a tight pool");
    assert_all_blocks_back(&subs);
    let mut subs = pair(&small, &large, 1024, BatchingRule::eager(2));
    let faults: Vec<(usize, usize, FaultPoint)> = (0..10).map(|k| (4 + k * 7, k % 2, FaultPoint::MidApply)).collect();
    let (got, resumed) = serve_with_faults(&mut subs, &specs, &[0, 1, 2, 3, 4, 5], &faults);
    assert_matches_reference(&specs, &want, &got, "after faults");
    assert!(resumed >= 3, "{resumed} resumed");
    assert!(accepted(&subs) > 0);
    assert_all_blocks_back(&subs);
}

/// Suffix drafts alone: a second round of the same prompts drafts from the first
/// round's outputs (the model's suffix cache), and is kept nearly whole; the outputs
/// are still the reference's.
#[test]
fn suffix_drafts_from_earlier_outputs_are_kept_and_change_nothing() {
    let plain = repeating_specs(Arc::new(Always::new(1)), 6);
    let want = reference_outputs(&plain);
    let round = |first_id: u64| -> Vec<Arc<RequestSpec>> {
        plain
            .iter()
            .map(|s| {
                let mut spec = RequestSpec::clone(s);
                spec.id += first_id;
                let method = Some(SpeculationMethod::Suffix);
                spec.speculation = Some(Speculation { method, max_tokens: 8, prediction: vec![] });
                Arc::new(spec)
            })
            .collect()
    };
    let (small, large) = models();
    let mut subs = pair(&small, &large, 1024, BatchingRule::eager(2));
    let order: Vec<usize> = (0..6).collect();
    let mut kept = Vec::new();
    for first_id in [0, 100] {
        let specs = round(first_id);
        let got = serve(&mut subs, &specs, &order);
        assert_matches_reference(&specs, &want, &got, "suffix rounds");
        kept.push(subs[1].stats().accepted_draft_tokens);
    }
    let output_tokens: usize = want.iter().map(|w| w.tokens.len()).sum();
    let second_round = (kept[1] - kept[0]) as usize;
    assert!(second_round * 2 > output_tokens, "the second round kept {second_round} guesses of {output_tokens} tokens");
    assert_all_blocks_back(&subs);
}
