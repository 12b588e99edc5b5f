//! Standard serving end to end: tokenrouter-load's dispatcher over two in-process
//! single-model servers (tiny random models, the real Qwen3 tokenizer), one token
//! per call. Skips, saying why, when the tokenizer is not available.

#[path = "../../tests/http_support/mod.rs"]
mod http_support;

use std::time::Instant;

use clap::Parser;
use futures::future::pending;
use http_support::{qwen3_tokenizer, test_limits, TestServer};
use serde_json::json;
use tokenrouter::core::policy::{self, Decision, ModelInfo, PolicyContext, RouteRow};
use tokenrouter::core::sched::request::policy_seed;
use tokenrouter_load::dispatch::{DispatchConfig, Dispatcher, ServerKind};
use tokenrouter_load::prompt::load_tokenizer;
use tokenrouter_load::target::Target;
use tokenrouter_load::{execute, LoadArgs};

const MODELS: [&str; 2] = ["small", "large"];

async fn single_model_server(name: &str, seed: u64) -> Option<TestServer> {
    TestServer::start_models(&[name], seed, ("always", json!({})), test_limits(), vec![], pending()).await
}

/// The small and the large model's servers (None without the tokenizer).
async fn server_pair() -> Option<(TestServer, TestServer)> {
    Some((single_model_server("small", 11).await?, single_model_server("large", 12).await?))
}

async fn stop_pair((small, large): (TestServer, TestServer)) {
    small.wait_all_kv_free().await;
    large.wait_all_kv_free().await;
    small.stop().await;
    large.stop().await;
}

async fn dispatcher(small: &TestServer, large: &TestServer, policy: &str, params: serde_json::Value) -> Dispatcher {
    let config = DispatchConfig {
        servers: vec![
            ("small".into(), Target::parse(&small.url).unwrap()),
            ("large".into(), Target::parse(&large.url).unwrap()),
        ],
        kind: ServerKind::Tokenrouter,
        policy: policy.into(),
        params,
        vocab_size: 151_936,
        temperature: Some(0.0),
        ignore_eos: true,
    };
    let tokenizer = load_tokenizer(&qwen3_tokenizer().unwrap()).unwrap();
    Dispatcher::connect(config, tokenizer).await.unwrap().0
}

/// The engine's random policy, run position by position on the small model: the
/// model that must write each position.
fn engine_random_choices(p: f64, seed: u64, output: &[u32]) -> Vec<usize> {
    let infos: Vec<ModelInfo> =
        MODELS.iter().map(|m| ModelInfo { name: m.to_string(), hidden_size: 64, vocab_size: 151_936 }).collect();
    let policy = policy::build("random", &json!({ "p": p }), &infos, &PolicyContext::default()).unwrap();
    let mut state = policy.new_state(policy_seed(seed));
    (0..output.len())
        .map(|t| {
            let row = RouteRow {
                request_id: 0,
                model: 0,
                logits: &[],
                hidden: None,
                sampled: 0,
                output: &output[..t],
                state: &mut state,
            };
            match policy.route(&mut [row])[0] {
                Decision::Stay => 0,
                Decision::Move { to, .. } => to,
            }
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_loop_through_standard_serving_completes_every_request() {
    let Some(pair) = server_pair().await else { return };
    let (small, large) = (&pair.0, &pair.1);
    let tokenizer = qwen3_tokenizer().unwrap();
    let servers = format!("small={},large={}", small.url, large.url);
    let argv = [
        "tokenrouter-load",
        "--quiet",
        "--dispatch",
        "standard",
        "--servers",
        &servers,
        "--policy",
        "random",
        "--policy-params",
        r#"{"p":0.3}"#,
        "--clients",
        "3",
        "--requests",
        "6",
        "--scale",
        "0.006",
        "--input-scale",
        "0.2",
        "--seed",
        "4",
        "--temperature",
        "0",
        "--tokenizer",
        tokenizer.to_str().unwrap(),
    ];
    let report = execute(&LoadArgs::try_parse_from(argv).unwrap(), pending()).await.unwrap();
    let s = &report.summary;
    assert_eq!((s.requests_done, s.requests_failed), (6, 0), "{:?}", s.failures);
    for r in &report.requests {
        assert!(r.ok, "{r:?}");
        assert_eq!((r.output_tokens, r.max_tokens), (12, 12), "{r:?}");
        assert_eq!((r.prompt_tokens, r.turn_tokens), (20, 20), "the dispatcher sends the prompt's exact ids: {r:?}");
        assert_eq!(r.tokens_per_model.values().sum::<u64>(), r.output_tokens, "{r:?}");
        assert!(r.ttft_s.unwrap() > 0.0 && r.ttft_s.unwrap() <= r.latency_s, "{r:?}");
        assert_eq!(r.finish_reason.as_deref(), Some("length"));
    }
    assert_eq!(s.tokens_per_model.values().sum::<u64>(), 72);
    assert!(s.tokens_per_model["large"] > 0 && s.tokens_per_model["small"] > s.tokens_per_model["large"], "{s:?}");
    assert!(report.run.target.starts_with("standard serving (tokenrouter, policy random"), "{}", report.run.target);
    stop_pair(pair).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_token_comes_from_the_server_the_engine_policy_chose() {
    let Some(pair) = server_pair().await else { return };
    let (small, large) = (&pair.0, &pair.1);
    let d = dispatcher(small, large, "random", json!({ "p": 0.3 })).await;
    let prompt: Vec<u32> = (1000..1030).collect();
    for seed in [1, 2, 3] {
        let done = d.generate(&prompt, 24, seed, Instant::now()).await.unwrap();
        assert_eq!((done.output.len(), done.prompt_tokens, done.finish_reason), (24, 30, "length"));
        assert_eq!(done.chosen, engine_random_choices(0.3, seed, &done.output), "seed {seed}");
        let writers: Vec<Option<&str>> = done.reported.iter().map(|r| r.as_deref()).collect();
        let chosen: Vec<Option<&str>> = done.chosen.iter().map(|&m| Some(MODELS[m])).collect();
        assert_eq!(writers, chosen, "each token's server reports the model the policy chose");
        // Every position is first drawn on the small model; delegated ones are discarded
        // there and written by the large model.
        let delegated = done.chosen.iter().filter(|&&m| m == 1).count() as u64;
        assert_eq!(done.calls, vec![24, delegated], "seed {seed}");
    }
    stop_pair(pair).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rstitch_reads_the_entropy_of_random_models_as_high_and_stays_large() {
    let Some(pair) = server_pair().await else { return };
    let (small, large) = (&pair.0, &pair.1);
    let d = dispatcher(small, large, "rstitch", json!({ "tau": 0.03 })).await;
    let done = d.generate(&(500..520).collect::<Vec<u32>>(), 10, 7, Instant::now()).await.unwrap();
    // Random weights give near-uniform next-token distributions (entropy ≈ 1 > τ): the
    // small model's first token is discarded, and the large model never hands back.
    assert_eq!(done.chosen, vec![1; 10]);
    assert_eq!(done.calls, vec![1, 10]);
    stop_pair(pair).await;
}
