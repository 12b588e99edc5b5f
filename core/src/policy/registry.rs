//! Builds a built-in policy from its config name and parameters. Each policy's
//! parameters are documented on its struct; `small`/`large` (model name or index,
//! default 0 and 1) apply to every two-model policy. Unknown keys are refused.
//!
//! | name | struct | parameters (defaults) |
//! |---|---|---|
//! | `random` | [`RandomDelegate`] | `p` (0.5) |
//! | `rstitch` | [`RStitch`] | `tau` (0.03) |
//! | `citer` | [`CiterDelegate`] | `tau` (0.98), `weights` (random) |
//! | `r2r` | [`R2rDelegate`] | `threshold` (0.5), `weights` (random), `embedding` (small model's folder) |
//! | `colm` | [`ColmDelegate`] | `eta` (0.15), `defer_index` (vocab − 1) |
//! | `me` | [`Ensemble`] | `weights` (required: list per model, or {model: weight}) |
//! | `glimprouter` | [`GlimpRouter`] | `threshold` (0.2), `boundary_tokens` or `boundary_text` ("\n\n") |
//! | `query-level` | [`QueryLevel`] | one of `prompt_len_above: N`, `random: p` |
//! | `always` | [`Always`] | `model` (0) |

use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::{DType, Tensor};
use serde_json::Value;

use super::citer::{CiterDelegate, CiterRouter};
use super::colm::ColmDelegate;
use super::delegate::BinaryAdapter;
use super::ensemble::Ensemble;
use super::error::PolicyError;
use super::glimprouter::{boundary_tokens_from_tokenizer, GlimpRouter};
use super::params::{quoted, resolve_model, Params};
use super::query::{Always, QueryLevel, QueryRule};
use super::r2r::{R2rDelegate, R2rRouter, R2rShape};
use super::random::RandomDelegate;
use super::rstitch::RStitch;
use super::shared_weights::SharedWeights;
use super::weights::TensorSource;
use super::{ModelInfo, Policy};
use crate::model::weights::Checkpoint;
use crate::model::ModelConfig;

/// Every name [`build`] accepts.
pub const POLICY_NAMES: &[&str] =
    &["random", "rstitch", "citer", "r2r", "colm", "me", "glimprouter", "query-level", "always"];

/// What building a policy may need besides its parameters.
#[derive(Debug, Clone, Default)]
pub struct PolicyContext {
    /// Each model's HF folder, in model order, where known: R2R reads the small model's
    /// embedding table and GlimpRouter its tokenizer from here.
    pub model_dirs: Vec<PathBuf>,
    /// Relative paths in parameters (router weights) resolve against this folder,
    /// typically the config file's; the working directory when `None`.
    pub base_dir: Option<PathBuf>,
    /// Seed of random router weights when a learned policy gets no weights file.
    pub seed: u64,
}

impl PolicyContext {
    fn resolve(&self, path: &str) -> PathBuf {
        match &self.base_dir {
            Some(base) => base.join(path),
            None => PathBuf::from(path),
        }
    }

    fn model_dir(&self, model: usize) -> Option<&Path> {
        self.model_dirs.get(model).map(PathBuf::as_path)
    }
}

/// The policy `name` with `params` (a JSON object, or null for defaults) over `models`.
pub fn build(
    name: &str,
    params: &Value,
    models: &[ModelInfo],
    ctx: &PolicyContext,
) -> Result<Arc<dyn Policy>, PolicyError> {
    build_shared(name, params, models, ctx, &SharedWeights::default())
}

/// [`build`], taking weight files (router weights, embedding tables) from `weights`, so
/// policies built from the same files share one copy in memory.
pub fn build_shared(
    name: &str,
    params: &Value,
    models: &[ModelInfo],
    ctx: &PolicyContext,
    weights: &SharedWeights,
) -> Result<Arc<dyn Policy>, PolicyError> {
    let mut p = Params::new(name, params)?;
    let policy: Arc<dyn Policy> = match name {
        "random" => {
            let delegate = RandomDelegate::new(p.probability("p", RandomDelegate::DEFAULT_P)?);
            Arc::new(BinaryAdapter::new(delegate, p.pair(models)?))
        }
        "rstitch" => Arc::new(RStitch::new(p.number("tau", RStitch::DEFAULT_TAU)?, p.pair(models)?)),
        "colm" => Arc::new(build_colm(&mut p, models)?),
        "citer" => Arc::new(build_citer(&mut p, models, ctx, weights)?),
        "r2r" => Arc::new(build_r2r(&mut p, models, ctx, weights)?),
        "me" => Arc::new(build_ensemble(&mut p, models)?),
        "glimprouter" => Arc::new(build_glimprouter(&mut p, models, ctx)?),
        "query-level" => Arc::new(build_query_level(&mut p, models)?),
        "always" => Arc::new(Always::new(p.model("model", 0, models)?)),
        _ => return Err(PolicyError::UnknownPolicy { name: name.to_string(), known: quoted(POLICY_NAMES) }),
    };
    p.finish()?;
    Ok(super::described::Described::wrap(policy, name, params))
}

