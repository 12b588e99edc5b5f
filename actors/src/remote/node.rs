//! A node: subservers for some models, in a process that joins the cluster. Its
//! endpoint actor takes frames from the front (greeting, arrivals, releases, settings,
//! pings) and sends back what its compute threads produce: events and handoffs, in the
//! order they were produced, so a peer's tokens never overtake this model's.
//!
//! Every request leaving a hosted model goes back through the front, even to another
//! model of this node: the front's ledger then always knows where a request is.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use flume::Sender;
use ractor::{Actor, ActorProcessingErr, ActorRef, ActorStatus};
use tokenrouter_core::policy::{ModelInfo, PolicyContext};
use tokenrouter_core::sched::RequestEvent;

use super::cluster::{self, ClusterServer, NODE_GROUP};
use super::messages::{LinkMsg, NodeMsg};
use super::node_book::NodeBook;
use super::wire::{Frame, Hello, Welcome};
use crate::compute;
use crate::config::{ModelSpec, SupervisionConfig};
use crate::error::EngineError;
use crate::handles::ComputeLinks;
use crate::messages::{ComputeMsg, Fault, Loaded};
use crate::registry::Registry;

/// How long a greeting waits for the front's link to show in the process groups.
const FIND_FRONT: Duration = Duration::from_secs(3);

#[derive(Debug, Clone)]
pub struct NodeOptions {
    pub listen: SocketAddr,
    pub cookie: String,
    /// The models this node can serve (loaded when a front first asks for them).
    pub models: Vec<ModelSpec>,
    /// One model steps at a time on this node (models sharing few cores).
    pub exclusive_compute: bool,
    /// Relative paths in policy parameters resolve here (the node config's folder).
    pub base_dir: Option<PathBuf>,
    /// Serve TLS with this certificate; `None`: plain TCP.
    pub tls: Option<super::NodeTls>,
    /// Obey a front's `InjectPanic` frames (tests, drills). Off, they are refused: a
    /// front that can reach this node must not be able to crash its models at will.
    pub allow_fault_injection: bool,
}

/// A node that serves until stopped.
pub struct RunningNode {
    endpoint: ActorRef<NodeMsg>,
    _server: ClusterServer,
    listen: SocketAddr,
}

impl RunningNode {
    pub fn listen_addr(&self) -> SocketAddr {
        self.listen
    }

    /// Stops the endpoint (and with it every compute thread) and the node server.
    pub async fn stop(self) {
        let _ = self.endpoint.stop_and_wait(None, None).await;
    }
}

/// Starts the node server and the endpoint; models load when a front asks for them.
pub async fn serve_node(options: NodeOptions) -> Result<RunningNode, EngineError> {
    for m in &options.models {
        if !m.path.join("config.json").is_file() {
            return Err(EngineError::ModelLoad {
                model: m.name.clone(),
                message: format!("no config.json in {}", m.path.display()),
            });
        }
    }
    tokenrouter_core::model::threads::configure(None);
    let name = format!("tokenrouter-node-{}", options.listen.port());
    let server = cluster::start_server(options.listen, &options.cookie, &name, options.tls.as_ref())
        .await
        .map_err(EngineError::Config)?;
    let listen = options.listen;
    let (endpoint, _) = Actor::spawn(None, EndpointActor, options)
        .await
        .map_err(|e| EngineError::Internal(format!("node endpoint: {e}")))?;
    ractor::pg::join(NODE_GROUP.to_string(), vec![endpoint.get_cell()]);
    Ok(RunningNode { endpoint, _server: server, listen })
}

struct EndpointActor;

struct Hosted {
    compute: Sender<ComputeMsg>,
    /// A compute thread takes `Start` before anything else (it exits otherwise), so
    /// nothing else is forwarded until the front's `Start` has been.
    started: bool,
    thread: Option<std::thread::JoinHandle<()>>,
    loaded: Loaded,
}

struct Endpoint {
    me: ActorRef<NodeMsg>,
    options: NodeOptions,
    /// The front's model list, fixed by the first greeting.
    front_models: Option<Vec<super::wire::ModelInfoWire>>,
    book: Option<NodeBook>,
    hosted: HashMap<usize, Hosted>,
    /// The front's link for each hosted model, and the group it was found in.
    links: HashMap<usize, (String, ActorRef<LinkMsg>)>,
    turn: Option<Arc<parking_lot::Mutex<()>>>,
}

