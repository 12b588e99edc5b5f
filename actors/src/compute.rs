//! The compute thread of one subserver: it owns the model, its KV and the scheduling
//! state, and never shares them. Everything about a request reaches it through its
//! one bounded inbox, in order — admissions and resumes from the request's owner,
//! moves from peers' compute threads, releases — and it refuses an arrival for a
//! request that has already ended, so a release that overtakes a move cannot leave
//! KV behind. Tokens leave to request actors; moving requests go straight to the
//! peer's compute thread.
//!
//! The thread supervises itself: a panic in a step or in message handling is caught,
//! the requests it interrupted are rebuilt from their committed tokens (their owners
//! send them again from position 0), every other request recomputes its KV, and the
//! model serves on with the same weights. A model that keeps panicking is taken out
//! of service: its requests, and every later one that needs it, fail with a clear
//! error instead of hanging.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use flume::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use tokenrouter_core::model::{load_backend, profile, Backend, StepCostSource};
use tokenrouter_core::policy::ModelIndex;
use tokenrouter_core::sched::planner::LatencyTable;
use tokenrouter_core::sched::{
    Arrival, BatchingRule, Checkpoint, FaultPoint, RequestEvent, RequestId, StepOutcome, Subserver, SubserverConfig,
};

use crate::config::{ModelSpec, SupervisionConfig};
use crate::error::EngineError;
use crate::handles::ComputeLinks;
use crate::messages::{ComputeMsg, Fault, Loaded, SubserverSnapshot, INBOX_CAPACITY};

/// Test hook: how long a compute thread waits between sending a step's events and its
/// handoffs, widening the window in which a client's release can overtake a move.
static HANDOFF_DELAY_US: AtomicU64 = AtomicU64::new(0);

#[cfg(feature = "test-hooks")]
pub fn set_handoff_delay_for_tests(delay: Duration) {
    HANDOFF_DELAY_US.store(delay.as_micros() as u64, Ordering::Relaxed);
}

/// Panics within [`PANIC_WINDOW`] after which a model gives up.
const MAX_PANICS: usize = 5;
const PANIC_WINDOW: Duration = Duration::from_secs(60);

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
            // Models that take turns on shared cores also load and profile in turn: a
            // start-up profile timed while the other model loads reads several times slow.
            let loading_turn = links.turn.as_deref().map(|turn| turn.lock());
            let backend = match load_backend(&spec.path, &spec.load) {
                Ok(b) => b,
                Err(e) => {
                    let _ = loaded_tx
                        .send(Err(EngineError::ModelLoad { model: spec.name.clone(), message: e.to_string() }));
                    return;
                }
            };
            let mut backend = backend;
            let pool = own_pool(spec.load.threads);
            let mut measure = || startup_step_cost(backend.as_mut(), &spec);
            let step_cost = match &pool {
                Some(pool) => pool.install(measure),
                None => measure(),
            };
            drop(loading_turn);
            let _ = loaded_tx.send(Ok(Loaded {
                config: backend.config().clone(),
                capacity: backend.kv_capacity(),
                pool: Some(backend.kv_pool().clone()),
                step_cost,
            }));
            if let Ok(ComputeMsg::Start(config, rule)) = rx.recv() {
                let work = ComputeLoop::new(Subserver::new(config.clone(), backend, rule), links, spec, config);
                match &pool {
                    Some(pool) => pool.install(|| work.run(&rx)),
                    None => work.run(&rx),
                }
            }
        })
        .expect("spawning a compute thread");
    (tx, loaded_rx, handle)
}

