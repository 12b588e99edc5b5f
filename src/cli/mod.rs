//! The `tokenrouter` command line.

mod chat_cmd;
mod check_device_cmd;
mod generate_cmd;
mod model_cmd;
mod node_cmd;
mod plan_cmd;
mod plan_remote;
mod pools_cmd;
mod pools_estimate;
mod profile_cmd;
mod serve;
mod sweep_cmd;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(name = "tokenrouter", version, about = "A serving engine for token-level LLM routing")]
pub struct Cli {
    /// Compute threads (default: TOKENROUTER_THREADS, RAYON_NUM_THREADS, or all cores).
    #[arg(long, global = true)]
    pub threads: Option<usize>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Serve the OpenAI-compatible API (the built-in demo pair without --config).
    Serve(serve::ServeArgs),
    /// Chat in the terminal with a running server (--url) or one started here (--config/--model),
    /// each token in its model's colour.
    Chat(chat_cmd::ChatArgs),
    /// Make or inspect model folders.
    #[command(subcommand)]
    Model(model_cmd::ModelCommand),
    /// Generate from one prompt through the runtime and report tokens/s.
    Generate(generate_cmd::GenerateArgs),
    /// Measure a model's step latency against batch size and context.
    Profile(profile_cmd::ProfileArgs),
    /// Pick delayed-batching thresholds per concurrency with the Markov throughput model.
    Plan(plan_cmd::PlanArgs),
    /// Measure throughput over a grid of batching thresholds and concurrencies, beside the planner's prediction.
    Sweep(sweep_cmd::SweepArgs),
    /// Serve some models' subservers for a front on another host (cluster node).
    Node(node_cmd::NodeArgs),
    /// Prove a CUDA card works: kernels and logits against the CPU, speed against the card's limits.
    CheckDevice(check_device_cmd::CheckDeviceArgs),
    /// Dual-pool routing: cost model, fleet simulator, estimator accuracy.
    #[command(subcommand)]
    Pools(pools_cmd::PoolsCommand),
}

pub fn run(cli: Cli) -> anyhow::Result<()> {
    let threads = tokenrouter_core::model::threads::configure(cli.threads);
    tracing::debug!(threads, "compute threads");
    match cli.command {
        Command::Serve(args) => serve::run(args),
        Command::Chat(args) => chat_cmd::run(args),
        Command::Model(cmd) => model_cmd::run(cmd),
        Command::Generate(args) => generate_cmd::run(args),
        Command::Profile(args) => profile_cmd::run(args, threads),
        Command::Plan(args) => plan_cmd::run(args),
        Command::Sweep(args) => sweep_cmd::run(args),
        Command::Pools(command) => pools_cmd::run(command),
        Command::Node(args) => node_cmd::run(args),
        Command::CheckDevice(args) => check_device_cmd::run(args),
    }
}
