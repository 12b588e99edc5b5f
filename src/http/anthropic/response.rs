//! The chat path's output in Anthropic's shapes: a whole `message`, the stream's named
//! events (`message_start`, `content_block_start`/`delta`/`stop`, `message_delta`,
//! `message_stop`, `error`), usage, and the error envelope. This server's extensions
//! (`routing` trace, `tokens_per_model`, `switches`) ride along as on chat.

use bytes::Bytes;
use serde_json::{json, Map, Value};
use tokenrouter_actors::Usage;
use tokenrouter_core::sse::json_data_event;

use crate::http::error::ApiError;
use crate::http::sse::{chunk_parts, Framer};

/// Anthropic's `stop_reason` for an OpenAI `finish_reason`, and `stop_sequence`: the
/// stop string that ended the choice (its `stop_reason`), if one did.
fn stop_reason(finish: &str, stop_string: Option<&str>) -> (&'static str, Option<String>) {
    match (finish, stop_string) {
        ("length", _) => ("max_tokens", None),
        ("tool_calls", _) => ("tool_use", None),
        (_, Some(stop)) => ("stop_sequence", Some(stop.to_string())),
        _ => ("end_turn", None),
    }
}

/// Anthropic's ids: `msg_…` for a response, `toolu_…` for a call.
fn message_id(openai_id: &str) -> String {
    format!("msg_{}", openai_id.rsplit('-').next().unwrap_or(openai_id))
}

fn call_id(openai_id: &str) -> String {
    match openai_id.strip_prefix("call_") {
        Some(rest) => format!("toolu_{rest}"),
        None => openai_id.to_string(),
    }
}

/// Anthropic counts cache reads apart from `input_tokens`.
pub fn usage(openai: &Value) -> Value {
    let prompt = openai["prompt_tokens"].as_u64().unwrap_or(0);
    let cached = openai["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0);
    let mut m = Map::new();
    m.insert("input_tokens".into(), json!(prompt.saturating_sub(cached)));
    m.insert("cache_creation_input_tokens".into(), json!(0));
    m.insert("cache_read_input_tokens".into(), json!(cached));
    m.insert("output_tokens".into(), json!(openai["completion_tokens"].as_u64().unwrap_or(0)));
    for extension in ["tokens_per_model", "switches", "speculation"] {
        if let Some(v) = openai.get(extension) {
            m.insert(extension.into(), v.clone());
        }
    }
    Value::Object(m)
}

/// A call's arguments as the `input` object (the text itself if it is not JSON, which
/// a grammar-free call cut short can be).
fn call_input(arguments: &str) -> Value {
    serde_json::from_str(arguments).unwrap_or_else(|_| Value::String(arguments.to_string()))
}

/// The whole response of a non-streamed request.
pub fn message(openai: &Value) -> Value {
    let choice = &openai["choices"][0];
    let said = &choice["message"];
    let mut content = Vec::new();
    if let Some(text) = said["content"].as_str().filter(|t| !t.is_empty()) {
        content.push(json!({ "type": "text", "text": text }));
    }
    for call in said["tool_calls"].as_array().into_iter().flatten() {
        content.push(json!({
            "type": "tool_use",
            "id": call_id(call["id"].as_str().unwrap_or_default()),
            "name": call["function"]["name"],
            "input": call_input(call["function"]["arguments"].as_str().unwrap_or("{}")),
        }));
    }
    let mut m = Map::new();
    m.insert("id".into(), json!(message_id(openai["id"].as_str().unwrap_or_default())));
    m.insert("type".into(), json!("message"));
    m.insert("role".into(), json!("assistant"));
    m.insert("model".into(), openai["model"].clone());
    m.insert("content".into(), Value::Array(content));
    let (reason, sequence) =
        stop_reason(choice["finish_reason"].as_str().unwrap_or("stop"), choice["stop_reason"].as_str());
    m.insert("stop_reason".into(), json!(reason));
    m.insert("stop_sequence".into(), json!(sequence));
    m.insert("usage".into(), usage(&openai["usage"]));
    for extension in ["routing_trace", "routing_drafted"] {
        if let Some(value) = choice.get(extension) {
            m.insert(extension.into(), value.clone());
        }
    }
    Value::Object(m)
}

/// Anthropic's `type` for an error's status.
fn error_type(error: &ApiError) -> &'static str {
    match error.status().as_u16() {
        400 | 422 | 431 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        504 => "timeout_error",
        _ => "api_error",
    }
}

/// `{"type": "error", "error": {"type", "message"}}`, as a body and as a stream event.
pub fn error_envelope(error: &ApiError) -> Value {
    json!({ "type": "error", "error": { "type": error_type(error), "message": error.to_string() } })
}

