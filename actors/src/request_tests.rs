//! The request logic ([`RequestCore`]) driven directly, without an actor: events in order,
//! endings exactly once, resumes from committed tokens.

use std::sync::Arc;

use tokenrouter_core::model::sampler::SamplingParams;
use tokenrouter_core::policy::{build, ModelInfo, PolicyContext, PolicyState};
use tokenrouter_core::sched::{FinishReason, RequestEvent, RequestSpec, Travel};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use super::{Next, RequestCore};
use crate::error::EngineError;
use crate::events::GenerationEvent;

fn spec() -> Arc<RequestSpec> {
    Arc::new(RequestSpec {
        id: 7,
        prompt: vec![1, 2, 3],
        max_tokens: 8,
        sampling: SamplingParams::default(),
        stop_ids: vec![],
        policy: {
            let infos: Vec<ModelInfo> =
                (0..2).map(|i| ModelInfo { name: format!("m{i}"), hidden_size: 0, vocab_size: 100 }).collect();
            build("random", &serde_json::json!({}), &infos, &PolicyContext::default()).expect("a built-in policy")
        },
        constraint: None,
        speculation: None,
    })
}

fn core() -> (RequestCore, UnboundedReceiver<GenerationEvent>) {
    let (tx, rx) = unbounded_channel();
    (RequestCore::new(spec(), 2, tx, None), rx)
}

fn token(index: usize, token: u32, model: usize) -> RequestEvent {
    RequestEvent::Token { id: 7, index, token, model, logprob: None, top_logprobs: vec![] }
}

fn travel() -> Travel {
    Travel { policy_state: PolicyState { seed: 3, ..PolicyState::default() }, seen: vec![5, 4] }
}

#[test]
fn tokens_commit_in_order_and_count_per_model() {
    let (mut c, mut rx) = core();
    assert!(matches!(c.on_event(token(0, 10, 0)), Next::Continue));
    assert!(matches!(c.on_event(RequestEvent::Moved { id: 7, from: 0, to: 1 }), Next::Continue));
    assert!(matches!(c.on_event(token(1, 11, 1)), Next::Continue));
    assert!(matches!(c.on_event(RequestEvent::Finished { id: 7, reason: FinishReason::Length }), Next::End));
    assert_eq!(c.committed(), &[10, 11]);
    assert_eq!((c.usage().tokens_per_model.clone(), c.usage().switches), (vec![1, 1], 1));
    let events: Vec<GenerationEvent> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
    assert_eq!(events.len(), 3);
    assert!(matches!(events[2], GenerationEvent::Finished { reason: FinishReason::Length, .. }));
}

#[test]
fn an_out_of_order_token_ends_the_request_with_an_error() {
    let (mut c, mut rx) = core();
    assert!(matches!(c.on_event(token(1, 10, 0)), Next::End));
    assert!(matches!(rx.try_recv(), Ok(GenerationEvent::Error { .. })));
}

#[test]
fn a_resume_rebuilds_the_request_from_its_committed_tokens() {
    let (mut c, _rx) = core();
    c.on_event(token(0, 10, 0));
    c.on_event(token(1, 11, 0));
    match c.on_event(RequestEvent::Resume { id: 7, model: 0, output_len: 2, travel: travel() }) {
        Next::Resume { model, arrival } => {
            assert_eq!(model, 0);
            assert_eq!((arrival.start, arrival.output_len), (0, 2));
            assert_eq!(arrival.suffix, vec![1, 2, 3, 10, 11]);
            assert_eq!(arrival.travel.seen, vec![0, 4], "the model that lost it holds nothing now");
            assert_eq!(arrival.travel.policy_state.seed, 3);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_resume_that_disagrees_with_the_committed_tokens_fails_loudly() {
    let (mut c, mut rx) = core();
    c.on_event(token(0, 10, 0));
    assert!(matches!(c.on_event(RequestEvent::Resume { id: 7, model: 1, output_len: 0, travel: travel() }), Next::End));
    assert!(matches!(rx.try_recv().unwrap(), GenerationEvent::Token { .. }));
    assert!(matches!(rx.try_recv().unwrap(), GenerationEvent::Error { .. }));
}

#[test]
fn a_request_ends_exactly_once() {
    let (mut c, mut rx) = core();
    assert!(matches!(c.fail(EngineError::DeadlineExceeded { limit: std::time::Duration::from_secs(1) }), Next::End));
    assert!(c.is_ended());
    assert!(matches!(c.on_event(token(0, 10, 0)), Next::End));
    assert!(matches!(c.on_event(RequestEvent::Finished { id: 7, reason: FinishReason::Stop }), Next::End));
    assert!(matches!(c.fail(EngineError::ShuttingDown), Next::End));
    let events: Vec<GenerationEvent> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
    assert_eq!(events.len(), 1, "{events:?}");
    match &events[0] {
        GenerationEvent::Error { error, .. } => assert!(matches!(error, EngineError::DeadlineExceeded { .. })),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_client_that_is_gone_cancels() {
    let (mut c, rx) = core();
    drop(rx);
    assert!(matches!(c.on_event(token(0, 10, 0)), Next::End));
    assert!(c.is_ended());
}
