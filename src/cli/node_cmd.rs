//! `tokenrouter node`: subservers for some models in a process that joins a cluster;
//! a front (`serve` with a `cluster:` section) sends them requests (docs/cluster.md).

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use tokenrouter_actors::remote::{serve_node, NodeOptions, NodeTls};

use crate::config::{ModelCache, ServerConfig, COOKIE_ENV};

#[derive(Args, Debug)]
pub struct NodeArgs {
    /// YAML configuration with the models this node serves (`models:`, and optionally
    /// `scheduler.exclusive_compute`); other sections are ignored.
    #[arg(long)]
    pub config: PathBuf,
    /// Address of the cluster listener, `HOST:PORT`.
    #[arg(long)]
    pub listen: SocketAddr,
    /// The cluster's shared secret (default: $TOKENROUTER_COOKIE).
    #[arg(long)]
    pub cookie: Option<String>,
    /// Serve TLS with this certificate chain (PEM); fronts then need `cluster.tls.ca`.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM).
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Obey fronts that inject faults (`POST /debug/fault` on a front with
    /// `debug.fault_injection`); also on with `debug.fault_injection: true` in this
    /// node's config. Off, such requests are refused and logged. For tests and drills.
    #[arg(long)]
    pub allow_fault_injection: bool,
    /// Skips the warm-up each model runs when a front first asks for it (as `serve
    /// --no-warm-up`): KV pages committed, one step at the largest batch, backtrace
    /// symbols loaded.
    #[arg(long)]
    pub no_warm_up: bool,
}

pub fn run(args: NodeArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(node(args))
}

async fn node(args: NodeArgs) -> anyhow::Result<()> {
    let cookie = match args.cookie {
        Some(c) => c,
        None => std::env::var(COOKIE_ENV).with_context(|| format!("give --cookie or set ${COOKIE_ENV}"))?,
    };
    let config = ServerConfig::load(&args.config)?;
    let cache = ModelCache::from_env();
    let prepared = tokio::task::block_in_place(|| config.prepare(&cache, None))?;
    if !args.no_warm_up {
        super::serve::enable_warm_up(&prepared.engine.limits);
    }
    let options = NodeOptions {
        listen: args.listen,
        cookie,
        // The front plans from served counters: a node's start-up profile would not reach it.
        models: prepared
            .engine
            .models
            .iter()
            .cloned()
            .map(|mut m| {
                m.load.step_cost = Default::default();
                m
            })
            .collect(),
        exclusive_compute: prepared.engine.exclusive_compute,
        base_dir: Some(config.base_dir.clone()),
        tls: args.tls_cert.zip(args.tls_key).map(|(cert, key)| NodeTls { cert, key }),
        allow_fault_injection: args.allow_fault_injection || config.debug.fault_injection,
    };
    let names: Vec<String> = options.models.iter().map(|m| m.name.clone()).collect();
    let node = serve_node(options).await.context("starting the node")?;
    println!("tokenrouter node listening on {} (models: {})", node.listen_addr(), names.join(", "));
    wait_for_signal().await;
    node.stop().await;
    println!("tokenrouter node stopped");
    Ok(())
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match (signal(SignalKind::interrupt()), signal(SignalKind::terminate())) {
        (Ok(mut interrupt), Ok(mut terminate)) => {
            tokio::select! {
                _ = interrupt.recv() => {}
                _ = terminate.recv() => {}
            }
        }
        _ => std::future::pending::<()>().await,
    }
}
