//! The front's side of a remote model: to the rest of the engine it is one more compute
//! thread (a flume inbox of `ComputeMsg`); underneath, a link actor turns those messages
//! into frames for the node, delivers the node's events and handoffs locally, watches
//! the node's health, and on a loss resumes its requests on a replacement or ends them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use flume::{Receiver, Sender};
use parking_lot::Mutex;
use ractor::{Actor, ActorProcessingErr, ActorRef, ActorStatus};
use tokenrouter_core::model::{KvCapacity, ModelConfig};
use tokenrouter_core::sched::{RequestEvent, RequestId};

use super::cluster::{self, ClusterServer};
use super::health::{Health, LinkState, TickVerdict};
use super::ledger::FrontLedger;
use super::messages::{LinkMsg, NodeMsg};
use super::stats::{record_frame, snapshot_from_json, Direction};
use super::wire::{Frame, Hello, RuleWire, StartWire, Welcome};
use super::{ClusterConfig, NodeStatus, RemoteModel};
use crate::error::EngineError;
use crate::handles::ComputeLinks;
use crate::messages::{ComputeMsg, Loaded, SubserverSnapshot, INBOX_CAPACITY};

/// Ask the node for a stats snapshot every this many heartbeats.
const STATS_EVERY_TICKS: u64 = 5;
/// Greet again after this many heartbeats without a welcome.
const GREETING_RETRY_HEARTBEATS: u32 = 10;

/// What `Engine::start` needs to wire a remote model like a local one.
pub(crate) struct LinkStart {
    pub remote: RemoteModel,
    pub config: Arc<ClusterConfig>,
    pub server: Arc<ClusterServer>,
    pub hello: Hello,
    /// The model's config.json as the front reads it.
    pub model_config: ModelConfig,
    pub links: ComputeLinks,
    pub status: Arc<Mutex<NodeStatus>>,
}

/// Starts the link; returns what `compute::spawn` would: the inbox, the load report
/// (the node's welcome, or why it never came) and a thread to join at shutdown.
pub(crate) async fn spawn_link(
    start: LinkStart,
) -> Result<(Sender<ComputeMsg>, Receiver<Result<Loaded, EngineError>>, std::thread::JoinHandle<()>), EngineError> {
    let (tx, rx) = flume::bounded::<ComputeMsg>(INBOX_CAPACITY);
    let (loaded_tx, loaded_rx) = flume::bounded(1);
    let name = start.remote.model.clone();
    let (link, _) = Actor::spawn(None, LinkActor, (start, loaded_tx))
        .await
        .map_err(|e| EngineError::ModelLoad { model: name.clone(), message: e.to_string() })?;
    // The engine talks to compute inboxes from threads and actors alike; one forwarding
    // thread keeps that contract and the order of what it sends.
    let thread = std::thread::Builder::new()
        .name(format!("link-{name}"))
        .spawn(move || {
            while let Ok(msg) = rx.recv() {
                let last = matches!(msg, ComputeMsg::Shutdown);
                if link.send_message(LinkMsg::Outbound(msg)).is_err() || last {
                    return;
                }
            }
            link.stop(None);
        })
        .map_err(|e| EngineError::Internal(format!("spawning a link thread: {e}")))?;
    Ok((tx, loaded_rx, thread))
}

struct LinkActor;

/// The link is stopping or gone (it dials from `pre_start`, while still starting).
fn link_stopped(link: &ActorRef<LinkMsg>) -> bool {
    matches!(link.get_status(), ActorStatus::Stopping | ActorStatus::Stopped)
}

struct Link {
    me: ActorRef<LinkMsg>,
    start: LinkStart,
    node: Option<ActorRef<NodeMsg>>,
    /// Bumped on every new dialing, so late answers of an older one are ignored.
    dial: u64,
    /// Bumped on every loss, so a resume deadline of an earlier loss is ignored.
    losses: u64,
    health: Health,
    ledger: FrontLedger,
    loaded: Option<Sender<Result<Loaded, EngineError>>>,
    subserver: Option<StartWire>,
    rule: Option<RuleWire>,
    active: Option<usize>,
    snapshot: Option<SubserverSnapshot>,
    ticks: u64,
    /// When the current node was first greeted (cleared by its welcome).
    greeted: Option<Instant>,
    /// When the greeting was last sent: it is sent again until a welcome comes.
    last_greeting: Instant,
}

