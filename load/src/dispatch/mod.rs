//! Standard serving: token-level routing without a routing engine. One
//! single-model server per model, and this dispatcher in front: after every token
//! it asks the routing policy which model writes the next one, and sends the whole
//! sequence (prompt + output so far, as token ids) to that model's server with a
//! one-token budget. Every token therefore pays a full request: HTTP, admission,
//! prefix matching or re-prefill, KV allocation — the costs a routing engine avoids.
//! The policy is the engine's own (`Router`), seeded the same way, so a request
//! routes identically here and in the engine.

pub mod backend;
pub mod router;

use std::time::{Duration, Instant};

use serde_json::Value;
use tokenizers::Tokenizer;
use tokenrouter_core::policy::{Decision, ModelIndex};
use tokenrouter_core::rng::mix64;

use crate::client::{Client, Conversation, Endpoint, Outcome, RequestOptions};
use crate::sse::{StreamTally, Usage};
use crate::target::Target;
pub use backend::{ServerKind, StepReply, StepRequest};
pub use router::Router;

/// How to reach the servers and route between them.
pub struct DispatchConfig {
    /// (model name, server), in the policy's model order (small first).
    pub servers: Vec<(String, Target)>,
    pub kind: ServerKind,
    pub policy: String,
    pub params: Value,
    /// The models' vocabulary, for policies that read the next-token distribution.
    pub vocab_size: usize,
    pub temperature: Option<f32>,
    pub ignore_eos: bool,
}

struct Server {
    name: String,
    client: Client,
}

pub struct Dispatcher {
    servers: Vec<Server>,
    kind: ServerKind,
    router: Router,
    tokenizer: Tokenizer,
    temperature: Option<f32>,
    ignore_eos: bool,
}

/// One request served through the dispatcher.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Dispatched {
    pub prompt_tokens: usize,
    pub output: Vec<u32>,
    /// The model the policy chose for each output token.
    pub chosen: Vec<ModelIndex>,
    /// The model each token's server says wrote it.
    pub reported: Vec<Option<String>>,
    /// Calls per model, discarded tokens included.
    pub calls: Vec<u64>,
    pub first_token: Option<Duration>,
    pub finish_reason: &'static str,
}

impl Dispatched {
    fn new(prompt_tokens: usize, models: usize) -> Self {
        Dispatched { prompt_tokens, calls: vec![0; models], finish_reason: "length", ..Dispatched::default() }
    }

    fn commit(&mut self, token: u32, model: ModelIndex, reported: Option<String>, sent: Instant) {
        self.output.push(token);
        self.chosen.push(model);
        self.reported.push(reported);
        self.first_token.get_or_insert_with(|| sent.elapsed());
    }
}

/// `small=http://127.0.0.1:8001` → ("small", target).
pub fn parse_server(spec: &str) -> anyhow::Result<(String, Target)> {
    let Some((name, url)) = spec.split_once('=') else {
        anyhow::bail!("--servers entries are NAME=URL (e.g. small=http://127.0.0.1:8001), got `{spec}`");
    };
    anyhow::ensure!(!name.trim().is_empty(), "--servers entry `{spec}` has no model name");
    Ok((name.trim().to_string(), Target::parse(url.trim())?))
}

impl Dispatcher {
    /// Builds the policy and checks that every server answers; returns the
    /// dispatcher and what the servers serve (`name: models`).
    pub async fn connect(config: DispatchConfig, tokenizer: Tokenizer) -> anyhow::Result<(Dispatcher, Vec<String>)> {
        anyhow::ensure!(!config.servers.is_empty(), "standard serving needs --servers");
        let names: Vec<String> = config.servers.iter().map(|(n, _)| n.clone()).collect();
        let router = Router::build(&config.policy, &config.params, &names, config.vocab_size)?;
        let mut servers = Vec::new();
        let mut served = Vec::new();
        for (name, target) in config.servers {
            let options = RequestOptions {
                endpoint: Endpoint::Completions,
                model: None,
                ignore_eos: config.ignore_eos,
                temperature: config.temperature,
                routing: None,
                response_format: None,
            };
            let client = Client::new(target, options)?;
            served.push(format!("{name}: {}", client.models().await?.join(", ")));
            servers.push(Server { name, client });
        }
        let dispatcher = Dispatcher {
            servers,
            kind: config.kind,
            router,
            tokenizer,
            temperature: config.temperature,
            ignore_eos: config.ignore_eos,
        };
        Ok((dispatcher, served))
    }

    pub fn model_names(&self) -> Vec<String> {
        self.servers.iter().map(|s| s.name.clone()).collect()
    }

