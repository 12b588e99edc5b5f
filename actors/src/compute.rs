//! The compute thread of one subserver: it owns the model, its KV and the scheduling
//! state, and never shares them. Control, arrivals and handoffs reach it over a
//! bounded flume channel; tokens leave to request actors, moving requests straight to
//! the peer's compute thread.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use flume::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use tokenrouter_core::model::{load_backend, KvCapacity, ModelConfig};
use tokenrouter_core::sched::{
    Arrival, BatchingRule, RequestEvent, RequestId, StepOutcome, Subserver, SubserverConfig, SubserverStats,
};

use crate::config::ModelSpec;
use crate::error::EngineError;
use crate::registry::Registry;

/// Bound of every compute inbox. In-flight messages are bounded by active requests;
/// this only guards against a runaway producer.
pub(crate) const INBOX_CAPACITY: usize = 65_536;

pub(crate) enum ComputeMsg {
    /// The engine-wide settings, once every model has loaded.
    Start(SubserverConfig, BatchingRule),
    Arrive(Arrival),
    Release(RequestId),
    SetActive(usize),
    SetRule(BatchingRule),
    Stats(Sender<SubserverSnapshot>),
    /// Test hook: the next step panics, as a bug in model code would.
    InjectPanic,
    Shutdown,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct SubserverSnapshot {
    pub model: String,
    pub ready: usize,
    pub pending: usize,
    pub threshold: usize,
    pub kv: KvCapacity,
    pub stats: SubserverStats,
    pub restarts: u64,
}

/// What a loaded model reports before serving.
pub(crate) struct Loaded {
    pub config: ModelConfig,
    pub capacity: KvCapacity,
}

pub(crate) struct ComputeLinks {
    pub name: String,
    /// Every model's name, by index (for per-peer metrics).
    pub model_names: Vec<String>,
    pub peers: Arc<OnceLock<Vec<Sender<ComputeMsg>>>>,
    pub registry: Registry,
    /// Held for the duration of a step when models take turns on shared cores.
    pub turn: Option<Arc<parking_lot::Mutex<()>>>,
}

/// Starts the thread; it loads the model and reports on `loaded` before serving.
pub(crate) fn spawn(
    spec: ModelSpec,
    links: ComputeLinks,
) -> (Sender<ComputeMsg>, Receiver<Result<Loaded, EngineError>>, std::thread::JoinHandle<()>) {
    let (tx, rx) = flume::bounded(INBOX_CAPACITY);
    let (loaded_tx, loaded_rx) = flume::bounded(1);
    let handle = std::thread::Builder::new()
        .name(format!("compute-{}", spec.name))
        .spawn(move || {
            let backend = match load_backend(&spec.path, &spec.load) {
                Ok(b) => b,
                Err(e) => {
                    let _ = loaded_tx
                        .send(Err(EngineError::ModelLoad { model: spec.name.clone(), message: e.to_string() }));
                    return;
                }
            };
            let _ = loaded_tx.send(Ok(Loaded { config: backend.config().clone(), capacity: backend.kv_capacity() }));
            if let Ok(ComputeMsg::Start(config, rule)) = rx.recv() {
                let work =
                    ComputeLoop { sub: Subserver::new(config, backend, rule), links, restarts: 0, panic_next: false };
                match own_pool(spec.load.threads) {
                    Some(pool) => pool.install(|| work.run(&rx)),
                    None => work.run(&rx),
                }
            }
        })
        .expect("spawning a compute thread");
    (tx, loaded_rx, handle)
}

fn own_pool(threads: Option<usize>) -> Option<rayon::ThreadPool> {
    let n = threads?;
    match rayon::ThreadPoolBuilder::new().num_threads(n).build() {
        Ok(pool) => Some(pool),
        Err(e) => {
            tracing::warn!(%e, "cannot build a model thread pool; sharing the process pool");
            None
        }
    }
}

struct ComputeLoop {
    sub: Subserver,
    links: ComputeLinks,
    restarts: u64,
    panic_next: bool,
}

impl ComputeLoop {
    fn run(mut self, rx: &Receiver<ComputeMsg>) {
        loop {
            loop {
                match rx.try_recv() {
                    Ok(msg) => {
                        if !self.handle(msg) {
                            return;
                        }
                    }
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => return,
                }
            }
            if self.sub.should_launch(Instant::now()) {
                self.step();
                continue;
            }
            let msg = match self.sub.deadline() {
                Some(deadline) => match rx.recv_deadline(deadline) {
                    Ok(msg) => msg,
                    Err(RecvTimeoutError::Timeout) => continue,
                    Err(RecvTimeoutError::Disconnected) => return,
                },
                None => match rx.recv() {
                    Ok(msg) => msg,
                    Err(_) => return,
                },
            };
            if !self.handle(msg) {
                return;
            }
        }
    }

