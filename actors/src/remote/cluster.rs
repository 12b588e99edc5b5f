//! ractor_cluster plumbing: a node server per process, connecting to a node and finding
//! its endpoint actor (advertised in a process group) once the cookie handshake is done.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ractor::{Actor, ActorRef};
use ractor_cluster::node::NodeConnectionMode;
use ractor_cluster::node::NodeServerSessionInformation;
use ractor_cluster::{IncomingEncryptionMode, NodeEventSubscription, NodeServer, NodeServerMessage};

use super::messages::NodeMsg;
use super::tls::{self, FrontTls, NodeTls};

/// The process group every node endpoint joins.
pub(crate) const NODE_GROUP: &str = "tokenrouter.node";

/// How often the handshake is polled.
const POLL: Duration = Duration::from_millis(20);

/// A running node server; stopped when dropped.
pub(crate) struct ClusterServer {
    pub server: ActorRef<NodeServerMessage>,
}

impl Drop for ClusterServer {
    fn drop(&mut self) {
        self.server.stop(None);
    }
}

/// Starts a node server on `listen` (port 0: any free port).
pub(crate) async fn start_server(
    listen: SocketAddr,
    cookie: &str,
    name: &str,
    tls: Option<&NodeTls>,
) -> Result<ClusterServer, String> {
    let hostname = listen.ip().to_string();
    let encryption = tls.map(crate::tls::acceptor).transpose()?.map(IncomingEncryptionMode::Tls);
    let server = NodeServer::new(
        listen.port(),
        cookie.to_string(),
        name.to_string(),
        hostname,
        encryption,
        Some(NodeConnectionMode::Isolated),
    )
    .with_listen_addr(listen.ip());
    let (server, _) = Actor::spawn(None, server, ()).await.map_err(|e| format!("cannot listen on {listen}: {e}"))?;
    Ok(ClusterServer { server })
}

/// Where the front's own node server listens: loopback, any port (nodes never dial
/// the front; it dials them).
pub(crate) fn front_listen() -> SocketAddr {
    SocketAddr::new(IpAddr::from([127, 0, 0, 1]), 0)
}

/// Connects to the node at `address` and returns its endpoint once the cookie
/// handshake and the process-group exchange are done, or why not by `deadline`.
pub(crate) async fn connect(
    server: &ActorRef<NodeServerMessage>,
    address: &str,
    deadline: Instant,
    tls: Option<&FrontTls>,
) -> Result<ActorRef<NodeMsg>, String> {
    let target = resolve(address).await?;
    let tls = tls.map(|t| tls::connector(t, address, target)).transpose()?;
    // Watch session endings from before dialing: a failed handshake ends in milliseconds.
    let (ended_tx, mut ended) = tokio::sync::mpsc::unbounded_channel();
    let watch_id = format!("connect-{target}-{}", WATCH_IDS.fetch_add(1, Ordering::Relaxed));
    let subscription = Box::new(SessionEnds { target: target.to_string(), ended: ended_tx });
    let _ = server.cast(NodeServerMessage::SubscribeToEvents { id: watch_id.clone(), subscription });
    let mut last_error = String::from("no answer");
    let mut result = Err(String::new());
    while Instant::now() < deadline {
        let dialed = match &tls {
            Some(t) => {
                ractor_cluster::client_connect_enc(server, target, t.connector.clone(), t.server_name.clone()).await
            }
            None => ractor_cluster::client_connect(server, target).await,
        };
        match dialed {
            Ok(()) => match endpoint_of(server, target, deadline, &mut ended).await {
                Ok(found) => {
                    result = Ok(found);
                    break;
                }
                Err(Handshake::Refused(why)) => {
                    result = Err(why);
                    break;
                }
                Err(Handshake::Timeout) => last_error = "the handshake did not finish".into(),
            },
            Err(e) => last_error = format!("{e}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let _ = server.cast(NodeServerMessage::UnsubscribeToEvents(watch_id));
    match result {
        Err(e) if e.is_empty() => Err(format!("node {address} did not answer in time ({last_error})")),
        other => other,
    }
}

static WATCH_IDS: AtomicU64 = AtomicU64::new(0);

/// Tells `connect` when an outgoing session to its target ends.
struct SessionEnds {
    target: String,
    ended: tokio::sync::mpsc::UnboundedSender<()>,
}

impl NodeEventSubscription for SessionEnds {
    fn node_session_opened(&self, _: NodeServerSessionInformation) {}

    fn node_session_disconnected(&self, ses: NodeServerSessionInformation) {
        if !ses.is_server && ses.peer_addr == self.target {
            let _ = self.ended.send(());
        }
    }

    fn node_session_authenticated(&self, _: NodeServerSessionInformation) {}
}

async fn resolve(address: &str) -> Result<SocketAddr, String> {
    tokio::net::lookup_host(address)
        .await
        .map_err(|e| format!("cannot resolve node address {address}: {e}"))?
        .next()
        .ok_or_else(|| format!("node address {address} resolves to nothing"))
}

enum Handshake {
    Refused(String),
    Timeout,
}

/// Polls the node server's sessions for the one to `target`, then the node group for
/// the endpoint on that session's node. A session that ends before the endpoint shows
/// up was closed by the peer during the handshake: that is how a wrong cookie looks.
async fn endpoint_of(
    server: &ActorRef<NodeServerMessage>,
    target: SocketAddr,
    deadline: Instant,
    ended: &mut tokio::sync::mpsc::UnboundedReceiver<()>,
) -> Result<ActorRef<NodeMsg>, Handshake> {
    let target = target.to_string();
    while Instant::now() < deadline {
        if ended.try_recv().is_ok() {
            return Err(Handshake::Refused(format!(
                "node {target} closed the connection during the handshake: authentication failed (wrong cookie?)"
            )));
        }
        let sessions = ractor::call!(server, NodeServerMessage::GetSessions).map_err(|_| Handshake::Timeout)?;
        let node_id = sessions.values().find(|s| !s.is_server && s.peer_addr == target).map(|s| s.node_id);
        let member = node_id.and_then(|id| {
            ractor::pg::get_members(&NODE_GROUP.to_string())
                .into_iter()
                .find(|cell| !cell.get_id().is_local() && cell.get_id().node() == id)
        });
        if let Some(cell) = member {
            return Ok(ActorRef::from(cell));
        }
        tokio::time::sleep(POLL).await;
    }
    Err(Handshake::Timeout)
}

/// Closes the session to the node of `endpoint` (a partitioned session would otherwise
/// linger until TCP gives up, and a reconnection would find it again).
pub(crate) async fn drop_session(server: &ActorRef<NodeServerMessage>, endpoint: &ActorRef<NodeMsg>) {
    let node_id = endpoint.get_id().node();
    if let Ok(sessions) = ractor::call!(server, NodeServerMessage::GetSessions) {
        for session in sessions.values().filter(|s| s.node_id == node_id) {
            session.actor.stop(Some("node lost".into()));
        }
    }
}