    /// One request of a run: the conversation as a completions prompt, dispatched
    /// token by token; measured as a streamed request would be.
    pub async fn send(&self, conversation: &Conversation, max_tokens: usize, seed: u64) -> Outcome {
        let sent = Instant::now();
        let result = match self.tokenizer.encode_fast(conversation.completion_prompt(), true) {
            Ok(encoding) => self.generate(encoding.get_ids(), max_tokens, seed, sent).await,
            Err(e) => Err(format!("tokenizing the prompt: {e}")),
        };
        let latency = sent.elapsed();
        match result {
            Ok(d) => Outcome::new(latency, self.tally(&d), None),
            Err(e) => Outcome::new(latency, StreamTally::default(), Some(e)),
        }
    }

    /// Runs the policy and the calls until `max_tokens` are committed or a server
    /// ends the sequence. `sent` is when the client's request began (for TTFT).
    pub async fn generate(
        &self,
        prompt: &[u32],
        max_tokens: usize,
        seed: u64,
        sent: Instant,
    ) -> Result<Dispatched, String> {
        let (mut state, mut model) = self.router.admit(seed, prompt, max_tokens);
        let mut done = Dispatched::new(prompt.len(), self.servers.len());
        let mut ids = prompt.to_vec();
        // A policy that keeps discarding would never finish; no built-in one does.
        let call_limit = 4 * max_tokens as u64 + 64;
        while done.output.len() < max_tokens {
            if done.calls.iter().sum::<u64>() >= call_limit {
                return Err(format!("{} calls for {} tokens: the policy keeps discarding", call_limit, max_tokens));
            }
            let reply = self.call(model, &ids, call_seed(seed, done.output.len())).await?;
            done.calls[model] += 1;
            let Some(token) = reply.token else {
                done.finish_reason = "stop";
                break;
            };
            let decision = self.router.decide(model, token, &reply.top_logprobs, &done.output, &mut state);
            let (commit, next) = match decision {
                Decision::Stay => (true, model),
                Decision::Move { to, commit } => (commit, to),
            };
            if next >= self.servers.len() {
                return Err(format!("the policy chose model {next}; only {} servers", self.servers.len()));
            }
            if commit {
                done.commit(token, model, reply.model, sent);
                ids.push(token);
                if reply.stopped {
                    done.finish_reason = "stop";
                    break;
                }
            }
            model = next;
        }
        Ok(done)
    }

    async fn call(&self, model: ModelIndex, ids: &[u32], seed: u64) -> Result<StepReply, String> {
        let step = StepRequest {
            ids,
            seed,
            top_logprobs: self.router.top_logprobs(),
            temperature: self.temperature,
            ignore_eos: self.ignore_eos,
        };
        let server = &self.servers[model];
        let reply = server.client.post_json(self.kind.path(), &self.kind.body(&step)).await;
        reply.and_then(|v| self.kind.parse(&v)).map_err(|e| format!("{}: {e}", server.name))
    }

    /// The request's account in the same terms as a streamed one.
    fn tally(&self, d: &Dispatched) -> StreamTally {
        let mut per_model = std::collections::BTreeMap::new();
        for &m in &d.chosen {
            *per_model.entry(self.servers[m].name.clone()).or_insert(0) += 1;
        }
        let usage = Usage {
            prompt_tokens: d.prompt_tokens as u64,
            completion_tokens: d.output.len() as u64,
            cached_tokens: 0,
            tokens_per_model: per_model,
        };
        let text = self.tokenizer.decode(&d.output, true).unwrap_or_default();
        StreamTally::assembled(d.first_token, text, usage, d.finish_reason)
    }
}

/// The sampling seed of the call for `position`: fixed by the request's seed, so a
/// run is reproducible, and distinct per position (each call is a new request to
/// the server, whose draws restart at its own position 0).
pub fn call_seed(seed: u64, position: usize) -> u64 {
    mix64(seed ^ mix64(position as u64 + 1)) & ((1 << 53) - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_specs_are_name_equals_loopback_url() {
        let (name, target) = parse_server("small=http://127.0.0.1:8001").unwrap();
        assert_eq!((name.as_str(), target.to_string().as_str()), ("small", "http://127.0.0.1:8001"));
        assert!(parse_server("http://127.0.0.1:8001").unwrap_err().to_string().contains("NAME=URL"));
        assert!(parse_server("=http://127.0.0.1:1").unwrap_err().to_string().contains("no model name"));
        assert!(parse_server("big=http://10.0.0.1:1").unwrap_err().to_string().contains("refusing target"));
    }

    #[test]
    fn call_seeds_differ_by_position_and_stay_exact_in_json() {
        let seeds: Vec<u64> = (0..100).map(|p| call_seed(9, p)).collect();
        let mut unique = seeds.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), 100);
        assert!(seeds.iter().all(|&s| s < 1 << 53));
        assert_eq!(call_seed(9, 3), call_seed(9, 3));
    }
}
