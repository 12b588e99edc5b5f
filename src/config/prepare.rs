//! From a checked config to what the server starts with: model folders (presets written
//! into the cache), the engine's config, and the catalog of per-request policies.

use std::path::{Path, PathBuf};

use indicatif::MultiProgress;
use serde_json::Value;
use tokenrouter_actors::{EngineConfig, ModelSpec, StepLimits};
use tokenrouter_core::model::gguf_read::{files_folder, is_gguf_file};
use tokenrouter_core::model::presets::{self, QWEN3_VOCAB};
use tokenrouter_core::model::profile::{profile_points, Profile};
use tokenrouter_core::model::{self as model, LoadOptions, ModelConfig, StepCostSource};
use tokenrouter_core::policy::{self, ModelInfo, PolicyContext, PolicyError};

use super::cache::{preset_config_for, ModelCache};
use super::catalog::PolicyCatalog;
use super::error::{ConfigError, Problems};
use super::hub::{self, HubSettings};
use super::tokenizer::DemoTokenizer;
use super::ServerConfig;

/// Policies whose parameters are checked against the models' folders.
const READS_MODEL_FOLDERS: &[&str] = &["r2r", "glimprouter"];

/// Everything the server needs from its config.
pub struct Prepared {
    pub engine: EngineConfig,
    /// The per-request policies; its default is `engine.default_policy` (the same object).
    pub catalog: PolicyCatalog,
    /// Each model's folder, in engine order.
    pub model_dirs: Vec<PathBuf>,
    /// Each model's architecture as read from its folder.
    pub model_configs: Vec<ModelConfig>,
    /// The tokenizer preset models were made with (`None` without presets).
    pub preset_tokenizer: Option<DemoTokenizer>,
}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prepared")
            .field("models", &self.engine.models)
            .field("catalog", &self.catalog)
            .field("model_dirs", &self.model_dirs)
            .finish_non_exhaustive()
    }
}

impl ServerConfig {
    /// Writes preset models that are not in the cache yet (showing progress under
    /// `progress`), reads every model's config.json, and builds the policies, the
    /// batching rule and the engine config. Nothing is loaded into memory yet:
    /// `Engine::start(prepared.engine)` does that.
    pub fn prepare(&self, cache: &ModelCache, progress: Option<&MultiProgress>) -> Result<Prepared, ConfigError> {
        let mut model_paths = Vec::new();
        let mut problems = Problems::default();
        for (i, m) in self.models.iter().enumerate() {
            let seed = m.seed.unwrap_or(0);
            let dir = match (self.model_path(i), m.preset, m.source, self.hub_model(i)) {
                (Some(path), ..) if is_gguf_file(&path) => Ok(cache.gguf_with_tokenizer(&path)),
                (Some(path), ..) => Ok(path),
                (None, Some(preset), ..) => match m.tokenizer {
                    Some(known) => cache.preset_model_for(preset, seed, known, progress),
                    None => cache.preset_model(preset, seed, progress),
                },
                (None, None, Some(known), _) => cache.known_model(known, progress),
                (None, None, None, Some(id)) => {
                    hub::fetch(&id, &HubSettings::from_env(), progress).map(|path| match is_gguf_file(&path) {
                        true => cache.gguf_with_tokenizer(&path),
                        false => path,
                    })
                }
                (None, None, None, None) => Err("none of `path`, `preset`, `source`, `hub`".to_string()),
            };
            match dir {
                Ok(dir) => model_paths.push(dir),
                Err(e) => problems.push(format!("models[{i}]"), e),
            }
        }
        problems.finish()?;
        let model_configs = self.read_model_configs(&model_paths)?;
        let model_dirs: Vec<PathBuf> = model_paths.iter().map(|p| files_folder(p)).collect();
        let infos = model_infos(&self.model_names(), &model_configs);
        let ctx = PolicyContext {
            model_dirs: model_dirs.clone(),
            base_dir: Some(self.base_dir.clone()),
            seed: self.policy.seed,
        };
        let allowed: Vec<(String, Value)> =
            self.policy.allowed.iter().map(|a| (a.name.clone(), a.params.clone())).collect();
        let catalog = PolicyCatalog::new(&self.policy.name, &self.policy.params, &allowed, infos, ctx)
            .map_err(|(index, e)| policy_error(index, &e))?;
        let step_costs = self.step_cost_sources()?;
        let models = self
            .models
            .iter()
            .zip(&model_paths)
            .zip(step_costs)
            .map(|((m, path), step_cost)| ModelSpec {
                name: m.name.clone(),
                path: path.clone(),
                load: LoadOptions {
                    dtype: m.dtype,
                    kv_budget_bytes: (m.kv_budget_mib << 20) as usize,
                    block_size: m.block_size,
                    kv_dtype: m.kv_dtype,
                    backend: m.backend,
                    threads: m.threads,
                    prefix_cache: m.prefix_cache,
                    shared_kv: None,
                    device: m.device,
                    step_cost,
                },
            })
            .collect();
        let engine = EngineConfig {
            models,
            default_policy: catalog.default_policy(),
            batching: self.batching_rule()?,
            limits: self.step_limits(),
            exclusive_compute: self.exclusive_compute(),
            replan: self.replan_config(),
            admission: self.admission_config(),
            supervision: self.supervision_config(),
        };
        let preset_tokenizer = match self.models.iter().any(|m| m.preset.is_some() && m.tokenizer.is_none()) {
            true => cache.tokenizer(progress).ok().cloned(),
            false => None,
        };
        Ok(Prepared { engine, catalog, model_dirs, model_configs, preset_tokenizer })
    }

