//! `tokenrouter plan`: the best delayed-batching thresholds per concurrency, from the
//! Markov model, with latencies given, profiled, or read off a running server.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};
use clap::Args;
use tokenrouter_core::model::profile::Profile;
use tokenrouter_core::sched::planner::{self, LatencyTable, Plan, PlannerInput, SearchOptions};

use crate::config::write_threshold_table;

#[derive(Args, Debug)]
pub struct PlanArgs {
    /// Step latency of each model in milliseconds, the same at every batch size.
    #[arg(long, value_delimiter = ',')]
    latency_ms: Vec<f64>,
    /// Step latency of one model against batch size, "batch:ms" pairs separated by
    /// spaces (e.g. "1:6 8:9.5 32:21"); repeat once per model in engine order.
    #[arg(long)]
    latency_table: Vec<String>,
    /// Profiles written by `tokenrouter profile`, one per model in engine order: decode
    /// latency against batch size.
    #[arg(long, value_delimiter = ',')]
    profile: Vec<PathBuf>,
    /// Which context (tokens in KV) of the profiles to take latencies at (the nearest).
    #[arg(long, default_value_t = 128)]
    context: usize,
    /// Two models: probability that the small model hands a token to the large one
    /// (which writes it and hands back).
    #[arg(long)]
    route: Option<f64>,
    /// Routing matrix p_ij, rows separated by ';' (e.g. "0.65,0.35;1,0").
    #[arg(long)]
    route_matrix: Option<String>,
    /// Tokens committed per step on i going on to j, like --route-matrix (default: a
    /// delegated token commits nothing with --route, everything commits otherwise).
    #[arg(long)]
    commit: Option<String>,
    /// Concurrencies to plan for: a range "1..16" or a list "2,4,8".
    #[arg(long, default_value = "1..16")]
    concurrency: String,
    #[arg(long, default_value_t = 64)]
    max_batch: usize,
    /// The chain's time unit (default: the fastest step / 20).
    #[arg(long)]
    delta_ms: Option<f64>,
    /// The models take turns on shared compute (one steps at a time), as the engine's
    /// `exclusive_compute` makes models on the same cores do.
    #[arg(long)]
    exclusive: bool,
    /// A running server (e.g. http://127.0.0.1:8000): routing probabilities, commits and
    /// latencies by batch size from its /v1/stats.
    #[arg(long)]
    from_metrics: Option<String>,
    /// A `tokenrouter sweep` JSON (--check-json): routing, commits and latencies by batch
    /// size pooled over its points.
    #[arg(long)]
    from_sweep: Option<PathBuf>,
    /// Saved `/v1/stats` answers: one file for everything since the server started, or two
    /// (BEFORE,AFTER) for what it served between them (e.g. one benchmark run).
    #[arg(long, value_delimiter = ',')]
    from_stats: Vec<PathBuf>,
    /// Write the threshold table into this config file's `scheduler.thresholds`.
    #[arg(long)]
    write_config: Option<PathBuf>,
    /// Solve every threshold vector at the full time resolution (default: screen them
    /// at 4δ and solve the best 8 at δ).
    #[arg(long)]
    exhaustive: bool,
    /// Also print the prediction for these thresholds at each N (e.g. --predict 1,1
    /// --predict 2,4), to compare with the best.
    #[arg(long)]
    predict: Vec<String>,
    /// Write the plans as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
}

pub fn run(args: PlanArgs) -> anyhow::Result<()> {
    let concurrencies = parse_concurrency(&args.concurrency)?;
    let (input, names) = planner_input(&args)?;
    input.validate()?;
    let started = Instant::now();
    let options = if args.exhaustive { SearchOptions::exhaustive() } else { SearchOptions::default() };
    let plans = planner::plan_table(&input, &concurrencies, options)?;
    print_plans(&plans, &input, started.elapsed().as_secs_f64());
    print_predictions(&args.predict, &input, &concurrencies)?;
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&plans)?)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    if let Some(path) = &args.write_config {
        let table: Vec<(usize, Vec<usize>)> = plans.iter().map(|p| (p.n, p.best.thresholds.clone())).collect();
        write_threshold_table(path, names.as_deref(), &table)?;
        println!("wrote the threshold table into {}", path.display());
    }
    Ok(())
}

