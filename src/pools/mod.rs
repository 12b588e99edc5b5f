//! The dual-pool dispatcher (DESIGN.md §8) behind the HTTP layer's `Generator` seam:
//! each request's budget is estimated from its prompt's bytes (no tokenizer on this
//! path), it goes to the short pool when the budget fits, else to the long pool; a
//! request the short pool refuses for length is retried on the long pool. Finished
//! requests' `usage.prompt_tokens` calibrate the estimator. Metrics: traffic per pool,
//! decisions by outcome, mis-route rate, estimator error per category.

mod learning;
mod pool;
mod start;
#[cfg(test)]
mod tests;
mod upstream;

use std::sync::Arc;

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use tokenrouter_actors::tokenizer::RenderedChat;
use tokenrouter_actors::{EngineError, GenerateRequest, GenerationEvent};
use tokenrouter_core::pool::{classify, Category, Dispatcher, EstimatorConfig, PoolChoice, RouteOutcome};
use tokenrouter_core::tokenize::{ChatMessage, RenderOptions};

pub use learning::{Learning, LearningSnapshot};
pub use pool::{Member, Pool, Refusal};
pub use start::{start_pools, StartedPools};
pub use upstream::UpstreamTimeouts;

use crate::http::{EngineStats, EventStream, Generator};

pub struct PoolDispatcher {
    short: Pool,
    long: Pool,
    /// Renders chat templates and tokenizes for every pool (they share a tokenizer).
    tokenizer: Arc<dyn Generator>,
    learning: Arc<Learning>,
}

/// What dispatch decided for one request, and what it learns from when it finishes.
struct Decision {
    choice: PoolChoice,
    outcome: RouteOutcome,
    /// The prompt's category and bytes, when its text was at hand.
    sample: Option<(Category, usize)>,
}

impl PoolDispatcher {
    /// `tokenizer` must share the pools' tokenizer (an in-process engine of theirs).
    pub fn new(short: Pool, long: Pool, tokenizer: Arc<dyn Generator>, estimator: EstimatorConfig) -> Self {
        PoolDispatcher { short, long, tokenizer, learning: Arc::new(Learning::new(estimator)) }
    }

    pub fn learning(&self) -> &Learning {
        &self.learning
    }

    /// The estimate from the text's bytes when there is text; the exact size when the
    /// prompt came as token ids (nothing to estimate).
    fn decide(&self, request: &GenerateRequest, prompt_text: Option<&str>) -> Decision {
        let dispatcher = Dispatcher { short_max_context: self.short.context_limit() };
        let exact = request.prompt.len() + request.max_tokens;
        let sample = prompt_text.map(|t| (classify(t.as_bytes()), t.len()));
        let budget = match sample {
            Some((category, bytes)) => self.learning.budget(category, bytes, request.max_tokens),
            None => exact,
        };
        let choice = dispatcher.choose(budget);
        let outcome = dispatcher.outcome(choice, exact);
        self.learning.record_route(choice, outcome);
        Decision { choice, outcome, sample }
    }

    async fn dispatch(&self, request: GenerateRequest, decision: Decision) -> Result<EventStream, EngineError> {
        let first = match decision.choice {
            PoolChoice::Short => &self.short,
            PoolChoice::Long => &self.long,
        };
        let events = match first.submit(request).await {
            Ok(events) => events,
            Err(Refusal::TooLong(request)) if decision.choice == PoolChoice::Short => {
                metrics::counter!("tokenrouter_pool_spilled_total").increment(1);
                self.long.submit(request).await.map_err(|r| refusal_error(r, &self.long))?
            }
            Err(r) => return Err(refusal_error(r, first)),
        };
        let served = decision.outcome.served_by(decision.choice).as_str();
        metrics::counter!("tokenrouter_pool_served_total", "pool" => served).increment(1);
        let Some((category, bytes)) = decision.sample else { return Ok(events) };
        let learning = self.learning.clone();
        Ok(Box::pin(events.inspect(move |event| {
            if let GenerationEvent::Finished { usage, .. } = event {
                learning.observe(category, bytes, usage.prompt_tokens);
            }
        })))
    }

    fn members(&self) -> impl Iterator<Item = &Member> {
        self.short.members.iter().chain(&self.long.members)
    }
}

fn refusal_error(refusal: Refusal, pool: &Pool) -> EngineError {
    match refusal {
        Refusal::TooLong(r) => EngineError::InvalidRequest(format!(
            "the request needs {} tokens (prompt + max_tokens); the {} pool serves at most {}",
            r.prompt.len() + r.max_tokens,
            pool.choice.as_str(),
            pool.context_limit()
        )),
        Refusal::Failed(e) => e,
    }
}

impl Generator for PoolDispatcher {
    fn model_names(&self) -> Vec<String> {
        self.tokenizer.model_names()
    }

    fn max_context(&self) -> usize {
        self.long.context_limit()
    }

    fn generate(&self, request: GenerateRequest) -> BoxFuture<'_, Result<EventStream, EngineError>> {
        self.generate_with_text(request, None)
    }

    fn generate_with_text(
        &self,
        request: GenerateRequest,
        prompt_text: Option<&str>,
    ) -> BoxFuture<'_, Result<EventStream, EngineError>> {
        let decision = self.decide(&request, prompt_text);
        self.dispatch(request, decision).boxed()
    }

    fn chat(
        &self,
        messages: Vec<ChatMessage>,
        options: RenderOptions,
    ) -> BoxFuture<'_, Result<RenderedChat, EngineError>> {
        self.tokenizer.chat(messages, options)
    }

    fn encode(&self, text: String, add_special_tokens: bool) -> BoxFuture<'_, Result<Vec<u32>, EngineError>> {
        self.tokenizer.encode(text, add_special_tokens)
    }

    fn chat_in_session(
        &self,
        messages: Vec<ChatMessage>,
        options: RenderOptions,
        session: Option<String>,
    ) -> BoxFuture<'_, Result<RenderedChat, EngineError>> {
        self.tokenizer.chat_in_session(messages, options, session)
    }

    fn encode_in_session(
        &self,
        text: String,
        add_special_tokens: bool,
        session: Option<String>,
    ) -> BoxFuture<'_, Result<Vec<u32>, EngineError>> {
        self.tokenizer.encode_in_session(text, add_special_tokens, session)
    }

    fn token_text(&self, id: u32) -> String {
        self.tokenizer.token_text(id)
    }

    fn stats(&self) -> BoxFuture<'_, EngineStats> {
        async move {
            let mut all = EngineStats::default();
            for member in self.members() {
                let s = member.generator.stats().await;
                all.models.extend(s.models);
                all.active_requests += s.active_requests;
            }
            all
        }
        .boxed()
    }

    fn ready(&self) -> BoxFuture<'_, bool> {
        async move {
            for member in self.members() {
                if !member.generator.ready().await {
                    return false;
                }
            }
            true
        }
        .boxed()
    }
}
