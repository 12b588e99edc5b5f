//! `pools`: dual-pool token-budget routing (DESIGN.md §8). Each pool is a group of
//! in-process engines (of the `models` above) and/or upstream OpenAI-compatible servers,
//! with its own context limit and concurrency per member; the estimator's settings
//! say how budgets are estimated from prompt bytes.

use serde::Deserialize;
use tokenrouter_core::pool::EstimatorConfig;

use super::error::Problems;
use super::ServerConfig;

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolsSection {
    pub short: PoolEntry,
    pub long: PoolEntry,
    #[serde(default)]
    pub estimator: EstimatorConfig,
}

/// One pool.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolEntry {
    /// Longest request (prompt + max_tokens) the pool serves; longer ones it refuses.
    pub max_context: usize,
    /// Requests in flight per member; more wait for a free slot.
    #[serde(default = "default_concurrency")]
    pub concurrency: usize,
    /// In-process engines running `models` (default: 1 without upstreams, else 0).
    #[serde(default)]
    pub engines: Option<usize>,
    /// Base URLs of OpenAI-compatible servers (`http://host:port`) with the same
    /// tokenizer, sent token-id prompts on `/v1/completions`.
    #[serde(default)]
    pub upstreams: Vec<String>,
}

impl PoolEntry {
    pub fn engine_count(&self) -> usize {
        self.engines.unwrap_or(usize::from(self.upstreams.is_empty()))
    }
}

fn default_concurrency() -> usize {
    64
}

impl ServerConfig {
    pub(super) fn check_pools(&self, p: &mut Problems) {
        let Some(pools) = &self.pools else { return };
        for (name, pool) in [("short", &pools.short), ("long", &pools.long)] {
            let at = |key: &str| format!("pools.{name}.{key}");
            if pool.max_context == 0 {
                p.push(at("max_context"), "must be at least 1");
            }
            if pool.concurrency == 0 {
                p.push(at("concurrency"), "must be at least 1");
            }
            if pool.engine_count() + pool.upstreams.len() == 0 {
                p.push(format!("pools.{name}"), "give at least one engine or upstream");
            }
            for (i, url) in pool.upstreams.iter().enumerate() {
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    p.push(format!("pools.{name}.upstreams[{i}]"), format!("`{url}` is not an http(s) URL"));
                }
            }
        }
        if pools.short.max_context >= pools.long.max_context {
            p.push(
                "pools.short.max_context",
                format!("must be below the long pool's ({} ≥ {})", pools.short.max_context, pools.long.max_context),
            );
        }
        for (key, message) in pools.estimator.problems() {
            p.push(format!("pools.estimator.{key}"), message);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::ServerConfig;

    const MODELS: &str = "models:\n  - {name: m, preset: tiny}\n";

    fn parse(pools: &str) -> Result<ServerConfig, crate::config::ConfigError> {
        ServerConfig::from_yaml_str(&format!("{MODELS}{pools}"), Path::new("."))
    }

    #[test]
    fn a_pools_section_parses_with_defaults() {
        let c = parse(
            "pools:\n  short: {max_context: 2048, concurrency: 32}\n  long: {max_context: 8192, upstreams: [\"http://h:1\"]}\n  estimator: {gamma: 2}\n",
        )
        .unwrap();
        let pools = c.pools.unwrap();
        assert_eq!((pools.short.engine_count(), pools.long.engine_count()), (1, 0));
        assert_eq!(pools.long.concurrency, 64);
        assert_eq!(pools.estimator.gamma, 2.0);
        assert_eq!(pools.estimator.beta, 0.95);
    }

    #[test]
    fn bad_pools_name_their_keys() {
        let e = parse(
            "pools:\n  short: {max_context: 9000, concurrency: 0}\n  long: {max_context: 8192, engines: 0, upstreams: [\"h:1\"]}\n  estimator: {beta: 1.5}\n",
        )
        .unwrap_err();
        for key in
            ["pools.short.concurrency", "pools.short.max_context", "pools.long.upstreams[0]", "pools.estimator.beta"]
        {
            assert!(e.mentions(key), "{key}: {e:?}");
        }
        assert!(parse("pools:\n  short: {max_context: 1}\n").unwrap_err().mentions("pools"));
    }
}
