//! One actor per request: it holds the committed tokens (the truth about the
//! request), usage, and the client's stream, rebuilds the request on a model that
//! lost it, and on any ending tells every model and the KV ledger to let it go.
//!
//! The logic is [`RequestCore`], a plain struct the tests below drive directly; the
//! actor only carries out what it decides.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokenrouter_core::policy::ModelIndex;
use tokenrouter_core::sched::{rebuild, Arrival, FinishReason, RequestEvent, RequestId, RequestSpec};
use tokenrouter_core::tokenize::{StopMatcher, StopStep, StreamDecoder};
use tokio::sync::mpsc::UnboundedSender;

use crate::error::EngineError;
use crate::events::{GenerationEvent, Usage};
use crate::handles::EngineLinks;
use crate::messages::RequestMsg;

/// Tokens to text for the client: incremental detokenization that never splits a
/// character, then stop strings matched across token boundaries.
pub struct TextStream {
    pub decoder: StreamDecoder,
    pub stops: StopMatcher,
}

impl TextStream {
    fn push(&mut self, token: u32) -> Result<StopStep, String> {
        let delta = self.decoder.step(token).map_err(|e| e.to_string())?;
        Ok(self.stops.push(&delta))
    }

    fn flush(&mut self) -> String {
        let tail = self.decoder.finish().unwrap_or_default();
        let mut text = self.stops.push(&tail).text;
        text.push_str(&self.stops.finish());
        text
    }
}

/// What the request's owner does after an event.
#[derive(Debug)]
pub enum Next {
    Continue,
    /// `model` lost the request: deliver this rebuilt arrival to it.
    Resume {
        model: ModelIndex,
        arrival: Arrival,
    },
    /// The request ended (the client has its last event, if it is still there).
    End,
}

/// The truth about one request: its committed tokens, usage and client stream.
pub struct RequestCore {
    spec: Arc<RequestSpec>,
    client: UnboundedSender<GenerationEvent>,
    committed: Vec<u32>,
    usage: Usage,
    text: Option<TextStream>,
    ended: bool,
    /// Output indices below this that follow the last verify step's start came from its draft.
    drafted_until: usize,
}

impl RequestCore {
    pub fn new(
        spec: Arc<RequestSpec>,
        models: usize,
        client: UnboundedSender<GenerationEvent>,
        text: Option<TextStream>,
    ) -> Self {
        let usage = Usage { prompt_tokens: spec.prompt.len(), tokens_per_model: vec![0; models], ..Usage::default() };
        RequestCore { spec, client, committed: Vec::new(), usage, text, ended: false, drafted_until: 0 }
    }

    pub fn committed(&self) -> &[u32] {
        &self.committed
    }

    pub fn usage(&self) -> &Usage {
        &self.usage
    }

    pub fn is_ended(&self) -> bool {
        self.ended
    }

    pub fn on_event(&mut self, event: RequestEvent) -> Next {
        if self.ended {
            return Next::End;
        }
        match event {
            RequestEvent::Token { index, token, model, logprob, top_logprobs, .. } => {
                self.on_token(index, token, model, logprob, top_logprobs)
            }
            RequestEvent::Moved { .. } => {
                self.usage.switches += 1;
                Next::Continue
            }
            RequestEvent::Verified { first_index, drafted, accepted, source, .. } => {
                self.usage.speculation.record(source, drafted, accepted);
                self.drafted_until = first_index + accepted;
                Next::Continue
            }
            RequestEvent::CachedPrefix { tokens, .. } => {
                // The prompt's own prefill is the one before the first token.
                if self.committed.is_empty() && self.usage.switches == 0 {
                    self.usage.cached_tokens = self.usage.cached_tokens.max(tokens.min(self.spec.prompt.len()));
                }
                Next::Continue
            }
            RequestEvent::Finished { reason, .. } => {
                let text = self.text.as_mut().map(TextStream::flush).unwrap_or_default();
                let usage = self.usage.clone();
                self.end_with(GenerationEvent::Finished { reason, usage, text, stop: None })
            }
            RequestEvent::Failed { message, .. } => self.fail(EngineError::Internal(message)),
            RequestEvent::OutOfService { message, .. } => self.fail(EngineError::ModelUnavailable(message)),
            RequestEvent::Resume { model, output_len, travel, .. } => {
                if output_len != self.committed.len() {
                    let m = format!(
                        "model {model} restarted at token {output_len}, but {} are committed",
                        self.committed.len()
                    );
                    return self.fail(EngineError::Internal(m));
                }
                Next::Resume { model, arrival: rebuild(self.spec.clone(), &self.committed, travel, model) }
            }
        }
    }

    /// Ends the request with an error to the client.
    pub fn fail(&mut self, error: EngineError) -> Next {
        if self.ended {
            return Next::End;
        }
        let usage = self.usage.clone();
        self.end_with(GenerationEvent::error(error, usage))
    }

    /// The client went away: end without a word.
    pub fn cancel(&mut self) -> Next {
        self.ended = true;
        Next::End
    }

