//! `tokenrouter sweep`: measured throughput of the real engine over a grid of
//! delayed-batching thresholds and concurrencies, beside the planner's prediction,
//! as a table, a CSV and a PNG chart.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use serde_json::Value;
use tokenrouter_actors::{ModelSpec, StepLimits};
use tokenrouter_core::model::{BackendKind, LoadOptions, ModelConfig, WeightDtype};
use tokenrouter_core::policy::{self, ModelInfo, Policy, PolicyContext};
use tokenrouter_core::sched::planner;
use tokenrouter_core::sched::SubserverStats;

use crate::sweep::{self, PlanCheck, SweepEvent, SweepOutcome, SweepPoint, SweepSpec};

#[derive(Args, Debug)]
pub struct SweepArgs {
    /// A model as NAME=DIR; repeat it, in engine order (the first is the entry model).
    #[arg(long = "model", required = true, value_parser = parse_model)]
    models: Vec<(String, PathBuf)>,
    /// Routing policy (as in the config's `policy.name`).
    #[arg(long, default_value = "random")]
    policy: String,
    /// The policy's parameters as a JSON object.
    #[arg(long, default_value = "{}")]
    policy_params: String,
    /// Shorthand for the policy's `p` parameter (overrides --policy-params).
    #[arg(long)]
    p: Option<f64>,
    /// Concurrencies N: closed-loop clients in flight.
    #[arg(long, value_delimiter = ',', default_value = "2,4,8,16")]
    concurrency: Vec<usize>,
    /// Candidate thresholds per model, lists separated by ':' (e.g. 1,2,4,8:1,2,4);
    /// 1,2,4 for every model when unset.
    #[arg(long)]
    grid: Option<String>,
    /// Prompt tokens per request.
    #[arg(long, default_value_t = 32)]
    prompt: usize,
    /// Output tokens per request (EOS ignored).
    #[arg(long, default_value_t = 256)]
    output: usize,
    /// Seconds after each threshold switch before measuring.
    #[arg(long, default_value_t = 2.0)]
    warmup_s: f64,
    /// Seconds of each measurement window.
    #[arg(long, default_value_t = 8.0)]
    measure_s: f64,
    /// Threads of each model's own pool (e.g. 1,1); the shared pool when unset.
    #[arg(long, value_delimiter = ',')]
    model_threads: Option<Vec<usize>>,
    /// Models take turns on the cores instead of stepping at the same time.
    #[arg(long)]
    exclusive: bool,
    #[arg(long, default_value = "f32")]
    dtype: WeightDtype,
    /// Backend of every model, or one per model (`candle,llamacpp`).
    #[arg(long, value_delimiter = ',', default_value = "candle")]
    backend: Vec<BackendKind>,
    /// KV budget per model, MiB.
    #[arg(long, default_value_t = 1024)]
    kv_mib: usize,
    #[arg(long, default_value_t = 0.7)]
    temperature: f32,
    /// Seed of prompts, sampling and random router weights.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// After the grid, let the planner pick thresholds per N from the pooled counters,
    /// measure its picks, and report them against the best measured point.
    #[arg(long)]
    check_plan: bool,
    /// Fresh interleaved windows of the planner's pick and of the grid's best, each,
    /// in the check (the order alternates between rounds).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=20))]
    check_rounds: u64,
    /// Where to write the planner check as JSON (with --check-plan).
    #[arg(long, default_value = "sweep-check.json")]
    check_json: PathBuf,
    #[arg(long, default_value = "sweep.csv")]
    csv: PathBuf,
    #[arg(long, default_value = "sweep.png")]
    chart: PathBuf,
}

fn parse_model(text: &str) -> Result<(String, PathBuf), String> {
    match text.split_once('=') {
        Some((name, dir)) if !name.is_empty() && !dir.is_empty() => Ok((name.to_string(), PathBuf::from(dir))),
        _ => Err(format!("expected NAME=DIR, got {text:?}")),
    }
}

/// "1,2,4:1,2" → [[1,2,4],[1,2]]; one list applies to every model.
fn parse_grid(text: &str, models: usize) -> anyhow::Result<Vec<Vec<usize>>> {
    let lists: Vec<Vec<usize>> = text
        .split(':')
        .map(|list| list.split(',').map(|b| b.trim().parse::<usize>()).collect::<Result<_, _>>())
        .collect::<Result<_, _>>()
        .with_context(|| format!("--grid {text:?}: expected lists of integers separated by ':'"))?;
    match lists.len() {
        1 => Ok(vec![lists[0].clone(); models]),
        n if n == models => Ok(lists),
        n => bail!("--grid has {n} lists for {models} models"),
    }
}

