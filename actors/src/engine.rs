//! The engine: it builds the parts (one subserver per model, the KV budget, the
//! tokenizer and re-planning actors) and hands requests the narrow [`EngineLinks`];
//! it serves the library API (`start`, `generate`, `shutdown`) and supervises the
//! actor tree.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use flume::Sender;
use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};
use tokenrouter_core::model::{BlockPool, ModelConfig};
use tokenrouter_core::policy::{expected_delegation, Policy};
use tokenrouter_core::sched::planner::{LatencyTable, PlannerStatus, Replanner, DEFAULT_DELEGATION_PRIOR};
use tokenrouter_core::sched::request::only_model;
use tokenrouter_core::sched::{BatchingRule, RequestId, RequestSpec, SubserverConfig};
use tokenrouter_core::stats::Samples;
use tokenrouter_core::tokenize::incremental::SessionConfig;
use tokenrouter_core::tokenize::{
    shared_vocab_check, ChatMessage, RenderOptions, StopMatcher, StreamDecoder, TextTokenizer, TokenizeError,
};
use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};

use crate::compute;
use crate::config::{AdmissionConfig, EngineConfig};
use crate::error::EngineError;
use crate::events::{GenerateRequest, GenerationEvent, Usage};
use crate::grammar::Grammars;
use crate::handles::{ComputeLinks, EngineLinks, STATS_TIMEOUT};
use crate::health::{ModelReadiness, Readiness};
use crate::kv_manager::{KvAdmission, KvLedger, KvNeed, KvUsage, SharedPages, Ticket};
use crate::kv_sharing::share_colocated_kv;
pub use crate::launch::GenerationStream;
use crate::launch::{Launch, StreamLink};
use crate::messages::{ComputeMsg, Fault, Loaded, PrefixFlush, ReplanMsg, RequestMsg, SubserverSnapshot};
use crate::registry::Registry;
use crate::remote::{self, ClusterConfig, NodeStatus};
use crate::replan::{PlannerStatusCell, ReplanActor, ReplanArgs};
use crate::request::{RequestCore, Reservation, TextStream};
use crate::tokenizer::{RenderedChat, TokenizerActor, TokenizerMsg};

/// How long a tokenizer call may take before the caller gives up on it.
const TOKENIZE_TIMEOUT: Duration = Duration::from_secs(60);

/// What the engine handle and its supervisor share; requests see only its `links`.
struct EngineShared {
    links: Arc<EngineLinks>,
    configs: Vec<ModelConfig>,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
    admission: AdmissionConfig,
    next_id: AtomicU64,
    default_policy: Arc<dyn Policy>,
    shared_vocab: usize,
    max_context: usize,
    eos_ids: Vec<u32>,
    closing: AtomicBool,
    tokenizer: Option<TextTokenizer>,
    /// Replaced by the supervisor when the actor dies.
    tokenizer_actor: parking_lot::RwLock<Option<ActorRef<TokenizerMsg>>>,
    /// The session settings last configured, for a respawned tokenizer actor.
    session_config: parking_lot::Mutex<Option<SessionConfig>>,
    grammars: Arc<Grammars>,
    /// The remote subservers' links, for the dashboard.
    nodes: Vec<Arc<parking_lot::Mutex<NodeStatus>>>,
    /// Each model's block pool where it is in this process (`None`: a remote model).
    pools: Vec<Option<BlockPool>>,
}

impl EngineShared {
    /// Prompt tokens every model holds cached now (0 if a model cannot say).
    fn cached_everywhere(&self, prompt: &[u32]) -> usize {
        let cached = self.pools.iter().map(|p| p.as_ref().map_or(0, |p| p.cached_prefix_tokens(prompt)));
        cached.min().unwrap_or(0)
    }
}

/// The root of the actor tree: it watches the request actors and the tokenizer. A
/// request actor that fails is released like any ended request (its client's stream
/// then ends), so its KV never leaks; a tokenizer actor that fails is started again.
/// Compute threads supervise themselves (see `compute`).
struct Supervisor {
    shared: Arc<OnceLock<Weak<EngineShared>>>,
}

impl Actor for Supervisor {
    type Msg = ();
    type State = ();
    type Arguments = ();

