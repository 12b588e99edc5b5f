//! Running the app: bind (port 0 picks a free port, for tests), serve on actix's
//! workers, and shut down gracefully when the caller's signal fires.
//!
//! The server is assembled from actix's parts, as actix-web's `HttpServer` does, with
//! one difference: every connection is wrapped in [`EnvelopedParseErrors`], so that
//! requests refused before any handler runs are answered in OpenAI's envelope too.
//! With `AppState::tls` the connection is TLS underneath that wrapper (rustls, through
//! tokio-rustls as the cluster links use it; HTTP/1.1 only, as without TLS).

use std::future::Future;
use std::io;
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::time::Duration;

use actix_http::error::DispatchError;
use actix_http::HttpService;
use actix_server::{GracefulShutdownSignal, ServerHandle};
use actix_service::{fn_service, map_config, IntoServiceFactory, ServiceFactory, ServiceFactoryExt};
use actix_web::dev::AppConfig;
use tokenrouter_actors::tls::TlsAcceptor;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use super::build_app;
use super::parse_errors::EnvelopedParseErrors;
use super::state::AppState;

/// Pending connections the kernel keeps per listener (actix-web's default).
const BACKLOG: i32 = 1024;

/// A server that is accepting connections.
pub struct RunningServer {
    addr: SocketAddr,
    handle: ServerHandle,
    state: AppState,
    task: tokio::task::JoinHandle<io::Result<()>>,
}

impl RunningServer {
    /// The bound address (the real port when bound to port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `https` when the server speaks TLS, else `http`.
    pub fn scheme(&self) -> &'static str {
        match self.state.tls {
            Some(_) => "https",
            None => "http",
        }
    }

    /// Graceful shutdown now, as when the shutdown signal fires: `/health` turns
    /// 503, new generation requests get 503, the listener closes, and in-flight
    /// responses get `Limits::shutdown_grace` to finish before they are cut (which
    /// cancels their requests). Returns once the workers have stopped.
    pub async fn shutdown(&self) {
        shutdown(&self.state, &self.handle).await;
    }

    /// Waits until the server has stopped (after the signal or `shutdown`).
    pub async fn wait(self) -> io::Result<()> {
        self.task.await.map_err(io::Error::other)?
    }
}

async fn shutdown(state: &AppState, handle: &ServerHandle) {
    tracing::info!(grace_s = state.limits.shutdown_grace.as_secs_f64(), in_flight = state.in_flight(), "shutting down");
    state.begin_shutdown();
    handle.stop(true).await;
}

/// Binds and starts serving on the current tokio runtime. `shutdown` resolving
/// starts a graceful shutdown (give it e.g. a SIGINT/SIGTERM future; actix's own
/// signal handling is off). The engine is not shut down here: do that after `wait`.
pub async fn run_server<A, F>(state: AppState, bind: A, shutdown_signal: F) -> io::Result<RunningServer>
where
    A: ToSocketAddrs,
    F: Future<Output = ()> + Send + 'static,
{
    let limits = state.limits.clone();
    tokio::spawn(super::history::sample_until_shutdown(state.clone()));
    let mut server =
        actix_server::Server::build().disable_signals().shutdown_timeout(limits.shutdown_grace.as_secs().max(1));
    if let Some(workers) = limits.workers {
        server = server.workers(workers.max(1));
    }
    let listeners = listen(bind)?;
    let addr = listeners[0].local_addr()?;
    let stopping = server.graceful_shutdown_signal();
    for listener in listeners {
        let (state, stopping) = (state.clone(), stopping.clone());
        server = match state.tls.clone() {
            None => server
                .listen("tokenrouter-http", listener, move || plain_connections(state.clone(), stopping.clone()))?,
            Some(tls) => server.listen("tokenrouter-https", listener, move || {
                tls_connections(state.clone(), tls.clone(), stopping.clone())
            })?,
        };
    }
    let server = server.run();
    let handle = server.handle();
    let task = tokio::spawn(server);
    let (watch_state, watch_handle) = (state.clone(), handle.clone());
    tokio::spawn(async move {
        shutdown_signal.await;
        shutdown(&watch_state, &watch_handle).await;
    });
    tracing::info!(%addr, tls = state.tls.is_some(), "listening");
    Ok(RunningServer { addr, handle, state, task })
}

