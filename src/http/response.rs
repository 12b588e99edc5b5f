//! Engine events into OpenAI's response shapes: stream chunks (`StreamEncoder`) and
//! whole responses (`Collected`), for chat and completions alike. Routing traces
//! (`routing.trace`) and logprobs ride along on the same pieces.

use std::sync::Arc;

use serde_json::{json, Map, Value};
use tokenrouter_actors::Usage;
use tokenrouter_core::sched::FinishReason;

use super::generator::Generator;
use super::request::{Endpoint, Plan};

/// What identifies one response and how it should be shaped.
#[derive(Clone)]
pub struct Shape {
    pub endpoint: Endpoint,
    pub id: String,
    pub created: u64,
    pub model: String,
    pub trace: bool,
    pub logprobs: bool,
    pub token_ids: bool,
    pub include_usage: bool,
    pub engine: Arc<dyn Generator>,
    model_names: Vec<String>,
}

impl Shape {
    pub fn new(plan: &Plan, id: String, created: u64, engine: Arc<dyn Generator>) -> Self {
        let prefix = match plan.endpoint {
            Endpoint::Chat => "chatcmpl-",
            Endpoint::Completions => "cmpl-",
        };
        Shape {
            endpoint: plan.endpoint,
            id: format!("{prefix}{id}"),
            created,
            model: plan.model.clone(),
            trace: plan.trace,
            logprobs: plan.logprobs.is_some(),
            token_ids: plan.token_ids,
            include_usage: plan.include_usage,
            model_names: engine.model_names(),
            engine,
        }
    }

    fn model_name(&self, index: usize) -> String {
        self.model_names.get(index).cloned().unwrap_or_else(|| index.to_string())
    }

    /// `usage` with tokens per model by name and the switch count.
    pub fn usage(&self, u: &Usage) -> Value {
        let per_model: Map<String, Value> =
            u.tokens_per_model.iter().enumerate().map(|(i, n)| (self.model_name(i), json!(n))).collect();
        json!({
            "prompt_tokens": u.prompt_tokens,
            "completion_tokens": u.completion_tokens,
            "total_tokens": u.prompt_tokens + u.completion_tokens,
            "prompt_tokens_details": { "cached_tokens": u.cached_tokens },
            "tokens_per_model": per_model,
            "switches": u.switches,
        })
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.endpoint, chunk) {
            (Endpoint::Chat, true) => "chat.completion.chunk",
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Completions, _) => "text_completion",
        }
    }

    fn envelope(&self, chunk: bool, choices: Vec<Value>) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("id".into(), json!(self.id));
        m.insert("object".into(), json!(self.object(chunk)));
        m.insert("created".into(), json!(self.created));
        m.insert("model".into(), json!(self.model));
        if self.endpoint == Endpoint::Chat {
            m.insert("system_fingerprint".into(), Value::Null);
        }
        m.insert("choices".into(), Value::Array(choices));
        m
    }

    /// OpenAI's logprobs object for these tokens, in the endpoint's format.
    fn logprobs_value(&self, tokens: &[TokenInfo]) -> Value {
        if !self.logprobs {
            return Value::Null;
        }
        let text = |id: u32| self.engine.token_text(id);
        match self.endpoint {
            Endpoint::Chat => {
                let entry =
                    |id: u32, lp: f32| json!({ "token": text(id), "logprob": lp, "bytes": text(id).into_bytes() });
                let content: Vec<Value> = tokens
                    .iter()
                    .map(|t| {
                        let mut e = entry(t.token, t.logprob.unwrap_or(f32::NAN));
                        e["top_logprobs"] = t.top_logprobs.iter().map(|&(id, lp)| entry(id, lp)).collect();
                        e
                    })
                    .collect();
                json!({ "content": content })
            }
            Endpoint::Completions => {
                let mut offset = 0;
                let (mut strings, mut lps, mut tops, mut offsets) = (vec![], vec![], vec![], vec![]);
                for t in tokens {
                    let s = text(t.token);
                    offsets.push(offset);
                    offset += s.len();
                    strings.push(s);
                    lps.push(json!(t.logprob));
                    tops.push(Value::Object(t.top_logprobs.iter().map(|&(id, lp)| (text(id), json!(lp))).collect()));
                }
                json!({ "tokens": strings, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets })
            }
        }
    }
}

pub fn finish_reason(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
    }
}

/// One committed token as the response reports it.
#[derive(Debug, Clone)]
pub struct TokenInfo {
    pub token: u32,
    pub model: usize,
    pub logprob: Option<f32>,
    pub top_logprobs: Vec<(u32, f32)>,
}

/// Builds the SSE chunks of one streamed response. Tokens whose text is held back
/// (an incomplete character, a possible stop string) are reported with the next
/// chunk that carries text, so every token's trace and logprobs appear exactly once.
pub struct StreamEncoder {
    shape: Shape,
    /// The choice this encoder writes (`n` > 1 has one encoder per choice).
    index: usize,
    pending: Vec<TokenInfo>,
}

impl StreamEncoder {
    pub fn new(shape: Shape, index: usize) -> Self {
        StreamEncoder { shape, index, pending: Vec::new() }
    }

