//! The command line, and `execute`: arguments → jobs → run → report. Tests and
//! other tools build `LoadArgs` with `LoadArgs::try_parse_from` and call `execute`,
//! so every path goes through the same checks (the loopback rule first of all).

use std::future::Future;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};

use crate::client::{Client, Endpoint, RequestOptions};
use crate::dispatch::{parse_server, DispatchConfig, Dispatcher, ServerKind};
use crate::prompt::load_tokenizer;
use crate::prompt::PromptMaker;
use crate::report::{Report, RunInfo};
use crate::runner::{self, Churn, Limits, LoadShape, Transport};
use crate::soak::{SoakPlan, Watchers};
use crate::stats::Summary;
use crate::target::Target;
use crate::trace::{load_trace, parse_trace, TraceRow};
use crate::workload::{make_jobs, poisson_arrivals, Job, Scale, WorkloadKind, WorkloadSpec};

/// Jobs prepared for a soak, reused in turn until the time is up.
const SOAK_JOBS: usize = 256;

/// The Azure sample in `fixtures/`, used by `--workload trace` without `--trace`.
const SAMPLE_TRACE: &str = include_str!("../fixtures/azure_conv_sample.csv");

/// Load generator for tokenrouter (or any OpenAI-compatible server on this machine).
#[derive(Parser, Debug, Clone)]
#[command(name = "tokenrouter-load", version)]
pub struct LoadArgs {
    /// The server's base URL; only loopback hosts (127.0.0.1, ::1, localhost).
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    pub url: String,
    #[arg(long, value_enum, default_value = "low-effort")]
    pub workload: WorkloadKind,
    /// Azure trace CSV for `--workload trace` (default: the 200-row sample built in).
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Closed loop: N clients, each sending its next request when its last one ends
    /// (the default, with 1 client).
    #[arg(long, group = "load")]
    pub clients: Option<usize>,
    /// Open loop: jobs arrive as a Poisson process at this rate per second.
    #[arg(long, group = "load")]
    pub rate: Option<f64>,
    /// Open loop: jobs arrive at the trace's timestamps (`--workload trace`).
    #[arg(long, group = "load")]
    pub replay: bool,
    /// Replay this many times faster than the trace (2 = twice the request rate).
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    /// At most this many requests (each turn of a session is one); default 100,
    /// unless --duration is given: then the run is a soak, bounded by time alone
    /// (closed-loop clients reuse the jobs until the time is up).
    #[arg(long)]
    pub requests: Option<usize>,
    /// No request starts after this many seconds (default 600).
    #[arg(long)]
    pub duration: Option<f64>,
    /// Seconds requests running at --duration may still take before they are cut.
    #[arg(long, default_value_t = 30.0)]
    pub grace: f64,
    /// Factor on output caps and input sizes (0.05 fits a small CPU machine).
    #[arg(long, default_value_t = 1.0)]
    pub scale: f64,
    /// Factor on input sizes alone (default: --scale).
    #[arg(long)]
    pub input_scale: Option<f64>,
    /// Turns per session (`--workload agentic`).
    #[arg(long, default_value_t = 4)]
    pub turns: usize,
    /// tokenizer.json (or its folder) to size prompts exactly; without it a word
    /// counts as a token.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Seed of the prompt text, the Poisson arrivals and each request's sampling seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[arg(long, value_enum, default_value = "chat")]
    pub endpoint: Endpoint,
    /// The `model` field of requests (default: none, the server's own).
    #[arg(long)]
    pub model: Option<String>,
    #[arg(long)]
    pub temperature: Option<f32>,
    /// Let outputs end at EOS; by default `ignore_eos` is sent so they reach the cap.
    #[arg(long)]
    pub allow_eos: bool,
    /// tokenrouter's `routing` object as JSON, e.g. '{"policy":"random","params":{"p":0.3}}'.
    #[arg(long)]
    pub routing: Option<String>,
    /// Ask for the model of every token (`routing.trace`), counted while streaming.
    #[arg(long)]
    pub routing_trace: bool,
    /// OpenAI's `response_format` as JSON (structured outputs), e.g.
    /// '{"type":"json_schema","json_schema":{"name":"x","schema":{...}}}'.
    #[arg(long)]
    pub response_format: Option<String>,
    /// Standard serving: route token by token from here over one single-model server
    /// per model (--servers), each call the whole sequence with max_tokens = 1,
    /// instead of sending requests to --url.
    #[arg(long, value_enum)]
    pub dispatch: Option<DispatchMode>,
    /// Standard serving: the per-model servers as NAME=URL, in the policy's model
    /// order (small first), e.g. small=http://127.0.0.1:8001,large=http://127.0.0.1:8002.
    #[arg(long, value_delimiter = ',')]
    pub servers: Vec<String>,
    /// Standard serving: the servers' API.
    #[arg(long, value_enum, default_value = "tokenrouter")]
    pub server_kind: ServerKind,
    /// Standard serving: the routing policy, by the engine's names (random, rstitch, me, ...).
    #[arg(long, default_value = "random")]
    pub policy: String,
    /// Standard serving: the policy's parameters as JSON, e.g. '{"p":0.1}'.
    #[arg(long)]
    pub policy_params: Option<String>,
    /// Standard serving: the models' vocabulary size (for policies that read the
    /// next-token distribution).
    #[arg(long, default_value_t = 151_936)]
    pub vocab_size: usize,
    /// Write the summary and every request here (JSON).
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write one row per request here (CSV).
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// Churn: hang up on this fraction (0..=1) of streamed requests, each at a
    /// uniformly random point mid-stream (after a random number of its tokens).
    #[arg(long, default_value_t = 0.0)]
    pub hangup_fraction: f64,
    /// Inject a fault into the server this often (seconds): POST /debug/fault
    /// {"model", "point"}, the models of --fault-models in turn, points step and
    /// message alternately. The server must have fault injection on (else 404).
    #[arg(long, requires = "fault_models")]
    pub fault_every: Option<f64>,
    /// The models --fault-every injects faults into, e.g. small,large.
    #[arg(long, value_delimiter = ',', requires = "fault_every")]
    pub fault_models: Vec<String>,
    /// After the run, wait for the server to go idle and report what it still holds
    /// (KV blocks, pending and ready requests, reservations, active requests; GET /v1/stats).
    #[arg(long)]
    pub leak_check: bool,
    /// How long --leak-check waits for the server to go idle (seconds).
    #[arg(long, default_value_t = 60.0)]
    pub leak_wait: f64,
    /// The server's process id: its RSS is sampled from /proc every minute and its
    /// growth reported.
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// No progress bar and no preamble.
    #[arg(long)]
    pub quiet: bool,
}