    async fn pre_start(&self, _: ActorRef<()>, _: ()) -> Result<(), ActorProcessingErr> {
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        me: ActorRef<()>,
        event: SupervisionEvent,
        _: &mut (),
    ) -> Result<(), ActorProcessingErr> {
        let SupervisionEvent::ActorFailed(who, why) = event else { return Ok(()) };
        tracing::error!(actor = ?who.get_id(), %why, "engine actor failed");
        let Some(shared) = self.shared.get().and_then(Weak::upgrade) else { return Ok(()) };
        if let Some(id) = shared.links.registry.request_of(who.get_id()) {
            shared.links.release(id);
        } else if shared.tokenizer_actor.read().as_ref().is_some_and(|t| t.get_id() == who.get_id()) {
            respawn_tokenizer(&shared, &me).await;
        }
        Ok(())
    }
}

/// Starts the tokenizer actor again with the engine's tokenizer and session settings.
async fn respawn_tokenizer(shared: &EngineShared, root: &ActorRef<()>) {
    let Some(tokenizer) = shared.tokenizer.clone() else { return };
    if shared.closing.load(Ordering::SeqCst) {
        return;
    }
    match Actor::spawn_linked(None, TokenizerActor, tokenizer, root.get_cell()).await {
        Ok((actor, _)) => {
            if let Some(config) = shared.session_config.lock().clone() {
                let _ = actor.send_message(TokenizerMsg::ConfigureSessions(config));
            }
            *shared.tokenizer_actor.write() = Some(actor);
            metrics::counter!("tokenrouter_tokenizer_restarts_total").increment(1);
            tracing::warn!("tokenizer actor restarted");
        }
        Err(e) => tracing::error!(%e, "the tokenizer actor cannot be restarted"),
    }
}

/// A running engine. Cloning shares it.
#[derive(Clone)]
pub struct Engine {
    shared: Arc<EngineShared>,
    root: ActorRef<()>,
    replanner: Option<(ActorRef<ReplanMsg>, PlannerStatusCell)>,
}

impl Engine {
    /// Loads every model on its own compute thread, then starts the actor tree.
    pub async fn start(config: EngineConfig) -> Result<Engine, EngineError> {
        Self::start_clustered(config, None).await
    }

    /// [`start`](Self::start), with the models `cluster.remote` names served by nodes on
    /// other hosts (waiting for each node's subserver, up to `cluster.connect_timeout`).
    pub async fn start_clustered(config: EngineConfig, cluster: Option<ClusterConfig>) -> Result<Engine, EngineError> {
        if config.models.is_empty() {
            return Err(EngineError::Config("at least one model is needed".into()));
        }
        config.batching.validate(config.models.len()).map_err(|e| EngineError::Config(e.to_string()))?;
        tokenrouter_core::model::threads::configure(None);
        let registry = Registry::default();
        let mut front = match cluster {
            Some(c) => Some(remote::FrontCluster::start(c, &config.models).await?),
            None => None,
        };
        let started = start_models(&config, &registry, front.as_mut()).await?;
        let loaded = await_loaded(&started.ready).await?;
        let configs: Vec<ModelConfig> = loaded.iter().map(|l| l.config.clone()).collect();
        let shared_vocab = configs.iter().map(|c| c.vocab_size).min().expect("one model at least");
        let max_context = configs.iter().map(|c| c.max_position_embeddings).min().expect("one model at least");
        started.peers.set(started.computes.clone()).ok();
        send_start(&config, &started.computes, shared_vocab, max_context);
        let supervised = Arc::new(OnceLock::new());
        let (root, _) = Actor::spawn(None, Supervisor { shared: supervised.clone() }, ()).await.map_err(spawn_err)?;
        let names: Vec<String> = config.models.iter().map(|m| m.name.clone()).collect();
        for name in &names {
            tracing::info!(model = %name, "subserver up");
        }
        let kv = kv_admission(&config, &names, &loaded, started.shared_pages);
        let tokenizer = shared_tokenizer(&config)?;
        let tokenizer_actor = match &tokenizer {
            Some(t) => {
                Some(Actor::spawn_linked(None, TokenizerActor, t.clone(), root.get_cell()).await.map_err(spawn_err)?.0)
            }
            None => None,
        };
        let shared = Arc::new(EngineShared {
            links: Arc::new(EngineLinks::new(names, started.computes, kv, registry)),
            eos_ids: eos_ids(&configs, tokenizer.as_ref()),
            configs,
            threads: Mutex::new(started.threads),
            admission: config.admission.clone(),
            next_id: AtomicU64::new(1),
            default_policy: config.default_policy.clone(),
            shared_vocab,
            max_context,
            closing: AtomicBool::new(false),
            grammars: Arc::new(Grammars::new(
                tokenizer.clone(),
                shared_vocab,
                config.admission.grammar_compile_timeout,
            )),
            tokenizer,
            tokenizer_actor: parking_lot::RwLock::new(tokenizer_actor),
            session_config: parking_lot::Mutex::new(None),
            nodes: front.map(|f| f.statuses).unwrap_or_default(),
            pools: loaded.iter().map(|l| l.pool.clone()).collect(),
        });
        supervised.set(Arc::downgrade(&shared)).ok();
        shared.grammars.warm_up();
        let step_costs = loaded.into_iter().map(|l| l.step_cost).collect();
        let replanner = spawn_replanner(&config, &shared, step_costs, &root).await?;
        Ok(Engine { shared, root, replanner })
    }

