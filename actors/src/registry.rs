//! Where compute threads find the actor of a request to hand it its events.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use ractor::ActorRef;
use tokenrouter_core::sched::{RequestEvent, RequestId};

use crate::messages::RequestMsg;

#[derive(Clone, Default)]
pub(crate) struct Registry {
    requests: Arc<RwLock<HashMap<RequestId, ActorRef<RequestMsg>>>>,
    /// On a cluster node the request actors live on the front: every event goes here.
    forward: Option<Arc<dyn Fn(RequestEvent) + Send + Sync>>,
}

impl Registry {
    /// A registry that hands every event to `forward` (on a node, toward the front).
    pub fn forwarding(forward: Arc<dyn Fn(RequestEvent) + Send + Sync>) -> Self {
        Registry { requests: Arc::default(), forward: Some(forward) }
    }

    pub fn insert(&self, id: RequestId, actor: ActorRef<RequestMsg>) {
        self.requests.write().unwrap_or_else(|p| p.into_inner()).insert(id, actor);
    }

    pub fn remove(&self, id: RequestId) {
        self.requests.write().unwrap_or_else(|p| p.into_inner()).remove(&id);
    }

    /// The request whose actor is `actor`, if it is still registered.
    pub fn request_of(&self, actor: ractor::ActorId) -> Option<RequestId> {
        let map = self.requests.read().unwrap_or_else(|p| p.into_inner());
        map.iter().find(|(_, a)| a.get_id() == actor).map(|(id, _)| *id)
    }

    /// Whether the request has not ended yet. Its actor is registered before its first
    /// arrival is sent and removed before its releases are, so a compute thread that
    /// finds it gone while taking in an arrival knows that arrival is stale. On a node
    /// the front decides, so every request counts as live there.
    pub fn is_live(&self, id: RequestId) -> bool {
        self.forward.is_some() || self.requests.read().unwrap_or_else(|p| p.into_inner()).contains_key(&id)
    }

    pub fn send_raw(&self, id: RequestId, msg: RequestMsg) {
        let actor = self.requests.read().unwrap_or_else(|p| p.into_inner()).get(&id).cloned();
        if let Some(actor) = actor {
            let _ = actor.send_message(msg);
        }
    }

    /// Delivers an event; events of requests that already ended are dropped.
    pub fn send(&self, event: RequestEvent) {
        if let Some(forward) = &self.forward {
            return forward(event);
        }
        let id = event.request_id();
        let actor = self.requests.read().unwrap_or_else(|p| p.into_inner()).get(&id).cloned();
        if let Some(actor) = actor {
            let _ = actor.send_message(RequestMsg::Event(event));
        }
    }

    /// Requests registered now.
    pub fn len(&self) -> usize {
        self.requests.read().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn for_each(&self, mut f: impl FnMut(&ActorRef<RequestMsg>)) {
        self.requests.read().unwrap_or_else(|p| p.into_inner()).values().for_each(|a| f(a));
    }
}