impl Actor for LinkActor {
    type Msg = LinkMsg;
    type State = Link;
    type Arguments = (LinkStart, Sender<Result<Loaded, EngineError>>);

    async fn pre_start(
        &self,
        me: ActorRef<LinkMsg>,
        (start, loaded): Self::Arguments,
    ) -> Result<Link, ActorProcessingErr> {
        ractor::pg::join(start.hello.reply_group.clone(), vec![me.get_cell()]);
        let link = Link {
            me: me.clone(),
            health: Health::new(start.config.loss_timeout, Instant::now()),
            start,
            node: None,
            dial: 0,
            losses: 0,
            ledger: FrontLedger::default(),
            loaded: Some(loaded),
            subserver: None,
            rule: None,
            active: None,
            snapshot: None,
            ticks: 0,
            greeted: None,
            last_greeting: Instant::now(),
        };
        link.connect(link.start.config.connect_timeout, false);
        me.send_interval(link.start.config.heartbeat, || LinkMsg::Tick);
        Ok(link)
    }

    async fn handle(&self, me: ActorRef<LinkMsg>, msg: LinkMsg, link: &mut Link) -> Result<(), ActorProcessingErr> {
        match msg {
            LinkMsg::Outbound(ComputeMsg::Shutdown) => me.stop(None),
            LinkMsg::Outbound(msg) => link.outbound(msg),
            LinkMsg::Frame(bytes) => link.inbound(&bytes),
            LinkMsg::Connected(epoch, result) if epoch == link.dial => link.connected(result),
            LinkMsg::Connected(_, Ok((stale, _))) => link.drop_stale(stale),
            LinkMsg::Connected(_, Err(_)) => {}
            LinkMsg::Tick => link.tick(),
            LinkMsg::ResumeDeadline(epoch) if epoch == link.losses => link.give_up(),
            LinkMsg::ResumeDeadline(_) => {}
        }
        Ok(())
    }
}

impl Link {
    fn model(&self) -> usize {
        self.start.hello.model
    }

    fn name(&self) -> &str {
        &self.start.remote.model
    }

    /// Dials the node (the primary first, then replacements) in the background; the
    /// answer comes back as `Connected` for the current dialing.
    fn connect(&self, first_timeout: Duration, keep_trying: bool) {
        let (me, epoch) = (self.me.clone(), self.dial);
        let server = self.start.server.clone();
        let addresses = self.start.remote.addresses();
        let tls = self.start.config.tls.clone();
        tokio::spawn(async move {
            loop {
                let mut last = String::new();
                for address in &addresses {
                    // A stopped link must not open sessions nobody will close.
                    if link_stopped(&me) {
                        return;
                    }
                    let deadline = Instant::now() + first_timeout;
                    match cluster::connect(&server.server, address, deadline, tls.as_ref()).await {
                        Ok(node) => {
                            let answer = LinkMsg::Connected(epoch, Ok((node.clone(), address.clone())));
                            if me.send_message(answer).is_err() {
                                cluster::drop_session(&server.server, &node).await;
                            }
                            return;
                        }
                        Err(e) => last = e,
                    }
                }
                if !keep_trying || link_stopped(&me) {
                    let _ = me.send_message(LinkMsg::Connected(epoch, Err(last)));
                    return;
                }
            }
        });
    }

    fn connected(&mut self, result: Result<(ActorRef<NodeMsg>, String), String>) {
        match result {
            Ok((node, address)) => {
                tracing::info!(model = %self.name(), %address, "node connected; greeting it");
                self.node = Some(node);
                self.start.status.lock().serving = Some(address);
                self.greeted = Some(Instant::now());
                self.greet();
            }
            Err(message) => self.refused(message),
        }
    }

    /// A dialing that was superseded still opened a session: close it, or the node
    /// would hold two sessions from this front and could keep the wrong one.
    fn drop_stale(&self, stale: ActorRef<NodeMsg>) {
        let current = self.node.as_ref().map(|n| n.get_id().node());
        if current != Some(stale.get_id().node()) {
            let server = self.start.server.clone();
            tokio::spawn(async move { cluster::drop_session(&server.server, &stale).await });
        }
    }

