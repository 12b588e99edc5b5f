//! The engine through its library API: routed serving equals the sequential
//! reference, cancellation frees KV everywhere, a failing model ends what it held.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tempfile::TempDir;
use tokenrouter_actors::{Engine, EngineConfig, Fault, GenerateRequest, GenerationEvent, ModelSpec, StepLimits};
use tokenrouter_core::model::generate::generate;
use tokenrouter_core::model::init::{copy_tokenizer, write_random_model, InitOptions};
use tokenrouter_core::model::presets::qwen3_shaped;
use tokenrouter_core::model::sampler::SamplingParams;
use tokenrouter_core::model::{load_backend, Backend, BackendKind, CandleBackend, LoadOptions};
use tokenrouter_core::policy::{self, ModelIndex, ModelInfo, Policy, PolicyContext};
use tokenrouter_core::sched::reference::{Reference, ReferenceOutput};
use tokenrouter_core::sched::{BatchingRule, RequestSpec};

const VOCAB: usize = 400;
/// Normalized entropy threshold that splits these random models' tokens between both.
const RSTITCH_TAU: f64 = 0.82;

fn policy(name: &str, params: serde_json::Value, models: usize) -> Arc<dyn Policy> {
    let infos: Vec<ModelInfo> =
        (0..models).map(|i| ModelInfo { name: format!("m{i}"), hidden_size: 0, vocab_size: VOCAB }).collect();
    policy::build(name, &params, &infos, &PolicyContext::default()).unwrap()
}

fn random(p: f64) -> Arc<dyn Policy> {
    policy("random", serde_json::json!({ "p": p }), 2)
}

struct Models {
    dirs: Vec<TempDir>,
    load: Vec<LoadOptions>,
    /// The vocabulary the models share (what the engine and the reference sample from).
    vocab: usize,
    /// Greedy requests only, and outputs may part where the reference's top-2 gap is
    /// below this: for backends whose batched sums are not bit-equal to unbatched ones.
    greedy_gap: Option<f32>,
}

fn models(hidden: &[usize]) -> Models {
    let dirs: Vec<TempDir> = hidden
        .iter()
        .enumerate()
        .map(|(i, &h)| {
            let dir = TempDir::new().unwrap();
            let config = qwen3_shaped(h, 2, 4, 2, 2 * h, VOCAB);
            write_random_model(&config, &InitOptions { seed: 40 + i as u64, std: 0.2 }, dir.path()).unwrap();
            dir
        })
        .collect();
    let load = vec![load_options(); dirs.len()];
    Models { dirs, load, vocab: VOCAB, greedy_gap: None }
}

fn load_options() -> LoadOptions {
    LoadOptions { block_size: 8, kv_budget_bytes: 16 << 20, ..LoadOptions::default() }
}

fn engine_config(m: &Models, policy: Arc<dyn Policy>, thresholds: &[usize]) -> EngineConfig {
    EngineConfig {
        models: m
            .dirs
            .iter()
            .enumerate()
            .map(|(i, d)| ModelSpec { name: format!("m{i}"), path: d.path().to_path_buf(), load: m.load[i].clone() })
            .collect(),
        default_policy: policy,
        batching: BatchingRule::fixed(thresholds),
        limits: StepLimits { prefill_chunk: 16, ..StepLimits::default() },
        admission: Default::default(),
        exclusive_compute: false,
        replan: None,
        supervision: Default::default(),
    }
}

fn request(i: u64) -> GenerateRequest {
    let prompt: Vec<u32> = (0..(3 + i * 5) % 29 + 2).map(|k| ((k * 13 + i * 31) % VOCAB as u64) as u32).collect();
    let mut r = GenerateRequest::new(prompt, 10 + (i as usize * 3) % 11);
    r.sampling = SamplingParams {
        temperature: if i % 3 == 0 { 0.0 } else { 0.8 },
        top_p: 0.95,
        seed: 1000 + i,
        ..SamplingParams::default()
    };
    r.ignore_eos = true;
    r
}

