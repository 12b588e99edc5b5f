//! Joint KV admission for colocated models. A request may visit every model and stay
//! pending on each, so admission reserves its worst case (prompt + max_tokens) on
//! every model; when that does not fit now, admission waits for releases. Subservers
//! still evict pending KV when fragmentation bites, so nothing runs out of memory.

use std::collections::{HashMap, VecDeque};

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokenrouter_core::sched::RequestId;

use crate::error::EngineError;

pub enum KvMsg {
    /// Reserve `tokens` on every model; the reply comes once they fit.
    Admit {
        id: RequestId,
        tokens: usize,
        reply: RpcReplyPort<Result<(), EngineError>>,
    },
    Release(RequestId),
    Usage(RpcReplyPort<KvUsage>),
}

// Local only: ractor's `cluster` feature drops the blanket impl (see remote/).
impl ractor::Message for KvMsg {}

#[derive(Debug, Clone, serde::Serialize)]
pub struct KvUsage {
    pub capacity_tokens: Vec<usize>,
    pub reserved_tokens: usize,
    pub admitted: usize,
    pub waiting: usize,
}

pub struct KvManager;

pub struct KvManagerArgs {
    pub model_names: Vec<String>,
    /// Token capacity of each model's KV pool.
    pub capacity_tokens: Vec<usize>,
}

pub struct KvState {
    names: Vec<String>,
    capacity: Vec<usize>,
    reserved: usize,
    reservations: HashMap<RequestId, usize>,
    waiting: VecDeque<(RequestId, usize, RpcReplyPort<Result<(), EngineError>>)>,
}

impl KvState {
    fn fits(&self, tokens: usize) -> bool {
        self.capacity.iter().all(|&c| self.reserved + tokens <= c)
    }

    fn admit_waiting(&mut self) {
        while let Some((_, tokens, _)) = self.waiting.front() {
            if !self.fits(*tokens) {
                break;
            }
            let (id, tokens, reply) = self.waiting.pop_front().expect("front exists");
            if reply.send(Ok(())).is_ok() {
                self.reserved += tokens;
                self.reservations.insert(id, tokens);
            }
        }
    }
}

impl Actor for KvManager {
    type Msg = KvMsg;
    type State = KvState;
    type Arguments = KvManagerArgs;

    async fn pre_start(&self, _: ActorRef<KvMsg>, args: KvManagerArgs) -> Result<KvState, ActorProcessingErr> {
        Ok(KvState {
            names: args.model_names,
            capacity: args.capacity_tokens,
            reserved: 0,
            reservations: HashMap::new(),
            waiting: VecDeque::new(),
        })
    }

    async fn handle(&self, _: ActorRef<KvMsg>, msg: KvMsg, state: &mut KvState) -> Result<(), ActorProcessingErr> {
        match msg {
            KvMsg::Admit { id, tokens, reply } => {
                if let Some((i, &capacity)) = state.capacity.iter().enumerate().find(|(_, &c)| tokens > c) {
                    let _ = reply.send(Err(EngineError::TooLarge {
                        needed: tokens,
                        capacity,
                        model: state.names[i].clone(),
                    }));
                } else if state.waiting.is_empty() && state.fits(tokens) {
                    if reply.send(Ok(())).is_ok() {
                        state.reserved += tokens;
                        state.reservations.insert(id, tokens);
                    }
                } else {
                    state.waiting.push_back((id, tokens, reply));
                }
            }
            KvMsg::Release(id) => {
                if let Some(tokens) = state.reservations.remove(&id) {
                    state.reserved -= tokens;
                }
                state.waiting.retain(|(w, _, _)| *w != id);
                state.admit_waiting();
            }
            KvMsg::Usage(reply) => {
                let _ = reply.send(KvUsage {
                    capacity_tokens: state.capacity.clone(),
                    reserved_tokens: state.reserved,
                    admitted: state.reservations.len(),
                    waiting: state.waiting.len(),
                });
            }
        }
        Ok(())
    }
}
