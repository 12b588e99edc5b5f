//! The front's ledger of remote requests and the node's book, driven directly.

use super::*;
use crate::remote::node_book::NodeBook;
use tokenrouter_core::model::sampler::SamplingParams;
use tokenrouter_core::policy::{self, ModelInfo, PolicyContext, PolicyState};

fn models() -> Vec<ModelInfo> {
    ["small", "large"].iter().map(|n| ModelInfo { name: n.to_string(), hidden_size: 8, vocab_size: 100 }).collect()
}

fn spec(id: RequestId) -> Arc<RequestSpec> {
    let policy = policy::build("random", &serde_json::json!({"p": 0.3}), &models(), &PolicyContext::default()).unwrap();
    Arc::new(RequestSpec {
        id,
        prompt: vec![1, 2, 3],
        max_tokens: 8,
        sampling: SamplingParams::greedy(),
        stop_ids: vec![99],
        policy,
        constraint: None,
        speculation: None,
    })
}

fn arrival(spec: &Arc<RequestSpec>, start: usize, suffix: &[u32], output_len: usize) -> Arrival {
    Arrival {
        spec: spec.clone(),
        suffix: suffix.to_vec(),
        start,
        output_len,
        travel: Travel {
            policy_state: PolicyState { seed: 5, ..Default::default() },
            seen: vec![start + suffix.len(), start],
        },
        draft: None,
    }
}

fn token(id: RequestId, index: usize, token: u32) -> RequestEvent {
    RequestEvent::Token { id, index, token, model: 1, logprob: None, top_logprobs: vec![] }
}

#[test]
fn the_spec_crosses_once_and_later_visits_send_only_the_suffix() {
    let s = spec(1);
    let mut ledger = FrontLedger::default();
    let first = ledger.outgoing(arrival(&s, 0, &[1, 2, 3, 10], 1)).unwrap();
    assert!(first.spec.is_some());
    assert_eq!(first.suffix, vec![1, 2, 3, 10]);
    ledger.event(&token(1, 1, 11));
    let back = ledger.handed_back(WireArrival { spec: None, start: 4, suffix: vec![11], ..first.clone() }).unwrap();
    assert_eq!(back.spec.id, 1);
    assert!(Arc::ptr_eq(&back.spec, &s), "the front's own spec (and policy object) comes back");
    assert!(ledger.on_node().is_empty());
    let again = ledger.outgoing(arrival(&s, 5, &[12], 3)).unwrap();
    assert_eq!((again.spec.is_none(), again.start, again.suffix.clone()), (true, 5, vec![12]));
    assert_eq!(ledger.on_node(), vec![1]);
}

#[test]
fn a_lost_node_strands_what_it_ran_and_a_replacement_gets_everything_from_zero() {
    let (a, b) = (spec(1), spec(2));
    let mut ledger = FrontLedger::default();
    ledger.outgoing(arrival(&a, 0, &[1, 2, 3], 0)).unwrap();
    ledger.event(&token(1, 0, 40));
    ledger.event(&token(1, 1, 41));
    ledger.event(&token(1, 5, 99)); // out of order: ignored, the mirror stays exact
    let w = ledger.outgoing(arrival(&b, 0, &[1, 2, 3, 7], 1)).unwrap();
    ledger.handed_back(WireArrival { spec: None, start: 4, suffix: vec![], ..w }).unwrap();
    assert_eq!(ledger.node_lost(), vec![1], "only the request running there is stranded");
    let resumed = ledger.resume(1).unwrap();
    assert_eq!((resumed.start, resumed.suffix.clone(), resumed.output_len), (0, vec![1, 2, 3, 40, 41], 2));
    assert!(resumed.spec.is_some());
    // Request 2 was pending there: its next visit must also start from zero.
    let next = ledger.outgoing(arrival(&b, 4, &[8], 2)).unwrap();
    assert_eq!((next.start, next.suffix, next.spec.is_some()), (0, vec![1, 2, 3, 7, 8], true));
}

#[test]
fn the_node_rebuilds_the_request_and_its_policy_once() {
    let s = spec(3);
    let mut ledger = FrontLedger::default();
    let mut book = NodeBook::new(models(), PolicyContext::default());
    let first = book.incoming(ledger.outgoing(arrival(&s, 0, &[1, 2, 3], 0)).unwrap()).unwrap();
    assert_eq!(first.spec.prompt, vec![1, 2, 3]);
    assert_eq!(first.spec.policy.name(), s.policy.name());
    assert_eq!(first.spec.policy.descriptor(), s.policy.descriptor());
    let other = book.incoming(ledger.outgoing(arrival(&spec(4), 0, &[1, 2, 3], 0)).unwrap()).unwrap();
    assert!(Arc::ptr_eq(&first.spec.policy, &other.spec.policy), "one policy object per descriptor");
    let unknown = WireArrival {
        id: 77,
        spec: None,
        start: 3,
        suffix: vec![],
        output_len: 0,
        policy_state: Default::default(),
        seen: vec![],
        draft: None,
    };
    assert!(book.incoming(unknown).unwrap_err().contains("never saw it"));
    book.release(3);
    book.release(4);
    assert_eq!(book.known(), 0);
}

#[test]
fn a_policy_made_in_code_cannot_cross() {
    let mut s = (*spec(5)).clone();
    s.policy = Arc::new(tokenrouter_core::policy::Always::new(0));
    let err = FrontLedger::default().outgoing(arrival(&Arc::new(s), 0, &[1], 0)).unwrap_err();
    assert!(err.contains("cannot run on another host"), "{err}");
}