    /// The node cannot serve us: fatal while the engine starts, a loss afterwards.
    fn refused(&mut self, message: String) {
        match self.loaded.take() {
            Some(loaded) => {
                let _ = loaded.send(Err(EngineError::ModelLoad { model: self.name().to_string(), message }));
                self.me.stop(None);
            }
            None => {
                tracing::warn!(model = %self.name(), %message, "node refused or unreachable");
                self.node = None;
                if self.health.state != LinkState::Up {
                    // Keep looking: another replacement, or this one once fixed.
                    self.dial += 1;
                    self.connect(self.start.config.heartbeat.max(Duration::from_millis(500)), true);
                }
            }
        }
    }

    fn outbound(&mut self, msg: ComputeMsg) {
        match msg {
            ComputeMsg::Start(config, rule) => {
                let start = StartWire::from_engine(&config, &rule);
                self.subserver = Some(start.clone());
                self.rule = Some(start.rule.clone());
                self.send_if_up(Frame::Start(start));
            }
            ComputeMsg::Arrive(arrival) => {
                let id = arrival.spec.id;
                match (self.health.state, self.ledger.outgoing(arrival)) {
                    (_, Err(message)) => self.fail(id, message),
                    (LinkState::Failed, Ok(_)) => self.fail(id, self.lost_message()),
                    (LinkState::Up, Ok(w)) => self.send(Frame::Arrive { model: self.model(), arrival: w }),
                    // Held in the ledger; resumed from zero once a node answers.
                    (LinkState::Connecting | LinkState::Down, Ok(_)) => {}
                }
            }
            ComputeMsg::Release(id) => {
                self.ledger.release(id);
                self.send_if_up(Frame::Release(id));
            }
            ComputeMsg::SetActive(n) => {
                self.active = Some(n);
                self.send_if_up(Frame::SetActive(n));
            }
            ComputeMsg::SetRule(rule) => {
                let rule = RuleWire::from_engine(&rule);
                self.rule = Some(rule.clone());
                self.send_if_up(Frame::SetRule(rule));
            }
            ComputeMsg::Stats(reply) => {
                // Answered from the last snapshot so a slow or lost node never stalls
                // the dashboard; nothing while it is down.
                if let Some(s) = self.snapshot.clone().filter(|_| self.health.state == LinkState::Up) {
                    let _ = reply.send(s);
                }
            }
            ComputeMsg::InjectFault(_) => self.send_if_up(Frame::InjectPanic(self.model())),
            // A node keeps its prefix cache: the reply is dropped unanswered, which the
            // flush reports as no answer for this model.
            ComputeMsg::FlushPrefixCache(_) => {}
            ComputeMsg::Shutdown => {}
        }
    }

    fn inbound(&mut self, bytes: &[u8]) {
        record_frame(self.name(), Direction::In, bytes.len(), &self.start.status);
        self.health.heard(Instant::now());
        let frame = match Frame::decode(bytes) {
            Ok(frame) => frame,
            Err(e) => {
                tracing::error!(model = %self.name(), %e, "undecodable frame from the node");
                return self.refused(format!("node speaks another protocol: {e}"));
            }
        };
        match frame {
            Frame::Welcome(w) => self.welcome(w),
            Frame::Refused(message) => self.refused(format!("node refused: {message}")),
            Frame::Event(event) => {
                self.ledger.event(&event);
                self.start.links.registry.send(event);
            }
            Frame::Handoff { to, arrival } => self.handed_back(to, arrival),
            Frame::StatsReply { json, .. } => self.snapshot = snapshot_from_json(&json),
            Frame::Pong(nonce) => {
                if let Some(rtt) = self.health.pong(nonce, Instant::now()) {
                    metrics::histogram!("tokenrouter_cluster_rtt_seconds", "model" => self.name().to_string())
                        .record(rtt.as_secs_f64());
                    self.start.status.lock().rtt_ms = Some(rtt.as_secs_f64() * 1e3);
                }
            }
            other => tracing::warn!(model = %self.name(), ?other, "unexpected frame from the node"),
        }
    }

