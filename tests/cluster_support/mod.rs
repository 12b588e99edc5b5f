//! Helpers for the cluster tests: two tiny random models, a `tokenrouter node` child
//! process serving one of them, an in-process front engine, and the sequential
//! reference the engine's output must equal.

#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use tempfile::TempDir;
use tokenrouter::actors::remote::{ClusterConfig, RemoteModel};
use tokenrouter::actors::{Engine, EngineConfig, GenerateRequest, GenerationEvent, ModelSpec, StepLimits};
use tokenrouter::core::model::init::{write_random_model, InitOptions};
use tokenrouter::core::model::presets::qwen3_shaped;
use tokenrouter::core::model::sampler::SamplingParams;
use tokenrouter::core::model::{Backend, CandleBackend, LoadOptions};
use tokenrouter::core::policy::{self, ModelIndex, ModelInfo, Policy, PolicyContext};
use tokenrouter::core::sched::reference::{Reference, ReferenceOutput};
use tokenrouter::core::sched::{BatchingRule, RequestSpec};

pub const VOCAB: usize = 400;
pub const COOKIE: &str = "test-cookie";

/// `m0` (small, on the front) and `m1` (larger, on the node).
pub struct Models {
    pub dirs: Vec<TempDir>,
}

pub fn models() -> Models {
    let dirs = [48, 96]
        .iter()
        .enumerate()
        .map(|(i, &h)| {
            let dir = TempDir::new().unwrap();
            let config = qwen3_shaped(h, 2, 4, 2, 2 * h, VOCAB);
            write_random_model(&config, &InitOptions { seed: 40 + i as u64, std: 0.2 }, dir.path()).unwrap();
            dir
        })
        .collect();
    Models { dirs }
}

pub fn load_options() -> LoadOptions {
    LoadOptions { block_size: 8, kv_budget_bytes: 16 << 20, ..LoadOptions::default() }
}

pub fn random_policy() -> Arc<dyn Policy> {
    let infos: Vec<ModelInfo> =
        (0..2).map(|i| ModelInfo { name: format!("m{i}"), hidden_size: 0, vocab_size: VOCAB }).collect();
    policy::build("random", &serde_json::json!({ "p": 0.3 }), &infos, &PolicyContext::default()).unwrap()
}

pub fn engine_config(m: &Models, thresholds: &[usize]) -> EngineConfig {
    EngineConfig {
        models: m
            .dirs
            .iter()
            .enumerate()
            .map(|(i, d)| ModelSpec { name: format!("m{i}"), path: d.path().to_path_buf(), load: load_options() })
            .collect(),
        default_policy: random_policy(),
        batching: BatchingRule::fixed(thresholds),
        limits: StepLimits { prefill_chunk: 16, ..StepLimits::default() },
        admission: Default::default(),
        exclusive_compute: false,
        replan: None,
        supervision: Default::default(),
    }
}

/// `m1` on the nodes at `addresses` (the first, then replacements), with short
/// timeouts so that losses show within a test.
pub fn cluster(addresses: &[String], cookie: &str) -> ClusterConfig {
    let remote = RemoteModel { model: "m1".into(), node: addresses[0].clone(), replacements: addresses[1..].to_vec() };
    let mut c = ClusterConfig::new(cookie.to_string(), vec![remote]);
    c.connect_timeout = Duration::from_secs(20);
    c.heartbeat = Duration::from_millis(100);
    c.loss_timeout = Duration::from_millis(600);
    c.resume_timeout = Duration::from_secs(8);
    c
}

pub fn request(i: u64, max_tokens: usize) -> GenerateRequest {
    let prompt: Vec<u32> = (0..(3 + i * 5) % 29 + 2).map(|k| ((k * 13 + i * 31) % VOCAB as u64) as u32).collect();
    let mut r = GenerateRequest::new(prompt, max_tokens);
    r.sampling = SamplingParams {
        temperature: if i % 3 == 0 { 0.0 } else { 0.8 },
        top_p: 0.95,
        seed: 1000 + i,
        ..SamplingParams::default()
    };
    r.ignore_eos = true;
    r
}

/// Tokens (with the model that produced each) and the final event of one request.
pub async fn collect(
    engine: &Engine,
    r: GenerateRequest,
    limit: Duration,
) -> (Vec<(u32, ModelIndex)>, GenerationEvent) {
    let mut stream = engine.generate(r).await.unwrap();
    let mut tokens = Vec::new();
    while let Some(event) = tokio::time::timeout(limit, stream.next()).await.expect("a request hung") {
        match event {
            GenerationEvent::Token { token, model, .. } => tokens.push((token, model)),
            end => return (tokens, end),
        }
    }
    panic!("stream ended without a final event");
}

