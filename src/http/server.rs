//! Running the app: bind (port 0 picks a free port, for tests), serve on actix's
//! workers, and shut down gracefully when the caller's signal fires.
//!
//! The server is assembled from actix's parts, as actix-web's `HttpServer` does, with
//! one difference: every connection is wrapped in [`EnvelopedParseErrors`], so that
//! requests refused before any handler runs are answered in OpenAI's envelope too.

use std::future::Future;
use std::io;
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::time::Duration;

use actix_http::HttpService;
use actix_server::ServerHandle;
use actix_service::{fn_service, map_config, IntoServiceFactory, ServiceFactoryExt};
use actix_web::dev::AppConfig;
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
    for listener in listeners {
        let state = state.clone();
        server = server.listen("tokenrouter-http", listener, move || connection_service(state.clone()))?;
    }
    let server = server.run();
    let handle = server.handle();
    let task = tokio::spawn(server);
    let (watch_state, watch_handle) = (state.clone(), handle.clone());
    tokio::spawn(async move {
        shutdown_signal.await;
        shutdown(&watch_state, &watch_handle).await;
    });
    tracing::info!(%addr, "listening");
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

/// What serves one worker's connections: each wrapped, then HTTP/1 into the app.
fn connection_service(
    state: AppState,
) -> impl actix_service::ServiceFactory<
    TcpStream,
    Config = (),
    Response = (),
    Error = actix_http::error::DispatchError,
    InitError = (),
> {
    let app = build_app(state).into_factory().map_err(|e| e.error_response());
    let http = HttpService::build()
        // As actix-web's server: a client has a second to read the rest of a closing response.
        .client_disconnect_timeout(Duration::from_secs(1))
        // A client that closes its side is gone, not half-closed: abort its
        // connection, which drops the handler's future and so cancels a request
        // still being generated for a non-streamed response.
        .h1_allow_half_closed(false)
        .h1(map_config(app, |_| AppConfig::default()));
    fn_service(|stream: TcpStream| async move {
        // Without it Nagle's algorithm holds a streamed chunk for the client's delayed
        // ACK: ~40 ms on every first token over a kept-alive connection.
        let _ = stream.set_nodelay(true);
        let peer = stream.peer_addr().ok();
        Ok((EnvelopedParseErrors::new(stream), peer))
    })
    .and_then(http)
}
