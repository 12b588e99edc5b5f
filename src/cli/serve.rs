//! `tokenrouter serve`: config (or the built-in demo) → models → engine → HTTP, and a
//! graceful stop on SIGINT/SIGTERM.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use tokenrouter_actors::{Engine, StepLimits};
use tokenrouter_core::model::warmup::{self, WarmUpShape};
use tokenrouter_core::policy::Policy;

use crate::config::{self, ModelCache, PolicyCatalog, ServerConfig};
use crate::http::{self, ApiError, AppState, Generator, Limits, PolicyResolver, RoutingRequest};

#[derive(Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub source: ConfigSource,
    /// Overrides `server.host`.
    #[arg(long)]
    pub host: Option<String>,
    /// Overrides `server.port` (0 picks a free port).
    #[arg(long)]
    pub port: Option<u16>,
    /// Skips the start-up warm-up (KV pages committed, one step per model at the largest
    /// batch, backtrace symbols loaded): a faster start, but resident memory then climbs
    /// over the first minutes of load instead of starting at its working size.
    #[arg(long)]
    pub no_warm_up: bool,
}

/// Which configuration to run: a file, a built-in one by name, or the demo.
#[derive(Args, Debug, Clone, Default)]
pub struct ConfigSource {
    /// YAML configuration file; without it (and without --model), the built-in demo pair.
    #[arg(long, conflicts_with = "model")]
    pub config: Option<PathBuf>,
    /// A built-in configuration: `smollm2` (the real SmolLM2-135M-Instruct alone, as
    /// config/smollm2.yaml), `smollm2-routed` (a random small model routed with it, as
    /// config/smollm2-routed.yaml) or `demo`; or one model alone: a Hugging Face folder or
    /// GGUF file by path, or a Hub id (`ORG/NAME`, or `ORG/NAME:FILE` for one GGUF file),
    /// downloaded into the Hub cache on first use.
    #[arg(long)]
    pub model: Option<String>,
}

impl ConfigSource {
    pub fn load(&self) -> anyhow::Result<ServerConfig> {
        match (&self.config, &self.model) {
            (Some(path), _) => Ok(ServerConfig::load(path)?),
            (None, Some(name)) => config::builtin_config(name).map_err(anyhow::Error::msg),
            (None, None) => Ok(config::demo_config()),
        }
    }
}

pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(serve(args))
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let mut config = args.source.load()?;
    if let Some(host) = args.host {
        config.server.host = host;
    }
    if let Some(port) = args.port {
        config.server.port = port;
    }
    let options = StartOptions { warm_up: !args.no_warm_up, report: say };
    let started = start(config, &options, shutdown_signal()).await?;
    let (scheme, addr) = (started.server.scheme(), started.server.addr());
    println!("tokenrouter listening on {scheme}://{addr}  (dashboard: {scheme}://{addr}/dashboard)");
    started.wait().await?;
    say("tokenrouter stopped");
    Ok(())
}

/// How `start` runs: whether to warm up, and where its status lines go.
pub struct StartOptions {
    pub warm_up: bool,
    pub report: fn(&str),
}

/// A server answering on its address, with the engines behind it.
pub struct Started {
    pub server: http::RunningServer,
    engines: Vec<Engine>,
}

impl Started {
    /// Waits for the server to stop (its shutdown signal), then shuts the engines down.
    pub async fn wait(self) -> anyhow::Result<()> {
        self.server.wait().await?;
        for engine in self.engines {
            engine.shutdown().await;
        }
        Ok(())
    }
}

