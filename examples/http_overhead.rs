//! Server overhead: streamed tokens/s through HTTP (SSE on loopback) against the
//! library API, same engine, same workload, measured back to back in one run.
//!
//! `cargo run --release --example http_overhead -- [--clients 32] [--requests 128] [--tokens 64]`

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use tokenrouter::actors::{Engine, EngineConfig, GenerateRequest, GenerationEvent, ModelSpec, StepLimits};
use tokenrouter::core::model::init::{write_random_model, InitOptions};
use tokenrouter::core::model::presets::preset;
use tokenrouter::core::model::LoadOptions;
use tokenrouter::core::openai::Completion;
use tokenrouter::core::policy::{self, ModelInfo, PolicyContext};
use tokenrouter::core::sched::BatchingRule;
use tokenrouter::core::sse::{SseEvent, SseParser};
use tokenrouter::http::{self, AppState, DefaultPolicyOnly};

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn prompt(i: usize) -> Vec<u32> {
    (0..32).map(|k| ((k * 7919 + i * 104_729) % 150_000) as u32).collect()
}

async fn library(engine: &Engine, clients: usize, requests: usize, tokens: usize) -> f64 {
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let (engine, next) = (engine.clone(), next.clone());
            tokio::spawn(async move {
                let mut n = 0;
                while next.fetch_add(1, Ordering::SeqCst) < requests {
                    let mut r = GenerateRequest::new(prompt(n), tokens);
                    r.ignore_eos = true;
                    let mut s = engine.generate(r).await.unwrap();
                    while let Some(e) = s.next().await {
                        if let GenerationEvent::Token { .. } = e {
                            n += 1;
                        }
                    }
                }
                n
            })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    total as f64 / start.elapsed().as_secs_f64()
}

async fn over_http(url: String, clients: usize, requests: usize, tokens: usize) -> f64 {
    let next = Arc::new(AtomicUsize::new(0));
    let client = reqwest::Client::new();
    let start = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let (client, next, url) = (client.clone(), next.clone(), url.clone());
            tokio::spawn(async move {
                let mut n = 0;
                while next.fetch_add(1, Ordering::SeqCst) < requests {
                    let body = serde_json::json!({
                        "model": "pair", "prompt": prompt(n), "max_tokens": tokens, "ignore_eos": true, "stream": true,
                        "stream_options": { "include_usage": true }
                    });
                    let response = client.post(&url).json(&body).send().await.unwrap();
                    let mut stream = response.bytes_stream();
                    let mut parser = SseParser::default();
                    while let Some(chunk) = stream.next().await {
                        for event in parser.push(&chunk.unwrap()) {
                            // Tokens are counted from the usage chunk: text chunks may merge tokens.
                            let SseEvent::Data(data) = event else { continue };
                            let chunk: Completion = serde_json::from_str(&data).expect("a well-formed chunk");
                            n += chunk.usage.map_or(0, |u| u.completion_tokens as usize);
                        }
                    }
                }
                n
            })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    total as f64 / start.elapsed().as_secs_f64()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let (clients, requests, tokens) = (arg("--clients", 32), arg("--requests", 128), arg("--tokens", 64));
    let dir = std::env::temp_dir().join("tokenrouter-http-overhead");
    let mut models = Vec::new();
    for (name, seed) in [("small", 1), ("large", 2)] {
        let path = dir.join(name);
        if !path.join("model.safetensors").is_file() {
            write_random_model(&preset("tiny").unwrap(), &InitOptions { seed, std: 0.02 }, &path)?;
        }
        models.push(ModelSpec { name: name.into(), path, load: LoadOptions::default() });
    }
    let infos: Vec<ModelInfo> =
        models.iter().map(|m| ModelInfo { name: m.name.clone(), hidden_size: 64, vocab_size: 151_936 }).collect();
    let random = policy::build("random", &serde_json::json!({ "p": 0.2 }), &infos, &PolicyContext::default())?;
    let engine = Engine::start(EngineConfig {
        models,
        default_policy: random.clone(),
        batching: BatchingRule::eager(2),
        limits: StepLimits::default(),
        admission: Default::default(),
        exclusive_compute: false,
        replan: None,
        supervision: Default::default(),
    })
    .await?;
    let state =
        AppState::new(Arc::new(engine.clone()), Arc::new(DefaultPolicyOnly::new(&*random))).with_served_model("pair");
    let server = http::run_server(state, "127.0.0.1:0", std::future::pending()).await?;
    let url = format!("http://{}/v1/completions", server.addr());

    // Warm up both paths, then alternate them twice.
    library(&engine, clients, clients, 8).await;
    over_http(url.clone(), clients, clients, 8).await;
    let mut rows = Vec::new();
    for round in 0..2 {
        let lib = library(&engine, clients, requests, tokens).await;
        let web = over_http(url.clone(), clients, requests, tokens).await;
        println!("round {round}: library {lib:.0} tok/s, HTTP+SSE {web:.0} tok/s, ratio {:.3}", web / lib);
        rows.push(web / lib);
    }
    println!(
        "HTTP/library throughput ratio (mean of {}): {:.3}",
        rows.len(),
        rows.iter().sum::<f64>() / rows.len() as f64
    );
    server.shutdown().await;
    engine.shutdown().await;
    Ok(())
}