    /// Chunks sent before any token: chat announces the assistant role.
    pub fn start(&self) -> Vec<Value> {
        match self.shape.endpoint {
            Endpoint::Chat => vec![self.chunk(json!({ "role": "assistant", "content": "" }), &[], None)],
            Endpoint::Completions => Vec::new(),
        }
    }

    pub fn token(&mut self, info: TokenInfo, text: &str) -> Option<Value> {
        self.pending.push(info);
        if text.is_empty() {
            return None;
        }
        Some(self.content_chunk(text))
    }

    /// The held-back text (if any), then the finish chunk.
    pub fn finished(&mut self, reason: FinishReason, tail: &str) -> Vec<Value> {
        let mut out = Vec::new();
        if !tail.is_empty() || !self.pending.is_empty() {
            out.push(self.content_chunk(tail));
        }
        let delta = match self.shape.endpoint {
            Endpoint::Chat => json!({}),
            Endpoint::Completions => json!(""),
        };
        out.push(self.chunk(delta, &[], Some(finish_reason(reason))));
        out
    }

    /// The last chunk, when usage was asked for: the usage of every choice together.
    pub fn usage_chunk(&self, usage: &Usage) -> Option<Value> {
        if !self.shape.include_usage {
            return None;
        }
        let mut m = self.shape.envelope(true, Vec::new());
        m.insert("usage".into(), self.shape.usage(usage));
        Some(Value::Object(m))
    }

    fn content_chunk(&mut self, text: &str) -> Value {
        let tokens = std::mem::take(&mut self.pending);
        let delta = match self.shape.endpoint {
            Endpoint::Chat => json!({ "content": text }),
            Endpoint::Completions => json!(text),
        };
        self.chunk(delta, &tokens, None)
    }

    /// A chunk with one choice; `delta` is the chat delta or the completion text.
    fn chunk(&self, delta: Value, tokens: &[TokenInfo], finish: Option<&str>) -> Value {
        let key = match self.shape.endpoint {
            Endpoint::Chat => "delta",
            Endpoint::Completions => "text",
        };
        let logprobs = if tokens.is_empty() { Value::Null } else { self.shape.logprobs_value(tokens) };
        let mut choice = Map::new();
        choice.insert("index".into(), json!(self.index));
        choice.insert(key.into(), delta);
        choice.insert("logprobs".into(), logprobs);
        choice.insert("finish_reason".into(), json!(finish));
        if self.shape.token_ids {
            choice.insert("token_ids".into(), tokens.iter().map(|t| t.token).collect());
        }
        let choice = Value::Object(choice);
        let mut m = self.shape.envelope(true, vec![choice]);
        if self.shape.trace {
            let models: Vec<String> = tokens.iter().map(|t| self.shape.model_name(t.model)).collect();
            m.insert("routing".into(), json!({ "models": models }));
        }
        Value::Object(m)
    }
}

/// One choice of a whole (non-streamed) response being gathered.
pub struct Collected {
    shape: Shape,
    index: usize,
    text: String,
    tokens: Vec<TokenInfo>,
}

impl Collected {
    pub fn new(shape: Shape, index: usize) -> Self {
        Collected { shape, index, text: String::new(), tokens: Vec::new() }
    }

    pub fn token(&mut self, info: TokenInfo, text: &str) {
        self.tokens.push(info);
        self.text.push_str(text);
    }

    /// The finished choice.
    pub fn finish(mut self, reason: FinishReason, tail: &str) -> Value {
        self.text.push_str(tail);
        let s = &self.shape;
        let mut choice = match s.endpoint {
            Endpoint::Chat => json!({ "index": self.index, "message": { "role": "assistant", "content": self.text } }),
            Endpoint::Completions => json!({ "index": self.index, "text": self.text }),
        };
        choice["logprobs"] = s.logprobs_value(&self.tokens);
        choice["finish_reason"] = json!(finish_reason(reason));
        if s.token_ids {
            choice["token_ids"] = self.tokens.iter().map(|t| t.token).collect();
        }
        if s.trace {
            choice["routing_trace"] = self.tokens.iter().map(|t| json!(s.model_name(t.model))).collect();
        }
        choice
    }
}

impl Shape {
    /// The whole response: its choices, in index order, and their usage together.
    pub fn response(&self, choices: Vec<Value>, usage: &Usage) -> Value {
        let mut m = self.envelope(false, choices);
        m.insert("usage".into(), self.usage(usage));
        Value::Object(m)
    }
}

/// The usage of `n` choices of one prompt: the prompt counted once (as OpenAI counts
/// it), the outputs summed.
pub fn add_choice_usage(total: &mut Usage, choice: &Usage) {
    if total.prompt_tokens == 0 {
        total.prompt_tokens = choice.prompt_tokens;
        total.cached_tokens = choice.cached_tokens;
    }
    total.completion_tokens += choice.completion_tokens;
    total.switches += choice.switches;
    if total.tokens_per_model.len() < choice.tokens_per_model.len() {
        total.tokens_per_model.resize(choice.tokens_per_model.len(), 0);
    }
    for (sum, n) in total.tokens_per_model.iter_mut().zip(&choice.tokens_per_model) {
        *sum += n;
    }
}