fn build_colm(p: &mut Params<'_>, models: &[ModelInfo]) -> Result<BinaryAdapter<ColmDelegate>, PolicyError> {
    let eta = p.probability("eta", ColmDelegate::DEFAULT_ETA)?;
    let pair = p.pair(models)?;
    let vocab = models[pair.small].vocab_size;
    let defer_index = p.take::<usize>("defer_index")?.unwrap_or(vocab.saturating_sub(1));
    if defer_index >= vocab {
        return Err(p.error(format!("`defer_index` {defer_index} is outside the vocabulary (size {vocab})")));
    }
    Ok(BinaryAdapter::new(ColmDelegate::new(eta, defer_index), pair))
}

/// The router file named by `weights`, or random weights seeded by the context.
fn tensor_source(
    p: &mut Params<'_>,
    ctx: &PolicyContext,
    weights: &SharedWeights,
) -> Result<TensorSource, PolicyError> {
    match p.take::<String>("weights")? {
        Some(path) => {
            let path = ctx.resolve(&path);
            Ok(TensorSource::from_file_tensors(&path, weights.router_file(&path)?))
        }
        None => Ok(TensorSource::random(ctx.seed)),
    }
}

fn build_citer(
    p: &mut Params<'_>,
    models: &[ModelInfo],
    ctx: &PolicyContext,
    weights: &SharedWeights,
) -> Result<BinaryAdapter<CiterDelegate>, PolicyError> {
    let tau = p.number("tau", CiterDelegate::DEFAULT_TAU)?;
    let pair = p.pair(models)?;
    let router = CiterRouter::new(&mut tensor_source(p, ctx, weights)?, models[pair.small].hidden_size)?;
    Ok(BinaryAdapter::new(CiterDelegate::new(router, tau), pair))
}

fn build_r2r(
    p: &mut Params<'_>,
    models: &[ModelInfo],
    ctx: &PolicyContext,
    weights: &SharedWeights,
) -> Result<BinaryAdapter<R2rDelegate>, PolicyError> {
    let threshold = p.number("threshold", R2rDelegate::DEFAULT_THRESHOLD)?;
    let pair = p.pair(models)?;
    let mut source = tensor_source(p, ctx, weights)?;
    let embedding_dir = p.take::<String>("embedding")?.map(|path| ctx.resolve(&path));
    // The router file's own frozen table counts only when no folder is named.
    let embedding =
        match (embedding_dir, source.contains("token_embeddings.weight"), ctx.model_dir(pair.small)) {
            (Some(dir), _, _) => Some(weights.embedding_table(&dir, embedding_table)?),
            (None, true, _) => None,
            (None, false, Some(dir)) => Some(weights.embedding_table(dir, embedding_table)?),
            (None, false, None) => return Err(p.error(
                "needs the small model's embedding table: give its folder (`embedding`, or the engine's model folder)",
            )),
        };
    let router = R2rRouter::new(&mut source, embedding, &R2rShape::default())?;
    let hidden = models[pair.small].hidden_size;
    if router.hidden_size() != hidden {
        return Err(p.error(format!(
            "the router works on hidden size {}, but the small model `{}` has {hidden}",
            router.hidden_size(),
            models[pair.small].name
        )));
    }
    Ok(BinaryAdapter::new(R2rDelegate::new(router, threshold), pair))
}

/// `model.embed_tokens.weight` of an HF folder, as f32 (the router reads a few rows per
/// step; keeping f32 avoids a conversion per step at the cost of memory).
pub fn embedding_table(dir: &Path) -> Result<Tensor, PolicyError> {
    let config = ModelConfig::from_file(&dir.join("config.json"))?;
    let checkpoint = Checkpoint::open(dir, DType::F32)?;
    Ok(checkpoint.load("model.embed_tokens.weight", &[config.vocab_size, config.hidden_size])?)
}