/// Per request: (token, model, the reference's top-2 logit gap there).
pub fn reference_outputs(m: &Models, ids: &[u64], max_tokens: usize) -> HashMap<u64, ReferenceOutput> {
    let mut backends: Vec<CandleBackend> =
        m.dirs.iter().map(|d| CandleBackend::load(d.path(), &load_options()).unwrap()).collect();
    let mut reference = Reference {
        models: backends.iter_mut().map(|b| b as &mut dyn Backend).collect(),
        shared_vocab: VOCAB,
        max_context: 4096,
    };
    let policy = random_policy();
    ids.iter()
        .map(|&i| {
            let r = request(i, max_tokens);
            let spec = RequestSpec {
                id: i,
                prompt: r.prompt,
                max_tokens: r.max_tokens,
                sampling: r.sampling,
                stop_ids: vec![],
                policy: policy.clone(),
                constraint: None,
                speculation: None,
            };
            (i, reference.run(&spec).unwrap())
        })
        .collect()
}

/// Equal to the reference, or parted where its top-2 gap was float noise.
pub fn assert_matches(got: &[(u32, ModelIndex)], want: &ReferenceOutput, what: &str) {
    want.check(got, 1e-4).unwrap_or_else(|e| panic!("{what}: {e}"));
}

/// A free loopback port (the kernel's pick, released for the child to take).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A `tokenrouter node` child process; killed when dropped.
pub struct NodeProcess {
    pub child: Child,
    pub address: String,
    _config: TempDir,
}

impl NodeProcess {
    /// Serves `m1` on `address`; `wrap` prefixes the command (e.g. `ip netns exec ns`).
    pub fn start(model_dir: &Path, address: &str, cookie: &str, wrap: &[&str]) -> NodeProcess {
        Self::start_with(model_dir, address, cookie, wrap, &[])
    }

    /// [`start`](Self::start) with more `tokenrouter node` arguments.
    pub fn start_with(model_dir: &Path, address: &str, cookie: &str, wrap: &[&str], extra: &[&str]) -> NodeProcess {
        Self::spawn(model_dir, address, cookie, wrap, extra, 16)
    }

    /// [`start_with`](Self::start_with), `m1` with a K/V budget of `kv_budget_mib`.
    pub fn start_with_kv(
        model_dir: &Path,
        address: &str,
        cookie: &str,
        extra: &[&str],
        kv_budget_mib: usize,
    ) -> NodeProcess {
        Self::spawn(model_dir, address, cookie, &[], extra, kv_budget_mib)
    }

    fn spawn(
        model_dir: &Path,
        address: &str,
        cookie: &str,
        wrap: &[&str],
        extra: &[&str],
        kv_budget_mib: usize,
    ) -> NodeProcess {
        let config = TempDir::new().unwrap();
        let yaml = format!(
            "models:\n  - name: m1\n    path: {}\n    kv_budget_mib: {kv_budget_mib}\n    block_size: 8\n",
            model_dir.display()
        );
        std::fs::write(config.path().join("node.yaml"), yaml).unwrap();
        let exe = env!("CARGO_BIN_EXE_tokenrouter");
        let yaml_path = config.path().join("node.yaml");
        let mut node_args = vec!["node", "--config", yaml_path.to_str().unwrap(), "--listen", address];
        node_args.extend_from_slice(extra);
        let (program, args): (&str, Vec<&str>) = match wrap.split_first() {
            Some((first, rest)) => (first, rest.iter().copied().chain([exe]).chain(node_args).collect()),
            None => (exe, node_args),
        };
        let mut child = Command::new(program)
            .args(args)
            .env("TOKENROUTER_COOKIE", cookie)
            .env("TOKENROUTER_THREADS", "1")
            .env("TOKENROUTER_CACHE", config.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the node starts");
        wait_for_line(&mut child, "listening on", Duration::from_secs(30));
        NodeProcess { child, address: address.to_string(), _config: config }
    }

    /// The node's resident memory, from `/proc/PID/status`.
    pub fn resident_mib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let line = status.lines().find_map(|l| l.strip_prefix("VmRSS:")).expect("a VmRSS line");
        let kib: u64 = line.trim().trim_end_matches("kB").trim().parse().unwrap();
        kib >> 10
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

fn wait_for_line(child: &mut Child, needle: &str, limit: Duration) {
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    let needle = needle.to_string();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            println!("node: {line}");
            if line.contains(&needle) {
                let _ = tx.send(());
            }
        }
    });
    let deadline = Instant::now() + limit;
    rx.recv_timeout(deadline.saturating_duration_since(Instant::now())).expect("the node did not start in time");
}