/// `request(i)`, greedy where the models ask for it.
fn request_in(m: &Models, i: u64) -> GenerateRequest {
    let mut r = request(i);
    if m.greedy_gap.is_some() {
        r.sampling.temperature = 0.0;
        r.prompt = r.prompt.iter().map(|&t| (t as u64 * 7919 % m.vocab as u64) as u32).collect();
    }
    r
}

async fn collect(engine: &Engine, r: GenerateRequest) -> (Vec<(u32, ModelIndex)>, GenerationEvent) {
    let mut stream = engine.generate(r).await.unwrap();
    let mut tokens = Vec::new();
    while let Some(event) = tokio::time::timeout(Duration::from_secs(60), stream.next()).await.expect("no hang") {
        match event {
            GenerationEvent::Token { token, model, .. } => tokens.push((token, model)),
            end => return (tokens, end),
        }
    }
    panic!("stream ended without a final event");
}

/// The sequential reference's output for each of requests `0..n`, whose specs
/// `spec_of(i)` gives, on fresh copies of the models.
fn run_reference(m: &Models, n: u64, spec_of: impl Fn(u64) -> RequestSpec) -> HashMap<u64, ReferenceOutput> {
    let mut backends: Vec<Box<dyn Backend>> =
        m.dirs.iter().zip(&m.load).map(|(d, load)| load_backend(d.path(), load).unwrap()).collect();
    let mut reference = Reference {
        models: backends.iter_mut().map(|b| -> &mut dyn Backend { b.as_mut() }).collect(),
        shared_vocab: m.vocab,
        max_context: 4096,
    };
    (0..n).map(|i| (i, reference.run(&spec_of(i)).unwrap())).collect()
}

fn reference_outputs(m: &Models, policy: Arc<dyn Policy>, n: u64) -> HashMap<u64, ReferenceOutput> {
    run_reference(m, n, |i| {
        let r = request_in(m, i);
        // The engine's seeds and stop ids come from the same request fields.
        RequestSpec {
            id: i,
            prompt: r.prompt,
            max_tokens: r.max_tokens,
            sampling: r.sampling,
            stop_ids: vec![],
            policy: policy.clone(),
            constraint: None,
            speculation: None,
        }
    })
}

/// 16 concurrent requests under several thresholds and arrival orders give the
/// reference's tokens, produced by the same models.
async fn check_against_reference(m: &Models, policy: Arc<dyn Policy>, cases: &[(Vec<usize>, Vec<u64>)]) {
    let want = reference_outputs(m, policy.clone(), 16);
    let models_used: std::collections::HashSet<ModelIndex> =
        want.values().flat_map(|o| o.tokens.iter().map(|t| t.model)).collect();
    assert_eq!(models_used.len(), m.dirs.len(), "every model produces some tokens: {models_used:?}");
    for (thresholds, order) in cases {
        let engine = Engine::start(engine_config(m, policy.clone(), thresholds)).await.unwrap();
        let tasks: Vec<_> = order
            .iter()
            .map(|&i| {
                let engine = engine.clone();
                let r = request_in(m, i);
                tokio::spawn(async move { (i, collect(&engine, r).await) })
            })
            .collect();
        for task in tasks {
            let (i, (tokens, end)) = task.await.unwrap();
            assert!(matches!(end, GenerationEvent::Finished { .. }), "{end:?}");
            let gap = m.greedy_gap.unwrap_or(1e-4);
            want[&i].check(&tokens, gap).unwrap_or_else(|e| panic!("request {i}, thresholds {thresholds:?}: {e}"));
        }
        // A shared budget's free blocks count every model's use: wait for all releases.
        wait_until_everything_is_freed(&engine).await;
        let stats = engine.stats().await;
        assert!(stats.iter().all(|s| s.stats.handoffs_in > 0), "{stats:?}");
        engine.shutdown().await;
    }
}

