//! One actor per request: it holds the committed tokens (the truth about the
//! request), usage, and the client's stream, and on any ending tells every model and
//! the KV manager to let the request go.

use std::sync::Arc;
use std::time::Instant;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokenrouter_core::sched::{FinishReason, RequestEvent, RequestId};
use tokenrouter_core::tokenize::{StopMatcher, StopStep, StreamDecoder};
use tokio::sync::mpsc::UnboundedSender;

use crate::engine::EngineShared;
use crate::events::{GenerationEvent, Usage};

pub enum RequestMsg {
    Event(RequestEvent),
    /// The client went away.
    Cancel,
    /// The engine ends the request (e.g. shutting down).
    Abort(String),
    /// Test hook: fail as a bug in this actor would.
    InjectPanic,
}

// Local only: ractor's `cluster` feature drops the blanket impl (see remote/).
impl ractor::Message for RequestMsg {}

pub struct RequestActor;

pub struct RequestArgs {
    pub id: RequestId,
    pub prompt_len: usize,
    pub client: UnboundedSender<GenerationEvent>,
    pub shared: Arc<EngineShared>,
    pub text: Option<TextStream>,
    pub deadline: Option<std::time::Duration>,
}

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

pub struct RequestState {
    id: RequestId,
    submitted: Instant,
    client: UnboundedSender<GenerationEvent>,
    committed: Vec<u32>,
    usage: Usage,
    shared: Arc<EngineShared>,
    text: Option<TextStream>,
}

impl Actor for RequestActor {
    type Msg = RequestMsg;
    type State = RequestState;
    type Arguments = RequestArgs;

    async fn pre_start(&self, me: ActorRef<RequestMsg>, args: RequestArgs) -> Result<RequestState, ActorProcessingErr> {
        let models = args.shared.model_count();
        if let Some(limit) = args.deadline {
            me.send_after(limit, move || {
                RequestMsg::Abort(format!("deadline of {:.1}s exceeded", limit.as_secs_f64()))
            });
        }
        Ok(RequestState {
            id: args.id,
            submitted: Instant::now(),
            client: args.client,
            committed: Vec::new(),
            usage: Usage { prompt_tokens: args.prompt_len, tokens_per_model: vec![0; models], ..Usage::default() },
            shared: args.shared,
            text: args.text,
        })
    }

    async fn handle(
        &self,
        me: ActorRef<RequestMsg>,
        msg: RequestMsg,
        s: &mut RequestState,
    ) -> Result<(), ActorProcessingErr> {
        let ended = match msg {
            RequestMsg::Event(RequestEvent::Token { index, token, model, logprob, top_logprobs, .. }) => {
                if index != s.committed.len() {
                    // Out-of-order tokens would corrupt the output: end loudly instead.
                    let message = format!("internal: token {index} arrived after {} tokens", s.committed.len());
                    end_with_error(s, message)
                } else {
                    if s.committed.is_empty() {
                        metrics::histogram!("tokenrouter_request_ttft_seconds")
                            .record(s.submitted.elapsed().as_secs_f64());
                    }
                    s.committed.push(token);
                    s.usage.completion_tokens += 1;
                    if let Some(n) = s.usage.tokens_per_model.get_mut(model) {
                        *n += 1;
                    }
                    let step = match s.text.as_mut().map(|t| t.push(token)).transpose() {
                        Ok(step) => step,
                        Err(message) => return finish(me, s, Some(message)),
                    };
                    let (text, stop) = step.map(|st| (st.text, st.stop)).unwrap_or_default();
                    // A failed send means the client is gone: stop working for it.
                    let gone = s
                        .client
                        .send(GenerationEvent::Token { index, token, model, logprob, top_logprobs, text })
                        .is_err();
                    if let Some(stop) = stop {
                        let usage = s.usage.clone();
                        let event = GenerationEvent::Finished {
                            reason: FinishReason::Stop,
                            usage,
                            text: String::new(),
                            stop: Some(stop.stop),
                        };
                        let _ = s.client.send(event);
                    }
                    gone || s.text.as_ref().is_some_and(|t| t.stops.is_stopped())
                }
            }
            RequestMsg::Event(RequestEvent::Moved { .. }) => {
                s.usage.switches += 1;
                false
            }
            RequestMsg::Event(RequestEvent::Finished { reason, .. }) => {
                let text = s.text.as_mut().map(TextStream::flush).unwrap_or_default();
                let _ = s.client.send(GenerationEvent::Finished { reason, usage: s.usage.clone(), text, stop: None });
                true
            }
            RequestMsg::Event(RequestEvent::Failed { message, .. }) | RequestMsg::Abort(message) => {
                end_with_error(s, message)
            }
            RequestMsg::Cancel => true,
            RequestMsg::InjectPanic => panic!("injected request-actor fault"),
        };
        if ended {
            return finish(me, s, None);
        }
        Ok(())
    }
}

/// Ends the request (with an error to the client first, if given) and lets it go
/// everywhere.
fn finish(me: ActorRef<RequestMsg>, s: &mut RequestState, error: Option<String>) -> Result<(), ActorProcessingErr> {
    if let Some(message) = error {
        end_with_error(s, message);
    }
    record_usage(s);
    s.shared.release(s.id);
    me.stop(None);
    Ok(())
}

fn record_usage(s: &RequestState) {
    metrics::histogram!("tokenrouter_request_latency_seconds").record(s.submitted.elapsed().as_secs_f64());
    for (model, &n) in s.usage.tokens_per_model.iter().enumerate() {
        let name = s.shared.model_name(model).to_string();
        metrics::histogram!("tokenrouter_request_tokens", "model" => name).record(n as f64);
    }
    metrics::histogram!("tokenrouter_request_switches").record(s.usage.switches as f64);
}

fn end_with_error(s: &mut RequestState, message: String) -> bool {
    let _ = s.client.send(GenerationEvent::Error { message, usage: s.usage.clone() });
    true
}