impl Actor for EndpointActor {
    type Msg = NodeMsg;
    type State = Endpoint;
    type Arguments = NodeOptions;

    async fn pre_start(&self, me: ActorRef<NodeMsg>, options: NodeOptions) -> Result<Endpoint, ActorProcessingErr> {
        me.send_interval(Duration::from_secs(1), || NodeMsg::Tick);
        let turn = options.exclusive_compute.then(|| Arc::new(parking_lot::Mutex::new(())));
        Ok(Endpoint {
            me,
            options,
            front_models: None,
            book: None,
            hosted: HashMap::new(),
            links: HashMap::new(),
            turn,
        })
    }

    async fn handle(&self, _: ActorRef<NodeMsg>, msg: NodeMsg, e: &mut Endpoint) -> Result<(), ActorProcessingErr> {
        match msg {
            NodeMsg::Tick => e.forget_departed_fronts(),
            NodeMsg::Frame(bytes) => e.frame(&bytes).await,
            NodeMsg::Event(model, event) => e.reply(model, Frame::Event(event)),
            NodeMsg::Handoff { from, to, arrival } => {
                e.reply(from, Frame::Handoff { to, arrival: NodeBook::outgoing(arrival) })
            }
        }
        Ok(())
    }

    async fn post_stop(&self, _: ActorRef<NodeMsg>, e: &mut Endpoint) -> Result<(), ActorProcessingErr> {
        for hosted in e.hosted.values_mut() {
            let _ = hosted.compute.send(ComputeMsg::Shutdown);
            if let Some(thread) = hosted.thread.take() {
                let _ = tokio::task::spawn_blocking(move || thread.join()).await;
            }
        }
        Ok(())
    }
}

impl Endpoint {
    async fn frame(&mut self, bytes: &[u8]) {
        let frame = match Frame::decode(bytes) {
            Ok(f) => f,
            Err(err) => return tracing::error!(%err, "undecodable frame from a front"),
        };
        if !matches!(frame, Frame::Ping { .. }) {
            tracing::debug!(?frame, "frame from the front");
        }
        match frame {
            Frame::Hello(hello) => self.hello(hello).await,
            Frame::Start(start) => {
                let (config, rule) = start.to_engine();
                self.to_model(config.model, ComputeMsg::Start(config, rule));
            }
            Frame::Arrive { model, arrival } => self.arrive(model, arrival),
            Frame::Release(id) => {
                if let Some(book) = &mut self.book {
                    book.release(id);
                }
                self.to_all(|| ComputeMsg::Release(id));
            }
            Frame::SetActive(n) => self.to_all(|| ComputeMsg::SetActive(n)),
            Frame::SetRule(rule) => self.to_all(|| ComputeMsg::SetRule(rule.to_engine())),
            Frame::StatsRequest { model, nonce } => self.stats(model, nonce).await,
            Frame::Ping { model, nonce } => self.reply(model, Frame::Pong(nonce)),
            Frame::InjectPanic(model) if self.options.allow_fault_injection => {
                self.to_model(model, ComputeMsg::InjectFault(Fault::Step))
            }
            // The front's `inject_fault` expects no answer, so there is none to refuse with.
            Frame::InjectPanic(model) => tracing::warn!(
                model,
                "refused a front's fault injection: this node runs without --allow-fault-injection"
            ),
            other => tracing::warn!(?other, "unexpected frame from a front"),
        }
    }

    fn arrive(&mut self, model: usize, arrival: super::wire::WireArrival) {
        let id = arrival.id;
        let started = self.hosted.get(&model).is_some_and(|h| h.started);
        let result = match &mut self.book {
            Some(_) if !started => Err(format!("model {model} is not started on this node")),
            Some(book) => book.incoming(arrival),
            None => Err("no front has greeted this node".to_string()),
        };
        match result {
            Ok(arrival) => self.to_model(model, ComputeMsg::Arrive(arrival)),
            Err(message) => self.reply(model, Frame::Event(RequestEvent::Failed { id, message })),
        }
    }

