//! Dual-pool routing end to end: one server in front of a short and a long pool of
//! tiny random engines (real Qwen3 tokenizer), and a long pool that is another server
//! reached over HTTP. Skips, saying why, without the tokenizer.

use std::sync::Arc;
use std::time::Duration;

use crate::http_support::*;
use serde_json::{json, Value};
use tempfile::TempDir;
use tokenrouter::actors::{Engine, EngineConfig, ModelSpec, StepLimits};
use tokenrouter::config::{PoolEntry, PoolsSection};
use tokenrouter::core::model::init::{copy_tokenizer, write_random_model, InitOptions};
use tokenrouter::core::model::presets::preset;
use tokenrouter::core::model::LoadOptions;
use tokenrouter::core::policy::{self, ModelInfo, PolicyContext};
use tokenrouter::core::pool::{Category, EstimatorConfig};
use tokenrouter::core::sched::BatchingRule;
use tokenrouter::http::{install_metrics_recorder, run_server, AppState, DefaultPolicyOnly, RunningServer};
use tokenrouter::pools::{start_pools, PoolDispatcher};

const SHORT_CONTEXT: usize = 256;

/// One tiny random model with the Qwen3 tokenizer, as the config of every pool engine.
fn tiny_engine_config(tokenizer: &std::path::Path) -> (EngineConfig, TempDir) {
    let mut config = preset("tiny").unwrap();
    config.max_position_embeddings = CONTEXT;
    let dir = TempDir::new().unwrap();
    write_random_model(&config, &InitOptions { seed: 5, std: 0.1 }, dir.path()).unwrap();
    copy_tokenizer(tokenizer, dir.path()).unwrap();
    let load = LoadOptions { kv_budget_bytes: 4 << 20, ..LoadOptions::default() };
    let spec = ModelSpec { name: "m".into(), path: dir.path().to_path_buf(), load };
    let info = ModelInfo { name: "m".into(), hidden_size: 64, vocab_size: 151_936 };
    let default_policy = policy::build("always", &json!({}), &[info], &PolicyContext::default()).unwrap();
    let engine = EngineConfig {
        models: vec![spec],
        default_policy,
        batching: BatchingRule::eager(1),
        limits: StepLimits::default(),
        admission: Default::default(),
        exclusive_compute: false,
        replan: None,
        supervision: Default::default(),
    };
    (engine, dir)
}

fn pool(max_context: usize, upstreams: Vec<String>) -> PoolEntry {
    let engines = Some(usize::from(upstreams.is_empty()));
    PoolEntry { max_context, concurrency: 4, engines, upstreams }
}

struct PoolServer {
    url: String,
    client: reqwest::Client,
    dispatcher: Arc<PoolDispatcher>,
    engines: Vec<Engine>,
    server: RunningServer,
    _model: TempDir,
}

impl PoolServer {
    async fn start(long_upstreams: Vec<String>) -> Option<PoolServer> {
        let (engine, model) = tiny_engine_config(&qwen3_tokenizer()?);
        let section = PoolsSection {
            short: pool(SHORT_CONTEXT, vec![]),
            long: pool(CONTEXT, long_upstreams),
            estimator: EstimatorConfig::default(),
        };
        let started = start_pools(&section, &engine).await.unwrap();
        let resolver = Arc::new(DefaultPolicyOnly::new(&*engine.default_policy));
        let state = AppState::new(started.dispatcher.clone(), resolver)
            .with_limits(test_limits())
            .with_served_model("tokenrouter-test")
            .with_metrics(install_metrics_recorder().unwrap());
        let server = run_server(state, "127.0.0.1:0", futures::future::pending()).await.unwrap();
        let url = format!("http://{}", server.addr());
        let (dispatcher, engines) = (started.dispatcher, started.engines);
        Some(PoolServer { url, client: reqwest::Client::new(), dispatcher, engines, server, _model: model })
    }

    async fn complete(&self, prompt: &str, max_tokens: usize) -> Value {
        let body = json!({ "prompt": prompt, "max_tokens": max_tokens, "seed": 1, "ignore_eos": true });
        let response = self.client.post(format!("{}/v1/completions", self.url)).json(&body).send().await.unwrap();
        assert_eq!(response.status(), 200);
        response.json().await.unwrap()
    }

    async fn wait_idle(&self) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while self.engines.iter().any(|e| e.active_requests() > 0) {
            assert!(tokio::time::Instant::now() < deadline, "requests still active");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn stop(self) {
        self.server.shutdown().await;
        for engine in self.engines {
            engine.shutdown().await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_pools_of_engines_behind_one_server_route_spill_and_learn() {
    let Some(s) = PoolServer::start(vec![]).await else { return };
    let short = s.client.post(format!("{}/v1/chat/completions", s.url)).json(&chat("Hello there", 8, 3)).send();
    assert_eq!(short.await.unwrap().status(), 200);
    // ~200 tokens of prose and 100 more to generate: over the short pool's 256.
    let long = s.complete(&"The story goes on and on. ".repeat(30), 100).await;
    assert_eq!(long["usage"]["completion_tokens"], 100);
    // " 7" is two tokens in two bytes: the prose prior guesses ~80 tokens, there are
    // 300, so the short pool refuses it and the long pool serves it.
    let spilled = s.complete(&" 7".repeat(150), 8).await;
    assert!(spilled["usage"]["prompt_tokens"].as_u64().unwrap() as usize + 8 > SHORT_CONTEXT, "{spilled}");
    assert_eq!(spilled["usage"]["completion_tokens"], 8);
    s.wait_idle().await;

    let snapshot = s.dispatcher.learning().snapshot();
    let r = snapshot.routes;
    assert_eq!((r.short, r.long, r.spilled, r.cautious), (2, 1, 1, 0), "{r:?}");
    // The rendered chat (with its `<|im_start|>` markup) reads as code, the others as prose.
    let observations = |category| snapshot.categories.iter().find(|c| c.0 == category).unwrap().1.observations;
    assert_eq!(observations(Category::Prose), 2, "{snapshot:?}");
    assert_eq!(observations(Category::Code), 1, "every finished request calibrates: {snapshot:?}");
    let metrics = s.client.get(format!("{}/metrics", s.url)).send().await.unwrap().text().await.unwrap();
    for name in ["tokenrouter_pool_routed_total", "tokenrouter_pool_spilled_total", "tokenrouter_pool_estimator_mape"] {
        assert!(metrics.contains(name), "{name} missing from /metrics");
    }
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_pool_of_upstream_servers_serves_over_http() {
    let Some(upstream) = TestServer::start(test_limits(), vec![]).await else { return };
    let Some(s) = PoolServer::start(vec![upstream.url.clone()]).await else { return };
    let long = s.complete(&"The story goes on and on. ".repeat(40), 40).await;
    assert_eq!(long["usage"]["completion_tokens"], 40, "{long}");
    assert!(!long["choices"][0]["text"].as_str().unwrap().is_empty(), "{long}");
    let r = s.dispatcher.learning().snapshot().routes;
    assert_eq!((r.short, r.long), (0, 1));
    upstream.wait_all_kv_free().await;
    s.stop().await;
    upstream.stop().await;
}