    pub fn model_names(&self) -> &[String] {
        self.shared.links.names()
    }

    pub fn model_configs(&self) -> &[ModelConfig] {
        &self.shared.configs
    }

    pub fn shared_vocab(&self) -> usize {
        self.shared.shared_vocab
    }

    pub fn max_context(&self) -> usize {
        self.shared.max_context
    }

    /// Submits a request; events arrive on the returned stream. Dropping the stream
    /// cancels the request. A request that cannot fit, or finds the admission queue
    /// full, is refused here; one that must wait for KV gets its stream at once (so a
    /// server can start its response) and waits behind it, up to the KV-wait limit.
    pub async fn generate(&self, request: GenerateRequest) -> Result<GenerationStream, EngineError> {
        let s = &self.shared;
        if s.closing.load(Ordering::SeqCst) {
            return Err(EngineError::ShuttingDown);
        }
        self.validate(&request)?;
        let submitted = Instant::now();
        let id = s.next_id.fetch_add(1, Ordering::Relaxed);
        let max_tokens = request.max_tokens.min(s.max_context - request.prompt.len());
        let text = self.text_stream(&request)?;
        let mut stop_ids = request.stop_ids.clone();
        if !request.ignore_eos {
            stop_ids.extend(&s.eos_ids);
        }
        stop_ids.sort_unstable();
        stop_ids.dedup();
        let constraint = match request.grammar {
            Some(grammar) => Some(s.grammars.compile(grammar, stop_ids.clone()).await?),
            None => None,
        };
        let spec = Arc::new(RequestSpec {
            id,
            prompt: request.prompt,
            max_tokens,
            sampling: request.sampling,
            stop_ids,
            policy: request.policy.unwrap_or_else(|| s.default_policy.clone()),
            constraint,
            speculation: request.speculation,
        });
        let need = KvNeed::new(spec.prompt.len(), max_tokens)
            .with_cached(s.cached_everywhere(&spec.prompt))
            .only_on(only_model(&spec, s.links.model_count()));
        let ticket = s.links.kv.request(id, need)?;
        // Until a request actor owns the reservation, dropping this gives it back.
        let reservation = Reservation::new(s.links.clone(), id);
        let (client, events) = unbounded_channel();
        let launch = Launch {
            links: s.links.clone(),
            root: self.root.clone(),
            core: RequestCore::new(spec.clone(), s.links.model_count(), client.clone(), text),
            spec,
            reservation,
            submitted,
            deadline: request.deadline.or(s.admission.request_timeout),
            link: StreamLink::new(),
        };
        let link = launch.link.clone();
        match ticket {
            Ticket::Admitted => launch.run().await?,
            waiting => {
                tokio::spawn(launch_when_admitted(waiting, launch, client));
            }
        }
        Ok(GenerationStream::new(events, link, id))
    }

    fn text_stream(&self, request: &GenerateRequest) -> Result<Option<TextStream>, EngineError> {
        let Some(tok) = &self.shared.tokenizer else { return Ok(None) };
        let decoder = StreamDecoder::with_context(tok.clone(), request.skip_special_tokens, &request.prompt)
            .map_err(|e| EngineError::Internal(e.to_string()))?;
        Ok(Some(TextStream { decoder, stops: StopMatcher::new(request.stop.clone()) }))
    }