pub fn run(args: SweepArgs) -> anyhow::Result<()> {
    let spec = spec(&args)?;
    let plan = sweep::schedule(&spec.concurrencies, &spec.grid);
    let bar = indicatif::ProgressBar::new(plan.len() as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} points, {elapsed} elapsed, ~{eta} left  {msg}")
            .expect("a valid template"),
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    bar.set_message(format!("loading {} models", spec.models.len()));
    let mut observe = |event: SweepEvent<'_>| match event {
        SweepEvent::Warming { concurrency, thresholds } => {
            bar.set_message(format!("N={concurrency} B={}", sweep::chart::label(thresholds)))
        }
        SweepEvent::Measured(_) => {
            bar.inc(1);
            if Some(bar.position()) == bar.length() {
                bar.set_message("stopping the engine, predicting");
            }
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let predict = predictor(spec.limits.max_batch_rows, spec.exclusive_compute);
    let outcome = runtime.block_on(sweep::run(&spec, &predict, &mut observe))?;
    bar.finish_and_clear();
    print_table(&outcome.points);
    print_checks(&outcome.checks);
    write_outputs(&args, &outcome)
}

fn print_checks(checks: &[PlanCheck]) {
    if checks.is_empty() {
        return;
    }
    println!("\nplanner (inputs pooled over every point) against the measurements; where it chose another point than");
    println!("the grid's best, both were measured again in fresh interleaved windows (rounds) and compared on those:");
    println!(
        "{:>4} {:>8} {:>10} {:>10} {:>8} {:>10} {:>9} {:>7}",
        "N", "chosen", "predicted", "measured", "best B", "best tok/s", "of best", "rounds"
    );
    for c in checks {
        println!(
            "{:>4} {:>8} {:>10.1} {:>10.1} {:>8} {:>10.1} {:>8.1}% {:>7}   prediction {:+.1}%  (grid best {:.1}){}",
            c.concurrency,
            sweep::chart::label(&c.chosen),
            c.predicted_tokens_per_sec,
            c.measured_tokens_per_sec,
            sweep::chart::label(&c.best_thresholds),
            c.best_measured_tokens_per_sec,
            100.0 * c.share_of_best(),
            c.confirm_rounds,
            100.0 * c.prediction_error(),
            c.grid_best_tokens_per_sec,
            round_spread(c)
        );
    }
}

/// Each round's figures, chosen / best, when the two were measured again.
fn round_spread(c: &PlanCheck) -> String {
    if c.measured_rounds.is_empty() {
        return String::new();
    }
    let rounds: Vec<String> =
        c.measured_rounds.iter().zip(&c.best_rounds).map(|(m, b)| format!("{m:.1}/{b:.1}")).collect();
    format!("  rounds chosen/best: {}", rounds.join(", "))
}

/// The planner's prediction at a point, from what the engine did there: step latency by
/// batch rows, routing and commit rates over the window. Feeding it the measured inputs
/// isolates the Markov model's own error from errors in profiling or routing estimates.
fn predictor(max_batch: usize, exclusive: bool) -> impl Fn(usize, &[usize], &SweepPoint) -> Option<f64> {
    move |n, thresholds, measured| {
        let stats: Vec<SubserverStats> = measured.models.iter().map(|m| m.stats.clone()).collect();
        // The first model is the entry model (see --model).
        let prediction = planner::input_from_stats(&stats, &[], 0, max_batch)
            .and_then(|input| planner::predict(&planner::PlannerInput { exclusive, ..input }, n, thresholds));
        match prediction {
            Ok(p) => Some(p.tokens_per_sec),
            Err(e) => {
                tracing::warn!(n, ?thresholds, "no prediction: {e}");
                None
            }
        }
    }
}

fn spec(args: &SweepArgs) -> anyhow::Result<SweepSpec> {
    if let Some(t) = &args.model_threads {
        if t.len() != args.models.len() {
            bail!("--model-threads has {} counts for {} models", t.len(), args.models.len());
        }
    }
    let grid = parse_grid(args.grid.as_deref().unwrap_or("1,2,4"), args.models.len())?;
    if args.backend.len() != 1 && args.backend.len() != args.models.len() {
        bail!("--backend names {} backends for {} models", args.backend.len(), args.models.len());
    }
    let load = LoadOptions { dtype: args.dtype, kv_budget_bytes: args.kv_mib << 20, ..LoadOptions::default() };
    let models = args
        .models
        .iter()
        .enumerate()
        .map(|(i, (name, dir))| ModelSpec {
            name: name.clone(),
            path: dir.clone(),
            load: LoadOptions {
                backend: args.backend[i.min(args.backend.len() - 1)],
                threads: args.model_threads.as_ref().map(|t| t[i]),
                ..load.clone()
            },
        })
        .collect();
    Ok(SweepSpec {
        models,
        policy: build_policy(args)?,
        concurrencies: args.concurrency.clone(),
        grid,
        prompt_tokens: args.prompt,
        output_tokens: args.output,
        warmup: Duration::from_secs_f64(args.warmup_s.max(0.0)),
        measure: Duration::from_secs_f64(args.measure_s.max(0.0)),
        seed: args.seed,
        temperature: args.temperature,
        limits: StepLimits::default(),
        exclusive_compute: args.exclusive,
        check_plan: args.check_plan,
        check_rounds: args.check_rounds as usize,
    })
}

fn build_policy(args: &SweepArgs) -> anyhow::Result<Arc<dyn Policy>> {
    let mut params: Value = serde_json::from_str(&args.policy_params).context("--policy-params is not JSON")?;
    if let Some(p) = args.p {
        let Value::Object(map) = &mut params else { bail!("--policy-params must be a JSON object") };
        map.insert("p".into(), p.into());
    }
    let configs = args
        .models
        .iter()
        .map(|(_, dir)| ModelConfig::from_file(&dir.join("config.json")).with_context(|| dir.display().to_string()))
        .collect::<anyhow::Result<Vec<_>>>()?;
    // The engine slices logits to the smallest vocabulary; policies see that one.
    let vocab = configs.iter().map(|c| c.vocab_size).min().unwrap_or(0);
    let infos: Vec<ModelInfo> = args
        .models
        .iter()
        .zip(&configs)
        .map(|((name, _), c)| ModelInfo { name: name.clone(), hidden_size: c.hidden_size, vocab_size: vocab })
        .collect();
    let ctx = PolicyContext {
        model_dirs: args.models.iter().map(|(_, d)| d.clone()).collect(),
        base_dir: None,
        seed: args.seed,
    };
    Ok(policy::build(&args.policy, &params, &infos, &ctx)?)
}

fn print_table(points: &[SweepPoint]) {
    let Some(first) = points.first() else { return };
    print!("{:>4} {:>10} {:>9} {:>9}", "N", "B", "tok/s", "predicted");
    for m in &first.models {
        print!("  | {:<10} {:>6} {:>8} {:>6} {:>6} {:>5}", m.model, "batch", "ms/step", "fed", "route", "busy");
    }
    println!();
    for p in points {
        let predicted = p.predicted_tokens_per_sec.map_or("-".to_string(), |t| format!("{t:.1}"));
        print!(
            "{:>4} {:>10} {:>9.1} {:>9}",
            p.concurrency,
            sweep::chart::label(&p.thresholds),
            p.tokens_per_sec,
            predicted
        );
        for m in &p.models {
            print!(
                "  | {:<10} {:>6.2} {:>8.2} {:>6.2} {:>6.3} {:>4.0}%",
                "",
                m.rows_per_step,
                m.ms_per_step,
                m.tokens_fed_per_step,
                m.handoffs_per_row,
                100.0 * m.busy_fraction
            );
        }
        println!();
    }
    println!("(batch: rows per step; fed: tokens fed per step; route: handoffs out per row; busy: share of the window stepping)");
}

fn write_outputs(args: &SweepArgs, outcome: &SweepOutcome) -> anyhow::Result<()> {
    let mut file = std::fs::File::create(&args.csv).with_context(|| format!("creating {}", args.csv.display()))?;
    sweep::write_csv(&outcome.points, &mut file).with_context(|| format!("writing {}", args.csv.display()))?;
    sweep::write_chart(&outcome.points, &args.chart)?;
    println!("wrote {} and {}", args.csv.display(), args.chart.display());
    if !outcome.checks.is_empty() {
        std::fs::write(&args.check_json, serde_json::to_string_pretty(outcome)?)
            .with_context(|| format!("writing {}", args.check_json.display()))?;
        println!("wrote {}", args.check_json.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grids_parse_per_model_or_shared() {
        assert_eq!(parse_grid("1,2,4:1,2", 2).unwrap(), vec![vec![1, 2, 4], vec![1, 2]]);
        assert_eq!(parse_grid("1,2", 3).unwrap(), vec![vec![1, 2]; 3]);
        assert!(parse_grid("1,2:1:3", 2).is_err());
        assert!(parse_grid("1,x", 2).is_err());
    }

    #[test]
    fn models_are_name_equals_dir() {
        assert_eq!(parse_model("small=/tmp/m").unwrap(), ("small".to_string(), PathBuf::from("/tmp/m")));
        assert!(parse_model("/tmp/m").is_err());
        assert!(parse_model("=x").is_err());
    }
}