fn event(name: &str, data: &Value) -> Bytes {
    let mut frame = format!("event: {name}\n").into_bytes();
    frame.extend(json_data_event(data));
    Bytes::from(frame)
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Block {
    Text,
    ToolUse,
}

/// Frames the chat path's chunks (one choice) as Anthropic's stream. Text and each
/// call are content blocks, opened when their first piece arrives and closed when the
/// next begins or the choice ends.
pub struct AnthropicFramer {
    id: String,
    model: String,
    input_tokens: usize,
    started: bool,
    open: Option<Block>,
    blocks: usize,
    stop_reason: &'static str,
    stop_sequence: Option<String>,
    /// An error event ended the stream: nothing follows it.
    failed: bool,
}

impl AnthropicFramer {
    pub fn new(openai_id: &str, model: &str, input_tokens: usize) -> Self {
        AnthropicFramer {
            id: message_id(openai_id),
            model: model.to_string(),
            input_tokens,
            started: false,
            open: None,
            blocks: 0,
            stop_reason: "end_turn",
            stop_sequence: None,
            failed: false,
        }
    }

    fn start(&mut self, out: &mut Vec<Bytes>) {
        if self.started {
            return;
        }
        self.started = true;
        let message = json!({
            "id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": [],
            "stop_reason": null, "stop_sequence": null,
            "usage": { "input_tokens": self.input_tokens, "output_tokens": 0 },
        });
        out.push(event("message_start", &json!({ "type": "message_start", "message": message })));
    }

    fn close(&mut self, out: &mut Vec<Bytes>) {
        if self.open.take().is_some() {
            let index = self.blocks - 1;
            out.push(event("content_block_stop", &json!({ "type": "content_block_stop", "index": index })));
        }
    }

    fn open_block(&mut self, kind: Block, block: Value, out: &mut Vec<Bytes>) -> usize {
        self.close(out);
        let index = self.blocks;
        self.blocks += 1;
        self.open = Some(kind);
        let start = json!({ "type": "content_block_start", "index": index, "content_block": block });
        out.push(event("content_block_start", &start));
        index
    }

    fn text(&mut self, text: &str, routing: Option<&Value>, out: &mut Vec<Bytes>) {
        let index = match self.open {
            Some(Block::Text) => self.blocks - 1,
            _ => self.open_block(Block::Text, json!({ "type": "text", "text": "" }), out),
        };
        let mut delta = json!({ "type": "content_block_delta", "index": index,
            "delta": { "type": "text_delta", "text": text } });
        if let Some(routing) = routing {
            delta["routing"] = routing.clone();
        }
        out.push(event("content_block_delta", &delta));
    }

    fn call(&mut self, call: &Value, out: &mut Vec<Bytes>) {
        if let Some(name) = call["function"]["name"].as_str() {
            let id = call_id(call["id"].as_str().unwrap_or_default());
            self.open_block(Block::ToolUse, json!({ "type": "tool_use", "id": id, "name": name, "input": {} }), out);
        }
        let arguments = call["function"]["arguments"].as_str().unwrap_or_default();
        if !arguments.is_empty() && self.open == Some(Block::ToolUse) {
            let delta = json!({ "type": "content_block_delta", "index": self.blocks - 1,
                "delta": { "type": "input_json_delta", "partial_json": arguments } });
            out.push(event("content_block_delta", &delta));
        }
    }
}

impl Framer for AnthropicFramer {
    fn chunk(&mut self, chunk: &Value) -> Vec<Bytes> {
        let mut out = Vec::new();
        self.start(&mut out);
        let parts = chunk_parts(chunk, self.open == Some(Block::Text));
        if let Some(text) = parts.text {
            self.text(text, parts.routing, &mut out);
        }
        for call in parts.calls {
            self.call(call, &mut out);
        }
        if let Some(finish) = parts.finish {
            (self.stop_reason, self.stop_sequence) = stop_reason(finish, chunk["choices"][0]["stop_reason"].as_str());
            self.close(&mut out);
        }
        out
    }

    fn finished(&mut self, _: &Usage, usage_chunk: Option<Value>) -> Vec<Bytes> {
        let mut out = Vec::new();
        self.start(&mut out);
        self.close(&mut out);
        let usage = usage_chunk.map(|c| usage(&c["usage"])).unwrap_or_else(|| json!({}));
        out.push(event(
            "message_delta",
            &json!({ "type": "message_delta",
                "delta": { "stop_reason": self.stop_reason, "stop_sequence": self.stop_sequence }, "usage": usage }),
        ));
        out
    }

    fn error(&mut self, error: &ApiError) -> Vec<Bytes> {
        self.failed = true;
        vec![event("error", &error_envelope(error))]
    }

    fn end(&mut self) -> Vec<Bytes> {
        if self.failed {
            return Vec::new();
        }
        vec![event("message_stop", &json!({ "type": "message_stop" }))]
    }
}
