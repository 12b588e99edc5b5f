//! A pool member on another server: any OpenAI-compatible server with the same
//! tokenizer (vLLM, another tokenrouter). Requests go to `/v1/completions` as token-id
//! prompts (the dispatcher has tokenized already) with `stream: true`; the SSE chunks
//! come back as engine events. Token ids arrive when the server honours vLLM's
//! `return_token_ids`; otherwise each chunk is one event with id 0 and its text.

use std::collections::VecDeque;

use futures::future::BoxFuture;
use futures::stream::{self, BoxStream};
use futures::{FutureExt, StreamExt};
use serde_json::{json, Value};
use tokenrouter_actors::tokenizer::RenderedChat;
use tokenrouter_actors::{EngineError, GenerateRequest, GenerationEvent, Usage};
use tokenrouter_core::sched::FinishReason;
use tokenrouter_core::tokenize::{ChatMessage, RenderOptions};

use crate::http::{EngineStats, EventStream, Generator};

pub struct Upstream {
    base: String,
    client: reqwest::Client,
}

impl Upstream {
    pub fn new(url: &str) -> anyhow::Result<Self> {
        Ok(Upstream { base: url.trim_end_matches('/').to_string(), client: reqwest::Client::builder().build()? })
    }

    async fn start(&self, request: GenerateRequest) -> Result<EventStream, EngineError> {
        let response = self
            .client
            .post(format!("{}/v1/completions", self.base))
            .json(&completion_body(&request))
            .send()
            .await
            .map_err(|e| EngineError::Internal(format!("upstream {}: {e}", self.base)))?;
        let status = response.status();
        if !status.is_success() {
            let body: Value = response.json().await.unwrap_or(Value::Null);
            let message = body["error"]["message"].as_str().unwrap_or("no message").to_string();
            return Err(match status.as_u16() {
                400 => EngineError::InvalidRequest(format!("upstream {}: {message}", self.base)),
                _ => EngineError::Internal(format!("upstream {} answered {status}: {message}", self.base)),
            });
        }
        Ok(events_of(response.bytes_stream().boxed()))
    }
}

fn completion_body(r: &GenerateRequest) -> Value {
    let s = &r.sampling;
    json!({
        "prompt": r.prompt,
        "max_tokens": r.max_tokens,
        "temperature": s.temperature,
        "top_p": s.top_p,
        "top_k": s.top_k,
        "min_p": s.min_p,
        // OpenAI-compatible servers take a signed 64-bit seed; the bits are kept.
        "seed": s.seed as i64,
        "presence_penalty": s.presence_penalty,
        "frequency_penalty": s.frequency_penalty,
        "repetition_penalty": s.repetition_penalty,
        "stop": r.stop,
        "stop_token_ids": r.stop_ids,
        "ignore_eos": r.ignore_eos,
        "skip_special_tokens": r.skip_special_tokens,
        "return_token_ids": true,
        "stream": true,
        "stream_options": { "include_usage": true },
    })
}

/// Parses the SSE body into events; the stream ends after `Finished` or `Error`.
struct SseState {
    body: BoxStream<'static, reqwest::Result<bytes::Bytes>>,
    buffer: String,
    ready: VecDeque<GenerationEvent>,
    emitted: usize,
    finish: Option<FinishReason>,
    done: bool,
}

fn events_of(body: BoxStream<'static, reqwest::Result<bytes::Bytes>>) -> EventStream {
    let state = SseState { body, buffer: String::new(), ready: VecDeque::new(), emitted: 0, finish: None, done: false };
    Box::pin(stream::unfold(state, |mut s| async move {
        loop {
            if let Some(event) = s.ready.pop_front() {
                return Some((event, s));
            }
            if s.done {
                return None;
            }
            match s.body.next().await {
                Some(Ok(chunk)) => {
                    s.buffer.push_str(&String::from_utf8_lossy(&chunk));
                    s.take_events();
                }
                Some(Err(e)) => s.fail(format!("upstream stream broke: {e}")),
                None => s.fail("upstream stream ended without usage".to_string()),
            }
        }
    }))
}

