//! What an engine is started with.

use std::path::PathBuf;
use std::sync::Arc;

use tokenrouter_core::model::LoadOptions;
use tokenrouter_core::policy::Policy;
use tokenrouter_core::sched::planner::ReplanConfig;
use tokenrouter_core::sched::BatchingRule;
use tokenrouter_core::spec::DraftingConfig;

pub use crate::kv_manager::AdmissionConfig;

#[derive(Debug, Clone)]
pub struct ModelSpec {
    /// Name requests and metrics use.
    pub name: String,
    /// A Hugging Face model folder.
    pub path: PathBuf,
    /// How to load it, its compute threads (`load.threads`) included.
    pub load: LoadOptions,
}

/// Per-subserver step limits.
#[derive(Debug, Clone)]
pub struct StepLimits {
    pub max_batch_rows: usize,
    pub prefill_chunk: usize,
    pub step_token_budget: usize,
    /// Speculative decoding's server-side settings.
    pub drafting: DraftingConfig,
}

impl Default for StepLimits {
    fn default() -> Self {
        StepLimits {
            max_batch_rows: 64,
            prefill_chunk: 512,
            step_token_budget: 1024,
            drafting: DraftingConfig::default(),
        }
    }
}

#[derive(Clone)]
pub struct EngineConfig {
    pub models: Vec<ModelSpec>,
    /// The policy a request gets when it names none.
    pub default_policy: Arc<dyn Policy>,
    pub batching: BatchingRule,
    pub limits: StepLimits,
    /// Let one model step at a time (taking turns fairly). Where models share the
    /// same few cores, concurrent steps only time-slice each other and thrash the
    /// caches; on separate devices leave it off.
    pub exclusive_compute: bool,
    /// Re-estimate routing and step latency from the engine's own counters on a timer
    /// and switch thresholds when the planner predicts a gain (opt-in).
    pub replan: Option<ReplanConfig>,
    /// KV reservations, the admission queue and time limits.
    pub admission: AdmissionConfig,
    /// How models that went out of service come back.
    pub supervision: SupervisionConfig,
}

/// A model that panicked too often is out of service; it reloads from its weights after
/// `restart_backoff`, doubling the wait after each failed or short-lived restart up to
/// `max_restart_backoff`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SupervisionConfig {
    pub restart_backoff: std::time::Duration,
    pub max_restart_backoff: std::time::Duration,
}

impl Default for SupervisionConfig {
    fn default() -> Self {
        SupervisionConfig {
            restart_backoff: std::time::Duration::from_secs(1),
            max_restart_backoff: std::time::Duration::from_secs(60),
        }
    }
}