    fn validate(&self, r: &GenerateRequest) -> Result<(), EngineError> {
        let s = &self.shared;
        let bad = |m: String| Err(EngineError::InvalidRequest(m));
        if r.prompt.is_empty() {
            return bad("the prompt is empty".into());
        }
        if r.max_tokens == 0 {
            return bad("max_tokens must be at least 1".into());
        }
        if let Some(t) = r.prompt.iter().find(|&&t| t as usize >= s.shared_vocab) {
            return bad(format!("token id {t} is outside the vocabulary (size {})", s.shared_vocab));
        }
        if !r.stop.is_empty() && s.tokenizer.is_none() {
            return bad("stop strings need a tokenizer; this engine's models have none".into());
        }
        if r.stop.iter().any(|x| x.is_empty()) {
            return bad("stop strings must not be empty".into());
        }
        if r.prompt.len() >= s.max_context {
            return bad(format!("the prompt has {} tokens; the context limit is {}", r.prompt.len(), s.max_context));
        }
        r.sampling.validate().map_err(|e| EngineError::InvalidRequest(e.to_string()))
    }

    /// The engine's tokenizer (shared by its models), if their folders have one.
    pub fn tokenizer(&self) -> Option<&TextTokenizer> {
        self.shared.tokenizer.as_ref()
    }

    /// Encodes text through the tokenizer actor.
    pub async fn encode(&self, text: String, add_special_tokens: bool) -> Result<Vec<u32>, EngineError> {
        self.encode_in_session(text, add_special_tokens, None).await
    }

    /// Encodes text continuing a session (by id, or by common prefix when `None`): only the
    /// text's end is re-tokenized, with ids identical to full tokenization.
    pub async fn encode_in_session(
        &self,
        text: String,
        add_special_tokens: bool,
        session: Option<String>,
    ) -> Result<Vec<u32>, EngineError> {
        let actor = self.tokenizer_actor()?;
        ractor::call_t!(
            actor,
            |reply| TokenizerMsg::Encode { text, add_special_tokens, session, reply },
            TOKENIZE_TIMEOUT.as_millis() as u64
        )
        .map_err(tokenizer_unavailable)?
        .map_err(tokenize_error)
    }

    /// Renders a conversation with the chat template and encodes it.
    pub async fn chat(&self, messages: Vec<ChatMessage>, options: RenderOptions) -> Result<RenderedChat, EngineError> {
        self.chat_in_session(messages, options, None).await
    }

    /// [`chat`](Self::chat), continuing a session (see [`encode_in_session`](Self::encode_in_session)).
    pub async fn chat_in_session(
        &self,
        messages: Vec<ChatMessage>,
        options: RenderOptions,
        session: Option<String>,
    ) -> Result<RenderedChat, EngineError> {
        let actor = self.tokenizer_actor()?;
        ractor::call_t!(
            actor,
            |reply| TokenizerMsg::Chat { messages, options, session, reply },
            TOKENIZE_TIMEOUT.as_millis() as u64
        )
        .map_err(tokenizer_unavailable)?
        .map_err(tokenize_error)
    }

    /// Replaces the tokenizer's session settings (stored sessions are dropped).
    pub fn configure_sessions(&self, config: SessionConfig) -> Result<(), EngineError> {
        let actor = self.tokenizer_actor()?;
        *self.shared.session_config.lock() = Some(config.clone());
        actor.send_message(TokenizerMsg::ConfigureSessions(config)).map_err(tokenizer_unavailable)
    }

    fn tokenizer_actor(&self) -> Result<ActorRef<TokenizerMsg>, EngineError> {
        self.shared
            .tokenizer_actor
            .read()
            .clone()
            .ok_or_else(|| EngineError::InvalidRequest("this engine's models have no tokenizer: send token ids".into()))
    }

    /// Whether every model can serve (its compute answers and is in service) and the
    /// tokenizer answers, each within a short time limit.
    pub async fn readiness(&self) -> Readiness {
        self.readiness_of(&self.shared.links.snapshots().await).await
    }

    /// [`readiness`](Self::readiness) from snapshots the caller already has.
    pub async fn readiness_of(&self, snapshots: &[SubserverSnapshot]) -> Readiness {
        let models = self
            .shared
            .links
            .names()
            .iter()
            .map(|name| {
                let reason = match snapshots.iter().find(|s| &s.model == name) {
                    None => Some(format!("not answering within {}s", STATS_TIMEOUT.as_secs())),
                    Some(s) if s.failed => Some("out of service after repeated failures; reloading".to_string()),
                    Some(_) => None,
                };
                ModelReadiness { model: name.clone(), ready: reason.is_none(), reason }
            })
            .collect::<Vec<_>>();
        let tokenizer = match self.shared.tokenizer.is_some() {
            true => Some(self.tokenizer_answers().await),
            false => None,
        };
        Readiness::new(models, tokenizer)
    }