/// The planner's start-up cost of this model by tokens fed: saved, or measured here
/// (under the compute turn its caller holds, so that models sharing cores do not time
/// each other).
fn startup_step_cost(backend: &mut dyn Backend, spec: &ModelSpec) -> Option<LatencyTable> {
    let points = match &spec.load.step_cost {
        StepCostSource::None => return None,
        StepCostSource::Saved(points) => points.clone(),
        StepCostSource::Measure { max_rows, max_tokens } => {
            let started = Instant::now();
            match profile::step_cost_points(backend, *max_rows, *max_tokens, profile::STARTUP_PROFILE_MAX_STEP) {
                Ok(points) => {
                    tracing::info!(model = %spec.name, ?points, seconds = started.elapsed().as_secs_f64(),
                        "start-up profile (tokens fed, ms)");
                    points
                }
                Err(e) => {
                    tracing::warn!(model = %spec.name, error = %e, "start-up profile failed; planning from served steps only");
                    return None;
                }
            }
        }
    };
    LatencyTable::from_points(points)
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

/// The message being handled, to undo it if its handling panics.
enum Handling {
    Arrive(Checkpoint),
    Release(RequestId),
}

#[derive(Default)]
struct Health {
    restarts: u64,
    resumed: u64,
    recent_panics: VecDeque<Instant>,
    failed: bool,
    /// Reloads from the weights after going out of service.
    reloads: u64,
    /// Times out of service in a row (a reload that soon fails again counts on).
    outages_in_a_row: u32,
    /// When the model last came back from an outage.
    back_since: Option<Instant>,
}

impl Health {
    /// How long to wait before reloading after this outage.
    fn backoff(&mut self, config: &SupervisionConfig, now: Instant) -> Duration {
        if self.back_since.is_some_and(|t| now.duration_since(t) > PANIC_WINDOW) {
            self.outages_in_a_row = 0;
        }
        self.outages_in_a_row += 1;
        let doubled = config.restart_backoff.saturating_mul(1 << (self.outages_in_a_row - 1).min(16));
        doubled.min(config.max_restart_backoff.max(config.restart_backoff))
    }

    /// Counts a panic; false when the model has panicked too often to go on.
    fn panicked(&mut self, now: Instant) -> bool {
        self.recent_panics.push_back(now);
        while self.recent_panics.front().is_some_and(|&t| now.duration_since(t) > PANIC_WINDOW) {
            self.recent_panics.pop_front();
        }
        self.recent_panics.len() <= MAX_PANICS
    }
}

struct ComputeLoop {
    sub: Subserver,
    links: ComputeLinks,
    health: Health,
    handling: Option<Handling>,
    fault_on_message: bool,
    fault_on_recover: bool,
    /// What a reload from the weights starts from: the model, its subserver settings,
    /// and the latest rule and active count the engine sent.
    spec: ModelSpec,
    config: SubserverConfig,
    rule: BatchingRule,
    active: usize,
}

impl ComputeLoop {
    fn new(sub: Subserver, links: ComputeLinks, spec: ModelSpec, config: SubserverConfig) -> Self {
        let rule = sub.rule().clone();
        ComputeLoop {
            sub,
            links,
            health: Health::default(),
            handling: None,
            fault_on_message: false,
            fault_on_recover: false,
            spec,
            config,
            rule,
            active: 0,
        }
    }

    /// Serves until shutdown. Every path runs under a panic guard: a panic while serving
    /// is recovered from; one while recovering takes the model out of service, as
    /// repeated panics do; out of service, it reloads from its weights after a backoff.
    fn run(mut self, rx: &Receiver<ComputeMsg>) {
        self.set_ready_gauge(true);
        loop {
            if catch_unwind(AssertUnwindSafe(|| self.serve(rx))).is_ok() {
                return;
            }
            if self.recover_guarded() {
                continue;
            }
            loop {
                match catch_unwind(AssertUnwindSafe(|| self.out_of_service_until_reloaded(rx))) {
                    Ok(true) => break,
                    Ok(false) => return,
                    Err(_) => tracing::error!(model = %self.links.name, "compute panicked while out of service"),
                }
            }
        }
    }

    /// [`recover`](Self::recover) under the panic guard; false when the model is out of
    /// service now.
    fn recover_guarded(&mut self) -> bool {
        match catch_unwind(AssertUnwindSafe(|| self.recover())) {
            Ok(serving) => serving,
            Err(_) => {
                tracing::error!(model = %self.links.name, "compute panicked while recovering; out of service");
                if catch_unwind(AssertUnwindSafe(|| self.give_up())).is_err() {
                    // What the subserver held is unknown now: its requests end at their
                    // deadlines; the reload starts from nothing.
                    tracing::error!(model = %self.links.name, "compute panicked while giving up its requests");
                    self.health.failed = true;
                }
                false
            }
        }
    }

    /// The loop proper; returns on shutdown.
    fn serve(&mut self, rx: &Receiver<ComputeMsg>) {
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
                if !self.step(rx) {
                    return;
                }
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
            ComputeMsg::Arrive(arrival) => self.arrive(arrival),
            ComputeMsg::Release(id) => {
                self.handling = Some(Handling::Release(id));
                self.sub.release(id);
            }
            ComputeMsg::SetActive(n) => {
                self.active = n;
                self.sub.set_active(n);
            }
            ComputeMsg::SetRule(rule) => {
                self.rule = rule.clone();
                self.sub.set_rule(rule);
            }
            ComputeMsg::Stats(reply) => {
                let _ = reply.send(self.snapshot());
            }
            ComputeMsg::FlushPrefixCache(reply) => {
                let _ = reply.send(self.sub.backend().kv_pool().flush_prefix_cache());
            }
            ComputeMsg::InjectFault(Fault::Step) => self.sub.inject_fault(FaultPoint::BeforeForward),
            ComputeMsg::InjectFault(Fault::MidApply) => self.sub.inject_fault(FaultPoint::MidApply),
            ComputeMsg::InjectFault(Fault::Message) => self.fault_on_message = true,
            ComputeMsg::InjectFault(Fault::Recover) => self.fault_on_recover = true,
            ComputeMsg::Start(..) => {}
            ComputeMsg::Shutdown => return false,
        }
        self.handling = None;
        true
    }

    fn arrive(&mut self, arrival: Arrival) {
        let id = arrival.spec.id;
        if !self.links.registry.is_live(id) {
            // It ended while this arrival was on its way: nothing may stay here.
            self.sub.release(id);
            return;
        }
        self.handling = Some(Handling::Arrive(Checkpoint::of_arrival(&arrival)));
        if let Err(e) = self.sub.arrive(arrival) {
            self.notify(RequestEvent::Failed { id, message: format!("model {}: {e}", self.links.name) });
        }
        if std::mem::take(&mut self.fault_on_message) {
            panic!("injected fault while handling an arrival");
        }
    }

    /// One step, in this model's turn where models share the cores; false when a
    /// message taken in while waiting for the turn said to shut down.
    fn step(&mut self, rx: &Receiver<ComputeMsg>) -> bool {
        let turn = self.links.turn.clone();
        let guard = turn.as_ref().map(|t| t.lock());
        if guard.is_some() {
            // Rows a peer handed here while this model waited for its turn join this
            // step: a peer's short step (a tiny model's, a draft's) often ends by
            // sending back the very rows this step would otherwise run without.
            while let Ok(msg) = rx.try_recv() {
                if !self.handle(msg) {
                    return false;
                }
            }
            if !self.sub.should_launch(Instant::now()) {
                return true;
            }
        }
        let outcome = self.sub.step();
        let grace = self.hand_over_grace(&outcome.handoffs);
        // Handoffs go out before the turn does, so that a peer waiting for the turn
        // finds them in its inbox when it gets it.
        self.dispatch(outcome);
        if let (Some(guard), Some(turn)) = (guard, turn.as_deref()) {
            // Fair hand-over: a waiting model gets the next turn.
            parking_lot::MutexGuard::unlock_fair(guard);
            if grace.is_some_and(|grace| !let_peer_take_the_turn(turn, grace)) {
                // No peer came for the turn in time: rows a peer sends straight back
                // will miss this model's next step.
                metrics::counter!("tokenrouter_turn_handover_missed_total", "model" => self.links.name.clone())
                    .increment(1);
            }
        }
        true
    }

    /// How long to leave the turn to the peers this step handed rows to.
    fn hand_over_grace(&self, handoffs: &[(ModelIndex, Arrival)]) -> Option<Duration> {
        if handoffs.is_empty() {
            return None;
        }
        let thresholds = self.rule.effective(self.active.max(1));
        let steps_again = self.sub.should_launch(Instant::now());
        hand_over_grace(handoffs.iter().map(|(to, _)| *to), &self.links.shares_turn, &thresholds, steps_again)
    }

    /// After a panic: take out what it interrupted, have the owners of those requests
    /// send them again from their committed tokens, and serve on. False when the model
    /// has panicked too often and gives up.
    fn recover(&mut self) -> bool {
        let name = self.links.name.clone();
        self.health.restarts += 1;
        metrics::counter!("tokenrouter_subserver_restarts_total", "model" => name.clone()).increment(1);
        if !self.health.panicked(Instant::now()) {
            tracing::error!(model = %name, "compute panicked {MAX_PANICS}+ times within a minute; out of service");
            self.give_up();
            return false;
        }
        tracing::error!(model = %name, "compute panicked; restarting the subserver and resuming its requests");
        if std::mem::take(&mut self.fault_on_recover) {
            panic!("injected fault while recovering");
        }
        let mut lost = self.sub.recover();
        match self.handling.take() {
            Some(Handling::Arrive(checkpoint)) => {
                self.sub.release(checkpoint.spec.id);
                lost.retain(|c| c.spec.id != checkpoint.spec.id);
                lost.push(checkpoint);
            }
            Some(Handling::Release(id)) => {
                self.sub.release(id);
            }
            None => {}
        }
        let leaked = self.sub.backend().kv_capacity().used_blocks;
        if leaked > 0 && self.sub.resident_ids().is_empty() {
            tracing::error!(model = %name, leaked, "KV blocks did not come back after the panic");
        }
        let model = self.sub.model();
        for checkpoint in lost {
            self.health.resumed += 1;
            self.notify(checkpoint.resume_event(model));
        }
        true
    }

    /// Ends every request this model holds, or was handling, with an error.
    fn give_up(&mut self) {
        self.health.failed = true;
        let mut ids = self.sub.reset();
        if let Some(Handling::Arrive(c)) = self.handling.take() {
            ids.push(c.spec.id);
        }
        ids.sort_unstable();
        ids.dedup();
        for id in ids {
            self.notify(RequestEvent::OutOfService { id, message: self.out_of_service() });
        }
    }

    fn out_of_service(&self) -> String {
        format!("model {} failed repeatedly and is out of service", self.links.name)
    }

    /// Out of service: the model answers and fails what needs it (503) until it has
    /// reloaded from its weights, tried after a backoff that grows while reloads fail or
    /// soon fail again. False on shutdown.
    fn out_of_service_until_reloaded(&mut self, rx: &Receiver<ComputeMsg>) -> bool {
        self.health.failed = true;
        self.set_ready_gauge(false);
        let mut wait = self.health.backoff(&self.links.supervision, Instant::now());
        let mut retry_at = Instant::now() + wait;
        loop {
            match rx.recv_deadline(retry_at) {
                Ok(ComputeMsg::Shutdown) | Err(RecvTimeoutError::Disconnected) => return false,
                Ok(msg) => self.handle_out_of_service(msg),
                Err(RecvTimeoutError::Timeout) => match self.reload() {
                    Ok(()) => return true,
                    Err(message) => {
                        tracing::error!(model = %self.links.name, %message, "reloading failed; retrying later");
                        wait = self.health.backoff(&self.links.supervision, Instant::now());
                        retry_at = Instant::now() + wait;
                    }
                },
            }
        }
    }

    /// Whether the model serves, for `/metrics` (a scrape sees an outage at once).
    fn set_ready_gauge(&self, ready: bool) {
        let value = if ready { 1.0 } else { 0.0 };
        metrics::gauge!("tokenrouter_model_ready", "model" => self.links.name.clone()).set(value);
    }

    fn handle_out_of_service(&mut self, msg: ComputeMsg) {
        match msg {
            ComputeMsg::Arrive(arrival) => {
                let id = arrival.spec.id;
                self.notify(RequestEvent::OutOfService { id, message: self.out_of_service() });
            }
            ComputeMsg::Stats(reply) => {
                let _ = reply.send(self.snapshot());
            }
            ComputeMsg::SetActive(n) => self.active = n,
            ComputeMsg::SetRule(rule) => self.rule = rule,
            _ => {}
        }
    }

    /// A fresh subserver on the weights loaded again. The old one is emptied (its
    /// requests and prefix cache, which the panics may have spoiled) and dropped once the
    /// new one has loaded.
    fn reload(&mut self) -> Result<(), String> {
        let name = self.links.name.clone();
        let _ = catch_unwind(AssertUnwindSafe(|| {
            self.sub.reset();
            let _ = self.sub.backend().kv_pool().flush_prefix_cache();
        }));
        let loaded = catch_unwind(AssertUnwindSafe(|| load_backend(&self.spec.path, &self.spec.load)))
            .map_err(|_| "the loader panicked".to_string())?
            .map_err(|e| e.to_string())?;
        let mut sub = Subserver::new(self.config.clone(), loaded, self.rule.clone());
        sub.set_active(self.active);
        // A failed reload leaves the model as it was: out of service, trying again later.
        self.sub = sub;
        self.health.failed = false;
        self.health.reloads += 1;
        self.health.back_since = Some(Instant::now());
        self.health.recent_panics.clear();
        self.set_ready_gauge(true);
        metrics::counter!("tokenrouter_model_reloads_total", "model" => name.clone()).increment(1);
        tracing::warn!(model = %name, "reloaded from its weights; serving again");
        Ok(())
    }

    fn dispatch(&mut self, outcome: StepOutcome) {
        self.record(&outcome);
        // Events first: a peer's tokens for this request must not overtake ours.
        for event in outcome.events {
            self.notify(event);
        }
        let peers = self.links.peers.get().expect("peers are set before serving");
        let delay = HANDOFF_DELAY_US.load(Ordering::Relaxed);
        if delay > 0 && !outcome.handoffs.is_empty() {
            std::thread::sleep(Duration::from_micros(delay));
        }
        for (to, arrival) in outcome.handoffs {
            let id = arrival.spec.id;
            if peers[to].send(ComputeMsg::Arrive(arrival)).is_err() {
                let message = format!("model {} is gone", self.links.model_names[to]);
                self.notify(RequestEvent::Failed { id, message });
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
        // A draft model's legs are speculation, counted below, not routing.
        for (to, _) in outcome.handoffs.iter().filter(|(_, arrival)| arrival.draft.is_none()) {
            let peer = self.links.model_names.get(*to).cloned().unwrap_or_default();
            metrics::counter!("tokenrouter_handoffs_total", "from" => model.clone(), "to" => peer).increment(1);
        }
        let committed = outcome.events.iter().filter(|e| matches!(e, RequestEvent::Token { .. })).count();
        metrics::counter!("tokenrouter_tokens_generated_total", "model" => model.clone()).increment(committed as u64);
        for event in &outcome.events {
            if let RequestEvent::Verified { accepted, .. } = event {
                metrics::histogram!("tokenrouter_spec_accepted_tokens", "model" => model.clone())
                    .record(*accepted as f64);
            }
        }
        let st = self.sub.stats();
        if st.verify_rows > 0 {
            metrics::counter!("tokenrouter_spec_drafted_tokens_total", "model" => model.clone())
                .absolute(st.drafted_tokens);
            metrics::counter!("tokenrouter_spec_accepted_tokens_total", "model" => model.clone())
                .absolute(st.accepted_draft_tokens);
            metrics::gauge!("tokenrouter_spec_acceptance_rate", "model" => model.clone())
                .set(st.accepted_draft_tokens as f64 / st.drafted_tokens.max(1) as f64);
        }
        if st.draft_rounds > 0 {
            metrics::counter!("tokenrouter_spec_draft_rounds_total", "model" => model.clone())
                .absolute(st.draft_rounds);
        }
        if st.drafts_sampled > 0 {
            metrics::counter!("tokenrouter_spec_drafts_sampled_total", "model" => model.clone())
                .absolute(st.drafts_sampled);
        }
        let decided = st.tokens_committed + st.handoffs_out;
        if decided > 0 {
            metrics::gauge!("tokenrouter_routed_fraction", "model" => model.clone())
                .set(st.handoffs_out as f64 / decided as f64);
        }
        let kv = self.sub.backend().kv_capacity();
        metrics::gauge!("tokenrouter_kv_blocks_used", "model" => model.clone()).set(kv.used_blocks as f64);
        metrics::gauge!("tokenrouter_kv_blocks_total", "model" => model.clone()).set(kv.total_blocks as f64);
        metrics::gauge!("tokenrouter_kv_blocks_cached", "model" => model.clone()).set(kv.cached_blocks as f64);
        metrics::counter!("tokenrouter_prefix_cache_lookup_tokens_total", "model" => model.clone())
            .absolute(st.prefix_lookup_tokens);
        metrics::counter!("tokenrouter_prefix_cache_hit_tokens_total", "model" => model.clone())
            .absolute(st.prefix_hit_tokens);
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
            restarts: self.health.restarts,
            resumed: self.health.resumed,
            failed: self.health.failed,
            reloads: self.health.reloads,
        }
    }
}

/// How long a model that just handed rows to a peer sharing its cores leaves the turn
/// to that peer: long enough for the peer's thread to wake and queue for it.
const PEER_TURN_GRACE: Duration = Duration::from_micros(200);

/// The same, for a peer that will step once it runs (it shares the turn and now holds
/// its threshold of rows). On two cores its thread can wait for a core longer than
/// [`PEER_TURN_GRACE`] (this model's pool threads spin a while after a step): with
/// R-Stitch at N = 16 on the smollm2 pair, 156 of ~1,000 large-model steps gave the turn
/// up in vain, and the rows the small model sent straight back missed the next step.
const PEER_TURN_LONG_GRACE: Duration = Duration::from_millis(2);

/// How long a model that handed rows to `peers` (one entry a row) leaves them the turn;
/// `None` when it handed none. The wait matters when this model would step again at
/// once (`steps_again`) without the rows a peer sends straight back. A peer that shares
/// the turn (`shares_turn`) and now holds at least its threshold of rows steps as soon
/// as its thread runs, so it then gets [`PEER_TURN_LONG_GRACE`]; otherwise the peer may
/// not step at all, and [`PEER_TURN_GRACE`] bounds the wait.
fn hand_over_grace(
    peers: impl Iterator<Item = ModelIndex>,
    shares_turn: &[bool],
    thresholds: &[usize],
    steps_again: bool,
) -> Option<Duration> {
    let mut rows = vec![0usize; shares_turn.len().max(thresholds.len())];
    let mut any = false;
    for peer in peers {
        any = true;
        if let Some(count) = rows.get_mut(peer) {
            *count += 1;
        }
    }
    let will_step = |(peer, &count): (usize, &usize)| {
        count > 0 && shares_turn.get(peer) == Some(&true) && thresholds.get(peer).is_some_and(|&t| count >= t)
    };
    match (any, steps_again && rows.iter().enumerate().any(will_step)) {
        (false, _) => None,
        (true, true) => Some(PEER_TURN_LONG_GRACE),
        (true, false) => Some(PEER_TURN_GRACE),
    }
}

/// After a step that handed rows to peers, waits (at most `grace`) until one
/// of them holds the turn. Without it this model's thread, already running, would take
/// the turn back before the peer woke: each row a peer sends straight back (R-Stitch's
/// small model, unsure, returns it at once) then missed the next step here, and a step
/// at N = 4 ran 2.6 rows on average instead of 4. The planner's chain assumes what
/// this gives: a model that waited takes the next turn.
/// True when a peer took the turn within `grace`.
fn let_peer_take_the_turn(turn: &parking_lot::Mutex<()>, grace: Duration) -> bool {
    let start = Instant::now();
    // Sleeps, not spins: on two cores a spinning thread can hold the core the peer
    // needs to wake on.
    while !turn.is_locked() && start.elapsed() < grace {
        std::thread::sleep(Duration::from_micros(20));
    }
    turn.is_locked()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_that_will_step_gets_the_long_grace_and_others_the_short_one() {
        let (both_share, thresholds) = ([true, true], [1, 3]);
        let grace = |peers: &[usize], shares: &[bool], steps_again: bool| {
            hand_over_grace(peers.iter().copied(), shares, &thresholds, steps_again)
        };
        assert_eq!(grace(&[], &both_share, true), None);
        // The small model (threshold 1) gets a row back: it steps once it runs.
        assert_eq!(grace(&[0], &both_share, true), Some(PEER_TURN_LONG_GRACE));
        // ... but a model with nothing left to run would not take the turn back anyway.
        assert_eq!(grace(&[0], &both_share, false), Some(PEER_TURN_GRACE));
        // Two rows to a large model that waits for three: it may not step.
        assert_eq!(grace(&[1, 1], &both_share, true), Some(PEER_TURN_GRACE));
        assert_eq!(grace(&[1, 1, 1], &both_share, true), Some(PEER_TURN_LONG_GRACE));
        // A peer on another host never takes this turn.
        assert_eq!(grace(&[0], &[false, true], true), Some(PEER_TURN_GRACE));
    }
}
