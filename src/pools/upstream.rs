//! A pool member on another server: any OpenAI-compatible server with the same
//! tokenizer (vLLM, another tokenrouter). Requests go to `/v1/completions` as token-id
//! prompts (the dispatcher has tokenized already) with `stream: true`; the SSE chunks
//! come back as engine events. Token ids arrive because the request asks for vLLM's
//! `return_token_ids`: an upstream that sends text without them fails the request (its
//! tokens cannot join a sequence that others continue by id).
//! Every wait on the upstream has a limit (`UpstreamTimeouts`): a stalled upstream
//! ends the request with an error, in the stream once it has begun.

use std::collections::VecDeque;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::{self, BoxStream};
use futures::{FutureExt, StreamExt};
use serde_json::Number;
use tokenrouter_actors::tokenizer::RenderedChat;
use tokenrouter_actors::{EngineError, GenerateRequest, GenerationEvent, Usage};
use tokenrouter_core::openai::{excerpt, Choice, Completion, CompletionRequest, ErrorEnvelope, Prompt, RequestOptions};
use tokenrouter_core::sched::FinishReason;
use tokenrouter_core::sse::{SseEvent, SseParser};
use tokenrouter_core::tokenize::{ChatMessage, RenderOptions};

use crate::http::fields;
use crate::http::{EngineStats, EventStream, Generator};

/// Time limits on an upstream member's HTTP, so that a stalled upstream ends its
/// client's request with an error instead of holding it (and a pool slot) forever.
#[derive(Debug, Clone, Copy, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UpstreamTimeouts {
    /// Opening the TCP connection.
    pub connect_s: f64,
    /// From sending the request to the response's status and headers.
    pub head_s: f64,
    /// Between two pieces of a streamed body: long enough for an upstream's prefill
    /// of a long prompt before its first token.
    pub idle_s: f64,
}

impl Default for UpstreamTimeouts {
    fn default() -> Self {
        UpstreamTimeouts { connect_s: 5.0, head_s: 60.0, idle_s: 120.0 }
    }
}

impl UpstreamTimeouts {
    fn connect(&self) -> Duration {
        Duration::from_secs_f64(self.connect_s)
    }

    fn head(&self) -> Duration {
        Duration::from_secs_f64(self.head_s)
    }

    fn idle(&self) -> Duration {
        Duration::from_secs_f64(self.idle_s)
    }

    /// (key, message) for every value that is not a positive number of seconds.
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        [("connect_s", self.connect_s), ("head_s", self.head_s), ("idle_s", self.idle_s)]
            .into_iter()
            .filter(|(_, v)| !(v.is_finite() && *v > 0.0 && *v < 1e9))
            .map(|(key, v)| (key, format!("must be a positive number of seconds (got {v})")))
            .collect()
    }
}

pub struct Upstream {
    base: String,
    client: reqwest::Client,
    timeouts: UpstreamTimeouts,
}

impl Upstream {
    pub fn new(url: &str, timeouts: UpstreamTimeouts) -> anyhow::Result<Self> {
        if let Some((key, message)) = timeouts.problems().into_iter().next() {
            anyhow::bail!("upstream timeouts: {key} {message}");
        }
        let client = reqwest::Client::builder().connect_timeout(timeouts.connect()).build()?;
        Ok(Upstream { base: url.trim_end_matches('/').to_string(), client, timeouts })
    }