    async fn tokenizer_answers(&self) -> bool {
        let Ok(actor) = self.tokenizer_actor() else { return false };
        ractor::call_t!(actor, TokenizerMsg::Ping, STATS_TIMEOUT.as_millis() as u64).is_ok()
    }

    /// Test hook: the tokenizer actor fails on its next message, as a bug would.
    #[doc(hidden)]
    pub fn inject_tokenizer_fault(&self) -> Result<(), EngineError> {
        let actor = self.tokenizer_actor()?;
        actor.send_message(TokenizerMsg::InjectPanic).map_err(|e| EngineError::Internal(e.to_string()))
    }

    /// Per-model snapshots: queues, thresholds, KV use, step statistics.
    pub async fn stats(&self) -> Vec<SubserverSnapshot> {
        self.shared.links.snapshots().await
    }

    /// Drops every model's cached prefix blocks that no request holds (what vLLM's
    /// `/reset_prefix_cache` does): for benchmarks that must not reuse an earlier
    /// run's prompts, or after a change that makes cached K/V stale.
    pub async fn flush_prefix_caches(&self) -> Vec<PrefixFlush> {
        self.shared.links.flush_prefix_caches().await
    }

    /// The remote subservers and the state of their nodes (empty without a cluster).
    pub fn nodes(&self) -> Vec<NodeStatus> {
        self.shared.nodes.iter().map(|n| n.lock().clone()).collect()
    }

    pub async fn kv_usage(&self) -> Option<KvUsage> {
        Some(self.shared.links.kv.usage())
    }

    pub fn active_requests(&self) -> usize {
        self.shared.links.active_count()
    }

    /// Requests whose actors compute threads can reach now (for leak checks: it must
    /// come back to zero with [`active_requests`](Self::active_requests)).
    #[doc(hidden)]
    pub fn registered_requests(&self) -> usize {
        self.shared.links.registry.len()
    }

    /// The times to first token (seconds) of requests whose first token came since the
    /// last call: what a stats history samples. Past 4,096 it keeps a uniform sample of
    /// them; `seen()` counts them all.
    pub fn take_recent_ttfts(&self) -> Samples {
        self.shared.links.take_recent_ttfts()
    }

    /// What the planner did and why (as of its last decision, also while it searches):
    /// `None` without re-planning.
    pub async fn planner_status(&self) -> Option<PlannerStatus> {
        self.replanner.as_ref().map(|(_, status)| status.get())
    }

    /// Changes the delayed-batching thresholds of every subserver.
    pub fn set_batching(&self, rule: BatchingRule) -> Result<(), EngineError> {
        rule.validate(self.shared.links.model_count()).map_err(|e| EngineError::Config(e.to_string()))?;
        if let Some((replanner, _)) = &self.replanner {
            let _ = replanner.send_message(ReplanMsg::SetRule(rule.clone()));
        }
        self.shared.links.broadcast_rule(rule);
        Ok(())
    }

    /// Test hook (and the server's opt-in fault injection): `model` panics at the
    /// chosen point, as a bug would.
    #[doc(hidden)]
    pub fn inject_fault(&self, model: usize, fault: Fault) -> Result<(), EngineError> {
        self.shared.links.to_model(model, ComputeMsg::InjectFault(fault))
    }

    /// Test hook: the actor of request `id` panics on its next message.
    #[doc(hidden)]
    pub fn inject_request_fault(&self, id: RequestId) {
        self.shared.links.registry.send_raw(id, RequestMsg::InjectPanic);
    }

    /// Stops admitting, ends in-flight requests with an error, stops every actor and
    /// compute thread.
    pub async fn shutdown(self) {
        self.shared.closing.store(true, Ordering::SeqCst);
        self.shared.links.registry.for_each(|actor| {
            let _ = actor.send_message(RequestMsg::Abort(EngineError::ShuttingDown));
        });
        self.root.stop_children_and_wait(None, None).await;
        self.root.stop(None);
        self.shared.links.to_every_model(|| ComputeMsg::Shutdown);
        let threads = std::mem::take(&mut *self.shared.threads.lock().unwrap_or_else(|p| p.into_inner()));
        // Joining blocks: do it off the async workers.
        let _ = tokio::task::spawn_blocking(move || threads.into_iter().for_each(|t| drop(t.join()))).await;
    }
}

