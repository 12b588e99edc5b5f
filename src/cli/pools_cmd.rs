//! `tokenrouter pools plan` and `tokenrouter pools simulate`: the dual-pool cost model
//! on a request stream (an Azure 2023 trace CSV or a Poisson stream drawn from quantile
//! tables), and the discrete-event simulator that checks it.

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use tokenrouter_core::model::profile::Profile;
use tokenrouter_core::pool::sim::{self, FleetConfig, FleetReport, PoolSizing, RoutingModel};
use tokenrouter_core::pool::{
    parse_azure_csv, poisson_stream, Arrival, Category, CostPlan, EstimatorConfig, InstanceProfile, PoolContexts,
    QuantileTable,
};

#[derive(Subcommand, Debug)]
pub enum PoolsCommand {
    /// α, ρ, the closed-form savings α(1 − 1/ρ) and the instances of each fleet.
    Plan(PlanArgs),
    /// Size homogeneous and dual-pool fleets by simulation and compare with the closed form.
    Simulate(SimulateArgs),
    /// The estimator's error per category against a real tokenizer on real text.
    Estimate(super::pools_estimate::EstimateArgs),
}

#[derive(Args, Debug)]
pub struct StreamArgs {
    /// An Azure LLM inference trace CSV (TIMESTAMP,ContextTokens,GeneratedTokens).
    #[arg(long, conflicts_with = "poisson")]
    trace: Option<PathBuf>,
    /// Instead of a trace: a stationary Poisson stream at this many requests per second.
    #[arg(long)]
    poisson: Option<f64>,
    /// Requests of the Poisson stream.
    #[arg(long, default_value_t = 10_000)]
    count: usize,
    /// Prompt sizes of the Poisson stream, "quantile:tokens" pairs from 0 to 1.
    #[arg(long, default_value = "0:20,0.5:1000,0.9:3000,0.99:6000,1:8000")]
    prompt_quantiles: String,
    /// Output sizes of the Poisson stream, like --prompt-quantiles.
    #[arg(long, default_value = "0:1,0.5:130,0.9:400,1:1000")]
    output_quantiles: String,
    /// Speed the stream up this many times (a trace at a larger fleet's rate).
    #[arg(long, default_value_t = 1.0)]
    scale: f64,
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

#[derive(Args, Debug)]
pub struct FleetArgs {
    /// The short pool's context (prompt + output tokens).
    #[arg(long, default_value_t = 2048)]
    short_context: usize,
    /// The long pool's context; the homogeneous fleet's too.
    #[arg(long, default_value_t = 8192)]
    long_context: usize,
    /// Tokens of KV cache per instance.
    #[arg(long)]
    kv_tokens: Option<usize>,
    /// Sequences per batch at most.
    #[arg(long)]
    max_batch: Option<usize>,
    /// Decode step time at batch 0 (the fixed part), ms.
    #[arg(long)]
    step_base_ms: Option<f64>,
    /// Decode step time per sequence in the batch, ms.
    #[arg(long)]
    step_per_seq_ms: Option<f64>,
    /// Prefill time per prompt token, ms.
    #[arg(long)]
    prefill_per_token_ms: Option<f64>,
    /// Prompt tokens prefilled in one step at most (vLLM's max_num_batched_tokens).
    #[arg(long)]
    step_token_budget: Option<usize>,
    /// A profile written by `tokenrouter profile`: the step-time model is fitted to its
    /// decode latencies and its prefill rate (flags above override).
    #[arg(long)]
    profile: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct PlanArgs {
    #[command(flatten)]
    stream: StreamArgs,
    #[command(flatten)]
    fleet: FleetArgs,
    /// Busy share instances are planned at (below 1 leaves headroom).
    #[arg(long, default_value_t = 0.8)]
    utilization: f64,
    /// A measured ρ (short-pool over long-pool instance throughput on short traffic)
    /// instead of the profile's.
    #[arg(long)]
    rho: Option<f64>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
pub struct SimulateArgs {
    #[command(flatten)]
    stream: StreamArgs,
    #[command(flatten)]
    fleet: FleetArgs,
    /// The P99 time-to-first-token objective every pool is sized for, seconds.
    #[arg(long, default_value_t = 2.0)]
    slo_ttft_p99: f64,
    /// Size pools for the stream sped up by 1 + this (room for bursts).
    #[arg(long, default_value_t = 0.0)]
    headroom: f64,
    /// Admit by KV in use up to --max-batch (vLLM's default, preempting when KV runs
    /// out) instead of as many sequences as KV holds at full context.
    #[arg(long)]
    overcommit: bool,
    /// Content category of the stream's prompts (prose, code, cjk).
    #[arg(long, default_value = "prose")]
    category: String,
    /// True mean bytes per token of the prompts (the traces have no text).
    #[arg(long, default_value_t = 4.0)]
    bytes_per_token: f64,
    /// Relative spread of bytes per token from request to request.
    #[arg(long, default_value_t = 0.1)]
    ratio_cv: f64,
    /// The estimator's margin γ (c* = ĉ − γσ̂).
    #[arg(long, default_value_t = 1.0)]
    gamma: f64,
    #[arg(long)]
    json: bool,
}

pub fn run(command: PoolsCommand) -> anyhow::Result<()> {
    match command {
        PoolsCommand::Plan(args) => plan(args),
        PoolsCommand::Simulate(args) => simulate(args),
        PoolsCommand::Estimate(args) => super::pools_estimate::run(args),
    }
}

fn plan(args: PlanArgs) -> anyhow::Result<()> {
    let stream = args.stream.arrivals()?;
    let (profile, pools) = args.fleet.resolve()?;
    anyhow::ensure!(args.utilization > 0.0 && args.utilization <= 1.0, "--utilization must be in (0, 1]");
    let plan = CostPlan::new(&stream, &profile, pools, args.utilization);
    let plan = match args.rho {
        Some(rho) => plan.with_measured_rho(rho),
        None => plan,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&plan)?);
        return Ok(());
    }
    print_stream(&stream, &profile, pools);
    print_closed_form(&plan);
    let dual = plan.short_instances.ceil() + plan.long_instances.ceil();
    println!("instances at {:.0}% utilization:", args.utilization * 100.0);
    println!("  homogeneous  {:>8.0}", plan.homogeneous_instances.ceil());
    println!("  short pool   {:>8.0}", plan.short_instances.ceil());
    println!("  long pool    {:>8.0}", plan.long_instances.ceil());
    println!("  dual total   {:>8.0}  ({:.1}% fewer)", dual, 100.0 * (1.0 - dual / plan.homogeneous_instances.ceil()));
    Ok(())
}

fn simulate(args: SimulateArgs) -> anyhow::Result<()> {
    let stream = args.stream.arrivals()?;
    let (profile, pools) = args.fleet.resolve()?;
    let category = Category::parse(&args.category).with_context(|| format!("unknown --category {}", args.category))?;
    let fleet = FleetConfig {
        profile,
        pools,
        slo_ttft_p99_s: args.slo_ttft_p99,
        headroom: args.headroom,
        overcommit: args.overcommit,
    };
    let routing = RoutingModel {
        category,
        bytes_per_token: args.bytes_per_token,
        ratio_cv: args.ratio_cv,
        estimator: EstimatorConfig { gamma: args.gamma, ..EstimatorConfig::default() },
        seed: args.stream.seed,
    };
    let report = sim::compare(&stream, &fleet, &routing);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    print_stream(&stream, &profile, pools);
    print_closed_form(&report.closed_form);
    print_report(&report, args.slo_ttft_p99);
    Ok(())
}

impl StreamArgs {
    fn arrivals(&self) -> anyhow::Result<Vec<Arrival>> {
        anyhow::ensure!(self.scale > 0.0, "--scale must be positive");
        let mut stream = match (&self.trace, self.poisson) {
            (Some(path), _) => {
                let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
                parse_azure_csv(&text).with_context(|| format!("in {}", path.display()))?
            }
            (None, Some(rate)) => {
                let prompt = QuantileTable::new(parse_quantiles(&self.prompt_quantiles)?)?;
                let output = QuantileTable::new(parse_quantiles(&self.output_quantiles)?)?;
                poisson_stream(rate, self.count, &prompt, &output, self.seed)
            }
            (None, None) => bail!("give --trace FILE.csv or --poisson RATE"),
        };
        stream.iter_mut().for_each(|a| a.at_s /= self.scale);
        Ok(stream)
    }
}

fn parse_quantiles(text: &str) -> anyhow::Result<Vec<(f64, f64)>> {
    text.split(',')
        .map(|pair| {
            let (q, v) = pair.split_once(':').with_context(|| format!("`{pair}` is not quantile:tokens"))?;
            Ok((q.trim().parse()?, v.trim().parse()?))
        })
        .collect()
}

impl FleetArgs {
    fn resolve(&self) -> anyhow::Result<(InstanceProfile, PoolContexts)> {
        anyhow::ensure!(self.short_context < self.long_context, "--short-context must be below --long-context");
        let base = match &self.profile {
            Some(path) => fitted_profile(path, self.kv_tokens, self.max_batch)?,
            None => InstanceProfile::default(),
        };
        let ms = |v: Option<f64>, default: f64| v.map_or(default, |ms| ms / 1000.0);
        let profile = InstanceProfile {
            kv_tokens: self.kv_tokens.unwrap_or(base.kv_tokens),
            max_batch: self.max_batch.unwrap_or(base.max_batch),
            step_base_s: ms(self.step_base_ms, base.step_base_s),
            step_per_seq_s: ms(self.step_per_seq_ms, base.step_per_seq_s),
            prefill_per_token_s: ms(self.prefill_per_token_ms, base.prefill_per_token_s),
            step_token_budget: self.step_token_budget.unwrap_or(base.step_token_budget),
        };
        anyhow::ensure!(profile.kv_tokens >= self.long_context, "--kv-tokens must hold one long-context request");
        Ok((profile, PoolContexts { short: self.short_context, long: self.long_context }))
    }
}

/// The step-time line fitted to a `tokenrouter profile` JSON (its smallest context).
fn fitted_profile(
    path: &std::path::Path,
    kv_tokens: Option<usize>,
    max_batch: Option<usize>,
) -> anyhow::Result<InstanceProfile> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let profile: Profile = serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let context = profile.decode.iter().map(|p| p.context).min().context("the profile has no decode points")?;
    let decode: Vec<(usize, f64)> =
        profile.decode.iter().filter(|p| p.context == context).map(|p| (p.batch, p.step_ms / 1000.0)).collect();
    let prefill = profile.prefill.iter().map(|p| p.tokens_per_sec).fold(0.0, f64::max);
    anyhow::ensure!(prefill > 0.0, "the profile has no prefill points");
    let default = InstanceProfile::default();
    let kv = kv_tokens.unwrap_or(default.kv_tokens);
    Ok(InstanceProfile::fitted(&decode, prefill, kv, max_batch.unwrap_or(default.max_batch)))
}