    fn welcome(&mut self, w: Welcome) {
        if self.greeted.is_none() {
            return; // the answer to a repeated greeting: this node is up already
        }
        let c = &self.start.model_config;
        if (w.vocab_size, w.hidden_size, w.num_layers) != (c.vocab_size, c.hidden_size, c.num_layers) {
            let message = format!(
                "the node's model (vocab {}, hidden {}, {} layers) is not the one in the front's config.json (vocab {}, hidden {}, {} layers)",
                w.vocab_size, w.hidden_size, w.num_layers, c.vocab_size, c.hidden_size, c.num_layers
            );
            return self.refused(message);
        }
        self.greeted = None;
        self.health.up(Instant::now());
        self.set_status(LinkState::Up);
        let capacity = KvCapacity {
            block_size: w.block_size,
            total_blocks: w.total_blocks,
            free_blocks: w.free_blocks,
            cached_blocks: 0,
            used_blocks: w.total_blocks - w.free_blocks,
            shared_with: 0,
        };
        self.snapshot.get_or_insert_with(|| SubserverSnapshot {
            model: self.start.remote.model.clone(),
            ready: 0,
            pending: 0,
            threshold: 1,
            kv: capacity,
            stats: Default::default(),
            restarts: 0,
            resumed: 0,
            failed: false,
            reloads: 0,
        });
        if let Some(loaded) = self.loaded.take() {
            tracing::info!(model = %self.name(), "remote subserver up");
            let _ = loaded.send(Ok(Loaded {
                config: self.start.model_config.clone(),
                capacity,
                pool: None,
                step_cost: None,
            }));
            return;
        }
        self.replay_settings();
        let stranded = self.ledger.on_node();
        tracing::warn!(model = %self.name(), requests = stranded.len(), "replacement node up; resuming requests");
        for id in stranded {
            match self.ledger.resume(id) {
                Ok(arrival) => {
                    self.send(Frame::Arrive { model: self.model(), arrival });
                    metrics::counter!("tokenrouter_cluster_resumed_total", "model" => self.name().to_string())
                        .increment(1);
                    self.start.status.lock().resumed += 1;
                }
                Err(message) => self.fail(id, message),
            }
        }
    }

    /// A replacement starts from the engine's current settings.
    fn replay_settings(&mut self) {
        if let Some(start) = self.subserver.clone() {
            let rule = self.rule.clone().unwrap_or_else(|| start.rule.clone());
            self.send(Frame::Start(StartWire { rule, ..start }));
        }
        if let Some(n) = self.active {
            self.send(Frame::SetActive(n));
        }
    }

    fn handed_back(&mut self, to: usize, arrival: super::wire::WireArrival) {
        let id = arrival.id;
        let arrival = match self.ledger.handed_back(arrival) {
            Ok(a) => a,
            Err(message) => return tracing::warn!(model = %self.name(), %message, "handoff of an unknown request"),
        };
        let peer = self.start.links.peers.get().and_then(|p| p.get(to));
        if peer.is_none_or(|p| p.send(ComputeMsg::Arrive(arrival)).is_err()) {
            self.fail(id, format!("model {to} is not available to take the request from {}", self.name()));
        }
    }

    fn greet(&mut self) {
        self.last_greeting = Instant::now();
        self.send(Frame::Hello(self.start.hello.clone()));
    }

    fn tick(&mut self) {
        self.greet_again();
        self.retry_silent_replacement();
        let node_gone = self.node.as_ref().is_some_and(|n| n.get_status() == ActorStatus::Stopped);
        let verdict = if node_gone { TickVerdict::Lost } else { self.health.tick(Instant::now()) };
        match verdict {
            TickVerdict::Nothing => {}
            TickVerdict::Ping(nonce) => {
                self.send(Frame::Ping { model: self.model(), nonce });
                self.ticks += 1;
                // Not before the node's subserver has its settings (it takes those first).
                if self.ticks % STATS_EVERY_TICKS == 1 && self.subserver.is_some() {
                    self.send(Frame::StatsRequest { model: self.model(), nonce: self.ticks });
                }
            }
            TickVerdict::Lost => self.lost(),
        }
    }

