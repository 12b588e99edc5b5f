//! Helpers for the HTTP tests: a server on loopback in front of a real engine on two
//! tiny random models with the real Qwen3 tokenizer, SSE parsing, and a scripted
//! generator for the few cases a real engine cannot produce on demand.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
use serde_json::{json, Value};
use tempfile::TempDir;
use tokenrouter::actors::tokenizer::RenderedChat;
use tokenrouter::actors::{
    AdmissionConfig, Engine, EngineConfig, EngineError, GenerateRequest, GenerationEvent, ModelSpec, StepLimits,
    SupervisionConfig,
};
use tokenrouter::core::model::init::{copy_tokenizer, write_random_model, InitOptions};
use tokenrouter::core::model::presets::preset;
use tokenrouter::core::model::LoadOptions;
use tokenrouter::core::policy::{self, ModelInfo, PolicyContext};
use tokenrouter::core::sched::BatchingRule;
use tokenrouter::core::tokenize::{ChatMessage, RenderOptions};
use tokenrouter::http::{
    install_metrics_recorder, run_server, AppState, DefaultPolicyOnly, EngineStats, EventStream, Generator, Limits,
    RunningServer,
};

/// Context of the test models: small, so a prompt longer than it is cheap to send.
pub const CONTEXT: usize = 1024;
pub const MAX_TOKENS_LIMIT: usize = 512;

pub fn qwen3_tokenizer() -> Option<PathBuf> {
    tokenrouter::core::assets::tokenizer_dir("qwen3")
}

pub fn test_limits() -> Limits {
    Limits {
        max_body_bytes: 64 << 10,
        max_queued_requests: 64,
        max_tokens_limit: MAX_TOKENS_LIMIT,
        keep_alive_interval: Duration::from_secs(10),
        shutdown_grace: Duration::from_secs(10),
        workers: Some(1),
        ..Limits::default()
    }
}

/// What a test server runs: its models, policy, limits and engine settings.
pub struct Setup {
    pub names: Vec<String>,
    pub first_seed: u64,
    /// Seed of model i: `first_seed + i * seed_step` (0: every model the same weights).
    pub seed_step: u64,
    pub policy: (String, Value),
    pub limits: Limits,
    pub keys: Vec<String>,
    pub admission: AdmissionConfig,
    pub kv_budget_bytes: usize,
    pub fault_injection: bool,
    pub prefix_cache: bool,
    pub supervision: SupervisionConfig,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            names: vec!["small".into(), "large".into()],
            first_seed: 11,
            seed_step: 1,
            policy: ("random".into(), json!({ "p": 0.5 })),
            limits: test_limits(),
            keys: Vec::new(),
            admission: AdmissionConfig::default(),
            kv_budget_bytes: 8 << 20,
            fault_injection: false,
            prefix_cache: true,
            supervision: SupervisionConfig::default(),
        }
    }
}

pub struct TestServer {
    pub url: String,
    pub engine: Engine,
    pub server: RunningServer,
    pub client: reqwest::Client,
    pub state: AppState,
    _models: Vec<TempDir>,
}

impl TestServer {
    /// None (after printing why) when the tokenizer is not available.
    pub async fn start(limits: Limits, keys: Vec<String>) -> Option<TestServer> {
        Self::start_with_signal(limits, keys, futures::future::pending()).await
    }

