//! `tokenrouter-spec-bench --url URL --workload agent --clients 4`: tokens per second of
//! the same requests with and without speculative decoding on one running server.
//! Phases alternate (plain, speculating, plain, …) so both meet the same machine; each
//! phase runs every client's rounds at the given concurrency, after one plain phase that
//! warms the prefix cache. Greedy or seeded, the two produce the same text where the
//! backend computes a row alike in any step (candle; `--require-identical` checks it),
//! so the ratio compares equal work; texts that differ are counted.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use serde_json::{json, Value};
use tokenrouter_load::spec::prompts::Workload;

#[derive(Parser, Debug)]
#[command(name = "tokenrouter-spec-bench", version)]
struct Args {
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    url: String,
    #[arg(long, value_enum)]
    workload: Workload,
    /// Requests in flight (one per client).
    #[arg(long, default_value_t = 1)]
    clients: usize,
    /// Requests per client in each phase.
    #[arg(long, default_value_t = 4)]
    rounds: usize,
    /// Pairs of phases (plain then speculating, alternating which goes first).
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    #[arg(long, default_value_t = 160)]
    max_tokens: usize,
    /// The `speculative` object of the speculating phase.
    #[arg(long, default_value = r#"{"method":"ngram","max_tokens":8}"#)]
    speculative: String,
    /// Sampling temperature (each request seeded, so both phases sample alike).
    #[arg(long, default_value_t = 0.0)]
    temperature: f64,
    /// Fail when a text differs with drafts (for a batch-invariant backend: candle).
    #[arg(long)]
    require_identical: bool,
    /// Write the phases and the summary here as JSON.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
}

#[derive(Debug, Default, Clone)]
struct Phase {
    speculating: bool,
    seconds: f64,
    tokens: u64,
    verify_steps: u64,
    drafted: u64,
    accepted: u64,
    /// Per request, in (client, round) order: the text, to check both phases agree.
    texts: Vec<String>,
}

impl Phase {
    fn tokens_per_second(&self) -> f64 {
        self.tokens as f64 / self.seconds
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    match run(Args::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tokenrouter-spec-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<()> {
    let speculative: Value = serde_json::from_str(&args.speculative).context("--speculative is not JSON")?;
    let client = reqwest::Client::builder().timeout(Duration::from_secs(900)).build()?;
    // The first phase fills the prefix cache with the prompts; later phases all find it full.
    let warm_up = run_phase(&client, &args, None).await?;
    eprintln!("{} warm-up: {:.2} tok/s", args.workload.name(), warm_up.tokens_per_second());
    let mut phases = Vec::new();
    for repeat in 0..args.repeats {
        for speculating in [repeat % 2 == 1, repeat % 2 == 0] {
            let phase = run_phase(&client, &args, speculating.then_some(&speculative)).await?;
            eprintln!(
                "{} repeat {repeat} {}: {:.2} tok/s ({} tokens in {:.1} s)",
                args.workload.name(),
                if speculating { "speculating" } else { "plain" },
                phase.tokens_per_second(),
                phase.tokens,
                phase.seconds
            );
            phases.push(phase);
        }
    }
    let summary = summarize(&args, &phases)?;
    println!("{}", serde_json::to_string_pretty(&summary)?);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&summary)?)?;
    }
    Ok(())
}

async fn run_phase(client: &reqwest::Client, args: &Args, speculative: Option<&Value>) -> Result<Phase> {
    let started = Instant::now();
    let clients = (0..args.clients).map(|c| async move {
        let mut results = Vec::new();
        for round in 0..args.rounds {
            results.push(request(client, args, speculative, c, round).await?);
        }
        anyhow::Ok(results)
    });
    let mut phase = Phase { speculating: speculative.is_some(), ..Phase::default() };
    for results in futures::future::join_all(clients).await {
        for response in results? {
            let usage = &response["usage"];
            let count = |v: &Value| v.as_u64().unwrap_or(0);
            phase.tokens += count(&usage["completion_tokens"]);
            phase.verify_steps += count(&usage["speculation"]["verify_steps"]);
            phase.drafted += count(&usage["speculation"]["drafted_tokens"]);
            phase.accepted += count(&usage["speculation"]["accepted_tokens"]);
            phase.texts.push(response["choices"][0]["message"]["content"].as_str().unwrap_or("").to_string());
        }
    }
    phase.seconds = started.elapsed().as_secs_f64();
    Ok(phase)
}

