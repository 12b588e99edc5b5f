//! Using the engine as a library, without HTTP: two random-weight models, the random
//! routing policy, one streamed request.
//!
//! `cargo run --release --example library`

use std::sync::Arc;

use futures::StreamExt;
use tokenrouter::actors::{Engine, EngineConfig, GenerateRequest, GenerationEvent, ModelSpec, StepLimits};
use tokenrouter::core::model::init::{write_random_model, InitOptions};
use tokenrouter::core::model::presets::qwen3_shaped;
use tokenrouter::core::model::LoadOptions;
use tokenrouter::core::policy::{self, ModelInfo, PolicyContext};
use tokenrouter::core::sched::BatchingRule;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join("tokenrouter-library-example");
    let mut models = Vec::new();
    for (name, hidden, seed) in [("small", 64, 1), ("large", 128, 2)] {
        let path = dir.join(name);
        write_random_model(&qwen3_shaped(hidden, 2, 4, 2, 2 * hidden, 1000), &InitOptions { seed, std: 0.2 }, &path)?;
        models.push(ModelSpec { name: name.into(), path, load: LoadOptions::default() });
    }
    let infos: Vec<ModelInfo> =
        models.iter().map(|m| ModelInfo { name: m.name.clone(), hidden_size: 0, vocab_size: 1000 }).collect();
    let random = policy::build("random", &serde_json::json!({ "p": 0.3 }), &infos, &PolicyContext::default())?;
    let engine = Engine::start(EngineConfig {
        models,
        default_policy: Arc::clone(&random),
        batching: BatchingRule::eager(2),
        limits: StepLimits::default(),
        admission: Default::default(),
        exclusive_compute: false,
        replan: None,
        supervision: Default::default(),
    })
    .await?;

    let mut stream = engine.generate(GenerateRequest::new(vec![1, 2, 3, 4], 24)).await?;
    while let Some(event) = stream.next().await {
        match event {
            GenerationEvent::Token { token, model, .. } => print!("{token}@{} ", engine.model_names()[model]),
            GenerationEvent::Finished { reason, usage, .. } => println!("\n{reason:?}: {usage:?}"),
            GenerationEvent::Error { message, .. } => println!("\nerror: {message}"),
        }
    }
    engine.shutdown().await;
    Ok(())
}