    /// A front asks this node to serve one of its models: load it (once), answer with
    /// its KV capacity, or refuse with the reason.
    async fn hello(&mut self, hello: Hello) {
        let Some(link) = find_front(&hello.reply_group).await else {
            return tracing::error!(group = %hello.reply_group, "a front greeted this node but its link is not visible");
        };
        match self.host(&hello).await {
            Ok(welcome) => {
                tracing::info!(model = %hello.models[hello.model].name, "serving a front");
                self.links.insert(hello.model, (hello.reply_group.clone(), link));
                self.reply(hello.model, Frame::Welcome(welcome));
            }
            Err(message) => {
                tracing::warn!(%message, "refusing a front");
                send_to(&link, Frame::Refused(message));
            }
        }
    }

    async fn host(&mut self, hello: &Hello) -> Result<Welcome, String> {
        let wanted = hello.models.get(hello.model).ok_or("the greeting names no model")?.name.clone();
        match &self.front_models {
            Some(models) if *models != hello.models => {
                return Err("this node was set up for a front with other models; restart it to serve this one".into());
            }
            Some(_) => {}
            None => self.front_models = Some(hello.models.clone()),
        }
        if self.book.is_none() {
            self.book = Some(NodeBook::new(self.model_infos(&hello.models), self.policy_context(hello)));
        }
        if !self.hosted.contains_key(&hello.model) {
            let spec = self.options.models.iter().find(|m| m.name == wanted).cloned().ok_or_else(|| {
                let served: Vec<&str> = self.options.models.iter().map(|m| m.name.as_str()).collect();
                format!("this node does not serve model `{wanted}`; it serves {}", served.join(", "))
            })?;
            let hosted = self.spawn_model(hello.model, spec, hello).await.map_err(|e| e.to_string())?;
            self.hosted.insert(hello.model, hosted);
        }
        let loaded = &self.hosted[&hello.model].loaded;
        Ok(Welcome {
            model: hello.model,
            block_size: loaded.capacity.block_size,
            total_blocks: loaded.capacity.total_blocks,
            free_blocks: loaded.capacity.free_blocks,
            vocab_size: loaded.config.vocab_size,
            hidden_size: loaded.config.hidden_size,
            num_layers: loaded.config.num_layers,
        })
    }

    /// Starts model `index`'s compute thread. Its events go straight to this endpoint;
    /// its handoffs, whatever the peer, through one forwarding thread per peer.
    async fn spawn_model(&self, index: usize, spec: ModelSpec, hello: &Hello) -> Result<Hosted, EngineError> {
        let me = self.me.clone();
        let registry = Registry::forwarding(Arc::new(move |event: RequestEvent| {
            let _ = me.send_message(NodeMsg::Event(index, event));
        }));
        let mut peers = Vec::new();
        for to in 0..hello.models.len() {
            peers.push(self.handoff_forwarder(index, to));
        }
        let links = ComputeLinks {
            name: spec.name.clone(),
            model_names: hello.models.iter().map(|m| m.name.clone()).collect(),
            peers: Arc::new(OnceLock::from(peers)),
            registry,
            turn: self.turn.clone(),
            // Which of the cluster's models this node hosts is not known here: its
            // models keep the short hand-over grace.
            shares_turn: vec![false; hello.models.len()],
            supervision: SupervisionConfig::default(),
        };
        let (compute, loaded, thread) = compute::spawn(spec, links);
        let loaded = loaded
            .recv_async()
            .await
            .map_err(|_| EngineError::Internal("a compute thread died while loading".into()))??;
        Ok(Hosted { compute, started: false, thread: Some(thread), loaded })
    }

    fn handoff_forwarder(&self, from: usize, to: usize) -> Sender<ComputeMsg> {
        let (tx, rx) = flume::unbounded::<ComputeMsg>();
        let me = self.me.clone();
        let spawned = std::thread::Builder::new().name(format!("handoff-{from}-{to}")).spawn(move || {
            while let Ok(msg) = rx.recv() {
                if let ComputeMsg::Arrive(arrival) = msg {
                    if me.send_message(NodeMsg::Handoff { from, to, arrival }).is_err() {
                        return;
                    }
                }
            }
        });
        if let Err(e) = spawned {
            tracing::error!(%e, "cannot spawn a handoff thread; handoffs to model {to} will be lost");
        }
        tx
    }

