//! Starting the pools of a config: in-process engines of the config's models and
//! upstream servers, grouped into the short and the long pool.

use std::sync::Arc;

use anyhow::Context;
use tokenrouter_actors::{Engine, EngineConfig};
use tokenrouter_core::pool::PoolChoice;

use super::{Member, Pool, PoolDispatcher, UpstreamTimeouts};
use crate::config::{PoolEntry, PoolsSection};
use crate::http::Generator;

pub struct StartedPools {
    pub dispatcher: Arc<PoolDispatcher>,
    /// The in-process engines, to shut down when the server stops.
    pub engines: Vec<Engine>,
}

/// Starts every pool's engines (each an engine of `engine`'s models) and upstream
/// clients. The first in-process engine renders and tokenizes for all.
pub async fn start_pools(section: &PoolsSection, engine: &EngineConfig) -> anyhow::Result<StartedPools> {
    let mut engines = Vec::new();
    let short = start_pool(PoolChoice::Short, &section.short, engine, &mut engines).await?;
    let long = start_pool(PoolChoice::Long, &section.long, engine, &mut engines).await?;
    let Some(tokenizer) = engines.first().cloned() else {
        anyhow::bail!("pools need at least one in-process engine: it renders chat templates and tokenizes");
    };
    let tokenizer: Arc<dyn Generator> = Arc::new(tokenizer);
    let dispatcher = PoolDispatcher::new(short, long, tokenizer, section.estimator.clone());
    Ok(StartedPools { dispatcher: Arc::new(dispatcher), engines })
}

async fn start_pool(
    choice: PoolChoice,
    entry: &PoolEntry,
    engine: &EngineConfig,
    engines: &mut Vec<Engine>,
) -> anyhow::Result<Pool> {
    let mut members = Vec::new();
    for i in 0..entry.engine_count() {
        let started = Engine::start(engine.clone())
            .await
            .with_context(|| format!("starting engine {i} of the {} pool", choice.as_str()))?;
        engines.push(started.clone());
        members.push(Member::new(Arc::new(started), entry.concurrency));
    }
    for url in &entry.upstreams {
        members.push(Member::new(
            Arc::new(super::upstream::Upstream::new(url, UpstreamTimeouts::default())?),
            entry.concurrency,
        ));
    }
    Ok(Pool { choice, max_context: entry.max_context, members })
}