/// Prepares the config's models (writing presets, preparing known models), starts the
/// engine(s) and the HTTP server on `config.server.address()`; `shutdown` resolving
/// begins a graceful stop. Used by `serve`, and by `chat` for an in-process server.
pub async fn start(
    config: ServerConfig,
    options: &StartOptions,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<Started> {
    // Before any model is prepared or loaded: a bad certificate stops the start at once.
    let tls = config.server.tls.as_ref().map(|t| t.acceptor(&config.base_dir)).transpose()?;
    // Before the engine starts: metrics recorded without a recorder are lost.
    let metrics = http::install_metrics_recorder()?;
    let progress = indicatif::MultiProgress::new();
    let cache = ModelCache::from_env();
    let prepared = tokio::task::block_in_place(|| config.prepare(&cache, Some(&progress)))?;
    if let Some(t) = &prepared.preset_tokenizer {
        (options.report)(&format!("tokenizer: {}", t.source));
    }
    if options.warm_up {
        enable_warm_up(&prepared.engine.limits);
    }
    let spinner = progress.add(indicatif::ProgressBar::new_spinner());
    spinner.set_message(format!("loading {} model(s)", prepared.engine.models.len()));
    spinner.enable_steady_tick(Duration::from_millis(120));
    let (generator, engines) = start_generator(&config, &prepared).await?;
    let engine = &engines[0];
    if engine.tokenizer().is_some() {
        engine.configure_sessions(config.tokenization.session_config())?;
    }
    spinner.finish_and_clear();
    for line in model_lines(engine).await {
        (options.report)(&line);
    }

    let limits = Limits {
        max_body_bytes: config.server.max_body_bytes,
        max_queued_requests: config.server.max_queued_requests,
        max_tokens_limit: config.max_tokens_limit(generator.max_context()),
        shutdown_grace: Duration::from_secs(config.server.shutdown_grace_secs),
        idle_connection: Duration::from_secs(config.server.idle_connection_secs.max(1)),
        request: config.server.request_limits(),
        responses: config.server.responses.limits(),
        ..Limits::default()
    };
    let resolver = CatalogResolver(Arc::new(prepared.catalog));
    let served = engine.model_names().join("+");
    let state = AppState::new(generator, Arc::new(resolver))
        .with_limits(limits)
        .with_api_keys(config.server.api_keys.clone())
        .with_served_model(served)
        .with_speculation(config.scheduler.speculative.as_ref().and_then(|s| s.speculation()))
        .with_fault_injection(config.debug.fault_injection)
        .with_metrics(metrics);
    let state = match tls {
        Some(tls) => state.with_tls(tls),
        None => state,
    };
    let server = http::run_server(state, config.server.address(), shutdown).await?;
    Ok(Started { server, engines })
}

/// One engine, or with `pools` the dispatcher over the pools' engines; also every
/// engine started, to shut down at the end.
async fn start_generator(
    config: &ServerConfig,
    prepared: &config::Prepared,
) -> anyhow::Result<(Arc<dyn Generator>, Vec<Engine>)> {
    let cluster = config.cluster.as_ref().map(|c| c.engine_config(config.policy.seed, &config.base_dir)).transpose();
    let cluster = cluster.map_err(anyhow::Error::msg)?;
    if cluster.is_some() && config.pools.is_some() {
        anyhow::bail!("`cluster` and `pools` cannot be combined yet: give remote models to a single engine");
    }
    let Some(section) = &config.pools else {
        let engine = Engine::start_clustered(prepared.engine.clone(), cluster).await.context("starting the engine")?;
        let generator: Arc<dyn Generator> = Arc::new(engine.clone());
        return Ok((generator, vec![engine]));
    };
    let started = crate::pools::start_pools(section, &prepared.engine).await?;
    println!(
        "pools: short ≤ {} tokens ({} engine(s), {} upstream(s)), long ≤ {} tokens ({} engine(s), {} upstream(s))",
        section.short.max_context,
        section.short.engine_count(),
        section.short.upstreams.len(),
        section.long.max_context,
        section.long.engine_count(),
        section.long.upstreams.len()
    );
    let generator: Arc<dyn Generator> = started.dispatcher;
    Ok((generator, started.engines))
}

/// Models loaded from now on warm up before they serve, at the largest step `limits`
/// allow (KV pages committed, one step per model), and with backtraces on the symbols
/// are loaded now: resident memory starts at its working size (docs/reliability.md).
/// `serve` and `node` call it unless told `--no-warm-up`.
pub(crate) fn enable_warm_up(limits: &StepLimits) {
    warmup::enable(WarmUpShape { rows: limits.max_batch_rows, tokens: limits.step_token_budget });
    tokio::task::block_in_place(load_backtrace_symbols);
}

/// With backtraces on (`RUST_BACKTRACE`), the first panic reads the binary's debug info
/// to print its trace, and std keeps what it parsed for the life of the process (187 MiB
/// measured on the demo). Symbolizing one trace now puts that in the footprint before
/// serving rather than at the first (say, injected) fault.
fn load_backtrace_symbols() {
    let enabled = std::env::var_os("RUST_BACKTRACE").is_some_and(|v| v != "0");
    if enabled {
        let _ = std::backtrace::Backtrace::force_capture().to_string();
    }
}

/// A status line that never fails the server (stdout may be a closed pipe).
pub fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stdout(), "{line}");
}

/// One line per model: its shape, context and KV capacity.
async fn model_lines(engine: &Engine) -> Vec<String> {
    let stats = engine.stats().await;
    let mut lines = Vec::new();
    for (config, name) in engine.model_configs().iter().zip(engine.model_names()) {
        let kv = stats.iter().find(|s| &s.model == name).map(|s| s.kv);
        lines.push(format!(
            "model {name}: {} {:.1}M parameters, {} layers, vocab {}, context {}, KV {} tokens",
            config.arch.hf_class(),
            config.num_parameters() as f64 / 1e6,
            config.num_layers,
            config.vocab_size,
            config.max_position_embeddings,
            kv.map(|k| k.total_tokens()).unwrap_or(0)
        ));
    }
    lines
}

/// SIGINT or SIGTERM. The handlers are installed here, before the server answers
/// anything, so a signal sent as soon as it is up is never the default (fatal) one.
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let (interrupt, terminate) = (signal(SignalKind::interrupt()), signal(SignalKind::terminate()));
    async move {
        let wait = |s: std::io::Result<tokio::signal::unix::Signal>| async move {
            match s {
                Ok(mut s) => {
                    s.recv().await;
                }
                Err(_) => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = wait(interrupt) => {}
            _ = wait(terminate) => {}
        }
        say("shutting down: no new requests; in-flight ones get the grace period");
    }
}

/// A request's `routing` object, checked against the policies the config allows.
struct CatalogResolver(Arc<PolicyCatalog>);

impl PolicyResolver for CatalogResolver {
    fn policy_names(&self) -> Vec<String> {
        let mut names = self.0.names();
        if !self.0.is_allowed("default") {
            names.push("default".into());
        }
        names
    }

    fn resolve(&self, routing: Option<&RoutingRequest>) -> Result<Option<Arc<dyn Policy>>, ApiError> {
        let Some(r) = routing.filter(|r| r.policy.is_some() || r.params.is_some()) else { return Ok(None) };
        self.0
            .resolve(r.policy.as_deref(), r.params.as_ref())
            .map(Some)
            .map_err(|e| ApiError::bad_request(e.to_string(), Some(e.param())))
    }
}
