//! The policies a request may choose with `routing: {policy, params}`: the default and
//! those under `policy.allowed`. A request's parameters override the configured ones key
//! by key. Built policies are cached by (name, canonical parameters), so identical
//! requests share one policy object (the engine batches a model's rows per policy
//! object): the configured ones for the catalog's life, request-made ones in a bounded
//! LRU. Every policy takes its weight files from one [`SharedWeights`], so parameter sets
//! that differ only in numbers never read a router file or embedding table again.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex, MutexGuard};

use lru::LruCache;
use serde_json::{Map, Value};
use tokenrouter_core::policy::{self, ModelInfo, Policy, PolicyContext, PolicyError, SharedWeights};

/// Request-made (name, parameters) pairs kept; the least recently used goes first.
pub const REQUEST_POLICY_CACHE: usize = 64;

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
    weights: SharedWeights,
    /// The default and allowed policies as configured: never evicted, so a request
    /// naming one gets the very object the engine batches by.
    configured: HashMap<PolicyKey, Arc<dyn Policy>>,
    /// Policies built for requests' parameters.
    recent: Mutex<LruCache<PolicyKey, Arc<dyn Policy>>>,
}

/// A policy name and its merged parameters as canonical JSON (keys sorted at every
/// level), so key order in a request does not make a new policy.
type PolicyKey = (String, String);

fn policy_key(name: &str, params: &Map<String, Value>) -> PolicyKey {
    (name.to_string(), canonical(&Value::Object(params.clone())).to_string())
}

fn canonical(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let sorted: BTreeMap<&String, Value> = map.iter().map(|(k, v)| (k, canonical(v))).collect();
            Value::Object(sorted.into_iter().map(|(k, v)| (k.clone(), v)).collect())
        }
        Value::Array(items) => Value::Array(items.iter().map(canonical).collect()),
        other => other.clone(),
    }
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
        let weights = SharedWeights::default();
        let default_policy =
            policy::build_shared(default_name, default_params, &models, &ctx, &weights).map_err(|e| (None, e))?;
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
        let mut configured = HashMap::new();
        configured.insert(policy_key(default_name, &as_object(default_params)), Arc::clone(&default_policy));
        for (i, (name, _)) in allowed.iter().enumerate() {
            let key = policy_key(name, &table[name]);
            if configured.contains_key(&key) {
                continue;
            }
            let built = policy::build_shared(name, &Value::Object(table[name].clone()), &models, &ctx, &weights)
                .map_err(|e| (Some(i), e))?;
            configured.insert(key, built);
        }
        let capacity = NonZeroUsize::new(REQUEST_POLICY_CACHE).expect("a positive capacity");
        Ok(PolicyCatalog {
            default_name: default_name.to_string(),
            default_policy,
            allowed: table,
            models,
            ctx,
            weights,
            configured,
            recent: Mutex::new(LruCache::new(capacity)),
        })
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
        let key = policy_key(name, &merged);
        if let Some(found) = self.cached(&key) {
            return Ok(found);
        }
        // Built outside the lock: a slow build must not stall requests that hit the cache.
        let built = policy::build_shared(name, &Value::Object(merged), &self.models, &self.ctx, &self.weights)
            .map_err(|e| match e {
                PolicyError::InvalidParams { .. } | PolicyError::UnknownModel { .. } => {
                    CatalogError::InvalidParams(e.to_string())
                }
                other => CatalogError::InvalidParams(format!("policy `{name}`: {other}")),
            })?;
        Ok(self.remember(key, built))
    }

    /// Request-made policies held now (at most [`REQUEST_POLICY_CACHE`]).
    pub fn cached_request_policies(&self) -> usize {
        self.lock().len()
    }

    /// The weight files every policy of this catalog shares.
    pub fn shared_weights(&self) -> &SharedWeights {
        &self.weights
    }

    fn cached(&self, key: &PolicyKey) -> Option<Arc<dyn Policy>> {
        if let Some(found) = self.configured.get(key) {
            return Some(Arc::clone(found));
        }
        self.lock().get(key).map(Arc::clone)
    }

    /// Caches `built`, evicting the least recently used beyond the bound; returns the
    /// cached object (an equal one may have been built concurrently).
    fn remember(&self, key: PolicyKey, built: Arc<dyn Policy>) -> Arc<dyn Policy> {
        let mut recent = self.lock();
        if let Some(found) = recent.get(&key) {
            return Arc::clone(found);
        }
        recent.put(key, Arc::clone(&built));
        built
    }

    fn lock(&self) -> MutexGuard<'_, LruCache<PolicyKey, Arc<dyn Policy>>> {
        self.recent.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

fn as_object(params: &Value) -> Map<String, Value> {
    match params {
        Value::Object(map) => map.clone(),
        _ => Map::new(),
    }
}

#[cfg(test)]
#[path = "catalog_tests.rs"]
mod tests;