    fn on_token(
        &mut self,
        index: usize,
        token: u32,
        model: ModelIndex,
        logprob: Option<f32>,
        top_logprobs: Vec<(u32, f32)>,
    ) -> Next {
        if index != self.committed.len() {
            // Out-of-order tokens would corrupt the output: end loudly instead.
            let message = format!("token {index} arrived after {} tokens", self.committed.len());
            return self.fail(EngineError::Internal(message));
        }
        self.committed.push(token);
        self.usage.completion_tokens += 1;
        if let Some(n) = self.usage.tokens_per_model.get_mut(model) {
            *n += 1;
        }
        let step = match self.text.as_mut().map(|t| t.push(token)).transpose() {
            Ok(step) => step,
            Err(message) => return self.fail(EngineError::Internal(message)),
        };
        let (text, stop) = step.map(|st| (st.text, st.stop)).unwrap_or_default();
        // A failed send means the client is gone: stop working for it.
        let drafted = index < self.drafted_until;
        let event = GenerationEvent::Token { index, token, model, logprob, top_logprobs, text, drafted };
        if self.client.send(event).is_err() {
            return self.cancel();
        }
        if let Some(stop) = stop {
            let usage = self.usage.clone();
            let event = GenerationEvent::Finished {
                reason: FinishReason::Stop,
                usage,
                text: String::new(),
                stop: Some(stop.stop),
            };
            return self.end_with(event);
        }
        Next::Continue
    }

    fn end_with(&mut self, event: GenerationEvent) -> Next {
        self.ended = true;
        let _ = self.client.send(event);
        Next::End
    }
}

/// A KV reservation not yet owned by a request actor: dropping it gives it back.
pub(crate) struct Reservation {
    links: Arc<EngineLinks>,
    id: RequestId,
    armed: bool,
}

impl Reservation {
    pub fn new(links: Arc<EngineLinks>, id: RequestId) -> Self {
        Reservation { links, id, armed: true }
    }

    /// The request actor owns it now (it releases the request when it ends).
    fn hand_over(mut self) {
        self.armed = false;
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.armed {
            self.links.kv_release(self.id);
        }
    }
}

pub(crate) struct RequestActor;

pub(crate) struct RequestArgs {
    pub core: RequestCore,
    pub links: Arc<EngineLinks>,
    /// The request's KV; the actor owns it from its start.
    pub reservation: Reservation,
    pub submitted: Instant,
    /// Time left to run, counted from `submitted`.
    pub deadline: Option<Duration>,
}

pub(crate) struct RequestState {
    core: RequestCore,
    submitted: Instant,
    links: Arc<EngineLinks>,
}

impl Actor for RequestActor {
    type Msg = RequestMsg;
    type State = RequestState;
    type Arguments = RequestArgs;

    async fn pre_start(&self, me: ActorRef<RequestMsg>, args: RequestArgs) -> Result<RequestState, ActorProcessingErr> {
        // Registered before any message is handled: every release finds it registered.
        args.links.admitted(args.core.spec.id, me.clone());
        args.reservation.hand_over();
        if let Some(limit) = args.deadline {
            let left = limit.saturating_sub(args.submitted.elapsed());
            me.send_after(left, move || RequestMsg::Abort(EngineError::DeadlineExceeded { limit }));
        }
        Ok(RequestState { core: args.core, submitted: args.submitted, links: args.links })
    }

    async fn handle(
        &self,
        me: ActorRef<RequestMsg>,
        msg: RequestMsg,
        s: &mut RequestState,
    ) -> Result<(), ActorProcessingErr> {
        let first_token = matches!(&msg, RequestMsg::Event(RequestEvent::Token { index: 0, .. }));
        let mut next = match msg {
            RequestMsg::Event(event) => s.core.on_event(event),
            RequestMsg::Cancel => s.core.cancel(),
            RequestMsg::Abort(error) => s.core.fail(error),
            RequestMsg::InjectPanic => panic!("injected request-actor fault"),
        };
        if first_token {
            s.links.record_ttft(s.submitted.elapsed().as_secs_f64());
        }
        if let Next::Resume { model, arrival } = next {
            metrics::counter!("tokenrouter_requests_resumed_total", "model" => s.links.model_name(model).to_string())
                .increment(1);
            next = match s.links.deliver(model, arrival) {
                Ok(()) => Next::Continue,
                Err(error) => s.core.fail(error),
            };
        }
        if let Next::End = next {
            record_usage(s);
            s.links.release(s.core.spec.id);
            me.stop(None);
        }
        Ok(())
    }
}

fn record_usage(s: &RequestState) {
    metrics::histogram!("tokenrouter_request_latency_seconds").record(s.submitted.elapsed().as_secs_f64());
    for (model, &n) in s.core.usage.tokens_per_model.iter().enumerate() {
        let name = s.links.model_name(model).to_string();
        metrics::histogram!("tokenrouter_request_tokens", "model" => name).record(n as f64);
    }
    metrics::histogram!("tokenrouter_request_switches").record(s.core.usage.switches as f64);
}

#[cfg(test)]
#[path = "request_tests.rs"]
mod tests;