async fn request(
    client: &reqwest::Client,
    args: &Args,
    speculative: Option<&Value>,
    c: usize,
    round: usize,
) -> Result<Value> {
    let mut body = json!({
        "messages": args.workload.messages(c, round),
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "seed": c * 1000 + round,
        "speculative": speculative.cloned().unwrap_or(json!({ "method": "none" })),
    });
    if args.workload == Workload::Chat {
        body["temperature"] = json!(args.temperature.max(0.7));
    }
    let response = client.post(format!("{}/v1/chat/completions", args.url)).json(&body).send().await?;
    let status = response.status();
    let value: Value = response.json().await?;
    if !status.is_success() {
        bail!("HTTP {status}: {value}");
    }
    Ok(value)
}

fn summarize(args: &Args, phases: &[Phase]) -> Result<Value> {
    let (plain, spec): (Vec<&Phase>, Vec<&Phase>) = phases.iter().partition(|p| !p.speculating);
    // Texts that differ between phases: with drafts (against the plain phase beside), and
    // between plain phases alone, which is the backend's own float noise across batch
    // shapes (zero on candle, whose rows sum alike in any step; not on llama.cpp).
    let differing = |a: &Phase, b: &Phase| a.texts.iter().zip(&b.texts).filter(|(x, y)| x != y).count();
    let with_drafts: usize = plain.iter().zip(&spec).map(|(p, s)| differing(p, s)).sum();
    let plain_alone: usize = plain.windows(2).map(|w| differing(w[0], w[1])).sum();
    if args.require_identical && with_drafts > 0 {
        let (p, s) = plain.iter().zip(&spec).find(|(p, s)| differing(p, s) > 0).expect("counted above");
        let k = p.texts.iter().zip(&s.texts).position(|(a, b)| a != b).unwrap_or(0);
        bail!("request {k} differs with drafts:\n{:?}\nvs\n{:?}", p.texts[k], s.texts[k]);
    }
    let ratios: Vec<f64> =
        plain.iter().zip(&spec).map(|(p, s)| s.tokens_per_second() / p.tokens_per_second()).collect();
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let rate = |ps: &[&Phase]| mean(&ps.iter().map(|p| p.tokens_per_second()).collect::<Vec<_>>());
    let (steps, accepted, drafted): (u64, u64, u64) =
        spec.iter().fold((0, 0, 0), |a, p| (a.0 + p.verify_steps, a.1 + p.accepted, a.2 + p.drafted));
    Ok(json!({
        "workload": args.workload.name(),
        "clients": args.clients,
        "requests_per_phase": args.clients * args.rounds,
        "repeats": args.repeats,
        "max_tokens": args.max_tokens,
        "speculative": serde_json::from_str::<Value>(&args.speculative)?,
        "plain_tokens_per_second": rate(&plain),
        "speculating_tokens_per_second": rate(&spec),
        "speedup_mean": mean(&ratios),
        "speedup_min": ratios.iter().copied().fold(f64::INFINITY, f64::min),
        "speedup_max": ratios.iter().copied().fold(0.0, f64::max),
        "speedups": ratios,
        "completion_tokens_per_phase": spec.first().map(|p| p.tokens),
        "verify_steps": steps,
        "drafted_tokens": drafted,
        "accepted_tokens": accepted,
        "acceptance_rate": accepted as f64 / drafted.max(1) as f64,
        "mean_tokens_per_verify_step": 1.0 + accepted as f64 / steps.max(1) as f64,
        "texts_differing_with_drafts": with_drafts,
        "texts_differing_between_plain_phases": plain_alone,
    }))
}