impl SseState {
    fn fail(&mut self, message: String) {
        self.ready.push_back(GenerationEvent::error(EngineError::Internal(message), Usage::default()));
        self.done = true;
    }

    /// Every complete `data:` event in the buffer becomes engine events.
    fn take_events(&mut self) {
        while let Some(end) = self.buffer.find("\n\n") {
            let event: String = self.buffer.drain(..end + 2).collect();
            for data in event.lines().filter_map(|l| l.strip_prefix("data:")).map(str::trim) {
                match serde_json::from_str::<Value>(data) {
                    _ if data == "[DONE]" || self.done => {}
                    Ok(chunk) => self.chunk(&chunk),
                    Err(e) => self.fail(format!("upstream sent bad JSON: {e}")),
                }
            }
        }
    }

    fn chunk(&mut self, chunk: &Value) {
        if let Some(message) = chunk["error"]["message"].as_str() {
            return self.fail(format!("upstream: {message}"));
        }
        if let Some(choice) = chunk["choices"].get(0) {
            let text = choice["text"].as_str().unwrap_or_default().to_string();
            let ids: Vec<u32> = choice["token_ids"]
                .as_array()
                .map(|a| a.iter().filter_map(|v| v.as_u64()).map(|v| v as u32).collect())
                .unwrap_or_default();
            self.tokens(&ids, text);
            self.finish = match choice["finish_reason"].as_str() {
                Some("length") => Some(FinishReason::Length),
                Some(_) => Some(FinishReason::Stop),
                None => self.finish,
            };
        }
        if let Some(usage) = chunk.get("usage").filter(|u| u.is_object()) {
            let count = |k: &str| usage[k].as_u64().unwrap_or(0) as usize;
            let completion_tokens = count("completion_tokens");
            let usage = Usage {
                prompt_tokens: count("prompt_tokens"),
                completion_tokens,
                tokens_per_model: vec![completion_tokens],
                switches: 0,
            };
            let reason = self.finish.unwrap_or(FinishReason::Length);
            self.ready.push_back(GenerationEvent::Finished { reason, usage, text: String::new(), stop: None });
            self.done = true;
        }
    }

    /// One event per token id, the chunk's text on the last (or one event for the text).
    fn tokens(&mut self, ids: &[u32], text: String) {
        let ids = if ids.is_empty() && !text.is_empty() { &[0][..] } else { ids };
        for (i, &token) in ids.iter().enumerate() {
            let text = if i + 1 == ids.len() { text.clone() } else { String::new() };
            let index = self.emitted;
            self.emitted += 1;
            self.ready.push_back(GenerationEvent::Token {
                index,
                token,
                model: 0,
                logprob: None,
                top_logprobs: Vec::new(),
                text,
            });
        }
    }
}

impl Generator for Upstream {
    fn model_names(&self) -> Vec<String> {
        vec![self.base.clone()]
    }

    fn max_context(&self) -> usize {
        // The pool's own limit applies; the upstream refuses beyond its own.
        usize::MAX
    }

    fn generate(&self, request: GenerateRequest) -> BoxFuture<'_, Result<EventStream, EngineError>> {
        self.start(request).boxed()
    }

    fn chat(&self, _: Vec<ChatMessage>, _: RenderOptions) -> BoxFuture<'_, Result<RenderedChat, EngineError>> {
        async { Err(EngineError::Config("an upstream pool member does not render chats".into())) }.boxed()
    }

    fn encode(&self, _: String, _: bool) -> BoxFuture<'_, Result<Vec<u32>, EngineError>> {
        async { Err(EngineError::Config("an upstream pool member does not tokenize".into())) }.boxed()
    }

    fn token_text(&self, id: u32) -> String {
        format!("<{id}>")
    }

    fn stats(&self) -> BoxFuture<'_, EngineStats> {
        async { EngineStats::default() }.boxed()
    }

    fn ready(&self) -> BoxFuture<'_, bool> {
        async move {
            let health = self.client.get(format!("{}/health", self.base)).send().await;
            health.is_ok_and(|r| r.status().is_success())
        }
        .boxed()
    }
}