    /// A greeting whose welcome is overdue goes again (a node answers each one the
    /// same). The node may have taken the first for a sibling session's, e.g. one a
    /// stopped front in this process opened as it went.
    fn greet_again(&mut self) {
        let overdue = (self.start.config.heartbeat * GREETING_RETRY_HEARTBEATS).max(Duration::from_millis(500));
        if self.greeted.is_some() && self.last_greeting.elapsed() >= overdue {
            tracing::info!(model = %self.name(), "no welcome yet; greeting the node again");
            self.greet();
        }
    }

    /// A node that took the greeting but never answered: at start-up that is fatal; a
    /// replacement (whose session may have been stale) is dialed again.
    fn retry_silent_replacement(&mut self) {
        let waited = self.greeted.is_some_and(|t| t.elapsed() > self.start.config.connect_timeout);
        if waited && self.health.state == LinkState::Connecting {
            self.greeted = None;
            let timeout = self.start.config.connect_timeout.as_secs_f64();
            return self.refused(format!("the node took the greeting but did not answer within {timeout:.0}s"));
        }
        if waited && matches!(self.health.state, LinkState::Down | LinkState::Failed) {
            self.greeted = None;
            self.node = None;
            self.dial += 1;
            self.connect(self.start.config.heartbeat.max(Duration::from_millis(500)), true);
        }
    }

    /// The node is gone: its requests wait for a replacement until the resume time.
    fn lost(&mut self) {
        if !self.health.lost() {
            return;
        }
        self.dial += 1;
        self.losses += 1;
        if let Some(old) = self.node.take() {
            let server = self.start.server.clone();
            tokio::spawn(async move { cluster::drop_session(&server.server, &old).await });
        }
        let stranded = self.ledger.node_lost();
        tracing::error!(model = %self.name(), requests = stranded.len(), "remote node lost; looking for a replacement");
        metrics::counter!("tokenrouter_cluster_node_losses_total", "model" => self.name().to_string()).increment(1);
        self.set_status(LinkState::Down);
        self.start.status.lock().losses += 1;
        let epoch = self.losses;
        self.me.send_after(self.start.config.resume_timeout, move || LinkMsg::ResumeDeadline(epoch));
        self.connect(self.start.config.heartbeat.max(Duration::from_millis(500)), true);
    }

    /// No replacement in time: end what the node held; later requests fail at once.
    fn give_up(&mut self) {
        if self.health.state != LinkState::Down {
            return;
        }
        self.health.state = LinkState::Failed;
        self.set_status(LinkState::Failed);
        for id in self.ledger.on_node() {
            self.fail(id, self.lost_message());
        }
    }

    fn lost_message(&self) -> String {
        format!(
            "model {} runs on a node that was lost (tried {}); no replacement answered within {:.1}s",
            self.name(),
            self.start.remote.addresses().join(", "),
            self.start.config.resume_timeout.as_secs_f64()
        )
    }

    fn fail(&mut self, id: RequestId, message: String) {
        self.ledger.drop_request(id);
        metrics::counter!("tokenrouter_cluster_failed_requests_total", "model" => self.name().to_string()).increment(1);
        self.start.status.lock().failed += 1;
        self.start.links.registry.send(RequestEvent::Failed { id, message });
    }

    fn send_if_up(&mut self, frame: Frame) {
        if self.health.state == LinkState::Up {
            self.send(frame);
        }
    }

    fn send(&mut self, frame: Frame) {
        let Some(node) = &self.node else { return };
        let bytes = frame.encode();
        record_frame(self.name(), Direction::Out, bytes.len(), &self.start.status);
        if node.send_message(NodeMsg::Frame(bytes)).is_err() {
            self.lost();
        }
    }

    fn set_status(&self, state: LinkState) {
        let up = if state == LinkState::Up { 1.0 } else { 0.0 };
        metrics::gauge!("tokenrouter_cluster_node_up", "model" => self.name().to_string()).set(up);
        let mut status = self.start.status.lock();
        status.state = state;
        status.since = std::time::SystemTime::now();
        if matches!(state, LinkState::Down | LinkState::Failed) {
            status.serving = None;
        }
    }
}