/// Waits for a request's KV place, then launches it; gives up when the client leaves
/// (dropping `launch` frees the place) or the request's deadline passes first.
async fn launch_when_admitted(waiting: Ticket, launch: Launch, client: UnboundedSender<GenerationEvent>) {
    let deadline = launch.deadline;
    let submitted = launch.submitted;
    let out_of_time = async {
        match deadline {
            Some(limit) => tokio::time::sleep_until((submitted + limit).into()).await,
            None => std::future::pending().await,
        }
    };
    let failed = |e: EngineError| {
        let _ = client.send(GenerationEvent::error(e, Usage::default()));
    };
    tokio::select! {
        admitted = waiting.wait() => match admitted {
            Ok(()) => {
                if let Err(e) = launch.run().await {
                    failed(e);
                }
            }
            Err(e) => {
                drop(launch);
                failed(e);
            }
        },
        () = client.closed() => {}
        () = out_of_time => {
            drop(launch);
            failed(EngineError::DeadlineExceeded { limit: deadline.unwrap_or_default() });
        }
    }
}

/// Each model's compute thread (or remote link), started and loading.
struct StartedModels {
    computes: Vec<Sender<ComputeMsg>>,
    ready: Vec<flume::Receiver<Result<Loaded, EngineError>>>,
    threads: Vec<std::thread::JoinHandle<()>>,
    /// Every model's inbox, for handoffs: set once all have loaded.
    peers: Arc<OnceLock<Vec<Sender<ComputeMsg>>>>,
    shared_pages: Option<SharedPages>,
}

/// Starts a compute thread per local model and a link per remote one (each remote
/// link's handshake awaited in turn); the models load on their own threads.
async fn start_models(
    config: &EngineConfig,
    registry: &Registry,
    mut front: Option<&mut remote::FrontCluster>,
) -> Result<StartedModels, EngineError> {
    let peers = Arc::new(OnceLock::new());
    let turn = config.exclusive_compute.then(|| Arc::new(parking_lot::Mutex::new(())));
    let mut models = config.models.clone();
    let is_local = |name: &str| front.as_ref().is_none_or(|f| f.remote_for(name).is_none());
    let shared_pages = match config.admission.share_kv {
        true => share_colocated_kv(&mut models, |m| is_local(&m.name))?,
        false => None,
    };
    let shares_turn: Vec<bool> = models.iter().map(|m| turn.is_some() && is_local(&m.name)).collect();
    let mut started = StartedModels {
        computes: Vec::new(),
        ready: Vec::new(),
        threads: Vec::new(),
        peers: peers.clone(),
        shared_pages,
    };
    for spec in &models {
        let links = ComputeLinks {
            name: spec.name.clone(),
            model_names: config.models.iter().map(|m| m.name.clone()).collect(),
            peers: peers.clone(),
            registry: registry.clone(),
            turn: turn.clone(),
            shares_turn: shares_turn.clone(),
            supervision: config.supervision,
        };
        let (compute, ready, thread) = match front.as_deref_mut().filter(|f| f.remote_for(&spec.name).is_some()) {
            Some(f) => remote::spawn_link(f.link_start(started.computes.len(), spec, links)?).await?,
            None => compute::spawn(spec.clone(), links),
        };
        started.computes.push(compute);
        started.ready.push(ready);
        started.threads.push(thread);
    }
    Ok(started)
}

/// What every model reports once loaded (an error if one failed to load).
async fn await_loaded(ready: &[flume::Receiver<Result<Loaded, EngineError>>]) -> Result<Vec<Loaded>, EngineError> {
    let mut loaded = Vec::new();
    for model in ready {
        let model = model
            .recv_async()
            .await
            .map_err(|_| EngineError::Internal("a compute thread died while loading".into()))??;
        loaded.push(model);
    }
    Ok(loaded)
}

/// The engine-wide settings every subserver starts serving with.
fn send_start(config: &EngineConfig, computes: &[Sender<ComputeMsg>], shared_vocab: usize, max_context: usize) {
    for (m, tx) in computes.iter().enumerate() {
        let mut sub = SubserverConfig::new(m, config.models.len(), shared_vocab, max_context);
        sub.max_batch_rows = config.limits.max_batch_rows;
        sub.prefill_chunk = config.limits.prefill_chunk;
        sub.step_token_budget = config.limits.step_token_budget;
        sub.drafting = config.limits.drafting.clone();
        let _ = tx.send(ComputeMsg::Start(sub, config.batching.clone()));
    }
}

