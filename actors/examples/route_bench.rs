//! Throughput of routed serving on a small/large pair against the large model alone
//! and against one request at a time, measured side by side in one run.
//!
//! `cargo run --release -p tokenrouter-actors --example route_bench -- SMALL_DIR LARGE_DIR \
//!     [--concurrency 16] [--prompt 64] [--output 256] [--p 0.15] [--thresholds 1,1]`

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokenrouter_actors::{Engine, EngineConfig, GenerateRequest, GenerationEvent, ModelSpec, StepLimits};
use tokenrouter_core::model::sampler::SamplingParams;
use tokenrouter_core::model::LoadOptions;
use tokenrouter_core::policy::{self, ModelInfo, Policy, PolicyContext};
use tokenrouter_core::sched::BatchingRule;

struct Args {
    small: PathBuf,
    large: PathBuf,
    concurrency: usize,
    prompt: usize,
    output: usize,
    p: f64,
    thresholds: Vec<usize>,
    /// Which runs: routed, large, sequential.
    runs: Vec<String>,
    /// Threads of each model's own pool in routed runs (e.g. 1,1); shared pool if unset.
    split: Option<Vec<usize>>,
    /// Models take turns on the cores instead of stepping concurrently.
    exclusive: bool,
}

fn parse() -> Args {
    let mut it = std::env::args().skip(1);
    let mut args = Args {
        small: it.next().expect("SMALL_DIR").into(),
        large: it.next().expect("LARGE_DIR").into(),
        concurrency: 16,
        prompt: 64,
        output: 256,
        p: 0.15,
        thresholds: vec![1, 1],
        runs: vec!["routed".into(), "large".into(), "sequential".into()],
        split: None,
        exclusive: false,
    };
    while let Some(flag) = it.next() {
        let value = it.next().expect("flag value");
        match flag.as_str() {
            "--concurrency" => args.concurrency = value.parse().unwrap(),
            "--prompt" => args.prompt = value.parse().unwrap(),
            "--output" => args.output = value.parse().unwrap(),
            "--p" => args.p = value.parse().unwrap(),
            "--thresholds" => args.thresholds = value.split(',').map(|v| v.parse().unwrap()).collect(),
            "--runs" => args.runs = value.split(',').map(String::from).collect(),
            "--exclusive" => args.exclusive = value.parse().unwrap(),
            "--split" => args.split = Some(value.split(',').map(|v| v.parse().unwrap()).collect()),
            other => panic!("unknown flag {other}"),
        }
    }
    args
}

fn spec(name: &str, path: &PathBuf, threads: Option<usize>) -> ModelSpec {
    ModelSpec {
        name: name.into(),
        path: path.clone(),
        load: LoadOptions { kv_budget_bytes: 1 << 30, threads, ..LoadOptions::default() },
    }
}

struct Run {
    label: String,
    tokens: usize,
    elapsed: Duration,
    busy: Vec<(String, f64)>,
    tokens_per_model: Vec<usize>,
}

