//! Subservers driven by hand, without threads: batched, routed serving reproduces the
//! sequential reference token for token, and every KV block comes back.

#[path = "sched/draft_model.rs"]
mod draft_model;
mod kernel_paths;
#[path = "sched/speculation.rs"]
mod speculation;

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Instant;

use tempfile::TempDir;
use tokenrouter_core::model::init::{write_random_model, InitOptions};
use tokenrouter_core::model::presets::qwen3_shaped;
use tokenrouter_core::model::sampler::SamplingParams;
use tokenrouter_core::model::{CandleBackend, LoadOptions};
use tokenrouter_core::policy::{policy_uniform, Decision, EntryRequest, ModelIndex, Policy, RouteRow};
use tokenrouter_core::sched::reference::{Reference, ReferenceOutput};
use tokenrouter_core::sched::request::admit;
use tokenrouter_core::sched::{
    rebuild, BatchingRule, FaultPoint, RequestEvent, RequestSpec, Subserver, SubserverConfig,
};

/// Moves to the other model with probability 0.3, discarding the token; comes back
/// after one token, committing it. Draws depend on (seed, position) only.
struct TestPolicy;

impl Policy for TestPolicy {
    fn name(&self) -> &str {
        "test-random"
    }
    fn entry_model(&self, _: &mut EntryRequest<'_>) -> ModelIndex {
        0
    }
    fn route(&self, rows: &mut [RouteRow<'_>]) -> Vec<Decision> {
        rows.iter()
            .map(|r| match r.model {
                0 if policy_uniform(r.state.seed, r.position(), 1) < 0.3 => Decision::Move { to: 1, commit: false },
                0 => Decision::Stay,
                _ => Decision::Move { to: 0, commit: true },
            })
            .collect()
    }
}

/// The large model's shape and seed with its weights drawn 30% wider: a draft model
/// that often agrees with it and sometimes does not.
fn near_twin() -> TempDir {
    let dir = TempDir::new().unwrap();
    write_random_model(&qwen3_shaped(96, 2, 4, 2, 192, 400), &InitOptions { seed: 12, std: 0.26 }, dir.path()).unwrap();
    dir
}

fn models() -> (TempDir, TempDir) {
    let make = |seed, hidden| {
        let dir = TempDir::new().unwrap();
        write_random_model(
            &qwen3_shaped(hidden, 2, 4, 2, 2 * hidden, 400),
            &InitOptions { seed, std: 0.2 },
            dir.path(),
        )
        .unwrap();
        dir
    };
    (make(11, 64), make(12, 96))
}

fn load(dir: &TempDir, blocks: usize) -> CandleBackend {
    let config = tokenrouter_core::model::ModelConfig::from_file(&dir.path().join("config.json")).unwrap();
    let options = LoadOptions {
        kv_budget_bytes: blocks * 4 * config.kv_bytes_per_token(4),
        block_size: 4,
        ..LoadOptions::default()
    };
    CandleBackend::load(dir.path(), &options).unwrap()
}

/// Subservers for the small and the large model, with `blocks` KV blocks each.
fn pair(small: &TempDir, large: &TempDir, blocks: usize, rule: BatchingRule) -> Vec<Subserver> {
    [small, large]
        .iter()
        .enumerate()
        .map(|(m, dir)| {
            Subserver::new(SubserverConfig::new(m, 2, 400, 4096), Box::new(load(dir, blocks)), rule.clone())
        })
        .collect()
}

fn specs(policy: Arc<dyn Policy>, n: u64) -> Vec<Arc<RequestSpec>> {
    (0..n)
        .map(|id| {
            let prompt: Vec<u32> = (0..(5 + id as u32 * 3) % 23 + 2).map(|i| (i * 17 + id as u32 * 29) % 400).collect();
            let sampling = SamplingParams {
                temperature: if id % 2 == 0 { 0.0 } else { 0.9 },
                seed: 100 + id,
                ..SamplingParams::default()
            };
            Arc::new(RequestSpec {
                id,
                prompt,
                max_tokens: 12 + id as usize % 7,
                sampling,
                stop_ids: vec![],
                policy: policy.clone(),
                constraint: None,
                speculation: None,
            })
        })
        .collect()
}

/// Below this top-2 gap a verify step's batch shape may tip a near-tie the other way.
const NEAR_TIE: f32 = 1e-3;

/// Every request's output is its reference's (up to a near-tie).
fn assert_matches_reference(specs: &[Arc<RequestSpec>], want: &[ReferenceOutput], got: &Outputs, context: &str) {
    for (s, want) in specs.iter().zip(want) {
        want.check(&got[&s.id], NEAR_TIE).unwrap_or_else(|e| panic!("request {} ({context}): {e}", s.id));
    }
}

fn assert_all_blocks_back(subs: &[Subserver]) {
    for sub in subs {
        let cap = sub.backend().kv_capacity();
        assert_eq!(cap.free_blocks, cap.total_blocks, "every KV block comes back");
    }
}

type Outputs = HashMap<u64, Vec<(u32, ModelIndex)>>;

/// Runs all requests through two subservers, admitting them in `order`, stepping
/// whichever may launch; returns each request's tokens and producing models.
fn serve(subs: &mut [Subserver], specs: &[Arc<RequestSpec>], order: &[usize]) -> Outputs {
    serve_with_faults(subs, specs, order, &[]).0
}

/// [`serve`], with a panic injected into model `m` at step round `r` for each `(r, m,
/// point)`; a panicked subserver recovers and the requests it lost are rebuilt from
/// their committed tokens (what a request's owner does). Also returns how many were.
fn serve_with_faults(
    subs: &mut [Subserver],
    specs: &[Arc<RequestSpec>],
    order: &[usize],
    faults: &[(usize, usize, FaultPoint)],
) -> (Outputs, usize) {
    let mut outputs: Outputs = HashMap::new();
    let mut resumed = 0;
    let mut active = 0;
    let mut admitted = 0;
    let mut finished = 0;
    let mut round = 0;
    while finished < specs.len() {
        round += 1;
        // Admit one more request every other round, so arrivals interleave with steps.
        if admitted < order.len() && (round % 2 == 1 || subs.iter().all(|s| s.ready_count() == 0)) {
            let (entry, arrival) = admit(specs[order[admitted]].clone(), subs.len());
            subs[entry].arrive(arrival).unwrap();
            admitted += 1;
            active += 1;
        }
        subs.iter_mut().for_each(|s| s.set_active(active));
        let now = Instant::now();
        let Some(i) = (0..subs.len()).find(|&i| subs[i].should_launch(now)) else {
            assert!(admitted < order.len(), "deadlock: nothing can launch with {active} active");
            continue;
        };
        for &(_, m, point) in faults.iter().filter(|f| f.0 == round) {
            subs[m].inject_fault(point);
        }
        let outcome = match catch_unwind(AssertUnwindSafe(|| subs[i].step())) {
            Ok(outcome) => outcome,
            Err(_) => {
                for lost in subs[i].recover() {
                    let output: Vec<u32> =
                        outputs.get(&lost.spec.id).map(|o| o.iter().map(|t| t.0).collect()).unwrap_or_default();
                    assert_eq!(output.len(), lost.output_len, "request {}", lost.spec.id);
                    let spec = lost.spec.clone();
                    let (model, travel) = lost.resume_at(i);
                    subs[model].arrive(rebuild(spec, &output, travel, model)).unwrap();
                    resumed += 1;
                }
                continue;
            }
        };
        for (to, arrival) in outcome.handoffs {
            subs[to].arrive(arrival).unwrap();
        }
        for event in outcome.events {
            match event {
                RequestEvent::Token { id, token, model, .. } => outputs.entry(id).or_default().push((token, model)),
                RequestEvent::Finished { id, .. } => {
                    finished += 1;
                    active -= 1;
                    subs.iter_mut().for_each(|s| {
                        s.release(id);
                    });
                }
                RequestEvent::Failed { id, message } => panic!("request {id} failed: {message}"),
                RequestEvent::Moved { .. } | RequestEvent::CachedPrefix { .. } | RequestEvent::Verified { .. } => {}
                RequestEvent::Resume { .. } => unreachable!("a subserver never asks to resume by itself"),
                RequestEvent::OutOfService { .. } => unreachable!("only a compute thread takes a model out of service"),
            }
        }
    }
    (outputs, resumed)
}

#[test]
fn batched_routed_serving_equals_the_sequential_reference() {
    let (small, large) = models();
    let policy: Arc<dyn Policy> = Arc::new(TestPolicy);
    let specs = specs(policy, 10);
    let (mut rs, mut rl) = (load(&small, 512), load(&large, 512));
    let mut reference = Reference { models: vec![&mut rs, &mut rl], shared_vocab: 400, max_context: 4096 };
    let want: HashMap<u64, Vec<(u32, ModelIndex)>> = specs
        .iter()
        .map(|s| (s.id, reference.run(s).unwrap().tokens.iter().map(|t| (t.token, t.model)).collect()))
        .collect();
    assert!(want.values().flatten().any(|(_, m)| *m == 1), "the policy must route some tokens to the large model");

    for (thresholds, order) in [
        ([1, 1], (0..10).collect::<Vec<_>>()),
        ([2, 2], vec![3, 1, 4, 9, 5, 0, 2, 6, 8, 7]),
        ([3, 1], vec![9, 8, 7, 6, 5, 4, 3, 2, 1, 0]),
    ] {
        let rule = BatchingRule::fixed(&thresholds);
        let mut subs: Vec<Subserver> = [&small, &large]
            .iter()
            .enumerate()
            .map(|(m, dir)| {
                let mut config = SubserverConfig::new(m, 2, 400, 4096);
                config.prefill_chunk = 8; // long prompts take several steps
                Subserver::new(config, Box::new(load(dir, 512)), rule.clone())
            })
            .collect();
        let got = serve(&mut subs, &specs, &order);
        for s in &specs {
            assert_eq!(got[&s.id], want[&s.id], "request {} with thresholds {thresholds:?}", s.id);
        }
        for sub in &subs {
            let cap = sub.backend().kv_capacity();
            assert_eq!(cap.free_blocks, cap.total_blocks, "every KV block comes back");
            assert!(sub.stats().steps > 0);
        }
        assert!(subs[1].stats().handoffs_in > 0 && subs[0].stats().handoffs_in > 0);
    }
}

#[test]
fn a_tight_kv_pool_evicts_pending_requests_and_still_matches() {
    let (small, large) = models();
    let policy: Arc<dyn Policy> = Arc::new(TestPolicy);
    let specs = specs(policy, 6);
    let (mut rs, mut rl) = (load(&small, 512), load(&large, 512));
    let mut reference = Reference { models: vec![&mut rs, &mut rl], shared_vocab: 400, max_context: 4096 };
    let want: Vec<Vec<u32>> = specs.iter().map(|s| reference.run(s).unwrap().ids()).collect();
    // 12 blocks of 4 tokens: too few to keep every request's KV on both models.
    let mut subs = pair(&small, &large, 12, BatchingRule::eager(2));
    let got = serve(&mut subs, &specs, &[0, 1, 2, 3, 4, 5]);
    for s in &specs {
        let ids: Vec<u32> = got[&s.id].iter().map(|(t, _)| *t).collect();
        assert_eq!(ids, want[s.id as usize], "request {}", s.id);
    }
    assert!(subs.iter().map(|s| s.stats().evictions).sum::<u64>() > 0, "the pool was tight enough to evict");
}

/// A step that panics (before its forward, or half-way through applying decisions)
/// loses nothing: the subserver recovers, the requests of that step are rebuilt from
/// their committed tokens, every other one recomputes its KV, and the outputs still
/// equal the reference's.
#[test]
fn panicking_steps_resume_their_requests_and_still_match() {
    let (small, large) = models();
    let policy: Arc<dyn Policy> = Arc::new(TestPolicy);
    let specs = specs(policy, 8);
    let (mut rs, mut rl) = (load(&small, 512), load(&large, 512));
    let mut reference = Reference { models: vec![&mut rs, &mut rl], shared_vocab: 400, max_context: 4096 };
    let want: Vec<Vec<u32>> = specs.iter().map(|s| reference.run(s).unwrap().ids()).collect();
    let mut subs = pair(&small, &large, 512, BatchingRule::eager(2));
    let faults: Vec<(usize, usize, FaultPoint)> = (0..12)
        .map(|k| {
            let point = if k % 2 == 0 { FaultPoint::MidApply } else { FaultPoint::BeforeForward };
            (3 + k * 5, k % 2, point)
        })
        .collect();
    let (got, resumed) = serve_with_faults(&mut subs, &specs, &[0, 1, 2, 3, 4, 5, 6, 7], &faults);
    for s in &specs {
        let ids: Vec<u32> = got[&s.id].iter().map(|(t, _)| *t).collect();
        assert_eq!(ids, want[s.id as usize], "request {}", s.id);
    }
    assert!(resumed >= 4, "the faults interrupted steps: {resumed} resumed");
    for sub in &subs {
        let cap = sub.backend().kv_capacity();
        assert_eq!(cap.free_blocks, cap.total_blocks, "every KV block comes back");
    }
}

/// Requests that share prefixes: a common system prompt, and "turns" that resend the
/// previous turn's prompt with more appended.
fn sharing_specs(policy: Arc<dyn Policy>, n: u64) -> Vec<Arc<RequestSpec>> {
    let system: Vec<u32> = (0..21).map(|i| (i * 13 + 5) % 400).collect();
    (0..n)
        .map(|id| {
            let mut prompt = system.clone();
            let turns = 1 + id % 3;
            for turn in 0..turns {
                prompt.extend((0..7).map(|i| (i * 31 + turn as u32 * 57 + (id / 3) as u32 * 101) % 400));
            }
            let sampling = SamplingParams { temperature: 0.8, seed: 7 + id, ..SamplingParams::default() };
            Arc::new(RequestSpec {
                id,
                prompt,
                max_tokens: 10,
                sampling,
                stop_ids: vec![],
                policy: policy.clone(),
                constraint: None,
                speculation: None,
            })
        })
        .collect()
}

/// With the prefix cache on, concurrent requests that share prefixes reuse blocks on
/// both models of the routed pair, a tight pool evicts cached blocks to make room, and
/// every output still equals the uncached sequential reference token for token.
#[test]
fn shared_prefixes_hit_the_cache_and_still_match_the_uncached_reference() {
    let (small, large) = models();
    let policy: Arc<dyn Policy> = Arc::new(TestPolicy);
    let specs = sharing_specs(policy, 12);
    let (mut rs, mut rl) = (load(&small, 512), load(&large, 512));
    let mut reference = Reference { models: vec![&mut rs, &mut rl], shared_vocab: 400, max_context: 4096 };
    let want: Vec<Vec<u32>> = specs.iter().map(|s| reference.run(s).unwrap().ids()).collect();
    for blocks in [512, 40] {
        let mut subs = pair(&small, &large, blocks, BatchingRule::fixed(&[2, 1]));
        let got = serve(&mut subs, &specs, &(0..specs.len()).collect::<Vec<_>>());
        for s in &specs {
            let ids: Vec<u32> = got[&s.id].iter().map(|(t, _)| *t).collect();
            assert_eq!(ids, want[s.id as usize], "request {} with {blocks} blocks", s.id);
        }
        for (m, sub) in subs.iter().enumerate() {
            let stats = sub.stats();
            assert!(stats.prefix_hit_tokens >= 20, "model {m} reused {} tokens", stats.prefix_hit_tokens);
            let pool = sub.backend().kv_pool();
            let cap = pool.capacity();
            assert_eq!(cap.free_blocks, cap.total_blocks, "every block is free or cached");
            pool.flush_prefix_cache();
            assert_eq!(pool.capacity().cached_blocks, 0);
        }
        if blocks == 40 {
            let evicted: u64 = subs.iter().map(|s| s.backend().kv_pool().prefix_cache_stats().evicted_blocks).sum();
            assert!(evicted > 0, "the tight pool had to evict cached blocks");
        }
    }
}

/// The engine's reference property on every path.
#[test]
fn the_reference_property_holds_on_every_kernel_path() {
    kernel_paths::rerun_on_other_kernel_paths(&[
        "batched_routed_serving_equals_the_sequential_reference",
        "panicking_steps_resume_their_requests_and_still_match",
        "shared_prefixes_hit_the_cache_and_still_match_the_uncached_reference",
    ]);
}