/// The inputs, and the model names when a server told them.
fn planner_input(args: &PlanArgs) -> anyhow::Result<(PlannerInput, Option<Vec<String>>)> {
    let sources = [args.from_metrics.is_some(), args.from_sweep.is_some(), !args.from_stats.is_empty()];
    if sources.iter().filter(|s| **s).count() > 1 {
        bail!("give one of --from-metrics, --from-sweep, --from-stats");
    }
    let measured = match (&args.from_metrics, &args.from_sweep) {
        (Some(url), _) => Some(super::plan_remote::input_from_server(url, args.max_batch)?),
        (None, Some(path)) => Some(super::plan_remote::input_from_sweep(path, args.max_batch)?),
        (None, None) if !args.from_stats.is_empty() => {
            Some(super::plan_remote::input_from_saved_stats(&args.from_stats, args.max_batch)?)
        }
        (None, None) => None,
    };
    let latencies = given_latencies(args)?;
    let (mut input, names) = match measured {
        Some((measured, names)) => (measured, Some(names)),
        None => {
            let Some(latencies) = &latencies else {
                bail!("give step latencies: --latency-ms, --latency-table, --profile, --from-metrics or --from-sweep");
            };
            (routing_input(args, latencies.len())?, None)
        }
    };
    // Routing given on the command line wins over the measured one.
    if names.is_some() && (args.route.is_some() || args.route_matrix.is_some()) {
        input = PlannerInput { latencies: input.latencies.clone(), ..routing_input(args, input.models())? };
    }
    if let Some(latencies) = latencies {
        if latencies.len() != input.models() {
            bail!("{} latencies given for {} models", latencies.len(), input.models());
        }
        input.latencies = latencies;
    }
    input.max_batch = args.max_batch;
    input.delta_ms = args.delta_ms;
    input.exclusive = args.exclusive;
    Ok((input, names))
}

fn given_latencies(args: &PlanArgs) -> anyhow::Result<Option<Vec<LatencyTable>>> {
    let sources = [!args.latency_ms.is_empty(), !args.latency_table.is_empty(), !args.profile.is_empty()];
    if sources.iter().filter(|s| **s).count() > 1 {
        bail!("give one of --latency-ms, --latency-table, --profile");
    }
    if !args.latency_table.is_empty() {
        return args.latency_table.iter().map(|t| parse_latency_table(t)).collect::<Result<_, _>>().map(Some);
    }
    match (args.latency_ms.is_empty(), args.profile.is_empty()) {
        (true, true) => Ok(None),
        (false, false) => unreachable!("refused above"),
        (false, true) => {
            if let Some(bad) = args.latency_ms.iter().find(|ms| !(**ms > 0.0)) {
                bail!("--latency-ms {bad}: latencies must be positive");
            }
            Ok(Some(args.latency_ms.iter().map(|&ms| LatencyTable::constant(ms)).collect()))
        }
        (true, false) => {
            args.profile.iter().map(|p| profile_latency(p, args.context)).collect::<Result<_, _>>().map(Some)
        }
    }
}

fn parse_latency_table(text: &str) -> anyhow::Result<LatencyTable> {
    let points = text
        .split_whitespace()
        .map(|pair| {
            let (b, ms) = pair.split_once(':')?;
            Some((b.parse::<usize>().ok()?, ms.parse::<f64>().ok()?))
        })
        .collect::<Option<Vec<_>>>()
        .with_context(|| format!("--latency-table {text:?}: give \"batch:ms\" pairs separated by spaces"))?;
    LatencyTable::from_points(points).with_context(|| format!("--latency-table {text:?}: no positive latency"))
}

/// Decode step latency by batch size at the profiled context nearest to `context`.
fn profile_latency(path: &PathBuf, context: usize) -> anyhow::Result<LatencyTable> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let profile: Profile = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a `tokenrouter profile` file", path.display()))?;
    let nearest = profile
        .decode
        .iter()
        .map(|d| d.context)
        .min_by_key(|c| c.abs_diff(context))
        .with_context(|| format!("{} has no decode points", path.display()))?;
    let points = profile.decode.iter().filter(|d| d.context == nearest).map(|d| (d.batch, d.step_ms));
    LatencyTable::from_points(points).with_context(|| format!("{} has no usable decode latency", path.display()))
}