/// Closed loop: `clients` workers share `requests` requests, each sending its next
/// when the last one ends.
async fn run(label: &str, config: EngineConfig, requests: usize, clients: usize, a: &Args) -> Run {
    let engine = Engine::start(config).await.expect("engine starts");
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let workers: Vec<_> = (0..clients)
        .map(|_| {
            let (engine, next) = (engine.clone(), next.clone());
            let (prompt, output) = (a.prompt, a.output);
            tokio::spawn(async move {
                let mut per_model = vec![0usize; 2];
                let mut tokens = 0;
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    if i >= requests {
                        return (tokens, per_model);
                    }
                    let ids: Vec<u32> = (0..prompt).map(|k| ((k * 7919 + i * 104_729) % 150_000) as u32).collect();
                    let mut r = GenerateRequest::new(ids, output);
                    r.ignore_eos = true;
                    r.sampling = SamplingParams { temperature: 0.7, seed: i as u64, ..SamplingParams::default() };
                    let mut stream = engine.generate(r).await.expect("accepted");
                    while let Some(event) = stream.next().await {
                        match event {
                            GenerationEvent::Token { .. } => tokens += 1,
                            GenerationEvent::Finished { usage, .. } => {
                                for (m, n) in usage.tokens_per_model.iter().enumerate() {
                                    per_model[m] += n;
                                }
                            }
                            GenerationEvent::Error { message, .. } => panic!("{message}"),
                        }
                    }
                }
            })
        })
        .collect();
    let mut tokens = 0;
    let mut tokens_per_model = vec![0usize; 2];
    for w in workers {
        let (t, per) = w.await.unwrap();
        tokens += t;
        tokens_per_model.iter_mut().zip(per).for_each(|(a, b)| *a += b);
    }
    let elapsed = started.elapsed();
    let stats = engine.stats().await;
    for s in &stats {
        let st = &s.stats;
        println!(
            "  {label} / {}: {} steps, {:.1} rows/step, {:.1} ms/step, {:.1} tokens fed/step",
            s.model,
            st.steps,
            st.rows as f64 / st.steps.max(1) as f64,
            st.busy.as_secs_f64() * 1e3 / st.steps.max(1) as f64,
            st.tokens_fed as f64 / st.steps.max(1) as f64
        );
    }
    let busy = stats.iter().map(|s| (s.model.clone(), s.stats.busy.as_secs_f64() / elapsed.as_secs_f64())).collect();
    engine.shutdown().await;
    Run { label: label.into(), tokens, elapsed, busy, tokens_per_model }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let a = parse();
    let split = a.split.clone();
    let models = |dirs: &[(&str, &PathBuf)]| {
        let threads = |i: usize| split.as_ref().filter(|_| dirs.len() > 1).map(|s| s[i]);
        dirs.iter().enumerate().map(|(i, (n, p))| spec(n, p, threads(i))).collect::<Vec<_>>()
    };
    let infos = |n: usize| {
        (0..n).map(|i| ModelInfo { name: format!("m{i}"), hidden_size: 0, vocab_size: 0 }).collect::<Vec<_>>()
    };
    let random: Arc<dyn Policy> =
        policy::build("random", &serde_json::json!({ "p": a.p }), &infos(2), &PolicyContext::default())
            .expect("random policy");
    let always: Arc<dyn Policy> =
        policy::build("always", &serde_json::json!({ "model": 0 }), &infos(1), &PolicyContext::default())
            .expect("always policy");
    let routed = |thresholds: &[usize]| EngineConfig {
        models: models(&[("small", &a.small), ("large", &a.large)]),
        default_policy: random.clone(),
        batching: BatchingRule::fixed(thresholds),
        limits: StepLimits::default(),
        admission: Default::default(),
        exclusive_compute: a.exclusive,
        replan: None,
        supervision: Default::default(),
    };
    let large_only = || EngineConfig {
        models: models(&[("large", &a.large)]),
        default_policy: always.clone(),
        batching: BatchingRule::fixed(&[1]),
        limits: StepLimits::default(),
        admission: Default::default(),
        exclusive_compute: false,
        replan: None,
        supervision: Default::default(),
    };
    let n = a.concurrency;
    let mut runs = Vec::new();
    let wants = |r: &str| a.runs.iter().any(|x| x == r);
    if wants("routed") {
        let label =
            format!("routed p={} B={:?}{}, {n} clients", a.p, a.thresholds, if a.exclusive { " turns" } else { "" });
        runs.push(run(&label, routed(&a.thresholds), n, n, &a).await);
    }
    if wants("large") {
        runs.push(run(&format!("large only, {n} clients"), large_only(), n, n, &a).await);
    }
    if wants("sequential") {
        runs.push(run("routed, one request at a time", routed(&[1, 1]), n.min(4), 1, &a).await);
    }
    if wants("large-sequential") {
        runs.push(run("large only, one request at a time", large_only(), n.min(4), 1, &a).await);
    }
    println!(
        "\n{:<42} {:>8} {:>9} {:>10}  busy fraction per model; tokens per model",
        "run", "tokens", "seconds", "tokens/s"
    );
    for r in &runs {
        let busy: Vec<String> = r.busy.iter().map(|(m, f)| format!("{m} {:.0}%", 100.0 * f)).collect();
        println!(
            "{:<42} {:>8} {:>9.1} {:>10.1}  {}; {:?}",
            r.label,
            r.tokens,
            r.elapsed.as_secs_f64(),
            r.tokens as f64 / r.elapsed.as_secs_f64(),
            busy.join(", "),
            r.tokens_per_model
        );
    }
    let Some(first) = runs.first() else { return };
    let base = first.tokens as f64 / first.elapsed.as_secs_f64();
    for r in &runs[1..] {
        println!("routed vs {}: {:.2}x", r.label, base / (r.tokens as f64 / r.elapsed.as_secs_f64()));
    }
}