    async fn start(&self, request: GenerateRequest) -> Result<EventStream, EngineError> {
        let send = self.client.post(format!("{}/v1/completions", self.base)).json(&completion_body(&request)).send();
        let response = match tokio::time::timeout(self.timeouts.head(), send).await {
            Ok(Ok(response)) => response,
            Ok(Err(e)) if e.is_connect() && e.is_timeout() => {
                return Err(self.stalled(format!("no connection within {} s (connect_s)", self.timeouts.connect_s)))
            }
            Ok(Err(e)) => return Err(EngineError::Internal(format!("upstream {}: {}", self.base, chain(&e)))),
            Err(_) => return Err(self.stalled(format!("no response head within {} s (head_s)", self.timeouts.head_s))),
        };
        let status = response.status();
        if !status.is_success() {
            // The error body is read under the idle limit too: a stalled upstream may stop here.
            let body = tokio::time::timeout(self.timeouts.idle(), response.json::<ErrorEnvelope>()).await;
            let message = match body.ok().and_then(Result::ok).and_then(|b| b.error) {
                Some(error) => error.message(),
                None => "no message".to_string(),
            };
            return Err(match status.as_u16() {
                400 => EngineError::InvalidRequest(format!("upstream {}: {message}", self.base)),
                _ => EngineError::Internal(format!("upstream {} answered {status}: {message}", self.base)),
            });
        }
        let reader = StreamReader::new(self.base.clone(), request.prompt.len(), self.timeouts);
        Ok(reader.events(response.bytes_stream().boxed()))
    }

    fn stalled(&self, what: String) -> EngineError {
        EngineError::UpstreamTimeout(format!("upstream {} timed out: {what}", self.base))
    }
}

fn completion_body(r: &GenerateRequest) -> CompletionRequest {
    let s = &r.sampling;
    let options = RequestOptions {
        max_tokens: Some(r.max_tokens),
        temperature: Some(s.temperature),
        top_p: Some(s.top_p),
        top_k: Some(s.top_k),
        min_p: Some(s.min_p),
        // OpenAI-compatible servers take a signed 64-bit seed; the bits are kept.
        seed: Some(Number::from(s.seed as i64)),
        presence_penalty: Some(s.presence_penalty),
        frequency_penalty: Some(s.frequency_penalty),
        repetition_penalty: Some(s.repetition_penalty),
        stop: Some(r.stop.clone()),
        stop_token_ids: Some(r.stop_ids.clone()),
        ignore_eos: Some(r.ignore_eos),
        skip_special_tokens: Some(r.skip_special_tokens),
        return_token_ids: Some(true),
        logit_bias: (!s.logit_bias.is_empty()).then(|| fields::logit_bias_json(&s.logit_bias)),
        response_format: r.grammar.as_ref().map(fields::response_format_of),
        ..RequestOptions::streamed()
    };
    CompletionRequest { prompt: Prompt::Tokens(r.prompt.clone()), logprobs: None, options }
}

/// An error with its causes: reqwest's own message says little ("error sending
/// request"), the cause says why (connection refused).
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

type Body = BoxStream<'static, reqwest::Result<bytes::Bytes>>;

/// Turns the SSE body into engine events; the stream ends after `Finished` or `Error`.
struct StreamReader {
    base: String,
    prompt_tokens: usize,
    idle: Duration,
    idle_s: f64,
    parser: SseParser,
    ready: VecDeque<GenerationEvent>,
    emitted: usize,
    /// Text of tokens already reported (a held-back stop-string prefix released at
    /// the end): it rides with the next token, or with the finish.
    unclaimed_text: String,
    finish: Option<FinishReason>,
    done: bool,
}

impl StreamReader {
    fn new(base: String, prompt_tokens: usize, timeouts: UpstreamTimeouts) -> Self {
        StreamReader {
            base,
            prompt_tokens,
            idle: timeouts.idle(),
            idle_s: timeouts.idle_s,
            parser: SseParser::default(),
            ready: VecDeque::new(),
            emitted: 0,
            unclaimed_text: String::new(),
            finish: None,
            done: false,
        }
    }

    fn events(self, body: Body) -> EventStream {
        // Dropping the state drops the body, which closes the connection: the
        // upstream sees its client leave and stops.
        Box::pin(stream::unfold((self, body), |(mut s, mut body)| async move {
            loop {
                if let Some(event) = s.ready.pop_front() {
                    return Some((event, (s, body)));
                }
                if s.done {
                    return None;
                }
                match tokio::time::timeout(s.idle, body.next()).await {
                    Ok(Some(Ok(bytes))) => s.read(&bytes),
                    Ok(Some(Err(e))) => s.fail(format!("upstream {} stream broke: {}", s.base, chain(&e))),
                    Ok(None) => s.end(),
                    Err(_) => {
                        let message = format!("upstream {} timed out: nothing for {} s (idle_s)", s.base, s.idle_s);
                        s.fail_with(EngineError::UpstreamTimeout(message))
                    }
                }
            }
        }))
    }