fn print_stream(stream: &[Arrival], profile: &InstanceProfile, pools: PoolContexts) {
    let duration = stream.last().map_or(0.0, |a| a.at_s);
    println!(
        "stream: {} requests over {:.0} s ({:.2} req/s); longest {} tokens",
        stream.len(),
        duration,
        stream.len() as f64 / duration.max(1e-9),
        stream.iter().map(Arrival::total_tokens).max().unwrap_or(0)
    );
    println!(
        "instance: KV {} tokens, batch cap {}, step {:.1} ms + {:.3} ms/seq, prefill {:.3} ms/token",
        profile.kv_tokens,
        profile.max_batch,
        profile.step_base_s * 1e3,
        profile.step_per_seq_s * 1e3,
        profile.prefill_per_token_s * 1e3
    );
    println!(
        "pools: short ≤ {} tokens ({} seqs/instance), long ≤ {} tokens ({} seqs/instance)",
        pools.short,
        profile.concurrency(pools.short),
        pools.long,
        profile.concurrency(pools.long)
    );
}

fn print_closed_form(plan: &CostPlan) {
    println!(
        "closed form: α = {:.3} of the work ({:.3} of requests), ρ = {:.2}, savings α(1 − 1/ρ) = {:.1}%",
        plan.alpha,
        plan.alpha_requests,
        plan.rho,
        plan.savings * 100.0
    );
}

