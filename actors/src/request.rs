//! One actor per request: it holds the committed tokens (the truth about the
//! request), usage, and the client's stream, and on any ending tells every model and
//! the KV manager to let the request go.

use std::sync::Arc;
use std::time::Instant;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokenrouter_core::sched::{RequestEvent, RequestId};
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

pub struct RequestActor;

pub struct RequestArgs {
    pub id: RequestId,
    pub prompt_len: usize,
    pub client: UnboundedSender<GenerationEvent>,
    pub shared: Arc<EngineShared>,
}

pub struct RequestState {
    id: RequestId,
    submitted: Instant,
    client: UnboundedSender<GenerationEvent>,
    committed: Vec<u32>,
    usage: Usage,
    shared: Arc<EngineShared>,
}

impl Actor for RequestActor {
    type Msg = RequestMsg;
    type State = RequestState;
    type Arguments = RequestArgs;

    async fn pre_start(&self, _: ActorRef<RequestMsg>, args: RequestArgs) -> Result<RequestState, ActorProcessingErr> {
        let models = args.shared.model_count();
        Ok(RequestState {
            id: args.id,
            submitted: Instant::now(),
            client: args.client,
            committed: Vec::new(),
            usage: Usage { prompt_tokens: args.prompt_len, tokens_per_model: vec![0; models], ..Usage::default() },
            shared: args.shared,
        })
    }

    async fn handle(&self, me: ActorRef<RequestMsg>, msg: RequestMsg, s: &mut RequestState) -> Result<(), ActorProcessingErr> {
        let ended = match msg {
            RequestMsg::Event(RequestEvent::Token { index, token, model, logprob, top_logprobs, .. }) => {
                if index != s.committed.len() {
                    // Out-of-order tokens would corrupt the output: end loudly instead.
                    let message = format!("internal: token {index} arrived after {} tokens", s.committed.len());
                    end_with_error(s, message)
                } else {
                    if s.committed.is_empty() {
                        metrics::histogram!("tokenrouter_request_ttft_seconds").record(s.submitted.elapsed().as_secs_f64());
                    }
                    s.committed.push(token);
                    s.usage.completion_tokens += 1;
                    if let Some(n) = s.usage.tokens_per_model.get_mut(model) {
                        *n += 1;
                    }
                    // A failed send means the client is gone: stop working for it.
                    s.client.send(GenerationEvent::Token { index, token, model, logprob, top_logprobs }).is_err()
                }
            }
            RequestMsg::Event(RequestEvent::Moved { .. }) => {
                s.usage.switches += 1;
                false
            }
            RequestMsg::Event(RequestEvent::Finished { reason, .. }) => {
                let _ = s.client.send(GenerationEvent::Finished { reason, usage: s.usage.clone() });
                true
            }
            RequestMsg::Event(RequestEvent::Failed { message, .. }) | RequestMsg::Abort(message) => end_with_error(s, message),
            RequestMsg::Cancel => true,
            RequestMsg::InjectPanic => panic!("injected request-actor fault"),
        };
        if ended {
            record_usage(s);
            s.shared.release(s.id);
            me.stop(None);
        }
        Ok(())
    }
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