    /// Where each model's start-up cost comes from: its saved `profile`, else a short
    /// measurement when the planner plans at start (and `startup_profile` is on).
    fn step_cost_sources(&self) -> Result<Vec<StepCostSource>, ConfigError> {
        let plan_at_start = self.replan_config().is_some_and(|r| r.plan_at_start);
        let mut problems = Problems::default();
        let mut sources = Vec::new();
        for (i, m) in self.models.iter().enumerate() {
            let source = match &m.profile {
                Some(file) => match read_profile(&self.base_dir.join(file)) {
                    Ok(points) => StepCostSource::Saved(points),
                    Err(e) => {
                        problems.push(format!("models[{i}].profile"), e);
                        StepCostSource::None
                    }
                },
                None if plan_at_start && self.scheduler.startup_profile => StepCostSource::Measure {
                    max_rows: self.scheduler.max_batch_rows,
                    max_tokens: self.scheduler.step_token_budget,
                },
                None => StepCostSource::None,
            };
            sources.push(source);
        }
        problems.finish()?;
        Ok(sources)
    }

    /// [`prepare`](Self::prepare), keeping only the engine's config.
    pub fn engine_config(
        &self,
        cache: &ModelCache,
        progress: Option<&MultiProgress>,
    ) -> Result<EngineConfig, ConfigError> {
        Ok(self.prepare(cache, progress)?.engine)
    }

    pub fn admission_config(&self) -> tokenrouter_actors::AdmissionConfig {
        self.admission.to_engine()
    }

    pub fn supervision_config(&self) -> tokenrouter_actors::SupervisionConfig {
        self.supervision.to_engine()
    }

    pub fn step_limits(&self) -> StepLimits {
        StepLimits {
            max_batch_rows: self.scheduler.max_batch_rows,
            prefill_chunk: self.scheduler.prefill_chunk,
            step_token_budget: self.scheduler.step_token_budget,
            drafting: self.scheduler.speculative.as_ref().map(|s| s.drafting()).unwrap_or_default(),
        }
    }

    /// Checks what `prepare` would, without writing anything: folder models' config.json,
    /// and the default and allowed policies' parameters against the models (presets as
    /// their architecture with Qwen3's vocabulary). Policies that read model folders
    /// (r2r, glimprouter) are checked only when no model is a preset.
    pub fn check(&self) -> Result<(), ConfigError> {
        self.check_with(&ModelCache::from_env())
    }

