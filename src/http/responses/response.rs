//! The chat path's output in the Responses API's shapes: the response object (output
//! items, status, usage with cached tokens) and the stream's events
//! (`response.created`, `response.output_item.added`, `response.output_text.delta`,
//! `response.function_call_arguments.delta`, …, `response.completed`), each numbered
//! by `sequence_number`. A stored response is kept when its last event is written,
//! so a client that reads `response.completed` can continue from it at once.

use std::sync::Arc;

use bytes::Bytes;
use serde_json::{json, Map, Value};
use tokenrouter_actors::Usage;
use tokenrouter_core::sse::json_data_event;

use super::store::{Owner, ResponseStore, StoredResponse};
use crate::http::error::ApiError;
use crate::http::sse::{chunk_parts, Framer};

/// What every form of one response shares.
#[derive(Debug, Clone)]
pub struct ResponseMeta {
    pub id: String,
    pub created_at: u64,
    pub model: String,
    /// The request's fields the response repeats.
    pub echo: Map<String, Value>,
}

impl ResponseMeta {
    fn suffix(&self) -> &str {
        self.id.strip_prefix("resp_").unwrap_or(&self.id)
    }

    fn message_id(&self) -> String {
        format!("msg_{}", self.suffix())
    }

    fn call_item_id(&self, k: usize) -> String {
        format!("fc_{}_{k}", self.suffix())
    }

    /// The response object with `output`; `usage` and the finish decide its status.
    fn object(&self, status: &str, output: Vec<Value>, usage: Option<Value>, incomplete: bool) -> Value {
        let mut m = Map::new();
        m.insert("id".into(), json!(self.id));
        m.insert("object".into(), json!("response"));
        m.insert("created_at".into(), json!(self.created_at));
        m.insert("status".into(), json!(status));
        m.insert("error".into(), Value::Null);
        let details = incomplete.then(|| json!({ "reason": "max_output_tokens" }));
        m.insert("incomplete_details".into(), json!(details));
        m.insert("model".into(), json!(self.model));
        m.insert("output".into(), Value::Array(output));
        m.insert("usage".into(), usage.unwrap_or(Value::Null));
        for (k, v) in &self.echo {
            m.insert(k.clone(), v.clone());
        }
        Value::Object(m)
    }
}

