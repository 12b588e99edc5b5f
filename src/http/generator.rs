//! The seam between the HTTP handlers and what generates tokens (like TGI's
//! `Backend`): handlers only see `dyn Generator`, implemented here for the real
//! `Engine`, so HTTP tests run against the engine on tiny random models and a test
//! double is needed only where a situation cannot be produced otherwise.

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::FutureExt;
use serde::Serialize;
use tokenrouter_actors::kv_manager::KvUsage;
use tokenrouter_actors::tokenizer::RenderedChat;
use tokenrouter_actors::{
    Engine, EngineError, Fault, GenerateRequest, GenerationEvent, ModelReadiness, PrefixFlush, Readiness,
    SubserverSnapshot,
};
use tokenrouter_core::sched::planner::PlannerStatus;
use tokenrouter_core::stats::Samples;
use tokenrouter_core::tokenize::{ChatMessage, RenderOptions};
use tokenrouter_core::tools::ToolSyntax;

/// Events of one request. Dropping the stream must cancel the request and free its
/// KV: the SSE body owns it, so a client that goes away cancels its request.
pub type EventStream = BoxStream<'static, GenerationEvent>;

/// What `/v1/stats` (and the dashboard) shows.
#[derive(Debug, Clone, Default, Serialize)]
pub struct EngineStats {
    /// One snapshot per subserver that answered, in model order.
    pub models: Vec<SubserverSnapshot>,
    pub kv: Option<KvUsage>,
    pub active_requests: usize,
    /// Remote subservers and their nodes' state (empty without a cluster).
    pub nodes: Vec<tokenrouter_actors::remote::NodeStatus>,
    /// Readiness from the same snapshots, where the generator can tell it that way.
    pub readiness: Option<Readiness>,
    /// The thresholds' source and the planner's last decisions (absent when it is off).
    pub planner: Option<PlannerStatus>,
}

pub trait Generator: Send + Sync + 'static {
    /// The engine's model names, in model order (`GenerationEvent::Token::model`
    /// and `Usage::tokens_per_model` index into this).
    fn model_names(&self) -> Vec<String>;

    /// The longest sequence (prompt + output) every model accepts.
    fn max_context(&self) -> usize;

    /// Token ids every model accepts are below this; `None` when unknown (the engine
    /// still checks prompts, so the HTTP layer's check only names the field).
    fn vocab_size(&self) -> Option<usize> {
        None
    }

    /// Submits a request; its events arrive on the stream.
    fn generate(&self, request: GenerateRequest) -> BoxFuture<'_, Result<EventStream, EngineError>>;

    /// Submits a request with the text its prompt was tokenized from (`None` when it
    /// came as token ids): a pool dispatcher estimates the request's size from it.
    fn generate_with_text(
        &self,
        request: GenerateRequest,
        _prompt_text: Option<&str>,
    ) -> BoxFuture<'_, Result<EventStream, EngineError>> {
        self.generate(request)
    }

    /// Renders a conversation with the chat template and tokenizes it.
    fn chat(
        &self,
        messages: Vec<ChatMessage>,
        options: RenderOptions,
    ) -> BoxFuture<'_, Result<RenderedChat, EngineError>>;

    fn encode(&self, text: String, add_special_tokens: bool) -> BoxFuture<'_, Result<Vec<u32>, EngineError>>;

    /// [`chat`](Self::chat) continuing a tokenization session (by id; `None`: by common
    /// prefix), so that only the end of a resent transcript is re-tokenized. Generators
    /// without sessions tokenize in full.
    fn chat_in_session(
        &self,
        messages: Vec<ChatMessage>,
        options: RenderOptions,
        _session: Option<String>,
    ) -> BoxFuture<'_, Result<RenderedChat, EngineError>> {
        self.chat(messages, options)
    }

    /// [`encode`](Self::encode) continuing a tokenization session.
    fn encode_in_session(
        &self,
        text: String,
        add_special_tokens: bool,
        _session: Option<String>,
    ) -> BoxFuture<'_, Result<Vec<u32>, EngineError>> {
        self.encode(text, add_special_tokens)
    }

    /// One token as text, for logprobs (`<id>` when there is no tokenizer).
    fn token_text(&self, id: u32) -> String;

    /// How the models write tool calls (from their chat template); `None` when they
    /// have no tokenizer to render tools with.
    fn tool_syntax(&self) -> Option<ToolSyntax> {
        None
    }

    /// Token ids back to text, special tokens included (`/detokenize`).
    fn decode(&self, _ids: Vec<u32>) -> Result<String, EngineError> {
        Err(EngineError::InvalidRequest("this server cannot detokenize".into()))
    }

    fn stats(&self) -> BoxFuture<'_, EngineStats>;

    /// Times to first token (seconds) of requests whose first token came since the
    /// last call (for the stats history); none where not tracked.
    fn take_recent_ttfts(&self) -> Samples {
        Samples::new()
    }

    /// Every model's subserver is up and answering.
    fn ready(&self) -> BoxFuture<'_, bool>;

    /// Readiness per model (for `/health` and `/v1/stats`); by default every model
    /// shares the answer of [`ready`](Self::ready).
    fn readiness(&self) -> BoxFuture<'_, Readiness> {
        async move {
            let ready = self.ready().await;
            let models = self
                .model_names()
                .into_iter()
                .map(|model| ModelReadiness { model, ready, reason: (!ready).then(|| "not answering".to_string()) })
                .collect();
            Readiness::new(models, None)
        }
        .boxed()
    }

    /// Test hook: model `model` panics at `fault` (see `/debug/fault`).
    fn inject_fault(&self, _model: usize, _fault: Fault) -> Result<(), EngineError> {
        Err(EngineError::InvalidRequest("this server cannot inject faults".into()))
    }

    /// Every model drops the cached prefixes no request holds (`/reset_prefix_cache`).
    fn flush_prefix_caches(&self) -> BoxFuture<'_, Result<Vec<PrefixFlush>, EngineError>> {
        async { Err(EngineError::InvalidRequest("this server has no prefix cache to reset".into())) }.boxed()
    }
}

