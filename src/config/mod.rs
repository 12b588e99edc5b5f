//! The server's YAML configuration: models, the routing policy (and which policies a
//! request may pick), the scheduler and the HTTP server. Parsing refuses unknown keys
//! and wrong types with the key's path (`models[1].kv_budget_mib: ...`); semantic checks
//! (unknown model names, zero sizes, deadlocking thresholds) report paths the same way.
//! [`ServerConfig::prepare`] turns a config into what the engine and the HTTP layer
//! start with, writing random-weight preset models into a cache folder on first use.
//!
//! Every key and default is documented in `docs/configuration.md`.

mod admission;
mod cache;
mod catalog;
mod demo;
mod error;
mod hub;
mod known;
mod pools;
mod prepare;
mod remote;
mod scheduler;
mod schema;
mod tokenization;
mod tokenizer;
mod validate;
mod write;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_prepare;

use std::path::{Path, PathBuf};

pub use admission::{AdmissionSection, DebugSection, SupervisionSection};
pub use cache::{default_cache_dir, ModelCache, TokenizerChoice};
pub use catalog::{CatalogError, PolicyCatalog};
pub use demo::{builtin_config, demo_config, BUILTIN_CONFIG_NAMES};
pub use error::{ConfigError, Problem};
pub use hub::{fetch as fetch_from_hub, HubModel, HubSettings};
pub use known::{how_to_get, SMOLLM2_PYPI_PACKAGE};
pub use pools::{PoolEntry, PoolsSection};
pub use prepare::Prepared;
pub use remote::{ClusterSection, RemoteEntry, TlsSection, COOKIE_ENV};
pub use scheduler::{ExclusiveCompute, ReplanSection, ReplanSetting, SchedulerSection, ThresholdSpec};
pub use schema::{AllowedPolicy, KnownModel, ModelEntry, PolicySection, Preset, ServerSection, ServerTlsSection};
pub use tokenization::TokenizationSection;
pub use tokenizer::{builtin_tokenizer_files, DemoTokenizer, TokenizerKind, QWEN3_PYPI_PACKAGE};
pub use write::write_threshold_table;

/// The whole configuration file.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// The engine's models, in engine order (policies' `small`/`large` default to 0 and 1).
    pub models: Vec<ModelEntry>,
    #[serde(default)]
    pub policy: PolicySection,
    #[serde(default)]
    pub scheduler: SchedulerSection,
    #[serde(default)]
    pub server: ServerSection,
    #[serde(default)]
    pub admission: AdmissionSection,
    #[serde(default)]
    pub supervision: SupervisionSection,
    #[serde(default)]
    pub debug: DebugSection,
    /// Dual-pool routing over pools of engines (absent: one engine).
    #[serde(default)]
    pub pools: Option<PoolsSection>,
    #[serde(default)]
    pub tokenization: TokenizationSection,
    /// Models served by nodes on other hosts (absent: every model runs here).
    #[serde(default)]
    pub cluster: Option<ClusterSection>,
    /// Relative paths (model folders, router weights) resolve against this folder: the
    /// config file's. Not a YAML key.
    #[serde(skip)]
    pub base_dir: PathBuf,
}

impl ServerConfig {
    /// Reads, parses and checks a YAML file; errors name the file and the key.
    pub fn load(path: &Path) -> Result<ServerConfig, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::new("", format!("cannot read the configuration: {e}")).with_origin(path))?;
        let base = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        Self::from_yaml_str(&text, &base).map_err(|e| e.with_origin(path))
    }

    /// Parses and checks YAML text; relative paths in it resolve against `base_dir`.
    pub fn from_yaml_str(text: &str, base_dir: &Path) -> Result<ServerConfig, ConfigError> {
        let deserializer = serde_yaml_ng::Deserializer::from_str(text);
        let mut config: ServerConfig = serde_path_to_error::deserialize(deserializer).map_err(|e| {
            let path = e.path().to_string();
            let path = if path == "." { String::new() } else { path };
            // A map key that failed to parse shows as `?`: the map's path says enough.
            let path = path.strip_suffix(".?").map(str::to_string).unwrap_or(path);
            let message = strip_yaml_path(&e.into_inner().to_string(), &path);
            ConfigError::new(path, message)
        })?;
        config.base_dir = base_dir.to_path_buf();
        config.validate()?;
        Ok(config)
    }

    /// Where model `index`'s folder is: its `path` resolved against the config's folder,
    /// or `None` for a preset (its folder is in the cache, made by `prepare`).
    pub fn model_path(&self, index: usize) -> Option<PathBuf> {
        self.models[index].path.as_ref().map(|p| self.base_dir.join(p))
    }

    /// The Hub id `models[index].hub` names (validated when the config was loaded).
    pub fn hub_model(&self, index: usize) -> Option<HubModel> {
        self.models[index].hub.as_deref().and_then(HubModel::parse)
    }

    pub fn model_names(&self) -> Vec<String> {
        self.models.iter().map(|m| m.name.clone()).collect()
    }

    /// The smallest `max_context` of any model: a request moves between models, so the
    /// tightest cap holds for all. `None` when no model sets one (the models' own
    /// context, as the engine reports it, applies).
    pub fn context_cap(&self) -> Option<usize> {
        self.models.iter().filter_map(|m| m.max_context).min()
    }

    /// The context the server enforces, given the engine's (`Engine::max_context`).
    pub fn max_context(&self, engine_max_context: usize) -> usize {
        self.context_cap().map_or(engine_max_context, |cap| cap.min(engine_max_context))
    }

    /// The largest `max_tokens` a request may ask for: `server.max_tokens_limit`, else
    /// the context (either way never more than the context).
    pub fn max_tokens_limit(&self, engine_max_context: usize) -> usize {
        let context = self.max_context(engine_max_context);
        self.server.max_tokens_limit.map_or(context, |limit| limit.min(context))
    }
}

/// serde_yaml_ng prefixes its messages with the path of the enclosing value, which is the
/// key's path or a prefix of it; the key's own path (from serde_path_to_error) replaces it.
fn strip_yaml_path(message: &str, path: &str) -> String {
    match message.split_once(": ") {
        Some((prefix, rest)) if !path.is_empty() && path.starts_with(prefix) && !prefix.contains(' ') => {
            rest.to_string()
        }
        _ => message.to_string(),
    }
}