    /// [`check`](Self::check), with known models' shapes read from files in `cache` (or
    /// their nominal shapes when not fetched yet); nothing is written.
    pub fn check_with(&self, cache: &ModelCache) -> Result<(), ConfigError> {
        self.validate()?;
        let mut dirs = Vec::new();
        let mut configs = Vec::new();
        for (i, m) in self.models.iter().enumerate() {
            let hub_path = self.hub_model(i).and_then(|id| hub::cached(&id, &HubSettings::from_env()));
            match (self.model_path(i).or(hub_path), m.preset, m.source) {
                (Some(path), _, _) => {
                    configs.push(read_model_config(i, &path)?);
                    dirs.push(files_folder(&path));
                }
                (None, Some(preset), _) => configs.push(match m.tokenizer {
                    Some(known) => preset_config_for(preset, &cache.known_model_config(known)),
                    None => presets::preset(preset.as_str()).expect("every Preset is a core preset"),
                }),
                (None, None, Some(known)) => configs.push(cache.known_model_config(known)),
                // A Hub model not downloaded yet: its shape is unknown until it is, so the
                // policies cannot be checked against it here.
                (None, None, None) if m.hub.is_some() => return Ok(()),
                (None, None, None) => {
                    return Err(ConfigError::new(format!("models[{i}]"), "none of `path`, `preset`, `source`, `hub`"))
                }
            }
        }
        let folders_known = dirs.len() == self.models.len();
        let infos = model_infos(&self.model_names(), &configs);
        let ctx = PolicyContext { model_dirs: dirs, base_dir: Some(self.base_dir.clone()), seed: self.policy.seed };
        let mut entries = vec![(None, self.policy.name.as_str(), self.policy.params.clone())];
        for (i, a) in self.policy.allowed.iter().enumerate() {
            let mut params = match (a.name == self.policy.name, &self.policy.params) {
                (true, Value::Object(base)) => base.clone(),
                _ => serde_json::Map::new(),
            };
            if let Value::Object(own) = &a.params {
                params.extend(own.clone());
            }
            entries.push((Some(i), a.name.as_str(), Value::Object(params)));
        }
        let mut problems = Problems::default();
        for (index, name, params) in entries {
            if !folders_known && READS_MODEL_FOLDERS.contains(&name) {
                continue;
            }
            if let Err(e) = policy::build(name, &params, &infos, &ctx) {
                problems.absorb(policy_error(index, &e));
            }
        }
        problems.finish()
    }

    fn read_model_configs(&self, paths: &[PathBuf]) -> Result<Vec<ModelConfig>, ConfigError> {
        paths.iter().zip(&self.models).enumerate().map(|(i, (path, _))| read_model_config(i, path)).collect()
    }
}

/// A folder's config.json, or a GGUF file's metadata (either backend: candle keeps a
/// llama GGUF's matrices quantized).
fn read_model_config(index: usize, path: &std::path::Path) -> Result<ModelConfig, ConfigError> {
    let at = format!("models[{index}].path");
    if !path.is_dir() && !is_gguf_file(path) {
        return Err(ConfigError::new(at, format!("{} is not a folder or a .gguf file", path.display())));
    }
    model::read_model_config(path).map_err(|e| ConfigError::new(at, e.to_string()))
}

/// What policies know of the models: hidden sizes, and the vocabulary all share (the
/// smallest, as the engine slices logits to it).
fn model_infos(names: &[String], configs: &[ModelConfig]) -> Vec<ModelInfo> {
    let vocab = configs.iter().map(|c| c.vocab_size).min().unwrap_or(QWEN3_VOCAB);
    names
        .iter()
        .zip(configs)
        .map(|(name, c)| ModelInfo { name: name.clone(), hidden_size: c.hidden_size, vocab_size: vocab })
        .collect()
}

/// A policy build error at the key it is about: the default (`None`) or `allowed[i]`.
fn policy_error(index: Option<usize>, e: &PolicyError) -> ConfigError {
    let path = match (index, e) {
        (None, PolicyError::UnknownPolicy { .. }) => "policy.name".to_string(),
        (None, _) => "policy.params".to_string(),
        (Some(i), PolicyError::UnknownPolicy { .. }) => format!("policy.allowed[{i}].name"),
        (Some(i), _) => format!("policy.allowed[{i}].params"),
    };
    ConfigError::new(path, e.to_string())
}

/// The (tokens fed, ms) points of a `tokenrouter profile` JSON.
fn read_profile(path: &Path) -> Result<Vec<(usize, f64)>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let profile: Profile = serde_json::from_str(&text)
        .map_err(|e| format!("{} is not a `tokenrouter profile` JSON: {e}", path.display()))?;
    let points = profile_points(&profile);
    if points.is_empty() {
        return Err(format!("{} has no step timings", path.display()));
    }
    Ok(points)
}
