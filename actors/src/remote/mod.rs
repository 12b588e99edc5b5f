//! Subservers on other hosts (docs/cluster.md). A *node* process runs subservers for
//! one or more models and joins the cluster (ractor_cluster, magic cookie); the *front*
//! (the process with the HTTP server and the request actors) links each remote model
//! so that the rest of the engine sees one more compute inbox. Only small frames cross
//! hosts (`wire`); KV stays on the host that computed it.
//!
//! - `wire`: the versioned binary format (pure, unit-tested).
//! - `ledger`, `node_book`, `health`: the bookkeeping that makes a node loss cost no
//!   request, and the liveness state machine (pure, unit-tested).
//! - `front`: the link actor on the front; `node`: the endpoint actor on a node;
//!   `cluster`: node servers, connecting, finding a node's endpoint.

mod cluster;
mod front;
mod health;
mod ledger;
mod messages;
mod node;
mod node_book;
mod stats;
mod tls;
mod wire;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use parking_lot::Mutex;
use tokenrouter_core::model::ModelConfig;

pub use health::LinkState;
pub use node::{serve_node, NodeOptions, RunningNode};
pub use tls::{FrontTls, NodeTls};
pub use wire::WIRE_VERSION;

pub(crate) use front::{spawn_link, LinkStart};

use crate::config::ModelSpec;
use crate::error::EngineError;

/// One model served by other hosts: the node to use, then replacements in order.
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteModel {
    /// The engine model (by name) that runs remotely.
    pub model: String,
    /// `host:port` of the node that serves it.
    pub node: String,
    /// Nodes that take over its requests when it is lost.
    pub replacements: Vec<String>,
}

impl RemoteModel {
    pub fn addresses(&self) -> Vec<String> {
        std::iter::once(self.node.clone()).chain(self.replacements.iter().cloned()).collect()
    }
}

/// The front's cluster settings.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterConfig {
    /// Shared secret of every process of the cluster.
    pub cookie: String,
    pub remote: Vec<RemoteModel>,
    /// How long the engine's start waits for each remote subserver.
    pub connect_timeout: Duration,
    /// How often the front pings each node.
    pub heartbeat: Duration,
    /// Silence after which a node counts as lost.
    pub loss_timeout: Duration,
    /// How long a lost node's requests wait for a replacement before they end with an error.
    pub resume_timeout: Duration,
    /// Seed of random router weights (the config's `policy.seed`), for policies the node rebuilds.
    pub policy_seed: u64,
    /// Check the nodes' TLS certificates (the nodes must then serve TLS); `None`: plain TCP.
    pub tls: Option<FrontTls>,
}

impl ClusterConfig {
    pub fn new(cookie: String, remote: Vec<RemoteModel>) -> Self {
        ClusterConfig {
            cookie,
            remote,
            connect_timeout: Duration::from_secs(60),
            heartbeat: Duration::from_millis(250),
            loss_timeout: Duration::from_secs(2),
            resume_timeout: Duration::from_secs(10),
            policy_seed: 0,
            tls: None,
        }
    }

    pub fn remote_for(&self, model: &str) -> Option<&RemoteModel> {
        self.remote.iter().find(|r| r.model == model)
    }
}

/// A remote subserver as the dashboard shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct NodeStatus {
    pub model: String,
    /// The configured node (the first address).
    pub node: String,
    /// The address of the node serving now: the configured one or a replacement.
    pub serving: Option<String>,
    pub state: LinkState,
    /// When `state` last changed.
    pub since: SystemTime,
    /// Last heartbeat round trip.
    pub rtt_ms: Option<f64>,
    pub messages_out: u64,
    pub messages_in: u64,
    pub bytes_out: u64,
    pub bytes_in: u64,
    pub losses: u64,
    /// Requests resumed on a replacement / ended because no replacement came.
    pub resumed: u64,
    pub failed: u64,
}

impl NodeStatus {
    fn new(remote: &RemoteModel) -> Self {
        NodeStatus {
            model: remote.model.clone(),
            node: remote.node.clone(),
            serving: None,
            state: LinkState::Connecting,
            since: SystemTime::now(),
            rtt_ms: None,
            messages_out: 0,
            messages_in: 0,
            bytes_out: 0,
            bytes_in: 0,
            losses: 0,
            resumed: 0,
            failed: 0,
        }
    }
}

/// The front's share of the cluster: its node server and what every link needs.
pub(crate) struct FrontCluster {
    config: Arc<ClusterConfig>,
    server: Arc<cluster::ClusterServer>,
    /// Unique to this front: its node name, and the stem of its links' reply groups.
    name: String,
    hello_models: Vec<wire::ModelInfoWire>,
    pub statuses: Vec<Arc<Mutex<NodeStatus>>>,
}

impl FrontCluster {
    /// Starts the front's node server; `models` are the engine's, in order.
    pub async fn start(config: ClusterConfig, models: &[ModelSpec]) -> Result<FrontCluster, EngineError> {
        for r in &config.remote {
            if !models.iter().any(|m| m.name == r.model) {
                return Err(EngineError::Config(format!(
                    "cluster.remote names model `{}`, which is not a model of the engine",
                    r.model
                )));
            }
        }
        let configs = models.iter().map(|m| model_config(m)).collect::<Result<Vec<_>, _>>()?;
        let vocab = configs.iter().map(|c| c.vocab_size).min().unwrap_or(0);
        let hello_models = models
            .iter()
            .zip(&configs)
            .map(|(m, c)| wire::ModelInfoWire { name: m.name.clone(), hidden_size: c.hidden_size, vocab_size: vocab })
            .collect();
        let name = front_name();
        let server = cluster::start_server(cluster::front_listen(), &config.cookie, &name, None)
            .await
            .map_err(EngineError::Config)?;
        Ok(FrontCluster {
            config: Arc::new(config),
            server: Arc::new(server),
            name,
            hello_models,
            statuses: Vec::new(),
        })
    }

    pub fn remote_for(&self, model: &str) -> Option<&RemoteModel> {
        self.config.remote_for(model)
    }

    /// What a link for model `index` starts with.
    pub fn link_start(
        &mut self,
        index: usize,
        spec: &ModelSpec,
        links: crate::handles::ComputeLinks,
    ) -> Result<LinkStart, EngineError> {
        let remote =
            self.remote_for(&spec.name).cloned().ok_or_else(|| EngineError::Internal("not a remote model".into()))?;
        let status = Arc::new(Mutex::new(NodeStatus::new(&remote)));
        self.statuses.push(status.clone());
        let hello = wire::Hello {
            // A node finds the link by this group among every front's actors it sees.
            reply_group: format!("{}.{index}", self.name),
            models: self.hello_models.clone(),
            model: index,
            policy_seed: self.config.policy_seed,
        };
        Ok(LinkStart {
            remote,
            config: self.config.clone(),
            server: self.server.clone(),
            hello,
            model_config: model_config(spec)?,
            links,
            status,
        })
    }
}

/// A model's config.json: the front needs it (not the weights) for a remote model.
fn model_config(spec: &ModelSpec) -> Result<ModelConfig, EngineError> {
    ModelConfig::from_file(&spec.path.join("config.json"))
        .map_err(|e| EngineError::ModelLoad { model: spec.name.clone(), message: e.to_string() })
}

/// A name no other front shares. A node keeps one session per peer name and finds a
/// front's links by group name, so two fronts with one name (two engines in a process,
/// or containers where every front is pid 1) would lose a session or get each other's
/// replies.
fn front_name() -> String {
    static STARTED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let nanos = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let n = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("tokenrouter-front-{}-{nanos:x}-{n}", std::process::id())
}