    pub async fn start_with_signal(
        limits: Limits,
        keys: Vec<String>,
        signal: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Option<TestServer> {
        Self::start_models(&["small", "large"], 11, ("random", json!({ "p": 0.5 })), limits, keys, signal).await
    }

    /// A server over tiny random models named `names` (seeds `first_seed`, +1, ...),
    /// routed by `policy` (name, params); None when the tokenizer is not available.
    pub async fn start_models(
        names: &[&str],
        first_seed: u64,
        policy: (&str, Value),
        limits: Limits,
        keys: Vec<String>,
        signal: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Option<TestServer> {
        let setup = Setup {
            names: names.iter().map(|n| n.to_string()).collect(),
            first_seed,
            policy: (policy.0.to_string(), policy.1),
            limits,
            keys,
            ..Setup::default()
        };
        Self::start_setup(setup, signal).await
    }

    pub async fn start_setup(
        setup: Setup,
        signal: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Option<TestServer> {
        let tokenizer = qwen3_tokenizer()?;
        let mut config = preset("tiny").unwrap();
        config.max_position_embeddings = CONTEXT;
        let mut models = Vec::new();
        let mut specs = Vec::new();
        for (i, name) in setup.names.iter().enumerate() {
            let dir = TempDir::new().unwrap();
            let init = InitOptions { seed: setup.first_seed + i as u64 * setup.seed_step, std: 0.1 };
            write_random_model(&config, &init, dir.path()).unwrap();
            copy_tokenizer(&tokenizer, dir.path()).unwrap();
            let load = LoadOptions {
                kv_budget_bytes: setup.kv_budget_bytes,
                prefix_cache: setup.prefix_cache,
                ..LoadOptions::default()
            };
            specs.push(ModelSpec { name: name.to_string(), path: dir.path().to_path_buf(), load });
            models.push(dir);
        }
        let infos: Vec<ModelInfo> =
            specs.iter().map(|s| ModelInfo { name: s.name.clone(), hidden_size: 64, vocab_size: 151_936 }).collect();
        let default_policy =
            policy::build(&setup.policy.0, &setup.policy.1, &infos, &PolicyContext::default()).unwrap();
        let engine = Engine::start(EngineConfig {
            models: specs,
            default_policy: default_policy.clone(),
            batching: BatchingRule::eager(setup.names.len()),
            limits: StepLimits::default(),
            admission: setup.admission,
            exclusive_compute: false,
            replan: None,
            supervision: setup.supervision,
        })
        .await
        .unwrap();
        let state = AppState::new(Arc::new(engine.clone()), Arc::new(DefaultPolicyOnly::new(&*default_policy)))
            .with_limits(setup.limits)
            .with_api_keys(setup.keys)
            .with_served_model("tokenrouter-test")
            .with_fault_injection(setup.fault_injection)
            .with_metrics(install_metrics_recorder().unwrap());
        let server = run_server(state.clone(), "127.0.0.1:0", signal).await.unwrap();
        let url = format!("http://{}", server.addr());
        Some(TestServer { url, engine, server, client: reqwest::Client::new(), state, _models: models })
    }

    pub async fn post(&self, path: &str, body: &Value) -> reqwest::Response {
        self.client.post(format!("{}{path}", self.url)).json(body).send().await.unwrap()
    }

    /// Posts and returns (status, JSON body).
    pub async fn post_json(&self, path: &str, body: &Value) -> (u16, Value) {
        let response = self.post(path, body).await;
        let status = response.status().as_u16();
        (status, response.json().await.unwrap())
    }

    pub async fn get(&self, path: &str) -> reqwest::Response {
        self.client.get(format!("{}{path}", self.url)).send().await.unwrap()
    }

    /// Waits until every model's KV blocks are free and no request is active.
    pub async fn wait_all_kv_free(&self) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let stats = self.engine.stats().await;
            let free = stats.iter().all(|s| s.kv.free_blocks == s.kv.total_blocks);
            if free && self.engine.active_requests() == 0 && stats.len() == self.engine.model_names().len() {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "KV still in use: {stats:?}, active {}",
                self.engine.active_requests()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn stop(self) {
        self.server.shutdown().await;
        self.engine.shutdown().await;
    }
}

/// A chat request for a short generation, seeded.
pub fn chat(content: &str, max_tokens: usize, seed: u64) -> Value {
    json!({
        "model": "tokenrouter-test",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "seed": seed,
        "ignore_eos": true,
    })
}

/// The `data:` payloads of an SSE body, in order (`[DONE]` included as a string).
/// `(event name, data)` of each frame of a stream of named events (Anthropic's, the
/// Responses API's).
pub fn named_events(body: &str) -> Vec<(String, Value)> {
    body.split("\n\n")
        .filter(|frame| !frame.trim().is_empty() && !frame.starts_with(':'))
        .map(|frame| {
            let name = frame.lines().find_map(|l| l.strip_prefix("event: ")).expect("a named event");
            let data = frame.lines().find_map(|l| l.strip_prefix("data: ")).expect("data");
            (name.to_string(), serde_json::from_str(data).unwrap())
        })
        .collect()
}

pub fn sse_data(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter_map(|event| event.lines().find_map(|l| l.strip_prefix("data: ")).map(str::to_string))
        .collect()
}

/// The lines of `body` as Python's `str.splitlines` cuts them (what httpx's
/// `aiter_lines` and the SDK wrappers built on it read): at \n, \r, \r\n, \x0b, \x0c,
/// \x1c, \x1d, \x1e, \x85, \u2028 and \u2029.
pub fn python_lines(body: &str) -> Vec<&str> {
    let ends_line =
        |c: char| matches!(c, '\n' | '\r' | '\x0b' | '\x0c' | '\x1c'..='\x1e' | '\u{85}' | '\u{2028}' | '\u{2029}');
    let mut lines = Vec::new();
    let mut start = 0;
    let mut chars = body.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        if ends_line(c) {
            lines.push(&body[start..at]);
            start = at + c.len_utf8();
            if c == '\r' && chars.peek().is_some_and(|&(_, next)| next == '\n') {
                chars.next();
                start += 1;
            }
        }
    }
    if start < body.len() {
        lines.push(&body[start..]);
    }
    lines
}

/// The JSON chunks of an SSE body read as [`python_lines`] does, asserting that every
/// `data:` line parses on its own and that the body ends with one `[DONE]`.
pub fn python_read_chunks(body: &str) -> Vec<Value> {
    let data: Vec<&str> = python_lines(body).into_iter().filter_map(|l| l.strip_prefix("data: ")).collect();
    assert_eq!(data.last(), Some(&"[DONE]"), "{body:?}");
    let chunks = &data[..data.len() - 1];
    chunks.iter().map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("{e}: {d:?} in {body:?}"))).collect()
}

/// The JSON chunks of an SSE body, asserting it ends with exactly one `[DONE]`.
pub fn sse_chunks(body: &str) -> Vec<Value> {
    let data = sse_data(body);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{body}");
    assert_eq!(data.iter().filter(|d| *d == "[DONE]").count(), 1, "{body}");
    data[..data.len() - 1].iter().map(|d| serde_json::from_str(d).unwrap()).collect()
}

/// Asserts an OpenAI error envelope with the given param.
pub fn assert_envelope(body: &Value, param: Option<&str>) {
    let e = &body["error"];
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{body}");
    assert!(e["type"].is_string(), "{body}");
    assert_eq!(e["param"].as_str(), param, "{body}");
    assert!(e.get("code").is_some(), "{body}");
}

/// A generator that plays a script, for situations a real engine does not produce on
/// demand.
pub enum Scripted {
    /// Waits, then fails: keep-alive comments and errors inside a stream.
    StallThenFail(Duration),
    /// Streams these texts as its tokens', then finishes.
    Says(Vec<String>),
    /// Decodes ids (`/detokenize`, `echo`) as `<id>`s, taking this long; generates nothing.
    SlowDecode(Duration),
}

impl Generator for Scripted {
    fn model_names(&self) -> Vec<String> {
        vec!["scripted".into()]
    }

