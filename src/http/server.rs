//! Running the app: bind (port 0 picks a free port, for tests), serve on actix's
//! workers, and shut down gracefully when the caller's signal fires.

use std::future::Future;
use std::io;
use std::net::{SocketAddr, ToSocketAddrs};

use actix_web::dev::ServerHandle;
use actix_web::HttpServer;

use super::build_app;
use super::state::AppState;

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
    let factory_state = state.clone();
    let mut server = HttpServer::new(move || build_app(factory_state.clone()))
        .disable_signals()
        // A client that closes its side is gone, not half-closed: abort its
        // connection, which drops the handler's future and so cancels a request
        // still being generated for a non-streamed response.
        .h1_allow_half_closed(false)
        // Without it Nagle's algorithm holds a streamed chunk for the client's delayed
        // ACK: ~40 ms on every first token over a kept-alive connection.
        .tcp_nodelay(true)
        .shutdown_timeout(limits.shutdown_grace.as_secs().max(1));
    if let Some(workers) = limits.workers {
        server = server.workers(workers.max(1));
    }
    let server = server.bind(bind)?;
    let addr = *server.addrs().first().ok_or_else(|| io::Error::other("bound to no address"))?;
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
