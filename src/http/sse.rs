//! The SSE body of a streamed response. It owns the engine's event stream and the
//! request's admission slot: when actix drops the body (the client went away, or
//! shutdown's grace ran out) both are dropped with it, which cancels the request and
//! frees its KV. Nothing else holds the event stream. The chunks are OpenAI's; a
//! [`Framer`] writes them as the route's protocol frames them (OpenAI's `data:` lines
//! and `[DONE]`, or Anthropic's named events).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use serde_json::Value;
use tokenrouter_actors::{GenerationEvent, Usage};
use tokenrouter_core::sse::json_data_event;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::{Instant, Sleep};

use super::error::ApiError;
use super::generator::EventStream;
use super::response::{add_choice_usage, StreamEncoder, TokenInfo};

const KEEP_ALIVE: &[u8] = b": keep-alive\n\n";
const DONE: &[u8] = b"data: [DONE]\n\n";

/// Events of a response's choices, each tagged with its choice index.
pub type ChoiceEvents = futures::stream::BoxStream<'static, (usize, GenerationEvent)>;

/// How a streamed response's chunks go on the wire.
pub trait Framer: Send + 'static {
    /// One OpenAI chunk (a choice's delta or finish).
    fn chunk(&mut self, chunk: &Value) -> Vec<Bytes>;
    /// Every choice finished: their usage together, and OpenAI's usage chunk when the
    /// request asked for it.
    fn finished(&mut self, usage: &Usage, usage_chunk: Option<Value>) -> Vec<Bytes>;
    /// An error after the response began.
    fn error(&mut self, error: &ApiError) -> Vec<Bytes>;
    /// The response's last frames.
    fn end(&mut self) -> Vec<Bytes>;
}

/// OpenAI's framing: each chunk a `data:` line, errors in the envelope, `[DONE]` last.
pub struct OpenAiFramer;

impl Framer for OpenAiFramer {
    fn chunk(&mut self, chunk: &Value) -> Vec<Bytes> {
        vec![data_frame(chunk)]
    }

    fn finished(&mut self, _: &Usage, usage_chunk: Option<Value>) -> Vec<Bytes> {
        usage_chunk.iter().map(data_frame).collect()
    }

    fn error(&mut self, error: &ApiError) -> Vec<Bytes> {
        vec![data_frame(&error.envelope())]
    }

    fn end(&mut self) -> Vec<Bytes> {
        vec![Bytes::from_static(DONE)]
    }
}

/// One chat chunk's parts, as a framer of another protocol re-frames them.
pub struct ChunkParts<'a> {
    /// Text to write: the delta's, or `""` for a token that wrote no text but carries
    /// its routing trace while a text block is open.
    pub text: Option<&'a str>,
    pub routing: Option<&'a Value>,
    pub calls: Vec<&'a Value>,
    pub finish: Option<&'a str>,
}

/// The parts of one chunk (one choice); `text_open`: the framer is writing text now.
pub fn chunk_parts(chunk: &Value, text_open: bool) -> ChunkParts<'_> {
    let choice = &chunk["choices"][0];
    let delta = &choice["delta"];
    let routing = chunk.get("routing");
    let text = match delta["content"].as_str() {
        Some(text) if !text.is_empty() => Some(text),
        Some(_) if routing.is_some() && text_open => Some(""),
        _ => None,
    };
    let calls = delta["tool_calls"].as_array().map(|calls| calls.iter().collect()).unwrap_or_default();
    ChunkParts { text, routing, calls, finish: choice["finish_reason"].as_str() }
}

pub struct SseStream {
    /// `None` once the request ended (dropped at once, not when actix drops the body).
    events: Option<ChoiceEvents>,
    /// One per choice.
    encoders: Vec<StreamEncoder>,
    framer: Box<dyn Framer>,
    unfinished: usize,
    usage: Usage,
    /// Frames ready to send.
    queue: VecDeque<Bytes>,
    keep_alive: Pin<Box<Sleep>>,
    interval: Duration,
    permit: Option<OwnedSemaphorePermit>,
}

impl SseStream {
    /// Streams the choices' events (`streams[i]` is choice `i`), each through its
    /// encoder, merged as they come.
    pub fn new(
        streams: Vec<EventStream>,
        encoders: Vec<StreamEncoder>,
        mut framer: Box<dyn Framer>,
        keep_alive: Duration,
        permit: OwnedSemaphorePermit,
    ) -> Self {
        let queue = encoders.iter().flat_map(StreamEncoder::start).flat_map(|c| framer.chunk(&c)).collect();
        let tagged = streams.into_iter().enumerate().map(|(i, s)| s.map(move |e| (i, e)));
        SseStream {
            events: Some(futures::stream::select_all(tagged).boxed()),
            unfinished: encoders.len(),
            encoders,
            framer,
            usage: Usage::default(),
            queue,
            keep_alive: Box::pin(tokio::time::sleep(keep_alive)),
            interval: keep_alive,
            permit: Some(permit),
        }
    }

    fn on_event(&mut self, choice: usize, event: GenerationEvent) {
        let encoder = &mut self.encoders[choice];
        match event {
            GenerationEvent::Token { token, model, logprob, top_logprobs, text, drafted, .. } => {
                let info = TokenInfo { token, model, logprob, top_logprobs, drafted };
                let chunks = encoder.token(info, &text);
                self.queue.extend(chunks.iter().flat_map(|c| self.framer.chunk(c)));
            }
            GenerationEvent::Finished { reason, usage, text, stop } => {
                let chunks = encoder.finished(reason, &text, stop.as_deref());
                self.queue.extend(chunks.iter().flat_map(|c| self.framer.chunk(c)));
                add_choice_usage(&mut self.usage, &usage);
                self.unfinished -= 1;
                if self.unfinished == 0 {
                    let usage_chunk = self.encoders[0].usage_chunk(&self.usage);
                    let frames = self.framer.finished(&self.usage, usage_chunk);
                    self.queue.extend(frames);
                    self.end();
                }
            }
            // One failed choice ends the response (dropping the others cancels them).
            GenerationEvent::Error { error, .. } => self.fail(ApiError::from(error)),
        }
    }

    /// An error after the response began: it goes inside the stream.
    fn fail(&mut self, error: ApiError) {
        tracing::warn!(%error, "stream ended with an error");
        let frames = self.framer.error(&error);
        self.queue.extend(frames);
        self.end();
    }

    fn end(&mut self) {
        self.events = None;
        self.permit = None;
        let frames = self.framer.end();
        self.queue.extend(frames);
    }
}

pub fn data_frame(value: &Value) -> Bytes {
    Bytes::from(json_data_event(value))
}

impl Stream for SseStream {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            if let Some(frame) = this.queue.pop_front() {
                return Poll::Ready(Some(Ok(frame)));
            }
            let Some(events) = this.events.as_mut() else { return Poll::Ready(None) };
            match events.poll_next_unpin(cx) {
                Poll::Ready(Some((choice, event))) => {
                    this.on_event(choice, event);
                    let next = Instant::now() + this.interval;
                    this.keep_alive.as_mut().reset(next);
                }
                Poll::Ready(None) => {
                    this.fail(ApiError::Internal("the engine ended the request without a final event".into()))
                }
                Poll::Pending => {
                    if this.keep_alive.as_mut().poll(cx).is_ready() {
                        let next = Instant::now() + this.interval;
                        this.keep_alive.as_mut().reset(next);
                        return Poll::Ready(Some(Ok(Bytes::from_static(KEEP_ALIVE))));
                    }
                    return Poll::Pending;
                }
            }
        }
    }
}