/// Requests of a run without --requests or --duration.
const DEFAULT_REQUESTS: usize = 100;
/// Seconds of a run without --duration.
const DEFAULT_DURATION_S: f64 = 600.0;

/// Runs the load described by `args` and writes the files it names.
pub async fn execute(args: &LoadArgs, interrupt: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<Report> {
    args.check()?;
    let (transport, target, served_models) = args.transport().await?;
    let maker = match &args.tokenizer {
        Some(path) => PromptMaker::with_tokenizer(path)?,
        None => PromptMaker::approximate(),
    };
    let rows = args.trace_rows()?;
    let (spec, count) = (args.workload_spec(), args.job_count());
    let jobs = tokio::task::spawn_blocking(move || make_jobs(&spec, &maker, rows.as_deref(), count)).await?;
    anyhow::ensure!(!jobs.is_empty(), "the workload has no requests");
    let shape = args.shape(&jobs);
    let info = args.run_info(target, served_models, &shape);
    if !args.quiet {
        eprintln!("{}", preamble(&info, &jobs));
    }
    let turns: usize = jobs.iter().map(|j| j.turns.len()).sum();
    let progress = progress_bar((!args.is_soak()).then(|| turns.min(args.max_requests()) as u64), args.quiet);
    let limits = Limits {
        max_requests: args.max_requests(),
        duration: Duration::from_secs_f64(args.duration_s()),
        grace: Duration::from_secs_f64(args.grace),
        reuse_jobs: args.is_soak(),
    };
    let churn = Churn { hangup_fraction: args.hangup_fraction, seed: args.seed };
    let watchers =
        Watchers::start(args.soak_plan(), Arc::new(Client::new(Target::parse(&args.url)?, args.request_options()?)?));
    let result = runner::run(Arc::new(transport), jobs, &shape, limits, churn, progress, interrupt).await;
    let soak = watchers.finish().await;
    let summary = Summary::new(&result.records, result.elapsed_s);
    let report = Report { run: info, summary, soak, requests: result.records };
    if let Some(path) = &args.json {
        report.write_json(path)?;
    }
    if let Some(path) = &args.csv {
        report.write_csv(path)?;
    }
    Ok(report)
}

impl LoadArgs {
    fn check(&self) -> anyhow::Result<()> {
        let positive = |v: f64, flag: &str| {
            anyhow::ensure!(v.is_finite() && v > 0.0, "{flag} must be a positive number (got {v})");
            Ok(())
        };
        positive(self.scale, "--scale")?;
        positive(self.input_scale.unwrap_or(self.scale), "--input-scale")?;
        positive(self.time_scale, "--time-scale")?;
        positive(self.duration_s(), "--duration")?;
        anyhow::ensure!(self.grace.is_finite() && self.grace >= 0.0, "--grace must be zero or more");
        if let Some(rate) = self.rate {
            positive(rate, "--rate")?;
        }
        anyhow::ensure!(self.requests != Some(0), "--requests must be at least 1");
        self.check_soak()?;
        anyhow::ensure!(self.clients != Some(0), "--clients must be at least 1");
        anyhow::ensure!(self.turns > 0, "--turns must be at least 1");
        let trace = self.workload == WorkloadKind::Trace;
        anyhow::ensure!(trace || self.trace.is_none(), "--trace needs --workload trace");
        anyhow::ensure!(trace || !self.replay, "--replay needs --workload trace (it replays the trace's timestamps)");
        if self.dispatch.is_some() {
            anyhow::ensure!(self.tokenizer.is_some(), "--dispatch needs --tokenizer (it sends token ids)");
            anyhow::ensure!(!self.servers.is_empty(), "--dispatch needs --servers NAME=URL,NAME=URL");
            anyhow::ensure!(
                self.routing.is_none() && !self.routing_trace,
                "--routing and --routing-trace are for the engine; standard serving takes --policy"
            );
        } else {
            anyhow::ensure!(self.servers.is_empty(), "--servers needs --dispatch standard");
        }
        Ok(())
    }

    fn check_soak(&self) -> anyhow::Result<()> {
        let h = self.hangup_fraction;
        anyhow::ensure!((0.0..=1.0).contains(&h), "--hangup-fraction must be in 0..=1 (got {h})");
        if let Some(every) = self.fault_every {
            anyhow::ensure!(every.is_finite() && every > 0.0, "--fault-every must be a positive number of seconds");
        }
        anyhow::ensure!(self.leak_wait.is_finite() && self.leak_wait >= 0.0, "--leak-wait must be zero or more");
        anyhow::ensure!(!self.replay || !self.is_soak(), "--replay needs --requests (a trace is not repeated)");
        if self.dispatch.is_some() {
            let soak = h > 0.0 || self.fault_every.is_some() || self.leak_check;
            anyhow::ensure!(!soak, "--hangup-fraction, --fault-every and --leak-check are for the engine at --url");
        }
        if let Some(pid) = self.server_pid {
            crate::soak::rss::check_pid(pid)?;
        }
        Ok(())
    }

    /// A soak: bounded by --duration alone.
    fn is_soak(&self) -> bool {
        self.duration.is_some() && self.requests.is_none()
    }

    fn max_requests(&self) -> usize {
        match self.is_soak() {
            true => usize::MAX,
            false => self.requests.unwrap_or(DEFAULT_REQUESTS),
        }
    }

    fn duration_s(&self) -> f64 {
        self.duration.unwrap_or(DEFAULT_DURATION_S)
    }

    fn soak_plan(&self) -> SoakPlan {
        SoakPlan {
            fault_every: self.fault_every.map(Duration::from_secs_f64),
            fault_models: self.fault_models.clone(),
            server_pid: self.server_pid,
            leak_wait: self.leak_check.then(|| Duration::from_secs_f64(self.leak_wait)),
        }
    }

    /// Where requests go: a streamed request to --url, or the dispatcher over
    /// --servers. Also returns the target as the report names it and the models
    /// it serves; fails early when a server does not answer.
    async fn transport(&self) -> anyhow::Result<(Transport, String, Vec<String>)> {
        let Some(DispatchMode::Standard) = self.dispatch else {
            let target = Target::parse(&self.url)?;
            let client = Client::new(target.clone(), self.request_options()?)?;
            let served = client.models().await?;
            return Ok((Transport::Stream(client), target.to_string(), served));
        };
        let servers = self.servers.iter().map(|s| parse_server(s)).collect::<anyhow::Result<Vec<_>>>()?;
        let params = match &self.policy_params {
            Some(text) => serde_json::from_str(text).context("--policy-params is not JSON")?,
            None => serde_json::Value::Null,
        };
        let label = format!(
            "standard serving ({}, policy {} {}) over {}",
            value_name(&self.server_kind),
            self.policy,
            params,
            self.servers.join(",")
        );
        let config = DispatchConfig {
            servers,
            kind: self.server_kind,
            policy: self.policy.clone(),
            params,
            vocab_size: self.vocab_size,
            temperature: self.temperature,
            ignore_eos: !self.allow_eos,
        };
        let tokenizer = load_tokenizer(self.tokenizer.as_deref().context("--dispatch needs --tokenizer")?)?;
        let (dispatcher, served) = Dispatcher::connect(config, tokenizer).await?;
        Ok((Transport::Dispatch(dispatcher), label, served))
    }

    fn request_options(&self) -> anyhow::Result<RequestOptions> {
        let mut routing = match &self.routing {
            Some(text) => {
                let v: serde_json::Value = serde_json::from_str(text).context("--routing is not JSON")?;
                anyhow::ensure!(v.is_object(), "--routing must be a JSON object");
                Some(v)
            }
            None => None,
        };
        if self.routing_trace {
            routing.get_or_insert_with(|| serde_json::json!({}))["trace"] = serde_json::json!(true);
        }
        let response_format = match &self.response_format {
            Some(text) => Some(serde_json::from_str(text).context("--response-format is not JSON")?),
            None => None,
        };
        Ok(RequestOptions {
            endpoint: self.endpoint,
            model: self.model.clone(),
            ignore_eos: !self.allow_eos,
            temperature: self.temperature,
            routing,
            response_format,
        })
    }

    fn trace_rows(&self) -> anyhow::Result<Option<Vec<TraceRow>>> {
        if self.workload != WorkloadKind::Trace {
            return Ok(None);
        }
        let rows = match &self.trace {
            Some(path) => load_trace(path)?,
            None => parse_trace(SAMPLE_TRACE).context("in the built-in trace sample")?,
        };
        Ok(Some(rows))
    }

    fn workload_spec(&self) -> WorkloadSpec {
        let scale = Scale { input: self.input_scale.unwrap_or(self.scale), output: self.scale };
        WorkloadSpec { kind: self.workload, scale, turns: self.turns, seed: self.seed }
    }

    /// Jobs to prepare: one per request, or per session for multi-turn work, and in
    /// a closed loop at least one per client so every client has a session.
    fn job_count(&self) -> usize {
        if self.is_soak() {
            // Jobs come round again; enough that concurrent clients rarely share one.
            return SOAK_JOBS.max(2 * self.clients.unwrap_or(1));
        }
        let requests = self.max_requests();
        if !self.workload.is_multi_turn() {
            return requests;
        }
        let sessions = requests.div_ceil(self.turns);
        if self.rate.is_some() || self.replay {
            sessions
        } else {
            sessions.max(self.clients.unwrap_or(1)).min(requests)
        }
    }

    fn shape(&self, jobs: &[Job]) -> LoadShape {
        if let Some(rate) = self.rate {
            // A soak needs arrivals for its whole time, with room for the Poisson spread.
            let count = match self.is_soak() {
                true => (rate * self.duration_s() * 1.2).ceil() as usize + 100,
                false => jobs.len(),
            };
            return LoadShape::Open { arrivals: poisson_arrivals(rate, count, self.seed) };
        }
        if self.replay {
            let arrivals = jobs.iter().map(|j| j.trace_at_s.unwrap_or(0.0) / self.time_scale).collect();
            return LoadShape::Open { arrivals };
        }
        LoadShape::Closed { clients: self.clients.unwrap_or(1) }
    }

    fn run_info(&self, target: String, served_models: Vec<String>, shape: &LoadShape) -> RunInfo {
        let load = match (shape, self.rate) {
            (LoadShape::Closed { clients }, _) => format!("closed loop, {clients} client(s)"),
            (LoadShape::Open { .. }, Some(rate)) => format!("open loop, Poisson {rate} job(s)/s"),
            (LoadShape::Open { .. }, None) => format!("open loop, trace replay x{}", self.time_scale),
        };
        RunInfo {
            target,
            served_models,
            workload: value_name(&self.workload),
            endpoint: value_name(&self.endpoint),
            load,
            scale: self.scale,
            input_scale: self.input_scale.unwrap_or(self.scale),
            turns: if self.workload.is_multi_turn() { self.turns } else { 1 },
            max_requests: if self.is_soak() { 0 } else { self.max_requests() },
            duration_s: self.duration_s(),
            hangup_fraction: self.hangup_fraction,
            seed: self.seed,
            tokenizer: self.tokenizer.as_ref().map(|p| p.display().to_string()),
            trace: self.trace.as_ref().map(|p| p.display().to_string()).or_else(|| {
                (self.workload == WorkloadKind::Trace).then(|| "built-in sample (load/fixtures)".to_string())
            }),
            command: std::env::args().collect(),
            started_unix_s: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
        }
    }
}

/// How requests reach the models besides the default (one request to --url).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DispatchMode {
    /// One single-model server per model and token-by-token routing from here.
    Standard,
}