fn cases(models: usize) -> Vec<(Vec<usize>, Vec<u64>)> {
    let shuffled = vec![5, 3, 11, 0, 15, 2, 9, 1, 14, 4, 8, 12, 6, 13, 7, 10];
    let mut three_one = vec![1; models];
    three_one[0] = 3;
    vec![(vec![1; models], (0..16).collect()), (vec![2; models], (0..16).rev().collect()), (three_one, shuffled)]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_policy_serving_equals_the_sequential_reference() {
    check_against_reference(&models(&[48, 64]), random(0.3), &cases(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rstitch_serving_equals_the_sequential_reference() {
    let rstitch = policy("rstitch", serde_json::json!({ "tau": RSTITCH_TAU }), 2);
    check_against_reference(&models(&[48, 64]), rstitch, &cases(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ensemble_of_three_serving_equals_the_sequential_reference() {
    let me = policy("me", serde_json::json!({ "weights": [0.5, 0.3, 0.2] }), 3);
    check_against_reference(&models(&[48, 64, 80]), me, &cases(3)).await;
}

/// The pair on one K/V budget of 128 pages (block 8: two pages per block of m0, three
/// of m1), enough for three of these requests at once: 16 concurrent routed requests
/// wait their turn, and cached prefixes of either model are evicted for the other's
/// new K/V. Outputs still equal the reference, and every page comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tight_shared_kv_budget_serves_routed_requests_as_the_reference_does() {
    let mut m = models(&[48, 64]);
    // Segments (a head's 8 keys or values) of 96 and 128 values: pages of 384.
    let page_bytes = 384 * 4;
    for load in &mut m.load {
        load.kv_budget_bytes = 64 * page_bytes;
    }
    let engine = Engine::start(engine_config(&m, random(0.3), &[1, 1])).await.unwrap();
    let stats = engine.stats().await;
    assert!(stats.iter().all(|s| s.kv.shared_with == 1), "{stats:?}");
    assert_eq!((stats[0].kv.total_blocks, stats[1].kv.total_blocks), (64, 42), "either may take every page");
    assert_eq!(engine.kv_usage().await.unwrap().shared_pages.map(|p| p.total), Some(128));
    engine.shutdown().await;
    check_against_reference(&m, random(0.3), &cases(2)).await;
}

/// Sharing moves memory to the model that needs it: m1's own half cannot hold this
/// prompt, the budget both models bring can.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_kv_budget_holds_a_prompt_that_one_models_half_cannot() {
    let mut m = models(&[48, 64]);
    // m1: 2 layers x K/V x 2 heads x 16 values = 128 values, 512 bytes a token.
    for load in &mut m.load {
        load.kv_budget_bytes = 500 * 512;
    }
    let mut r = request(0);
    r.prompt = (0..600).map(|k| (k * 7 % VOCAB) as u32).collect();
    r.max_tokens = 8;
    let large = || policy("always", serde_json::json!({ "model": 1 }), 2);
    let mut split = engine_config(&m, large(), &[1, 1]);
    split.admission.share_kv = false;
    let engine = Engine::start(split).await.unwrap();
    let refused = engine.generate(r.clone()).await.err().expect("500 tokens of room cannot take 600");
    assert!(refused.to_string().contains("m1"), "{refused}");
    engine.shutdown().await;
    // A request pinned to m0 (666 tokens of room at 384 bytes a token) reserves nothing on m1.
    let mut split = engine_config(&m, policy("always", serde_json::json!({ "model": 0 }), 2), &[1, 1]);
    split.admission.share_kv = false;
    let engine = Engine::start(split).await.unwrap();
    let (tokens, end) = collect(&engine, r.clone()).await;
    assert!(matches!(end, GenerationEvent::Finished { .. }) && tokens.iter().all(|t| t.1 == 0), "{end:?}");
    engine.shutdown().await;

    let engine = Engine::start(engine_config(&m, large(), &[1, 1])).await.unwrap();
    let mut plain = CandleBackend::load(m.dirs[1].path(), &load_options()).unwrap();
    let want = generate(&mut plain, &r.prompt, r.max_tokens, &r.sampling, &[]).unwrap().token_ids();
    let (tokens, end) = collect(&engine, r).await;
    assert!(matches!(end, GenerationEvent::Finished { .. }), "{end:?}");
    assert_eq!(tokens.iter().map(|t| t.0).collect::<Vec<_>>(), want);
    wait_until_everything_is_freed(&engine).await;
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn always_small_equals_plain_small_model_generation() {
    let m = models(&[48, 64]);
    let engine = Engine::start(engine_config(&m, policy("always", serde_json::json!({ "model": 0 }), 2), &[1, 1]))
        .await
        .unwrap();
    let mut small = CandleBackend::load(m.dirs[0].path(), &load_options()).unwrap();
    for i in 0..4 {
        let r = request(i);
        let plain = generate(&mut small, &r.prompt, r.max_tokens, &r.sampling, &[]).unwrap().token_ids();
        let (tokens, _) = collect(&engine, r).await;
        assert_eq!(tokens.iter().map(|t| t.0).collect::<Vec<_>>(), plain, "request {i}");
        assert!(tokens.iter().all(|t| t.1 == 0));
    }
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_mid_stream_frees_every_kv_block() {
    let m = models(&[48, 64]);
    let engine = Engine::start(engine_config(&m, random(0.5), &[1, 1])).await.unwrap();
    let mut streams = Vec::new();
    for i in 0..6 {
        let mut r = request(i);
        r.max_tokens = 400;
        let mut s = engine.generate(r).await.unwrap();
        // Read a few tokens so each request is mid-generation, holding KV on both models.
        for _ in 0..5 {
            s.next().await.unwrap();
        }
        streams.push(s);
    }
    let busy = engine.stats().await;
    assert!(busy.iter().all(|s| s.kv.free_blocks < s.kv.total_blocks), "{busy:?}");
    drop(streams);
    wait_until_everything_is_freed(&engine).await;
    engine.shutdown().await;
}

/// Releases travel as messages: poll until every model holds nothing.
async fn wait_until_everything_is_freed(engine: &Engine) {
    for _ in 0..200 {
        let stats = engine.stats().await;
        let idle = stats.iter().all(|s| s.kv.free_blocks == s.kv.total_blocks && s.ready == 0 && s.pending == 0);
        let unregistered = engine.registered_requests() == 0;
        if idle
            && unregistered
            && engine.active_requests() == 0
            && engine.kv_usage().await.unwrap().reserved_tokens == 0
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("not freed: {:?}", engine.stats().await);
}

/// A model that panics (while taking in an arrival, half-way through applying a step,
/// or before a forward) restarts on the same weights and resumes every request it
/// held from the committed tokens: all of them finish as the sequential reference
/// does, and everything is freed after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panicking_models_resume_their_requests_and_match_the_reference() {
    let m = models(&[48, 64]);
    let policy = random(0.3);
    let want = reference_outputs(&m, policy.clone(), 8);
    let engine = Engine::start(engine_config(&m, policy, &[1, 1])).await.unwrap();
    // Armed before any request: the first arrival at m0 and m1's first step fail.
    engine.inject_fault(0, Fault::Message).unwrap();
    engine.inject_fault(1, Fault::MidApply).unwrap();
    let mut streams = Vec::new();
    for i in 0..8 {
        streams.push((i, engine.generate(request_in(&m, i)).await.unwrap()));
    }
    for (n, (i, mut stream)) in streams.into_iter().enumerate() {
        let mut tokens = Vec::new();
        loop {
            match tokio::time::timeout(Duration::from_secs(60), stream.next()).await.expect("no request hangs") {
                Some(GenerationEvent::Token { token, model, .. }) => {
                    tokens.push((token, model));
                    if n == 0 && tokens.len() == 1 {
                        engine.inject_fault(0, Fault::Step).unwrap();
                    }
                }
                Some(GenerationEvent::Finished { .. }) => break,
                other => panic!("request {i}: {other:?}"),
            }
        }
        want[&i].check(&tokens, 1e-4).unwrap_or_else(|e| panic!("request {i}: {e}"));
    }
    let stats = engine.stats().await;
    assert!(stats[0].restarts >= 1 && stats[1].restarts >= 1, "{stats:?}");
    assert!(stats.iter().map(|s| s.resumed).sum::<u64>() >= 2, "{stats:?}");
    wait_until_everything_is_freed(&engine).await;
    let (tokens, end) = collect(&engine, request(9)).await;
    assert!(matches!(end, GenerationEvent::Finished { .. }) && !tokens.is_empty());
    engine.shutdown().await;
}

/// A model that keeps panicking gives up: what needs it fails with a clear error,
/// never hangs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_that_keeps_failing_fails_its_requests_instead_of_hanging() {
    let m = models(&[48]);
    let mut config = engine_config(&m, random(0.0), &[1]);
    // Out of service for the whole test (the reload is another test's).
    config.supervision.restart_backoff = Duration::from_secs(600);
    config.supervision.max_restart_backoff = Duration::from_secs(600);
    let engine = Engine::start(config).await.unwrap();
    for _ in 0..8 {
        engine.inject_fault(0, Fault::Message).unwrap();
        let (_, end) = collect(&engine, request(1)).await;
        if let GenerationEvent::Error { message, .. } = end {
            assert!(message.contains("out of service"), "{message}");
            assert!(engine.stats().await[0].failed);
            let (_, again) = collect(&engine, request(2)).await;
            assert!(matches!(again, GenerationEvent::Error { .. }), "{again:?}");
            wait_until_everything_is_freed(&engine).await;
            return engine.shutdown().await;
        }
    }
    panic!("the model never gave up: {:?}", engine.stats().await);
}

/// A client that leaves just as its request moves: the release may overtake the move
/// (the window is widened here by a delay before handoffs leave), and the model the
/// move lands on for the first time must not keep the request, its KV or a pending
/// entry. With p = 1 every request moves at its first decision, so clients that
/// leave at once or after one token race the move.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_at_the_moment_of_a_move_leaves_nothing_behind() {
    tokenrouter_actors::set_handoff_delay_for_tests(Duration::from_millis(3));
    let m = models(&[48, 64]);
    let engine = Engine::start(engine_config(&m, random(1.0), &[1, 1])).await.unwrap();
    for round in 0..4u64 {
        let mut clients = Vec::new();
        for i in 0..12u64 {
            let mut r = request(round * 12 + i);
            r.max_tokens = 200;
            let mut stream = engine.generate(r).await.unwrap();
            let leave_after = (i % 2) as usize;
            clients.push(tokio::spawn(async move {
                for _ in 0..leave_after {
                    stream.next().await;
                }
            }));
        }
        for client in clients {
            client.await.unwrap();
        }
    }
    wait_until_everything_is_freed(&engine).await;
    engine.shutdown().await;
}

/// Churn for a bounded time: streamed clients under random routing (p = 0.5), a third
/// of them hanging up at random points, panics injected into both models as they go.
/// No request that was not dropped is lost (each finishes), and afterwards no block,
/// reservation, pending, ready or active request is left on any model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn churn_with_hang_ups_and_faults_loses_and_leaks_nothing() {
    let m = models(&[48, 64]);
    let engine = Engine::start(engine_config(&m, random(0.5), &[1, 1])).await.unwrap();
    let until = std::time::Instant::now() + Duration::from_secs(60);
    let clients: Vec<_> = (0..12u64)
        .map(|client| {
            let engine = engine.clone();
            tokio::spawn(async move {
                let (mut finished, mut dropped) = (0, 0);
                let mut n = 0u64;
                while std::time::Instant::now() < until {
                    n += 1;
                    let mut r = request(client * 1000 + n);
                    r.max_tokens = 20 + ((client * 31 + n * 17) % 100) as usize;
                    let hang_up_after = ((client + n) % 3 == 0).then_some(1 + ((client * 7 + n * 13) % 40) as usize);
                    let mut stream = engine.generate(r).await.expect("admitted");
                    let mut tokens = 0;
                    loop {
                        if hang_up_after == Some(tokens) {
                            dropped += 1;
                            break;
                        }
                        match tokio::time::timeout(Duration::from_secs(60), stream.next()).await.expect("no hang") {
                            Some(GenerationEvent::Token { .. }) => tokens += 1,
                            Some(GenerationEvent::Finished { .. }) => {
                                finished += 1;
                                break;
                            }
                            other => panic!("request lost: {other:?}"),
                        }
                    }
                }
                (finished, dropped)
            })
        })
        .collect();
    let faults = [Fault::Step, Fault::MidApply, Fault::Message];
    let mut injected = 0;
    while std::time::Instant::now() + Duration::from_secs(8) < until {
        tokio::time::sleep(Duration::from_secs(8)).await;
        engine.inject_fault(injected % 2, faults[injected % 3]).unwrap();
        injected += 1;
    }
    let (mut finished, mut dropped) = (0, 0);
    for client in clients {
        let (f, d) = client.await.unwrap();
        finished += f;
        dropped += d;
    }
    wait_until_everything_is_freed(&engine).await;
    let stats = engine.stats().await;
    let restarts: u64 = stats.iter().map(|s| s.restarts).sum();
    eprintln!("churn: {finished} finished, {dropped} dropped, {injected} faults injected, {restarts} survived");
    assert!(finished > 50 && dropped > 10, "{finished} finished, {dropped} dropped");
    assert!(restarts >= 4, "the injected faults struck: {stats:?}");
    assert!(stats.iter().all(|s| !s.failed), "{stats:?}");
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_refused_with_reasons() {
    let m = models(&[48]);
    let engine = Engine::start(engine_config(&m, random(0.0), &[1])).await.unwrap();
    let err = |r: GenerateRequest| {
        let engine = engine.clone();
        async move { engine.generate(r).await.err().expect("refused").to_string() }
    };
    assert!(err(GenerateRequest::new(vec![], 4)).await.contains("empty"));
    assert!(err(GenerateRequest::new(vec![1], 0)).await.contains("max_tokens"));
    assert!(err(GenerateRequest::new(vec![VOCAB as u32], 4)).await.contains("vocabulary"));
    let mut r = GenerateRequest::new(vec![1], 4);
    r.sampling.temperature = -1.0;
    assert!(err(r).await.contains("emperature"));
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_request_actor_ends_its_stream_and_frees_its_kv() {
    let m = models(&[48, 64]);
    let engine = Engine::start(engine_config(&m, random(0.3), &[1, 1])).await.unwrap();
    let mut r = request(1);
    r.max_tokens = 300;
    let mut stream = engine.generate(r).await.unwrap();
    stream.next().await.unwrap();
    engine.inject_request_fault(stream.request_id());
    loop {
        match tokio::time::timeout(Duration::from_secs(30), stream.next()).await.expect("no hang") {
            Some(GenerationEvent::Token { .. }) => continue,
            None => break,
            Some(other) => panic!("unexpected {other:?}"),
        }
    }
    wait_until_everything_is_freed(&engine).await;
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn online_replanning_moves_off_thresholds_that_starve_the_small_model() {
    use tokenrouter_core::sched::planner::ReplanConfig;
    // At N = 4, B_large = 4 holds every request on the large model until all four have
    // arrived while the small model idles: the planner must find something better.
    let m = models(&[16, 32]);
    let mut config = engine_config(&m, random(0.5), &[1, 4]);
    config.replan = Some(ReplanConfig {
        interval: Duration::from_millis(300),
        margin: 0.0,
        min_steps: 20,
        ..ReplanConfig::default()
    });
    let engine = Engine::start(config).await.unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients: Vec<_> = (0..4u64)
        .map(|c| {
            let (engine, stop) = (engine.clone(), stop.clone());
            tokio::spawn(async move {
                let mut done = 0;
                for i in 0.. {
                    if stop.load(std::sync::atomic::Ordering::SeqCst) {
                        break;
                    }
                    let (tokens, end) = collect(&engine, request(c * 1000 + i)).await;
                    assert!(matches!(end, GenerationEvent::Finished { .. }), "{end:?}");
                    assert!(!tokens.is_empty());
                    done += 1;
                }
                done
            })
        })
        .collect();
    let mut switched = None;
    for _ in 0..60 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let thresholds: Vec<usize> = engine.stats().await.iter().map(|s| s.threshold).collect();
        if engine.active_requests() == 4 && thresholds != vec![1, 4] {
            switched = Some(thresholds);
            break;
        }
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for c in clients {
        assert!(c.await.unwrap() > 0);
    }
    let thresholds = switched.expect("the re-planner switched thresholds within 12 s");
    assert!(thresholds[1] < 4, "{thresholds:?}");
    engine.shutdown().await;
}

const QWEN3_VOCAB: usize = 151_936;

fn qwen3_models(backends: &[BackendKind]) -> Option<Models> {
    let tokenizer = tokenrouter_core::assets::tokenizer_dir("qwen3")?;
    let mut dirs = Vec::new();
    let mut load = Vec::new();
    for (i, &backend) in backends.iter().enumerate() {
        let dir = TempDir::new().unwrap();
        let h = 64 + 32 * i;
        let config = qwen3_shaped(h, 2, 4, 2, 2 * h, QWEN3_VOCAB);
        write_random_model(&config, &InitOptions { seed: 60 + i as u64, std: 0.2 }, dir.path()).unwrap();
        copy_tokenizer(&tokenizer, dir.path()).unwrap();
        dirs.push(dir);
        load.push(LoadOptions { backend, threads: Some(1), ..load_options() });
    }
    // llama.cpp's f16 KV and shape-dependent kernels move logits by ~1e-3 of their
    // range between batched and single-row steps: greedy ties closer than this may
    // break either way.
    let greedy_gap = backends.contains(&BackendKind::Llamacpp).then_some(0.05);
    Some(Models { dirs, load, vocab: QWEN3_VOCAB, greedy_gap })
}

fn random_qwen3(p: f64) -> Arc<dyn Policy> {
    let infos: Vec<ModelInfo> =
        (0..2).map(|i| ModelInfo { name: format!("m{i}"), hidden_size: 0, vocab_size: QWEN3_VOCAB }).collect();
    policy::build("random", &serde_json::json!({ "p": p }), &infos, &PolicyContext::default()).unwrap()
}

/// The same property with llama.cpp kernels: both models on llama.cpp, and one on each
/// backend. Random Qwen3-shaped models with the real tokenizer (llama.cpp needs one).
#[cfg(feature = "llamacpp")]
mod llamacpp {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn both_models_on_llamacpp_serve_as_the_sequential_reference() {
        let Some(m) = qwen3_models(&[BackendKind::Llamacpp, BackendKind::Llamacpp]) else { return };
        check_against_reference(&m, random_qwen3(0.3), &cases(2)).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_model_on_each_backend_serves_as_the_sequential_reference() {
        let Some(m) = qwen3_models(&[BackendKind::Candle, BackendKind::Llamacpp]) else { return };
        check_against_reference(&m, random_qwen3(0.3), &cases(2)[..2]).await;
    }
}

#[path = "engine/structured.rs"]
mod structured;

#[path = "engine/supervision.rs"]
mod supervision;

#[path = "engine/planner.rs"]
mod planner;
