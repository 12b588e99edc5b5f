//! `cluster:` in the front's config: which models run on other hosts (docs/cluster.md).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use tokenrouter_actors::remote::{ClusterConfig, FrontTls, RemoteModel};

/// The environment variable a cookie may come from instead of the file.
pub const COOKIE_ENV: &str = "TOKENROUTER_COOKIE";

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSection {
    /// The cluster's shared secret; absent: `$TOKENROUTER_COOKIE`.
    #[serde(default)]
    pub cookie: Option<String>,
    /// Models served by nodes: `{model, node, replacements}`.
    pub remote: Vec<RemoteEntry>,
    #[serde(default = "defaults::connect_timeout_s")]
    pub connect_timeout_s: f64,
    #[serde(default = "defaults::heartbeat_ms")]
    pub heartbeat_ms: u64,
    #[serde(default = "defaults::loss_timeout_ms")]
    pub loss_timeout_ms: u64,
    #[serde(default = "defaults::resume_timeout_s")]
    pub resume_timeout_s: f64,
    /// Verify the nodes' TLS certificates (the nodes run with `--tls-cert/--tls-key`).
    #[serde(default)]
    pub tls: Option<TlsSection>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSection {
    /// PEM file of the CA that signed the nodes' certificates; relative to the config file.
    pub ca: PathBuf,
    /// Name the certificates must carry; default: each node address's host.
    #[serde(default)]
    pub server_name: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteEntry {
    pub model: String,
    /// `host:port` of the node (`tokenrouter node --listen`).
    pub node: String,
    #[serde(default)]
    pub replacements: Vec<String>,
}

mod defaults {
    pub fn connect_timeout_s() -> f64 {
        60.0
    }
    pub fn heartbeat_ms() -> u64 {
        250
    }
    pub fn loss_timeout_ms() -> u64 {
        2000
    }
    pub fn resume_timeout_s() -> f64 {
        10.0
    }
}

impl ClusterSection {
    /// Problems as (key, message), for the config's checks.
    pub fn problems(&self, model_names: &[String]) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for (i, r) in self.remote.iter().enumerate() {
            if !model_names.contains(&r.model) {
                out.push((format!("cluster.remote[{i}].model"), format!("`{}` is not one of `models`", r.model)));
            }
        }
        let positive = |v: f64| v.is_finite() && v > 0.0;
        if !positive(self.connect_timeout_s) || !positive(self.resume_timeout_s) {
            out.push(("cluster".into(), "connect_timeout_s and resume_timeout_s must be positive".into()));
        }
        if self.heartbeat_ms == 0 || self.loss_timeout_ms <= self.heartbeat_ms {
            out.push(("cluster.loss_timeout_ms".into(), "must exceed heartbeat_ms (> 0)".into()));
        }
        out
    }

    /// The engine's cluster settings; the cookie from the file or the environment.
    pub fn engine_config(&self, policy_seed: u64, base_dir: &Path) -> Result<ClusterConfig, String> {
        let cookie = match &self.cookie {
            Some(c) => c.clone(),
            None => std::env::var(COOKIE_ENV)
                .map_err(|_| format!("cluster: no cookie (set `cluster.cookie` or ${COOKIE_ENV})"))?,
        };
        let remote = self
            .remote
            .iter()
            .map(|r| RemoteModel { model: r.model.clone(), node: r.node.clone(), replacements: r.replacements.clone() })
            .collect();
        let mut config = ClusterConfig::new(cookie, remote);
        config.connect_timeout = Duration::from_secs_f64(self.connect_timeout_s);
        config.heartbeat = Duration::from_millis(self.heartbeat_ms);
        config.loss_timeout = Duration::from_millis(self.loss_timeout_ms);
        config.resume_timeout = Duration::from_secs_f64(self.resume_timeout_s);
        config.policy_seed = policy_seed;
        config.tls =
            self.tls.as_ref().map(|t| FrontTls { ca: base_dir.join(&t.ca), server_name: t.server_name.clone() });
        Ok(config)
    }
}