/// Routing and commit matrices from --route / --route-matrix / --commit.
fn routing_input(args: &PlanArgs, models: usize) -> anyhow::Result<PlannerInput> {
    let placeholder = vec![LatencyTable::constant(1.0); models];
    let mut input = match (args.route, &args.route_matrix) {
        (Some(_), Some(_)) => bail!("give --route or --route-matrix, not both"),
        (Some(p), None) => {
            if models != 2 {
                bail!("--route describes two models (small delegates to large); use --route-matrix for {models}");
            }
            if !(0.0..=1.0).contains(&p) {
                bail!("--route {p}: a probability is in [0, 1]");
            }
            PlannerInput::delegation(placeholder[0].clone(), placeholder[1].clone(), p)
        }
        (None, Some(text)) => {
            let route = parse_matrix(text, models, "--route-matrix")?;
            PlannerInput {
                latencies: placeholder.clone(),
                commit: vec![vec![1.0; models]; models],
                route,
                max_batch: args.max_batch,
                entry_model: 0,
                delta_ms: None,
                exclusive: false,
            }
        }
        (None, None) if models == 1 => PlannerInput {
            latencies: placeholder.clone(),
            route: vec![vec![1.0]],
            commit: vec![vec![1.0]],
            max_batch: args.max_batch,
            entry_model: 0,
            delta_ms: None,
            exclusive: false,
        },
        (None, None) => bail!("give --route P (two models) or --route-matrix"),
    };
    if let Some(text) = &args.commit {
        input.commit = parse_matrix(text, models, "--commit")?;
    }
    Ok(input)
}

fn parse_matrix(text: &str, models: usize, flag: &str) -> anyhow::Result<Vec<Vec<f64>>> {
    let rows: Vec<Vec<f64>> = text
        .split(';')
        .map(|row| row.split(',').map(|v| v.trim().parse::<f64>()).collect::<Result<_, _>>())
        .collect::<Result<_, _>>()
        .with_context(|| format!("{flag} {text:?}: numbers separated by ',' and rows by ';'"))?;
    if rows.len() != models || rows.iter().any(|r| r.len() != models) {
        bail!("{flag} {text:?}: expected {models}×{models} for {models} models");
    }
    Ok(rows)
}

/// "1..16" (inclusive) or "2,4,8".
pub fn parse_concurrency(text: &str) -> anyhow::Result<Vec<usize>> {
    let values: Vec<usize> = match text.split_once("..") {
        Some((a, b)) => {
            let (a, b): (usize, usize) = (a.trim().parse()?, b.trim().trim_start_matches('=').parse()?);
            (a..=b).collect()
        }
        None => text.split(',').map(|v| v.trim().parse()).collect::<Result<_, _>>()?,
    };
    if values.is_empty() || values.contains(&0) || values.iter().any(|&n| n > planner::MAX_REQUESTS) {
        bail!("--concurrency {text:?}: give N in 1..={}", planner::MAX_REQUESTS);
    }
    Ok(values)
}

fn print_plans(plans: &[Plan], input: &PlannerInput, seconds: f64) {
    let latencies: Vec<String> = input.latencies.iter().map(|l| format!("{:.2}", l.at(1))).collect();
    println!(
        "{} models, step ms at batch 1: {}; routing {:?}; δ = {:.3} ms",
        input.models(),
        latencies.join(", "),
        input.route,
        input.delta_ms()
    );
    println!(
        "{:>4}  {:<12} {:>12} {:>9} {:>10}  {:<12} {:>12}",
        "N", "thresholds", "tokens/s", "states", "mean batch", "runner-up", "tokens/s"
    );
    for plan in plans {
        let best = &plan.best;
        let batches: Vec<String> = best.prediction.mean_batch.iter().map(|b| format!("{b:.1}")).collect();
        let (runner, runner_tps) = plan
            .runner_up
            .as_ref()
            .map(|c| (join(&c.thresholds), format!("{:.1}", c.prediction.tokens_per_sec)))
            .unwrap_or_else(|| ("-".into(), "-".into()));
        println!(
            "{:>4}  {:<12} {:>12.1} {:>9} {:>10}  {:<12} {:>12}",
            plan.n,
            join(&best.thresholds),
            best.prediction.tokens_per_sec,
            best.prediction.states,
            batches.join("/"),
            runner,
            runner_tps
        );
    }
    let evaluated: usize = plans.iter().map(|p| p.evaluated).sum();
    println!("solved {evaluated} chains in {seconds:.2} s");
}

fn print_predictions(vectors: &[String], input: &PlannerInput, concurrencies: &[usize]) -> anyhow::Result<()> {
    for text in vectors {
        let thresholds: Vec<usize> = text
            .split(',')
            .map(|b| b.trim().parse())
            .collect::<Result<_, _>>()
            .with_context(|| format!("--predict {text:?}: thresholds separated by ','"))?;
        let cells: Vec<String> = concurrencies
            .iter()
            .map(|&n| match planner::predict(input, n, &thresholds) {
                Ok(p) => format!("N={n}: {:.1}", p.tokens_per_sec),
                Err(_) => format!("N={n}: -"),
            })
            .collect();
        println!("B = {}: {}", join(&thresholds), cells.join(", "));
    }
    Ok(())
}

fn join(values: &[usize]) -> String {
    values.iter().map(|v| v.to_string()).collect::<Vec<_>>().join(",")
}