    /// Applies one message; false when the thread should end.
    fn handle(&mut self, msg: ComputeMsg) -> bool {
        match msg {
            ComputeMsg::Arrive(arrival) => {
                let id = arrival.spec.id;
                if let Err(e) = self.sub.arrive(arrival) {
                    self.notify(RequestEvent::Failed { id, message: format!("model {}: {e}", self.links.name) });
                }
            }
            ComputeMsg::Release(id) => {
                self.sub.release(id);
            }
            ComputeMsg::SetActive(n) => self.sub.set_active(n),
            ComputeMsg::SetRule(rule) => self.sub.set_rule(rule),
            ComputeMsg::Stats(reply) => {
                let _ = reply.send(self.snapshot());
            }
            ComputeMsg::InjectPanic => self.panic_next = true,
            ComputeMsg::Start(..) => {}
            ComputeMsg::Shutdown => return false,
        }
        true
    }

    fn step(&mut self) {
        let inject = std::mem::take(&mut self.panic_next);
        let turn = self.links.turn.clone();
        let guard = turn.as_ref().map(|t| t.lock());
        let sub = &mut self.sub;
        let result = catch_unwind(AssertUnwindSafe(|| {
            if inject {
                panic!("injected fault");
            }
            sub.step()
        }));
        // Fair hand-over: a waiting model gets the next turn.
        if let Some(guard) = guard {
            parking_lot::MutexGuard::unlock_fair(guard);
        }
        match result {
            Ok(outcome) => self.dispatch(outcome),
            Err(_) => self.restart(),
        }
    }

    /// After a panic the scheduling state cannot be trusted: start afresh on the same
    /// weights and end every request this model held with a clear error.
    fn restart(&mut self) {
        self.restarts += 1;
        tracing::error!(model = %self.links.name, "compute step panicked; restarting the subserver");
        metrics::counter!("tokenrouter_subserver_restarts_total", "model" => self.links.name.clone()).increment(1);
        for id in self.sub.reset() {
            let message = format!("model {} failed while holding this request and restarted", self.links.name);
            self.notify(RequestEvent::Failed { id, message });
        }
    }

    fn dispatch(&mut self, outcome: StepOutcome) {
        self.record(&outcome);
        // Events first: a peer's tokens for this request must not overtake ours.
        for event in outcome.events {
            self.notify(event);
        }
        let peers = self.links.peers.get().expect("peers are set before serving");
        for (to, arrival) in outcome.handoffs {
            if peers[to].send(ComputeMsg::Arrive(arrival)).is_err() {
                tracing::warn!(model = %self.links.name, to, "peer subserver is gone");
            }
        }
    }

    fn notify(&self, event: RequestEvent) {
        self.links.registry.send(event);
    }

    fn record(&self, outcome: &StepOutcome) {
        let model = self.links.name.clone();
        metrics::histogram!("tokenrouter_step_seconds", "model" => model.clone()).record(outcome.elapsed.as_secs_f64());
        metrics::histogram!("tokenrouter_batch_rows", "model" => model.clone()).record(outcome.rows as f64);
        metrics::counter!("tokenrouter_tokens_fed_total", "model" => model.clone())
            .increment(outcome.tokens_fed as u64);
        for (to, _) in &outcome.handoffs {
            let peer = self.links.model_names.get(*to).cloned().unwrap_or_default();
            metrics::counter!("tokenrouter_handoffs_total", "from" => model.clone(), "to" => peer).increment(1);
        }
        let committed = outcome.events.iter().filter(|e| matches!(e, RequestEvent::Token { .. })).count();
        metrics::counter!("tokenrouter_tokens_generated_total", "model" => model.clone()).increment(committed as u64);
        let st = self.sub.stats();
        let decided = st.tokens_committed + st.handoffs_out;
        if decided > 0 {
            metrics::gauge!("tokenrouter_routed_fraction", "model" => model.clone())
                .set(st.handoffs_out as f64 / decided as f64);
        }
        let kv = self.sub.backend().kv_capacity();
        metrics::gauge!("tokenrouter_kv_blocks_used", "model" => model.clone()).set(kv.used_blocks() as f64);
        metrics::gauge!("tokenrouter_kv_blocks_total", "model" => model.clone()).set(kv.total_blocks as f64);
        metrics::gauge!("tokenrouter_ready_requests", "model" => model.clone()).set(self.sub.ready_count() as f64);
        metrics::gauge!("tokenrouter_pending_requests", "model" => model).set(self.sub.pending_count() as f64);
    }

    fn snapshot(&self) -> SubserverSnapshot {
        SubserverSnapshot {
            model: self.links.name.clone(),
            ready: self.sub.ready_count(),
            pending: self.sub.pending_count(),
            threshold: self.sub.threshold(),
            kv: self.sub.backend().kv_capacity(),
            stats: self.sub.stats().clone(),
            restarts: self.restarts,
        }
    }
}
