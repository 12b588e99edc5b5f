//! The SSE body of a streamed response. It owns the engine's event stream and the
//! request's admission slot: when actix drops the body (the client went away, or
//! shutdown's grace ran out) both are dropped with it, which cancels the request and
//! frees its KV. Nothing else holds the event stream.

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

pub struct SseStream {
    /// `None` once the request ended (dropped at once, not when actix drops the body).
    events: Option<ChoiceEvents>,
    /// One per choice.
    encoders: Vec<StreamEncoder>,
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
        keep_alive: Duration,
        permit: OwnedSemaphorePermit,
    ) -> Self {
        let queue = encoders.iter().flat_map(StreamEncoder::start).map(|c| data_frame(&c)).collect();
        let tagged = streams.into_iter().enumerate().map(|(i, s)| s.map(move |e| (i, e)));
        SseStream {
            events: Some(futures::stream::select_all(tagged).boxed()),
            unfinished: encoders.len(),
            encoders,
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
            GenerationEvent::Token { token, model, logprob, top_logprobs, text, .. } => {
                let info = TokenInfo { token, model, logprob, top_logprobs };
                let chunks = encoder.token(info, &text);
                self.queue.extend(chunks.iter().map(data_frame));
            }
            GenerationEvent::Finished { reason, usage, text, .. } => {
                let chunks = encoder.finished(reason, &text);
                self.queue.extend(chunks.iter().map(data_frame));
                add_choice_usage(&mut self.usage, &usage);
                self.unfinished -= 1;
                if self.unfinished == 0 {
                    if let Some(chunk) = self.encoders[0].usage_chunk(&self.usage) {
                        self.queue.push_back(data_frame(&chunk));
                    }
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
        self.queue.push_back(data_frame(&error.envelope()));
        self.end();
    }

    fn end(&mut self) {
        self.events = None;
        self.permit = None;
        self.queue.push_back(Bytes::from_static(DONE));
    }
}

fn data_frame(value: &Value) -> Bytes {
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
