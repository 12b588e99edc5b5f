//! Engine events into OpenAI's response shapes: stream chunks (`StreamEncoder`) and
//! whole responses (`Collected`), for chat and completions alike. Routing traces
//! (`routing.trace`) and logprobs ride along on the same pieces.

use std::sync::Arc;

use serde_json::{json, Map, Value};
use tokenrouter_actors::Usage;
use tokenrouter_core::sched::FinishReason;
use tokenrouter_core::tools::{ParsedPiece, ToolCall, ToolCallParser, ToolSyntax};

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
    /// The trace also marks verified drafts (the request speculates).
    pub trace_drafts: bool,
    pub logprobs: bool,
    pub token_ids: bool,
    pub include_usage: bool,
    /// Tool calls are read out of the output in this syntax.
    pub tool_syntax: Option<ToolSyntax>,
    /// The prompt's text, which completion texts start with (`echo`).
    pub echo: Option<String>,
    /// The stop string the server added, never named as the client's (`Plan::server_stop`).
    pub server_stop: Option<&'static str>,
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
            trace_drafts: plan.trace && plan.speculates,
            logprobs: plan.logprobs.is_some(),
            token_ids: plan.token_ids,
            include_usage: plan.include_usage,
            tool_syntax: plan.tool_syntax,
            echo: plan.echo.clone(),
            server_stop: plan.server_stop,
            model_names: engine.model_names(),
            engine,
        }
    }

    fn tool_parser(&self) -> Option<ToolCallParser> {
        self.tool_syntax.map(ToolCallParser::new)
    }

    /// OpenAI's `call_...` id of call `k` of choice `index`: unique within the response
    /// (the response id is unique per server run).
    fn call_id(&self, index: usize, k: usize) -> String {
        let response = self.id.rsplit('-').next().unwrap_or(&self.id);
        format!("call_{response}_{index}_{k}")
    }

    fn model_name(&self, index: usize) -> String {
        self.model_names.get(index).cloned().unwrap_or_else(|| index.to_string())
    }

    /// `usage` with tokens per model by name and the switch count.
    pub fn usage(&self, u: &Usage) -> Value {
        let s = &u.speculation;
        let per_model: Map<String, Value> =
            u.tokens_per_model.iter().enumerate().map(|(i, n)| (self.model_name(i), json!(n))).collect();
        json!({
            "prompt_tokens": u.prompt_tokens,
            "completion_tokens": u.completion_tokens,
            "total_tokens": u.prompt_tokens + u.completion_tokens,
            "prompt_tokens_details": { "cached_tokens": u.cached_tokens },
            "completion_tokens_details": {
                "accepted_prediction_tokens": s.prediction_accepted,
                "rejected_prediction_tokens": s.rejected_prediction_tokens(),
            },
            "tokens_per_model": per_model,
            "switches": u.switches,
            "speculation": {
                "verify_steps": s.verify_steps,
                "drafted_tokens": s.drafted_tokens,
                "accepted_tokens": s.accepted_tokens,
            },
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

/// What the tool-call parser still holds when a choice ends: a call cut off by the
/// budget is dropped.
fn finish_parser(parser: &mut ToolCallParser, reason: FinishReason) -> Vec<ParsedPiece> {
    match reason {
        FinishReason::Length => parser.finish_cut(),
        FinishReason::Stop => parser.finish(),
    }
}

/// A choice that ended by itself after calling tools ends with `tool_calls`, as
/// OpenAI's do; one cut by the budget still says `length`.
fn choice_finish_reason(reason: FinishReason, calls: usize) -> &'static str {
    match reason {
        FinishReason::Stop if calls > 0 => "tool_calls",
        other => finish_reason(other),
    }
}

/// One committed token as the response reports it.
#[derive(Debug, Clone)]
pub struct TokenInfo {
    pub token: u32,
    pub model: usize,
    pub logprob: Option<f32>,
    pub top_logprobs: Vec<(u32, f32)>,
    /// A verified draft's token (speculative decoding).
    pub drafted: bool,
}

/// Builds the SSE chunks of one streamed response. Tokens whose text is held back
/// (an incomplete character, a possible stop string) are reported with the next
/// chunk that carries text, so every token's trace and logprobs appear exactly once.
pub struct StreamEncoder {
    shape: Shape,
    /// The choice this encoder writes (`n` > 1 has one encoder per choice).
    index: usize,
    pending: Vec<TokenInfo>,
    /// Reads tool calls out of the text, when the request offered tools.
    tools: Option<ToolCallParser>,
    calls: usize,
}

impl StreamEncoder {
    pub fn new(shape: Shape, index: usize) -> Self {
        let tools = shape.tool_parser();
        StreamEncoder { shape, index, pending: Vec::new(), tools, calls: 0 }
    }

    /// Chunks sent before any token: chat announces the assistant role; an echoed
    /// completion starts with its prompt.
    pub fn start(&self) -> Vec<Value> {
        match (self.shape.endpoint, &self.shape.echo) {
            (Endpoint::Chat, _) => vec![self.chunk(json!({ "role": "assistant", "content": "" }), &[], None)],
            (Endpoint::Completions, Some(prompt)) => vec![self.chunk(json!(prompt), &[], None)],
            (Endpoint::Completions, None) => Vec::new(),
        }
    }

    /// The chunks a token's text makes: none while text is held back (by the
    /// detokenizer, or while a tool call is being written).
    pub fn token(&mut self, info: TokenInfo, text: &str) -> Vec<Value> {
        self.pending.push(info);
        if text.is_empty() {
            return Vec::new();
        }
        match self.tools.as_mut().map(|parser| parser.push(text)) {
            Some(pieces) => self.piece_chunks(pieces),
            None => vec![self.content_chunk(text)],
        }
    }

    /// The held-back text and calls (if any), then the finish chunk; `stop` is the stop
    /// string that ended the choice, if one did.
    pub fn finished(&mut self, reason: FinishReason, tail: &str, stop: Option<&str>) -> Vec<Value> {
        let mut out = match self.tools.as_mut() {
            Some(parser) => {
                let mut pieces = parser.push(tail);
                pieces.extend(finish_parser(parser, reason));
                self.piece_chunks(pieces)
            }
            None if !tail.is_empty() => vec![self.content_chunk(tail)],
            None => Vec::new(),
        };
        if !self.pending.is_empty() {
            out.push(self.content_chunk(""));
        }
        let delta = match self.shape.endpoint {
            Endpoint::Chat => json!({}),
            Endpoint::Completions => json!(""),
        };
        let finish = choice_finish_reason(reason, self.calls);
        let mut last = self.chunk(delta, &[], Some(finish));
        mark_stop_string(&mut last["choices"][0], finish, stop, self.shape.server_stop);
        out.push(last);
        out
    }

    fn piece_chunks(&mut self, pieces: Vec<ParsedPiece>) -> Vec<Value> {
        let mut out = Vec::new();
        for piece in pieces {
            match piece {
                ParsedPiece::Content(text) => out.push(self.content_chunk(&text)),
                ParsedPiece::Call(call) => out.extend(self.call_chunks(call)),
            }
        }
        out
    }

    /// A call as OpenAI streams one: its id, type and name with empty arguments,
    /// then the arguments.
    fn call_chunks(&mut self, call: ToolCall) -> [Value; 2] {
        let k = self.calls;
        self.calls += 1;
        let tokens = std::mem::take(&mut self.pending);
        let id = self.shape.call_id(self.index, k);
        let head = json!({ "tool_calls": [{ "index": k, "id": id, "type": "function",
            "function": { "name": call.name, "arguments": "" } }] });
        let arguments = json!({ "tool_calls": [{ "index": k, "function": { "arguments": call.arguments } }] });
        [self.chunk(head, &tokens, None), self.chunk(arguments, &[], None)]
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
            let mut routing = json!({ "models": models });
            if self.shape.trace_drafts {
                routing["drafted"] = tokens.iter().map(|t| t.drafted).collect();
            }
            m.insert("routing".into(), routing);
        }
        Value::Object(m)
    }
}

/// Names the client's stop string that ended a choice, as vLLM's `stop_reason` does
/// (Anthropic's `stop_sequence` is read from it): not on a choice that ended in tool calls,
/// nor for the stop string the server added itself (`server_stop`).
fn mark_stop_string(choice: &mut Value, finish: &str, stop: Option<&str>, server_stop: Option<&str>) {
    match (stop, finish) {
        (Some(stop), "stop") if Some(stop) != server_stop => choice["stop_reason"] = json!(stop),
        _ => {}
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
    pub fn finish(mut self, reason: FinishReason, tail: &str, stop: Option<&str>) -> Value {
        self.text.push_str(tail);
        let s = &self.shape;
        let (message, calls) = match s.tool_parser() {
            Some(parser) => self.message_with_calls(parser, reason),
            None => (json!({ "role": "assistant", "content": self.text }), 0),
        };
        let mut choice = match s.endpoint {
            Endpoint::Chat => json!({ "index": self.index, "message": message }),
            Endpoint::Completions => {
                let text = format!("{}{}", s.echo.as_deref().unwrap_or_default(), self.text);
                json!({ "index": self.index, "text": text })
            }
        };
        choice["logprobs"] = s.logprobs_value(&self.tokens);
        let finish = choice_finish_reason(reason, calls);
        choice["finish_reason"] = json!(finish);
        mark_stop_string(&mut choice, finish, stop, s.server_stop);
        if s.token_ids {
            choice["token_ids"] = self.tokens.iter().map(|t| t.token).collect();
        }
        if s.trace {
            choice["routing_trace"] = self.tokens.iter().map(|t| json!(s.model_name(t.model))).collect();
        }
        if s.trace_drafts {
            choice["routing_drafted"] = self.tokens.iter().map(|t| t.drafted).collect();
        }
        choice
    }
}

impl Collected {
    /// The assistant message with the calls read out of its text: `content` is null
    /// when only calls were written, as OpenAI's is.
    fn message_with_calls(&self, mut parser: ToolCallParser, reason: FinishReason) -> (Value, usize) {
        let mut pieces = parser.push(&self.text);
        pieces.extend(finish_parser(&mut parser, reason));
        let mut content = String::new();
        let mut calls = Vec::new();
        for piece in pieces {
            match piece {
                ParsedPiece::Content(text) => content.push_str(&text),
                ParsedPiece::Call(call) => {
                    let id = self.shape.call_id(self.index, calls.len());
                    calls.push(json!({ "id": id, "type": "function",
                        "function": { "name": call.name, "arguments": call.arguments } }));
                }
            }
        }
        let count = calls.len();
        let mut message = json!({ "role": "assistant", "content": content });
        if count > 0 {
            if content.is_empty() {
                message["content"] = Value::Null;
            }
            message["tool_calls"] = Value::Array(calls);
        }
        (message, count)
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
    let (sum, one) = (&mut total.speculation, &choice.speculation);
    sum.verify_steps += one.verify_steps;
    sum.drafted_tokens += one.drafted_tokens;
    sum.accepted_tokens += one.accepted_tokens;
    sum.prediction_drafted += one.prediction_drafted;
    sum.prediction_accepted += one.prediction_accepted;
    if total.tokens_per_model.len() < choice.tokens_per_model.len() {
        total.tokens_per_model.resize(choice.tokens_per_model.len(), 0);
    }
    for (sum, n) in total.tokens_per_model.iter_mut().zip(&choice.tokens_per_model) {
        *sum += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_clients_stop_string_is_named() {
        let named = |stop: Option<&str>, finish: &str, server_stop: Option<&str>| {
            let mut choice = json!({});
            mark_stop_string(&mut choice, finish, stop, server_stop);
            choice.get("stop_reason").cloned()
        };
        assert_eq!(named(Some("END"), "stop", Some("</tool_call>")), Some(json!("END")));
        assert_eq!(named(Some("</tool_call>"), "stop", Some("</tool_call>")), None, "the server's own");
        assert_eq!(named(Some("END"), "tool_calls", None), None);
        assert_eq!(named(None, "stop", None), None, "ended by EOS or the grammar");
    }
}