/// A listener on every address `bind` resolves to that can be bound.
fn listen(bind: impl ToSocketAddrs) -> io::Result<Vec<TcpListener>> {
    let mut listeners = Vec::new();
    let mut last_error = None;
    for addr in bind.to_socket_addrs()? {
        match bound_listener(addr) {
            Ok(listener) => listeners.push(listener),
            Err(e) => last_error = Some(e),
        }
    }
    match (listeners.is_empty(), last_error) {
        (false, _) => Ok(listeners),
        (true, Some(e)) => Err(e),
        (true, None) => Err(io::Error::other("the address resolved to nothing")),
    }
}

fn bound_listener(addr: SocketAddr) -> io::Result<TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    // A restarted server binds at once, not after TIME_WAIT.
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(BACKLOG)?;
    Ok(socket.into())
}

/// A client gets this long to finish its TLS handshake: without a limit, connections
/// opened and left silent would each hold a socket and a task forever.
const TLS_HANDSHAKE_LIMIT: Duration = Duration::from_secs(10);

/// What serves one worker's plain connections: each wrapped, then HTTP/1 into the app.
fn plain_connections(
    state: AppState,
    stopping: GracefulShutdownSignal,
) -> impl ServiceFactory<TcpStream, Config = (), Response = (), Error = DispatchError, InitError = ()> {
    fn_service(|stream: TcpStream| async move {
        let peer = accepted(&stream);
        Ok((EnvelopedParseErrors::new(stream), peer))
    })
    .and_then(http_service(state, stopping))
}

/// [`plain_connections`] over TLS: the handshake first, within [`TLS_HANDSHAKE_LIMIT`].
/// A client that fails it (plain HTTP to this port, a certificate it does not trust) is
/// dropped; there is no HTTP connection yet to answer on.
fn tls_connections(
    state: AppState,
    tls: TlsAcceptor,
    stopping: GracefulShutdownSignal,
) -> impl ServiceFactory<TcpStream, Config = (), Response = (), Error = DispatchError, InitError = ()> {
    fn_service(move |stream: TcpStream| {
        let tls = tls.clone();
        async move {
            let peer = accepted(&stream);
            let handshake = tokio::time::timeout(TLS_HANDSHAKE_LIMIT, tls.accept(stream)).await;
            let stream = handshake.map_err(|_| io::Error::from(io::ErrorKind::TimedOut)).and_then(|done| done);
            let stream = stream.map_err(|e| {
                tracing::debug!(?peer, %e, "TLS handshake failed");
                DispatchError::Io(e)
            })?;
            Ok((EnvelopedParseErrors::new(stream), peer))
        }
    })
    .and_then(http_service(state, stopping))
}

/// Socket settings for a new connection; returns its peer's address.
fn accepted(stream: &TcpStream) -> Option<SocketAddr> {
    // Without it Nagle's algorithm holds a streamed chunk for the client's delayed
    // ACK: ~40 ms on every first token over a kept-alive connection.
    let _ = stream.set_nodelay(true);
    stream.peer_addr().ok()
}

/// HTTP/1 into the app, over any (wrapped) connection.
fn http_service<T>(
    state: AppState,
    stopping: GracefulShutdownSignal,
) -> impl ServiceFactory<(T, Option<SocketAddr>), Config = (), Response = (), Error = DispatchError, InitError = ()>
where
    T: AsyncRead + AsyncWrite + Unpin + 'static,
{
    let idle_connection = state.limits.idle_connection;
    let app = build_app(state).into_factory().map_err(|e| e.error_response());
    HttpService::build()
        .keep_alive(idle_connection)
        .client_request_timeout(idle_connection)
        // At a graceful stop, idle keep-alive connections close at once and busy ones
        // after their current response (a stream included), so the stop waits for
        // work in flight, not for clients that keep a connection open.
        .graceful_shutdown_signal(move || {
            let stopping = stopping.clone();
            async move { stopping.notified().await }
        })
        // As actix-web's server: a client has a second to read the rest of a closing response.
        .client_disconnect_timeout(Duration::from_secs(1))
        // A client that closes its side is gone, not half-closed: abort its
        // connection, which drops the handler's future and so cancels a request
        // still being generated for a non-streamed response.
        .h1_allow_half_closed(false)
        .h1(map_config(app, |_| AppConfig::default()))
}