/// A value as the command line spells it, for the report.
fn value_name<T: clap::ValueEnum>(v: &T) -> String {
    v.to_possible_value().map(|v| v.get_name().to_string()).unwrap_or_default()
}

fn preamble(info: &RunInfo, jobs: &[Job]) -> String {
    let first = &jobs[0];
    let sizes: Vec<String> = first.turns.iter().map(|t| t.tokens.to_string()).collect();
    let bound = match info.max_requests {
        0 => format!("soak for {} s", info.duration_s),
        n => format!("up to {n} requests in {} s", info.duration_s),
    };
    format!(
        "tokenrouter-load: {} against {} ({}), {}, {bound}; first job: turns of {} tokens, max_tokens {}{}",
        info.workload,
        info.target,
        info.served_models.join(", "),
        info.load,
        sizes.join("+"),
        first.max_tokens,
        if info.tokenizer.is_some() { "" } else { " (no --tokenizer: words counted as tokens)" },
    )
}

/// Hidden when stderr is not a terminal (CI logs, pipes) or with --quiet; a plain
/// count when the number of requests is not known (a soak).
fn progress_bar(len: Option<u64>, quiet: bool) -> ProgressBar {
    if quiet || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let (bar, template) = match len {
        Some(len) => (ProgressBar::new(len), "{elapsed_precise} [{bar:30}] {pos}/{len} requests  {msg}"),
        None => (ProgressBar::no_length(), "{elapsed_precise} {pos} requests  {msg}"),
    };
    let style = ProgressStyle::with_template(template)
        .map(|s| s.progress_chars("=> "))
        .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar.enable_steady_tick(Duration::from_millis(250));
    bar
}
