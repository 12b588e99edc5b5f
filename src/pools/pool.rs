//! One pool: members (in-process engines or upstream servers, each behind the
//! `Generator` seam) with a context limit and a number of requests each may have in
//! flight. A request longer than the limit is refused and handed back, so the
//! dispatcher can retry it on the long pool: like vLLM's HTTP 400 for an over-length
//! request, but with nothing lost.

use std::sync::Arc;

use futures::StreamExt;
use tokenrouter_actors::{EngineError, GenerateRequest};
use tokenrouter_core::pool::PoolChoice;
use tokio::sync::Semaphore;

use crate::http::{EventStream, Generator};

/// Why a pool did not take a request.
pub enum Refusal {
    /// Longer than this pool serves; the request comes back untouched for another pool.
    TooLong(GenerateRequest),
    Failed(EngineError),
}

pub struct Member {
    pub generator: Arc<dyn Generator>,
    slots: Arc<Semaphore>,
}

impl Member {
    pub fn new(generator: Arc<dyn Generator>, concurrency: usize) -> Self {
        Member { generator, slots: Arc::new(Semaphore::new(concurrency.max(1))) }
    }
}

pub struct Pool {
    pub choice: PoolChoice,
    pub max_context: usize,
    pub members: Vec<Member>,
}

impl Pool {
    /// The limit this pool enforces: its own, within what every member accepts.
    pub fn context_limit(&self) -> usize {
        self.members.iter().map(|m| m.generator.max_context()).fold(self.max_context, usize::min)
    }

    /// Submits to the member with the most free slots, waiting for a slot when all are
    /// busy. The slot is held until the request's stream ends or is dropped.
    pub async fn submit(&self, request: GenerateRequest) -> Result<EventStream, Refusal> {
        if request.prompt.len() + request.max_tokens > self.context_limit() {
            return Err(Refusal::TooLong(request));
        }
        let member = self
            .members
            .iter()
            .max_by_key(|m| m.slots.available_permits())
            .ok_or_else(|| Refusal::Failed(EngineError::Config("a pool without members".into())))?;
        let slot =
            member.slots.clone().acquire_owned().await.map_err(|_| Refusal::Failed(EngineError::ShuttingDown))?;
        let pool = self.choice.as_str();
        let events = member.generator.generate(request).await.map_err(Refusal::Failed)?;
        metrics::gauge!("tokenrouter_pool_in_flight", "pool" => pool).increment(1.0);
        let release = InFlight { pool, _slot: slot };
        Ok(Box::pin(events.map(move |event| {
            let _held = &release;
            event
        })))
    }
}

/// A member's slot and the in-flight gauge, released when the stream is dropped.
struct InFlight {
    pool: &'static str,
    _slot: tokio::sync::OwnedSemaphorePermit,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        metrics::gauge!("tokenrouter_pool_in_flight", "pool" => self.pool).decrement(1.0);
    }
}