    fn model_infos(&self, models: &[super::wire::ModelInfoWire]) -> Vec<ModelInfo> {
        models
            .iter()
            .map(|m| ModelInfo { name: m.name.clone(), hidden_size: m.hidden_size, vocab_size: m.vocab_size })
            .collect()
    }

    /// Policies rebuilt here see this node's folders for the models it has.
    fn policy_context(&self, hello: &Hello) -> PolicyContext {
        let model_dirs = hello
            .models
            .iter()
            .map(|m| self.options.models.iter().find(|s| s.name == m.name).map(|s| s.path.clone()).unwrap_or_default())
            .collect();
        PolicyContext { model_dirs, base_dir: self.options.base_dir.clone(), seed: hello.policy_seed }
    }

    async fn stats(&self, model: usize, nonce: u64) {
        let Some(hosted) = self.hosted.get(&model).filter(|h| h.started) else { return };
        let (tx, rx) = flume::bounded(1);
        if hosted.compute.send_async(ComputeMsg::Stats(tx)).await.is_err() {
            return;
        }
        if let Ok(snapshot) = rx.recv_async().await {
            let json = serde_json::to_vec(&snapshot).unwrap_or_default();
            self.reply(model, Frame::StatsReply { nonce, json });
        }
    }

    fn to_model(&mut self, model: usize, msg: ComputeMsg) {
        let Some(h) = self.hosted.get_mut(&model) else {
            return tracing::warn!(model, "a front addressed a model this node does not run");
        };
        let is_start = matches!(msg, ComputeMsg::Start(..));
        if !(h.started || is_start) {
            return tracing::warn!(model, "a front sent work before the subserver's settings; dropped");
        }
        h.started |= is_start;
        if h.compute.send(msg).is_err() {
            tracing::error!(model, "compute thread is gone");
        }
    }

    fn to_all(&self, msg: impl Fn() -> ComputeMsg) {
        for h in self.hosted.values().filter(|h| h.started) {
            let _ = h.compute.send(msg());
        }
    }

    fn reply(&self, model: usize, frame: Frame) {
        if let Some((_, link)) = self.links.get(&model) {
            send_to(link, frame);
        }
    }

    /// A front whose session ended will never release its requests: free them here.
    fn forget_departed_fronts(&mut self) {
        let before = self.links.len();
        // A link seen through a session that ended may still be reachable through
        // another one (the front redialed): look for it in its group before giving up.
        self.links.retain(|_, (group, link)| {
            if link.get_status() == ActorStatus::Stopped {
                match live_member(group) {
                    Some(found) => *link = found,
                    None => return false,
                }
            }
            true
        });
        if before > 0 && self.links.is_empty() {
            let ids = self.book.as_mut().map(NodeBook::take_all).unwrap_or_default();
            tracing::warn!(requests = ids.len(), "the front left; freeing its requests");
            for id in ids {
                self.to_all(|| ComputeMsg::Release(id));
            }
            // `front_models` stays: the compute threads were wired for that model list,
            // so only a front with the same models (a restarted one) is served next.
            self.book = None;
        }
    }
}

/// A member of `group` that is not stopped.
fn live_member(group: &str) -> Option<ActorRef<LinkMsg>> {
    ractor::pg::get_members(&group.to_string())
        .into_iter()
        .find(|cell| cell.get_status() != ActorStatus::Stopped)
        .map(ActorRef::from)
}

/// Frames are counted on the front, which sees both directions (a node has no metrics endpoint).
fn send_to(link: &ActorRef<LinkMsg>, frame: Frame) {
    let _ = link.send_message(LinkMsg::Frame(frame.encode()));
}

/// The front's link, once the process-group exchange has brought it here.
async fn find_front(group: &str) -> Option<ActorRef<LinkMsg>> {
    let deadline = std::time::Instant::now() + FIND_FRONT;
    loop {
        if let Some(link) = live_member(group) {
            return Some(link);
        }
        if std::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
