//! The handles through which the engine's parts reach the models, in a module that
//! imports no actor: [`EngineLinks`] is all a request's actor, its launcher and the
//! re-planner may touch (each model's inbox, the registry of request actors, the KV
//! budget, the active count, the model names); [`ComputeLinks`] is what a compute thread
//! holds of the rest. The engine builds both; nobody else needs the engine to use them.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use flume::Sender;
use ractor::ActorRef;
use tokenrouter_core::sched::{Arrival, BatchingRule, RequestId};
use tokenrouter_core::stats::Samples;

use crate::config::SupervisionConfig;
use crate::error::EngineError;
use crate::kv_manager::KvAdmission;
use crate::messages::{ComputeMsg, PrefixFlush, RequestMsg, SubserverSnapshot};
use crate::registry::Registry;

/// How long a stats call may take before the caller gives up on a model.
pub(crate) const STATS_TIMEOUT: Duration = Duration::from_secs(2);

/// The most first-token times kept between two reads of [`EngineLinks::take_recent_ttfts`]:
/// a uniform sample of them when more came, so their quantiles stay unbiased.
const RECENT_TTFTS: usize = 4096;

/// What requests and the engine's helpers share: the models' inboxes and the books
/// about requests in flight.
pub(crate) struct EngineLinks {
    names: Vec<String>,
    /// Each model's one ordered inbox (a compute thread, or a remote model's link).
    computes: Vec<Sender<ComputeMsg>>,
    pub kv: KvAdmission,
    pub registry: Registry,
    /// Active request count; changes are broadcast under this lock so every
    /// subserver sees them in order (a stale high N could deadlock thresholds).
    active: Mutex<usize>,
    /// Times to first token since the last read, in seconds (a reservoir of at most
    /// `RECENT_TTFTS`, which counts every one it saw).
    recent_ttfts: parking_lot::Mutex<Samples>,
}

impl EngineLinks {
    pub fn new(names: Vec<String>, computes: Vec<Sender<ComputeMsg>>, kv: KvAdmission, registry: Registry) -> Self {
        EngineLinks {
            names,
            computes,
            kv,
            registry,
            active: Mutex::new(0),
            recent_ttfts: parking_lot::Mutex::new(Samples::reservoir(RECENT_TTFTS, 0x7474_6674)),
        }
    }

    pub fn record_ttft(&self, seconds: f64) {
        metrics::histogram!("tokenrouter_request_ttft_seconds").record(seconds);
        self.recent_ttfts.lock().push(seconds);
    }

    pub fn take_recent_ttfts(&self) -> Samples {
        self.recent_ttfts.lock().take()
    }

    pub fn names(&self) -> &[String] {
        &self.names
    }

    pub fn model_count(&self) -> usize {
        self.names.len()
    }

    pub fn model_name(&self, index: usize) -> &str {
        &self.names[index]
    }

    pub fn active_count(&self) -> usize {
        *self.active.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Per-model snapshots from the subservers that answer in time.
    pub async fn snapshots(&self) -> Vec<SubserverSnapshot> {
        self.ask_every_model(ComputeMsg::Stats).await.into_iter().flatten().collect()
    }

    /// Every model drops the prefix blocks no request holds; in model order, with no
    /// count where a model did not answer within the stats time limit.
    pub async fn flush_prefix_caches(&self) -> Vec<PrefixFlush> {
        let answers = self.ask_every_model(ComputeMsg::FlushPrefixCache).await;
        self.names
            .iter()
            .zip(answers)
            .map(|(name, dropped_blocks)| PrefixFlush { model: name.clone(), dropped_blocks })
            .collect()
    }

    /// Asks every model at once and waits for each answer up to the stats time limit;
    /// in model order, `None` where a model's inbox was full or it did not answer.
    async fn ask_every_model<T>(&self, question: impl Fn(Sender<T>) -> ComputeMsg) -> Vec<Option<T>> {
        let asked: Vec<_> = self
            .computes
            .iter()
            .map(|compute| {
                let (tx, rx) = flume::bounded(1);
                compute.try_send(question(tx)).ok().map(|_| rx)
            })
            .collect();
        let mut out = Vec::with_capacity(asked.len());
        for rx in asked {
            let answer = match rx {
                Some(rx) => tokio::time::timeout(STATS_TIMEOUT, rx.recv_async()).await.ok().and_then(Result::ok),
                None => None,
            };
            out.push(answer);
        }
        out
    }

    pub fn broadcast_rule(&self, rule: BatchingRule) {
        self.to_every_model(|| ComputeMsg::SetRule(rule.clone()));
    }

    fn change_active(&self, delta: isize) {
        let mut active = self.active.lock().unwrap_or_else(|p| p.into_inner());
        *active = active.saturating_add_signed(delta);
        self.to_every_model(|| ComputeMsg::SetActive(*active));
        metrics::gauge!("tokenrouter_active_requests").set(*active as f64);
    }

    /// Sends to every model's inbox. The inboxes are far larger than the messages a
    /// bounded number of requests can have in flight, so this does not block.
    pub fn to_every_model(&self, msg: impl Fn() -> ComputeMsg) {
        for compute in &self.computes {
            let _ = compute.send(msg());
        }
    }

    /// Sends to one model's inbox (an error if there is no such model or it is gone).
    pub fn to_model(&self, model: usize, msg: ComputeMsg) -> Result<(), EngineError> {
        let compute =
            self.computes.get(model).ok_or_else(|| EngineError::InvalidRequest(format!("no model {model}")))?;
        compute.send(msg).map_err(|_| EngineError::ModelUnavailable(format!("model {} is gone", self.names[model])))
    }

    /// Hands a request to a model (its entry, or a model that lost it).
    pub fn deliver(&self, model: usize, arrival: Arrival) -> Result<(), EngineError> {
        self.to_model(model, ComputeMsg::Arrive(arrival))
    }

    /// The request holds its reservation and has an actor: it counts as active, and
    /// compute threads accept arrivals for it from now on.
    pub fn admitted(&self, id: RequestId, actor: ActorRef<RequestMsg>) {
        self.registry.insert(id, actor);
        self.change_active(1);
    }

    pub fn kv_release(&self, id: RequestId) {
        self.kv.release(id);
    }

    /// The request ended: free it on every model and in the KV budget. It leaves the
    /// registry first, so an arrival still on its way is refused where it lands.
    pub fn release(&self, id: RequestId) {
        self.registry.remove(id);
        self.to_every_model(|| ComputeMsg::Release(id));
        self.kv.release(id);
        self.change_active(-1);
    }
}

/// What a compute thread holds of the rest of the engine: its peers' inboxes (for
/// handoffs), the registry (for events), and the turn on shared cores.
pub(crate) struct ComputeLinks {
    pub name: String,
    /// Every model's name, by index (for per-peer metrics).
    pub model_names: Vec<String>,
    pub peers: Arc<OnceLock<Vec<Sender<ComputeMsg>>>>,
    pub registry: Registry,
    /// Held for the duration of a step when models take turns on shared cores.
    pub turn: Option<Arc<parking_lot::Mutex<()>>>,
    /// By model index: whether that model takes turns on `turn` with this one (known
    /// for an engine's local models; all false where it is not known).
    pub shares_turn: Vec<bool>,
    pub supervision: SupervisionConfig,
}