fn build_ensemble(p: &mut Params<'_>, models: &[ModelInfo]) -> Result<Ensemble, PolicyError> {
    let raw = p.take_raw("weights").ok_or_else(|| p.error("`weights` is required (one per model)"))?;
    let weights = ensemble_weights(p.policy(), &raw, models)?;
    Ensemble::new(&weights).map_err(|message| p.error(message))
}

/// A list in model order (every entry positive), or an object keyed by model name or
/// index (named models positive, the others never drawn).
fn ensemble_weights(policy: &str, raw: &Value, models: &[ModelInfo]) -> Result<Vec<f64>, PolicyError> {
    let bad = |message: String| PolicyError::params(policy, format!("`weights`: {message}"));
    let positive = |value: &Value| value.as_f64().filter(|w| w.is_finite() && *w > 0.0);
    match raw {
        Value::Array(list) => {
            if list.len() != models.len() {
                return Err(bad(format!("{} weights for {} models", list.len(), models.len())));
            }
            list.iter().map(|v| positive(v).ok_or_else(|| bad(format!("{v} is not a positive number")))).collect()
        }
        Value::Object(map) => {
            let mut weights = vec![0.0; models.len()];
            for (model, value) in map {
                let key = model.parse::<u64>().map_or_else(|_| Value::from(model.as_str()), Value::from);
                let index = resolve_model(policy, &key, models)?;
                weights[index] =
                    positive(value).ok_or_else(|| bad(format!("{model}: {value} is not a positive number")))?;
            }
            Ok(weights)
        }
        other => Err(bad(format!("expected a list or an object, got {other}"))),
    }
}

fn build_glimprouter(
    p: &mut Params<'_>,
    models: &[ModelInfo],
    ctx: &PolicyContext,
) -> Result<GlimpRouter, PolicyError> {
    let threshold = p.number("threshold", GlimpRouter::DEFAULT_THRESHOLD)?;
    let pair = p.pair(models)?;
    let ids = p.take::<Vec<u32>>("boundary_tokens")?;
    let text = p.take::<String>("boundary_text")?;
    let boundary = match (ids, text) {
        (Some(_), Some(_)) => return Err(p.error("give `boundary_tokens` or `boundary_text`, not both")),
        (Some(ids), None) => ids,
        (None, text) => {
            let text = text.unwrap_or_else(|| GlimpRouter::DEFAULT_BOUNDARY_TEXT.to_string());
            boundary_from_folder(p, ctx.model_dir(pair.small), &text)?
        }
    };
    if boundary.is_empty() {
        return Err(p.error("no boundary token: a reasoning step would never end"));
    }
    Ok(GlimpRouter::new(threshold, boundary, pair))
}

fn boundary_from_folder(p: &Params<'_>, dir: Option<&Path>, text: &str) -> Result<Vec<u32>, PolicyError> {
    let dir = dir.ok_or_else(|| {
        p.error("give `boundary_tokens`, or the small model's folder to derive them from its tokenizer")
    })?;
    let path = dir.join("tokenizer.json");
    let tokenizer =
        tokenizers::Tokenizer::from_file(&path).map_err(|e| p.error(format!("cannot read {}: {e}", path.display())))?;
    boundary_tokens_from_tokenizer(&tokenizer, text).map_err(|message| p.error(message))
}

fn build_query_level(p: &mut Params<'_>, models: &[ModelInfo]) -> Result<QueryLevel, PolicyError> {
    let above = p.take::<usize>("prompt_len_above")?;
    let random = p.take::<f64>("random")?;
    let rule = match (above, random) {
        (Some(n), None) => QueryRule::PromptLenAbove(n),
        (None, Some(share)) if (0.0..=1.0).contains(&share) => QueryRule::Random(share),
        (None, Some(share)) => return Err(p.error(format!("`random` must be in [0, 1], got {share}"))),
        _ => return Err(p.error("give exactly one rule: `prompt_len_above` or `random`")),
    };
    Ok(QueryLevel::new(rule, p.pair(models)?))
}

#[cfg(test)]
#[path = "registry_tests.rs"]
mod tests;