    fn read(&mut self, bytes: &[u8]) {
        for event in self.parser.push(bytes) {
            self.on_event(event);
        }
    }

    /// The body ended: complete if the upstream said so, else an error.
    fn end(&mut self) {
        if let Some(event) = self.parser.finish() {
            self.on_event(event);
        }
        if !self.done {
            self.fail(format!("upstream {} stream ended before its usage or [DONE]", self.base));
        }
    }

    fn on_event(&mut self, event: SseEvent) {
        if self.done {
            return;
        }
        match event {
            // The usage chunk normally finishes first; a server that sends none ends here.
            SseEvent::Done => self.finished(self.prompt_tokens, self.emitted),
            SseEvent::Data(data) => match serde_json::from_str::<Completion>(&data) {
                Ok(chunk) => self.chunk(chunk),
                Err(e) => self.fail(format!("upstream {} sent a malformed chunk ({e}): {}", self.base, excerpt(&data))),
            },
        }
    }

    fn fail(&mut self, message: String) {
        self.fail_with(EngineError::Internal(message));
    }

    fn fail_with(&mut self, error: EngineError) {
        self.ready.push_back(GenerationEvent::error(error, Usage::default()));
        self.done = true;
    }

    fn finished(&mut self, prompt_tokens: usize, completion_tokens: usize) {
        let usage =
            Usage { prompt_tokens, completion_tokens, tokens_per_model: vec![completion_tokens], ..Usage::default() };
        let reason = self.finish.unwrap_or(FinishReason::Length);
        let text = std::mem::take(&mut self.unclaimed_text);
        self.ready.push_back(GenerationEvent::Finished { reason, usage, text, stop: None });
        self.done = true;
    }

    fn chunk(&mut self, chunk: Completion) {
        if let Some(error) = chunk.error {
            return self.fail(format!("upstream {}: {}", self.base, error.message()));
        }
        if let Some(choice) = chunk.choices.into_iter().next() {
            if let Err(message) = self.choice(choice) {
                return self.fail(message);
            }
        }
        if let Some(usage) = chunk.usage {
            self.finished(usage.prompt_tokens as usize, usage.completion_tokens as usize);
        }
    }

    fn choice(&mut self, choice: Choice) -> Result<(), String> {
        let text = choice.text().to_string();
        match choice.token_ids {
            Some(ids) => self.tokens(&ids, text),
            None if text.is_empty() => {}
            None => {
                return Err(format!(
                    "upstream {} sent text without token_ids (it must honour vLLM's return_token_ids): {text:?}",
                    self.base
                ))
            }
        }
        self.finish = match choice.finish_reason.as_deref() {
            Some("length") => Some(FinishReason::Length),
            Some(_) => Some(FinishReason::Stop),
            None => self.finish,
        };
        Ok(())
    }

    /// One event per token id, the chunk's text on the last; text with no ids belongs
    /// to tokens reported before, so it waits for the next token or the finish.
    fn tokens(&mut self, ids: &[u32], text: String) {
        self.unclaimed_text.push_str(&text);
        for (i, &token) in ids.iter().enumerate() {
            let text = if i + 1 == ids.len() { std::mem::take(&mut self.unclaimed_text) } else { String::new() };
            let index = self.emitted;
            self.emitted += 1;
            self.ready.push_back(GenerationEvent::Token {
                index,
                token,
                model: 0,
                logprob: None,
                top_logprobs: Vec::new(),
                text,
                drafted: false,
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
            let health = self.client.get(format!("{}/health", self.base)).timeout(self.timeouts.head()).send().await;
            health.is_ok_and(|r| r.status().is_success())
        }
        .boxed()
    }
}

#[cfg(test)]
#[path = "upstream_tests.rs"]
mod tests;