    fn max_context(&self) -> usize {
        CONTEXT
    }

    fn generate(&self, _: GenerateRequest) -> BoxFuture<'_, Result<EventStream, EngineError>> {
        let events: EventStream = match self {
            Scripted::StallThenFail(stall) => {
                let stall = *stall;
                Box::pin(futures::stream::once(async move {
                    tokio::time::sleep(stall).await;
                    GenerationEvent::error(EngineError::Internal("scripted failure".into()), Default::default())
                }))
            }
            Scripted::Says(pieces) => Box::pin(futures::stream::iter(said(pieces))),
            Scripted::SlowDecode(_) => Box::pin(futures::stream::iter(said(&[]))),
        };
        async move { Ok(events) }.boxed()
    }

    fn decode(&self, ids: Vec<u32>) -> Result<String, EngineError> {
        if let Scripted::SlowDecode(time) = self {
            std::thread::sleep(*time);
        }
        Ok(ids.iter().map(|id| self.token_text(*id)).collect())
    }

    fn chat(&self, _: Vec<ChatMessage>, _: RenderOptions) -> BoxFuture<'_, Result<RenderedChat, EngineError>> {
        async { Ok(RenderedChat { text: "x".into(), ids: vec![1, 2, 3] }) }.boxed()
    }

    fn encode(&self, _: String, _: bool) -> BoxFuture<'_, Result<Vec<u32>, EngineError>> {
        async { Ok(vec![1, 2, 3]) }.boxed()
    }

    fn token_text(&self, id: u32) -> String {
        format!("<{id}>")
    }

    fn stats(&self) -> BoxFuture<'_, EngineStats> {
        async { EngineStats::default() }.boxed()
    }

    fn ready(&self) -> BoxFuture<'_, bool> {
        async { true }.boxed()
    }
}

fn said(pieces: &[String]) -> Vec<GenerationEvent> {
    let tokens = pieces.iter().enumerate().map(|(index, text)| GenerationEvent::Token {
        index,
        token: index as u32,
        model: 0,
        logprob: None,
        top_logprobs: Vec::new(),
        text: text.clone(),
        drafted: false,
    });
    let finished = GenerationEvent::Finished {
        reason: tokenrouter::core::sched::FinishReason::Length,
        usage: Default::default(),
        text: String::new(),
        stop: None,
    };
    tokens.chain([finished]).collect()
}

/// A `tokenrouter serve` child process: its base URL, killed when dropped however the
/// test ends.
pub struct ServeProcess {
    pub child: std::process::Child,
    pub url: String,
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Spawns `command` (a `serve` on `--port 0`) and waits, within `limit`, for the line that
/// names its address; its output is drained afterwards so the server never writes into
/// a closed pipe.
pub fn spawn_serve(mut command: std::process::Command, limit: Duration) -> ServeProcess {
    use std::io::{BufRead, BufReader};
    let mut child = command.stdout(std::process::Stdio::piped()).spawn().expect("the binary starts");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let deadline = std::time::Instant::now() + limit;
    let mut server = ServeProcess { child, url: String::new() };
    for line in lines.by_ref() {
        let line = line.unwrap();
        if let Some(rest) = line.strip_prefix("tokenrouter listening on ") {
            server.url = rest.split_whitespace().next().unwrap().to_string();
            std::thread::spawn(move || lines.for_each(drop));
            return server;
        }
        assert!(std::time::Instant::now() < deadline, "the server did not start within {limit:?}");
    }
    panic!("the server exited before listening");
}