/// The KV budget admission draws on: every model's capacity, pages shared between
/// co-located models counted once.
fn kv_admission(
    config: &EngineConfig,
    names: &[String],
    loaded: &[Loaded],
    shared_pages: Option<SharedPages>,
) -> KvAdmission {
    let capacities = loaded.iter().map(|l| l.capacity.total_tokens()).collect();
    let mut ledger = KvLedger::new(names.to_vec(), capacities, &config.admission);
    if let Some(pages) = shared_pages {
        ledger = ledger.with_shared_pages(pages);
    }
    KvAdmission::new(ledger, config.admission.kv_wait_timeout)
}

/// Every id that ends a sequence on some model or in the tokenizer.
fn eos_ids(configs: &[ModelConfig], tokenizer: Option<&TextTokenizer>) -> Vec<u32> {
    let mut eos_ids: Vec<u32> = configs.iter().flat_map(|c| c.eos_token_ids.iter().copied()).collect();
    eos_ids.extend(tokenizer.iter().flat_map(|t| t.eos_token_ids().iter().copied()));
    eos_ids.sort_unstable();
    eos_ids.dedup();
    eos_ids
}

/// The re-planning actor, where the config asks for one; it plans at start when both
/// models' start-up costs are known.
async fn spawn_replanner(
    config: &EngineConfig,
    shared: &Arc<EngineShared>,
    step_costs: Vec<Option<LatencyTable>>,
    root: &ActorRef<()>,
) -> Result<Option<(ActorRef<ReplanMsg>, PlannerStatusCell)>, EngineError> {
    let Some(mut replan) = config.replan.clone() else { return Ok(None) };
    replan.exclusive_compute = config.exclusive_compute;
    let plan_at_start = (replan.plan_at_start && step_costs.len() == 2 && step_costs.iter().all(Option::is_some))
        .then(|| expected_delegation(&*shared.default_policy).unwrap_or(DEFAULT_DELEGATION_PRIOR));
    let mut replanner = Replanner::new(replan, config.batching.clone());
    replanner.set_priors(step_costs);
    let status = PlannerStatusCell::new(replanner.status());
    let args = ReplanArgs { replanner, engine: Arc::downgrade(&shared.links), plan_at_start, status: status.clone() };
    let actor = Actor::spawn_linked(None, ReplanActor, args, root.get_cell()).await.map_err(spawn_err)?.0;
    Ok(Some((actor, status)))
}

fn spawn_err(e: ractor::SpawnErr) -> EngineError {
    EngineError::Internal(e.to_string())
}

/// The tokenizer actor did not answer: it is being restarted, or overloaded (503).
fn tokenizer_unavailable<E: std::fmt::Display>(e: E) -> EngineError {
    EngineError::ModelUnavailable(format!("the tokenizer is not answering ({e}); retry shortly"))
}

fn tokenize_error(e: TokenizeError) -> EngineError {
    if e.is_client_error() {
        EngineError::InvalidRequest(e.to_string())
    } else {
        EngineError::Internal(e.to_string())
    }
}

/// The tokenizer of the engine's models. Models must agree on the ids they share;
/// padding of embedding tables beyond the tokenizer is fine (logits are sliced).
fn shared_tokenizer(config: &EngineConfig) -> Result<Option<TextTokenizer>, EngineError> {
    let mut found: Vec<TextTokenizer> = Vec::new();
    for m in &config.models {
        // A GGUF file's tokenizer files sit beside it.
        let folder = tokenrouter_core::model::gguf_read::files_folder(&m.path);
        if folder.join("tokenizer.json").is_file() {
            let t = TextTokenizer::from_folder(&folder)
                .map_err(|e| EngineError::ModelLoad { model: m.name.clone(), message: e.to_string() })?;
            found.push(t);
        }
    }
    for other in found.iter().skip(1) {
        shared_vocab_check(&found[0], other)
            .map_err(|e| EngineError::Config(format!("the models do not share a tokenizer: {e}")))?;
    }
    if !found.is_empty() && found.len() < config.models.len() {
        tracing::warn!("some model folders have no tokenizer.json; using the one found");
    }
    Ok(found.into_iter().next())
}