fn print_report(report: &FleetReport, slo: f64) {
    println!("simulated, each pool sized for P99 TTFT ≤ {slo} s:");
    println!(
        "  {:<12} {:>9} {:>9} {:>10} {:>10} {:>11} {:>6}",
        "fleet", "instances", "requests", "P50 TTFT", "P99 TTFT", "preemptions", "util"
    );
    let row = |name: &str, p: &PoolSizing| {
        println!(
            "  {:<12} {:>9} {:>9} {:>9.3}s {:>9.3}s {:>11} {:>5.0}%",
            name,
            p.instances,
            p.requests,
            p.p50_ttft_s,
            p.p99_ttft_s,
            p.preemptions,
            p.utilization * 100.0
        );
        if !p.meets_slo {
            println!("  {:<12} misses the objective even with one instance per request", "");
        }
    };
    row("homogeneous", &report.homogeneous);
    row("short pool", &report.short);
    row("long pool", &report.long);
    let r = &report.routes;
    println!(
        "routing: {} short, {} long, {} spilled to long, {} long though they fit short; mis-route rate {:.2}%; estimator MAPE {:.1}%",
        r.short,
        r.long,
        r.spilled,
        r.cautious,
        r.misroute_rate() * 100.0,
        report.estimator_mape * 100.0
    );
    let rejected = report.homogeneous.rejected;
    if rejected > 0 {
        println!("{rejected} requests are longer than the long pool serves (left out of every fleet)");
    }
    println!(
        "savings: simulated {:.1}% vs closed form {:.1}%",
        report.simulated_savings * 100.0,
        report.closed_form.savings * 100.0
    );
}
