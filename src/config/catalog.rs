//! The policies a request may choose with `routing: {policy, params}`: the default and
//! those under `policy.allowed`. A request's parameters override the configured ones key
//! by key. Built policies are cached by (name, parameters), so identical requests share
//! one policy object (the engine batches a model's rows per policy object).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex};

use serde_json::{Map, Value};
use tokenrouter_core::policy::{self, ModelInfo, Policy, PolicyContext, PolicyError};

/// Distinct (name, parameters) pairs kept; beyond this, policies are built per request.
const CACHE_LIMIT: usize = 64;

/// What a request may call the default policy.
const DEFAULT_ALIAS: &str = "default";

/// Parameters that name files on the server: only the config may set them.
const SERVER_ONLY_KEYS: &[&str] = &["weights", "embedding"];

/// Why a request's routing choice was refused (a 400 for the HTTP layer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CatalogError {
    /// The policy is not allowed on this server (or does not exist).
    NotAllowed { name: String, allowed: Vec<String> },
    /// The parameters are malformed or out of range; the message names the key.
    InvalidParams(String),
}

impl CatalogError {
    /// The request field the error is about, for OpenAI's `error.param`.
    pub fn param(&self) -> &'static str {
        match self {
            CatalogError::NotAllowed { .. } => "routing.policy",
            CatalogError::InvalidParams(_) => "routing.params",
        }
    }
}

impl fmt::Display for CatalogError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CatalogError::NotAllowed { name, allowed } => {
                write!(f, "routing policy `{name}` is not allowed on this server; allowed: {}", allowed.join(", "))
            }
            CatalogError::InvalidParams(message) => f.write_str(message),
        }
    }
}

impl std::error::Error for CatalogError {}

pub struct PolicyCatalog {
    default_name: String,
    default_policy: Arc<dyn Policy>,
    /// Allowed names and their configured parameters (always an object).
    allowed: BTreeMap<String, Map<String, Value>>,
    models: Vec<ModelInfo>,
    ctx: PolicyContext,
    cache: Mutex<HashMap<(String, String), Arc<dyn Policy>>>,
}

impl fmt::Debug for PolicyCatalog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PolicyCatalog").field("default", &self.default_name).field("allowed", &self.allowed).finish()
    }
}

impl PolicyCatalog {
    /// Builds the default policy and every allowed one (so that bad configured parameters
    /// fail at start). `allowed` entries are (name, parameters); an entry with the
    /// default's name and no parameters inherits the default's. Errors carry the index
    /// of the failing entry (`None`: the default).
    pub fn new(
        default_name: &str,
        default_params: &Value,
        allowed: &[(String, Value)],
        models: Vec<ModelInfo>,
        ctx: PolicyContext,
    ) -> Result<Self, (Option<usize>, PolicyError)> {
        let default_policy = policy::build(default_name, default_params, &models, &ctx).map_err(|e| (None, e))?;
        let mut table = BTreeMap::new();
        table.insert(default_name.to_string(), as_object(default_params));
        for (name, params) in allowed {
            let mut base = match name == default_name {
                true => as_object(default_params),
                false => Map::new(),
            };
            base.extend(as_object(params));
            table.insert(name.clone(), base);
        }
        let catalog = PolicyCatalog {
            default_name: default_name.to_string(),
            default_policy: Arc::clone(&default_policy),
            allowed: table,
            models,
            ctx,
            cache: Mutex::new(HashMap::new()),
        };
        catalog.remember(default_name, &as_object(default_params), default_policy);
        for (i, (name, _)) in allowed.iter().enumerate() {
            let params = catalog.allowed[name].clone();
            let built = policy::build(name, &Value::Object(params.clone()), &catalog.models, &catalog.ctx)
                .map_err(|e| (Some(i), e))?;
            catalog.remember(name, &params, built);
        }
        Ok(catalog)
    }

    /// The policy requests get when they name none (the engine's `default_policy`).
    pub fn default_policy(&self) -> Arc<dyn Policy> {
        Arc::clone(&self.default_policy)
    }

    pub fn default_name(&self) -> &str {
        &self.default_name
    }

    /// Every policy a request may name, the default among them, sorted.
    pub fn names(&self) -> Vec<String> {
        self.allowed.keys().cloned().collect()
    }

    pub fn is_allowed(&self, name: &str) -> bool {
        self.allowed.contains_key(name)
    }

    /// The policy for a request's `routing` object: `name` (absent: the default) with the
    /// configured parameters overridden by `params` (an object, or null/absent).
    pub fn resolve(&self, name: Option<&str>, params: Option<&Value>) -> Result<Arc<dyn Policy>, CatalogError> {
        self.build(name.unwrap_or(&self.default_name), params)
    }

    /// The policy `name` (`"default"`: the default policy's name) with the configured
    /// parameters overridden by `params`. Refuses names the config does not allow and
    /// file-path parameters (server-only).
    pub fn build(&self, name: &str, params: Option<&Value>) -> Result<Arc<dyn Policy>, CatalogError> {
        let name = if name == DEFAULT_ALIAS && !self.allowed.contains_key(name) { &self.default_name } else { name };
        let Some(base) = self.allowed.get(name) else {
            return Err(CatalogError::NotAllowed { name: name.to_string(), allowed: self.names() });
        };
        let mut merged = base.clone();
        match params {
            None | Some(Value::Null) => {}
            Some(Value::Object(overrides)) => {
                for (key, value) in overrides {
                    if SERVER_ONLY_KEYS.contains(&key.as_str()) && value.is_string() {
                        return Err(CatalogError::InvalidParams(format!(
                            "routing.params.{key}: file paths are set in the server's configuration, not per request"
                        )));
                    }
                    merged.insert(key.clone(), value.clone());
                }
            }
            Some(other) => {
                return Err(CatalogError::InvalidParams(format!("routing.params must be an object, got {other}")));
            }
        }
        let key = (name.to_string(), Value::Object(merged.clone()).to_string());
        if let Some(found) = self.lock().get(&key) {
            return Ok(Arc::clone(found));
        }
        let built =
            policy::build(name, &Value::Object(merged.clone()), &self.models, &self.ctx).map_err(|e| match e {
                PolicyError::InvalidParams { .. } | PolicyError::UnknownModel { .. } => {
                    CatalogError::InvalidParams(e.to_string())
                }
                other => CatalogError::InvalidParams(format!("policy `{name}`: {other}")),
            })?;
        Ok(self.remember(name, &merged, built))
    }

    /// Caches `built` under (name, params) unless the cache is full; returns the cached
    /// object (an equal one may have been built concurrently).
    fn remember(&self, name: &str, params: &Map<String, Value>, built: Arc<dyn Policy>) -> Arc<dyn Policy> {
        let key = (name.to_string(), Value::Object(params.clone()).to_string());
        let mut cache = self.lock();
        if let Some(found) = cache.get(&key) {
            return Arc::clone(found);
        }
        if cache.len() < CACHE_LIMIT {
            cache.insert(key, Arc::clone(&built));
        }
        built
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Arc<dyn Policy>>> {
        self.cache.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

fn as_object(params: &Value) -> Map<String, Value> {
    match params {
        Value::Object(map) => map.clone(),
        _ => Map::new(),
    }
}