impl Generator for Engine {
    fn model_names(&self) -> Vec<String> {
        Engine::model_names(self).to_vec()
    }

    fn take_recent_ttfts(&self) -> Samples {
        Engine::take_recent_ttfts(self)
    }

    fn max_context(&self) -> usize {
        Engine::max_context(self)
    }

    fn vocab_size(&self) -> Option<usize> {
        Some(self.shared_vocab())
    }

    fn generate(&self, request: GenerateRequest) -> BoxFuture<'_, Result<EventStream, EngineError>> {
        async move {
            let stream = Engine::generate(self, request).await?;
            Ok(Box::pin(stream) as EventStream)
        }
        .boxed()
    }

    fn chat(
        &self,
        messages: Vec<ChatMessage>,
        options: RenderOptions,
    ) -> BoxFuture<'_, Result<RenderedChat, EngineError>> {
        Engine::chat(self, messages, options).boxed()
    }

    fn encode(&self, text: String, add_special_tokens: bool) -> BoxFuture<'_, Result<Vec<u32>, EngineError>> {
        Engine::encode(self, text, add_special_tokens).boxed()
    }

    fn chat_in_session(
        &self,
        messages: Vec<ChatMessage>,
        options: RenderOptions,
        session: Option<String>,
    ) -> BoxFuture<'_, Result<RenderedChat, EngineError>> {
        Engine::chat_in_session(self, messages, options, session).boxed()
    }

    fn encode_in_session(
        &self,
        text: String,
        add_special_tokens: bool,
        session: Option<String>,
    ) -> BoxFuture<'_, Result<Vec<u32>, EngineError>> {
        Engine::encode_in_session(self, text, add_special_tokens, session).boxed()
    }

    fn token_text(&self, id: u32) -> String {
        self.tokenizer().and_then(|t| t.decode(&[id], false).ok()).unwrap_or_else(|| format!("<{id}>"))
    }

    fn tool_syntax(&self) -> Option<ToolSyntax> {
        let tokenizer = self.tokenizer()?;
        Some(ToolSyntax::of_template(tokenizer.config().chat_template.as_deref()))
    }

    fn decode(&self, ids: Vec<u32>) -> Result<String, EngineError> {
        let tokenizer = self
            .tokenizer()
            .ok_or_else(|| EngineError::InvalidRequest("this engine's models have no tokenizer".into()))?;
        tokenizer.decode(&ids, false).map_err(|e| EngineError::InvalidRequest(e.to_string()))
    }

    fn stats(&self) -> BoxFuture<'_, EngineStats> {
        async move {
            let models = Engine::stats(self).await;
            let readiness = Some(self.readiness_of(&models).await);
            EngineStats {
                models,
                kv: self.kv_usage().await,
                active_requests: self.active_requests(),
                nodes: self.nodes(),
                readiness,
                planner: self.planner_status().await,
            }
        }
        .boxed()
    }

    fn ready(&self) -> BoxFuture<'_, bool> {
        async move { Engine::readiness(self).await.ready }.boxed()
    }

    fn readiness(&self) -> BoxFuture<'_, Readiness> {
        Engine::readiness(self).boxed()
    }

    fn inject_fault(&self, model: usize, fault: Fault) -> Result<(), EngineError> {
        Engine::inject_fault(self, model, fault)
    }

    fn flush_prefix_caches(&self) -> BoxFuture<'_, Result<Vec<PrefixFlush>, EngineError>> {
        async move { Ok(Engine::flush_prefix_caches(self).await) }.boxed()
    }
}
