//! A routing policy of your own, in a few lines, served over the OpenAI API: the large
//! model writes every eighth token. Starts on a free port, sends one request with the
//! routing trace, prints it, and stops.
//!
//! `cargo run --release --example custom_policy`

use std::sync::Arc;

use tokenrouter::actors::{Engine, EngineConfig, ModelSpec, StepLimits};
use tokenrouter::core::model::init::{write_random_model, InitOptions};
use tokenrouter::core::model::presets::qwen3_shaped;
use tokenrouter::core::model::LoadOptions;
use tokenrouter::core::policy::{Decision, EntryRequest, ModelIndex, Policy, RouteRow};
use tokenrouter::core::sched::BatchingRule;
use tokenrouter::http::{self, AppState, DefaultPolicyOnly};

/// Small model by default; the large one produces every eighth position.
struct EveryEighth;

impl Policy for EveryEighth {
    fn name(&self) -> &str {
        "every-eighth"
    }
    fn entry_model(&self, _: &mut EntryRequest<'_>) -> ModelIndex {
        0
    }
    fn route(&self, rows: &mut [RouteRow<'_>]) -> Vec<Decision> {
        rows.iter()
            .map(|r| match (r.model, r.position() % 8 == 7) {
                (0, true) => Decision::Move { to: 1, commit: false }, // large writes this one
                (1, _) => Decision::Move { to: 0, commit: true },     // and hands back
                _ => Decision::Stay,
            })
            .collect()
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join("tokenrouter-custom-policy-example");
    let mut models = Vec::new();
    for (name, hidden, seed) in [("small", 64, 1), ("large", 128, 2)] {
        let path = dir.join(name);
        write_random_model(&qwen3_shaped(hidden, 2, 4, 2, 2 * hidden, 1000), &InitOptions { seed, std: 0.2 }, &path)?;
        models.push(ModelSpec { name: name.into(), path, load: LoadOptions::default() });
    }
    let policy: Arc<dyn Policy> = Arc::new(EveryEighth);
    let engine = Engine::start(EngineConfig {
        models,
        default_policy: policy.clone(),
        batching: BatchingRule::eager(2),
        limits: StepLimits::default(),
        admission: Default::default(),
        exclusive_compute: false,
        replan: None,
        supervision: Default::default(),
    })
    .await?;
    let state =
        AppState::new(Arc::new(engine.clone()), Arc::new(DefaultPolicyOnly::new(&*policy))).with_served_model("pair");
    let server = http::run_server(state, "127.0.0.1:0", std::future::pending()).await?;

    let body = serde_json::json!({
        "model": "pair", "prompt": [1, 2, 3], "max_tokens": 24, "temperature": 0,
        "routing": { "trace": true }
    });
    let url = format!("http://{}/v1/completions", server.addr());
    let response: serde_json::Value = reqwest::Client::new().post(url).json(&body).send().await?.json().await?;
    let trace = &response["choices"][0]["routing_trace"];
    println!("models per token: {trace}");
    println!("usage: {}", response["usage"]);
    let large = trace.as_array().map(|t| t.iter().filter(|m| *m == "large").count()).unwrap_or(0);
    anyhow::ensure!(large == 3, "the large model should write tokens 8, 16 and 24, wrote {large}");

    server.shutdown().await;
    engine.shutdown().await;
    Ok(())
}