/// The Responses usage for chat's usage object (its extensions ride along).
pub fn usage(chat: &Value) -> Value {
    let input = chat["prompt_tokens"].as_u64().unwrap_or(0);
    let output = chat["completion_tokens"].as_u64().unwrap_or(0);
    let mut m = Map::new();
    m.insert("input_tokens".into(), json!(input));
    m.insert(
        "input_tokens_details".into(),
        json!({ "cached_tokens": chat["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0) }),
    );
    m.insert("output_tokens".into(), json!(output));
    m.insert("output_tokens_details".into(), json!({ "reasoning_tokens": 0 }));
    m.insert("total_tokens".into(), json!(input + output));
    for extension in ["tokens_per_model", "switches", "speculation"] {
        if let Some(v) = chat.get(extension) {
            m.insert(extension.into(), v.clone());
        }
    }
    Value::Object(m)
}

/// One call as the model wrote it.
#[derive(Debug, Clone, Default, PartialEq)]
struct Call {
    call_id: String,
    name: String,
    arguments: String,
}

fn message_item(meta: &ResponseMeta, text: &str, status: &str) -> Value {
    json!({
        "type": "message", "id": meta.message_id(), "status": status, "role": "assistant",
        "content": [{ "type": "output_text", "text": text, "annotations": [], "logprobs": [] }],
    })
}

fn call_item(meta: &ResponseMeta, k: usize, call: &Call, status: &str) -> Value {
    json!({
        "type": "function_call", "id": meta.call_item_id(k), "call_id": call.call_id, "name": call.name,
        "arguments": call.arguments, "status": status,
    })
}

/// The assistant's turn as a chat message, as the conversation keeps it.
fn assistant_message(text: &str, calls: &[Call]) -> Value {
    let mut message = json!({ "role": "assistant", "content": text });
    if !calls.is_empty() {
        let calls: Vec<Value> = calls
            .iter()
            .map(|c| {
                json!({ "id": c.call_id, "type": "function",
                "function": { "name": c.name, "arguments": c.arguments } })
            })
            .collect();
        message["tool_calls"] = Value::Array(calls);
    }
    message
}

/// Where a finished response is kept (`store: true`).
pub struct Keep {
    pub store: Arc<ResponseStore>,
    pub owner: Owner,
    pub chain: String,
    /// The conversation up to this response: kept turns and the request's input.
    pub messages: Vec<Value>,
}

impl Keep {
    fn keep(self, meta: &ResponseMeta, text: &str, calls: &[Call], response: &Value) {
        let mut messages = self.messages;
        messages.push(assistant_message(text, calls));
        let tokens = response["usage"]["total_tokens"].as_u64().unwrap_or(0) as usize;
        let stored =
            StoredResponse { owner: self.owner, chain: self.chain, messages, response: response.clone(), tokens };
        if !self.store.insert(meta.id.clone(), stored) {
            tracing::info!(id = %meta.id, tokens, "a response over the store's token budget was not kept");
        }
    }
}

/// The whole response of a non-streamed request, from chat's; kept when asked.
pub fn from_chat(meta: &ResponseMeta, chat: &Value, keep: Option<Keep>) -> Value {
    let choice = &chat["choices"][0];
    let said = &choice["message"];
    let text = said["content"].as_str().unwrap_or_default();
    let calls: Vec<Call> = said["tool_calls"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| Call {
            call_id: c["id"].as_str().unwrap_or_default().to_string(),
            name: c["function"]["name"].as_str().unwrap_or_default().to_string(),
            arguments: c["function"]["arguments"].as_str().unwrap_or_default().to_string(),
        })
        .collect();
    let incomplete = choice["finish_reason"] == "length";
    let item_status = if incomplete { "incomplete" } else { "completed" };
    let mut output = Vec::new();
    if !text.is_empty() || calls.is_empty() {
        output.push(message_item(meta, text, item_status));
    }
    output.extend(calls.iter().enumerate().map(|(k, c)| call_item(meta, k, c, "completed")));
    let status = if incomplete { "incomplete" } else { "completed" };
    let mut response = meta.object(status, output, Some(usage(&chat["usage"])), incomplete);
    for extension in ["routing_trace", "routing_drafted"] {
        if let Some(value) = choice.get(extension) {
            response[extension] = value.clone();
        }
    }
    if let Some(keep) = keep {
        keep.keep(meta, text, &calls, &response);
    }
    response
}

/// The item being written.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Open {
    Text,
    Call(usize),
}

/// Frames the chat path's chunks (one choice) as the Responses stream.
pub struct ResponsesFramer {
    meta: ResponseMeta,
    sequence: u64,
    started: bool,
    /// Output items done so far.
    items: Vec<Value>,
    open: Option<Open>,
    text: String,
    calls: Vec<Call>,
    incomplete: bool,
    keep: Option<Keep>,
}

impl ResponsesFramer {
    pub fn new(meta: ResponseMeta, keep: Option<Keep>) -> Self {
        ResponsesFramer {
            meta,
            sequence: 0,
            started: false,
            items: Vec::new(),
            open: None,
            text: String::new(),
            calls: Vec::new(),
            incomplete: false,
            keep,
        }
    }

    fn event(&mut self, kind: &str, mut data: Value, out: &mut Vec<Bytes>) {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        let mut frame = format!("event: {kind}\n").into_bytes();
        frame.extend(json_data_event(&data));
        out.push(Bytes::from(frame));
    }

    fn start(&mut self, out: &mut Vec<Bytes>) {
        if self.started {
            return;
        }
        self.started = true;
        let response = self.meta.object("in_progress", Vec::new(), None, false);
        self.event("response.created", json!({ "response": response }), out);
        let response = self.meta.object("in_progress", Vec::new(), None, false);
        self.event("response.in_progress", json!({ "response": response }), out);
    }

    fn item_status(&self) -> &'static str {
        if self.incomplete {
            "incomplete"
        } else {
            "completed"
        }
    }

    /// Ends the item being written with its `.done` events.
    fn close(&mut self, out: &mut Vec<Bytes>) {
        let index = self.items.len();
        match self.open.take() {
            None => {}
            Some(Open::Text) => {
                let id = self.meta.message_id();
                let text = self.text.clone();
                let ids = json!({ "item_id": id, "output_index": index, "content_index": 0 });
                let mut done = ids.clone();
                done["text"] = json!(text);
                done["logprobs"] = json!([]);
                self.event("response.output_text.done", done, out);
                let mut part = ids;
                part["part"] = json!({ "type": "output_text", "text": text, "annotations": [], "logprobs": [] });
                self.event("response.content_part.done", part, out);
                let item = message_item(&self.meta, &text, self.item_status());
                self.items.push(item.clone());
                self.event("response.output_item.done", json!({ "output_index": index, "item": item }), out);
            }
            Some(Open::Call(k)) => {
                let call = self.calls[k].clone();
                let id = self.meta.call_item_id(k);
                self.event(
                    "response.function_call_arguments.done",
                    json!({ "item_id": id, "output_index": index, "name": call.name, "arguments": call.arguments }),
                    out,
                );
                let item = call_item(&self.meta, k, &call, "completed");
                self.items.push(item.clone());
                self.event("response.output_item.done", json!({ "output_index": index, "item": item }), out);
            }
        }
    }

    fn text(&mut self, text: &str, routing: Option<&Value>, out: &mut Vec<Bytes>) {
        if self.open != Some(Open::Text) {
            self.close(out);
            let index = self.items.len();
            let item = json!({ "type": "message", "id": self.meta.message_id(), "status": "in_progress",
                "role": "assistant", "content": [] });
            self.event("response.output_item.added", json!({ "output_index": index, "item": item }), out);
            let part = json!({ "item_id": self.meta.message_id(), "output_index": index, "content_index": 0,
                "part": { "type": "output_text", "text": "", "annotations": [], "logprobs": [] } });
            self.event("response.content_part.added", part, out);
            self.open = Some(Open::Text);
        }
        self.text.push_str(text);
        let mut delta = json!({ "item_id": self.meta.message_id(), "output_index": self.items.len(),
            "content_index": 0, "delta": text, "logprobs": [] });
        if let Some(routing) = routing {
            delta["routing"] = routing.clone();
        }
        self.event("response.output_text.delta", delta, out);
    }

    fn call(&mut self, chunk: &Value, out: &mut Vec<Bytes>) {
        if let Some(name) = chunk["function"]["name"].as_str() {
            self.close(out);
            let call_id = chunk["id"].as_str().unwrap_or_default().to_string();
            self.calls.push(Call { call_id, name: name.to_string(), arguments: String::new() });
            let k = self.calls.len() - 1;
            let item = call_item(&self.meta, k, &self.calls[k], "in_progress");
            self.event("response.output_item.added", json!({ "output_index": self.items.len(), "item": item }), out);
            self.open = Some(Open::Call(k));
        }
        let arguments = chunk["function"]["arguments"].as_str().unwrap_or_default();
        if let (false, Some(Open::Call(k))) = (arguments.is_empty(), self.open) {
            self.calls[k].arguments.push_str(arguments);
            let delta = json!({ "item_id": self.meta.call_item_id(k), "output_index": self.items.len(),
                "delta": arguments });
            self.event("response.function_call_arguments.delta", delta, out);
        }
    }
}

impl Framer for ResponsesFramer {
    fn chunk(&mut self, chunk: &Value) -> Vec<Bytes> {
        let mut out = Vec::new();
        self.start(&mut out);
        let parts = chunk_parts(chunk, self.open == Some(Open::Text));
        if let Some(text) = parts.text {
            self.text(text, parts.routing, &mut out);
        }
        for call in parts.calls {
            self.call(call, &mut out);
        }
        if let Some(finish) = parts.finish {
            self.incomplete = finish == "length";
            // An answer of no text and no call is still one (empty) message.
            if self.items.is_empty() && self.open.is_none() && self.calls.is_empty() {
                self.text("", None, &mut out);
            }
            self.close(&mut out);
        }
        out
    }

    fn finished(&mut self, _: &Usage, usage_chunk: Option<Value>) -> Vec<Bytes> {
        let mut out = Vec::new();
        self.start(&mut out);
        self.close(&mut out);
        let usage = usage_chunk.map(|c| usage(&c["usage"]));
        let (status, kind) =
            if self.incomplete { ("incomplete", "response.incomplete") } else { ("completed", "response.completed") };
        let response = self.meta.object(status, self.items.clone(), usage, self.incomplete);
        if let Some(keep) = self.keep.take() {
            keep.keep(&self.meta, &self.text, &self.calls, &response);
        }
        self.event(kind, json!({ "response": response }), &mut out);
        out
    }

    fn error(&mut self, error: &ApiError) -> Vec<Bytes> {
        let mut out = Vec::new();
        self.start(&mut out);
        let envelope = error.envelope();
        let detail = &envelope["error"];
        let event = json!({ "code": detail["code"], "message": detail["message"], "param": detail["param"] });
        self.event("error", event, &mut out);
        let mut response = self.meta.object("failed", self.items.clone(), None, false);
        response["error"] =
            json!({ "code": detail["code"].as_str().unwrap_or("server_error"), "message": detail["message"] });
        self.event("response.failed", json!({ "response": response }), &mut out);
        out
    }

    fn end(&mut self) -> Vec<Bytes> {
        // The Responses stream has no terminator: its last event is the response's end.
        Vec::new()
    }
}
