//! `r2r` (Roads to Rome): a learned router on the small model's step. Inputs per row:
//! the last hidden state `h` (d), the embedding of the sampled token `e` (d, a frozen
//! copy of the small model's table) and the top-k logits, sorted descending, projected
//! to d. `[h, e, proj(top-k)]` (3d) → Linear → width → residual pre-LN MLP blocks →
//! LayerNorm → Linear → 1 logit; sigmoid ≥ threshold sends the position to the large
//! model. All rows of a step go through one batched forward.
//!
//! Router file (safetensors) = the state dict of R2R's
//! `HiddenStatesTokenLMHeadLogitsClassifier`, so published routers load after a plain
//! `torch.load` → `safetensors.torch.save_file` conversion (`nn.Linear` layout: weight
//! `(out, in)`, bias `(out)`):
//! - `logits_projection.{weight,bias}`: `(d, k)`, `(d)` — k is read from here (100).
//! - `combined_projection.{weight,bias}`: `(w, 3d)`, `(w)`.
//! - `backbone.input_projection.{weight,bias}`: `(w, w)`, `(w)` — one more linear layer
//!   that R2R's backbone applies before its blocks.
//! - per block i: `backbone.blocks.{i}.layer_norm.{weight,bias}` `(in)`,
//!   `backbone.blocks.{i}.mlp.0.{weight,bias}` `(e·in, in)`, `backbone.blocks.{i}.mlp.3.{weight,bias}`
//!   `(out, e·in)`, and `backbone.blocks.{i}.dim_change.{weight,bias}` `(out, in)` when out ≠ in.
//! - `backbone.output_layer.0.{weight,bias}` (LayerNorm), `backbone.output_layer.1.{weight,bias}` `(1, w)`.
//! - optional `token_embeddings.weight` `(vocab, d)`: used when no embedding table is given.
//! - optional `layer_norm_hidden_states.*` and `layer_norm_token.*` `(d)`: present when the
//!   router was trained with `normalize_input`; then h and e are layer-normed and the
//!   top-k logits softmaxed, as in training.
//!
//! Random weights: width 1024, 6 blocks, expansion 4, k = 100 ([`R2rShape::default`]).

use candle_core::{DType, Device, Module, Tensor};
use candle_nn::LayerNorm;

use super::delegate::DelegatePolicy;
use super::error::PolicyError;
use super::logits::top_k_desc;
use super::weights::{Init, TensorSource};
use super::RouteRow;
use crate::model::linear::Linear;

/// Sizes of a random router (a file's sizes are read from its tensors).
#[derive(Debug, Clone, PartialEq)]
pub struct R2rShape {
    pub width: usize,
    pub blocks: usize,
    pub expansion: usize,
    pub top_k: usize,
}

impl Default for R2rShape {
    /// The published configuration.
    fn default() -> Self {
        R2rShape { width: 1024, blocks: 6, expansion: 4, top_k: 100 }
    }
}

/// Widths of one residual block: `in → inner → out`.
#[derive(Debug, Clone, Copy)]
struct BlockDims {
    input: usize,
    inner: usize,
    output: usize,
}

/// LayerNorm → Linear → GELU → Linear, plus the (projected) input.
struct ResidualBlock {
    norm: LayerNorm,
    up: Linear,
    down: Linear,
    skip: Option<Linear>,
}

impl ResidualBlock {
    fn load(source: &mut TensorSource, i: usize, dims: BlockDims) -> Result<Self, PolicyError> {
        let p = format!("backbone.blocks.{i}");
        Ok(ResidualBlock {
            norm: source.layer_norm(&format!("{p}.layer_norm"), dims.input)?,
            up: source.linear(&format!("{p}.mlp.0"), dims.input, dims.inner)?,
            down: source.linear(&format!("{p}.mlp.3"), dims.inner, dims.output)?,
            skip: match dims.input == dims.output {
                true => None,
                false => Some(source.linear(&format!("{p}.dim_change"), dims.input, dims.output)?),
            },
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor, PolicyError> {
        // PyTorch's nn.GELU() is the exact (erf) form; dropout is off at inference.
        let inner = self.up.forward(&self.norm.forward(x)?)?.gelu_erf()?;
        let update = self.down.forward(&inner)?;
        let residual = match &self.skip {
            Some(projection) => projection.forward(x)?,
            None => x.clone(),
        };
        Ok((residual + update)?)
    }
}

/// One row's router input.
pub struct R2rInput<'a> {
    pub hidden: &'a [f32],
    pub token: u32,
    /// The row's top-k logits, descending (see [`top_k_desc`]).
    pub top_logits: Vec<f32>,
}

/// The router network with its frozen embedding table.
pub struct R2rRouter {
    embedding: Tensor,
    input_norms: Option<(LayerNorm, LayerNorm)>,
    logits_projection: Linear,
    combined_projection: Linear,
    input_projection: Linear,
    blocks: Vec<ResidualBlock>,
    output_norm: LayerNorm,
    output: Linear,
    hidden: usize,
    top_k: usize,
}

impl R2rRouter {
    /// `embedding`: the small model's `(vocab, d)` input table; `None` takes the file's
    /// `token_embeddings.weight`. `shape` sizes random weights only.
    pub fn new(source: &mut TensorSource, embedding: Option<Tensor>, shape: &R2rShape) -> Result<Self, PolicyError> {
        let embedding = match embedding {
            Some(table) => table,
            None => file_embedding(source)?,
        };
        let (_, d) = embedding.dims2()?;
        let top_k = source.shape("logits_projection.weight").map_or(shape.top_k, |s| s[1]);
        let width = source.shape("combined_projection.weight").map_or(shape.width, |s| s[0]);
        let input_norms = match source.contains("layer_norm_hidden_states.weight") {
            true => {
                Some((source.layer_norm("layer_norm_hidden_states", d)?, source.layer_norm("layer_norm_token", d)?))
            }
            false => None,
        };
        let logits_projection = source.linear("logits_projection", top_k, d)?;
        let combined_projection = source.linear("combined_projection", 3 * d, width)?;
        let input_projection = source.linear("backbone.input_projection", width, width)?;
        let dims = block_dims(source, shape, width);
        let blocks = (0..dims.len()).map(|i| ResidualBlock::load(source, i, dims[i])).collect::<Result<Vec<_>, _>>()?;
        let last = dims.last().map_or(width, |b| b.output);
        let output_norm = source.layer_norm("backbone.output_layer.0", last)?;
        let output = source.linear("backbone.output_layer.1", last, 1)?;
        Ok(R2rRouter {
            embedding,
            input_norms,
            logits_projection,
            combined_projection,
            input_projection,
            blocks,
            output_norm,
            output,
            hidden: d,
            top_k,
        })
    }

    pub fn hidden_size(&self) -> usize {
        self.hidden
    }

    pub fn top_k(&self) -> usize {
        self.top_k
    }

    pub fn vocab_size(&self) -> usize {
        self.embedding.dims()[0]
    }

    /// Router probabilities ("this token needs the large model"), one per input, from one
    /// batched forward. Inputs must have `hidden_size` values, `top_k` logits and a token
    /// inside the embedding table.
    pub fn scores(&self, inputs: &[R2rInput<'_>]) -> Result<Vec<f32>, PolicyError> {
        let n = inputs.len();
        let hidden: Vec<f32> = inputs.iter().flat_map(|r| r.hidden.iter().copied()).collect();
        let logits: Vec<f32> = inputs.iter().flat_map(|r| r.top_logits.iter().copied()).collect();
        let tokens: Vec<u32> = inputs.iter().map(|r| r.token).collect();
        let mut h = Tensor::from_vec(hidden, (n, self.hidden), &Device::Cpu)?;
        let mut l = Tensor::from_vec(logits, (n, self.top_k), &Device::Cpu)?;
        let ids = Tensor::from_vec(tokens, n, &Device::Cpu)?;
        let mut e = self.embedding.index_select(&ids, 0)?.to_dtype(DType::F32)?;
        if let Some((hidden_norm, token_norm)) = &self.input_norms {
            h = hidden_norm.forward(&h)?;
            e = token_norm.forward(&e)?;
            l = candle_nn::ops::softmax_last_dim(&l)?;
        }
        let projected = self.logits_projection.forward(&l)?;
        let combined = Tensor::cat(&[&h, &e, &projected], 1)?;
        let mut x = self.input_projection.forward(&self.combined_projection.forward(&combined)?)?;
        for block in &self.blocks {
            x = block.forward(&x)?;
        }
        let logit = self.output.forward(&self.output_norm.forward(&x)?)?;
        Ok(candle_nn::ops::sigmoid(&logit)?.flatten_all()?.to_vec1::<f32>()?)
    }
}

fn file_embedding(source: &mut TensorSource) -> Result<Tensor, PolicyError> {
    match source.shape("token_embeddings.weight") {
        Some(shape) => source.tensor("token_embeddings.weight", &shape, Init::Unit),
        None => Err(PolicyError::Weights {
            path: source.describe().into(),
            message: "no embedding table: give the small model's, or a file with `token_embeddings.weight`".into(),
        }),
    }
}

fn block_dims(source: &TensorSource, shape: &R2rShape, width: usize) -> Vec<BlockDims> {
    if source.is_random() {
        let dims = BlockDims { input: width, inner: width * shape.expansion, output: width };
        return vec![dims; shape.blocks];
    }
    let mut dims = Vec::new();
    let dim0 = |name: String| source.shape(&name).map(|s| s[0]);
    while let (Some(input), Some(inner), Some(output)) = (
        dim0(format!("backbone.blocks.{}.layer_norm.weight", dims.len())),
        dim0(format!("backbone.blocks.{}.mlp.0.weight", dims.len())),
        dim0(format!("backbone.blocks.{}.mlp.3.weight", dims.len())),
    ) {
        dims.push(BlockDims { input, inner, output });
    }
    dims
}

/// Parameters: `threshold` (delegate when the router probability ≥ threshold; default
/// 0.5, published per-task values 0.1–0.42), `weights` (router safetensors; default
/// random with the context's seed), `embedding` (a model folder or safetensors file with
/// `model.embed_tokens.weight`; default the router file's `token_embeddings.weight`, else
/// the small model's folder), `small`, `large`.
pub struct R2rDelegate {
    router: R2rRouter,
    threshold: f64,
}

impl R2rDelegate {
    pub const DEFAULT_THRESHOLD: f64 = 0.5;

    pub fn new(router: R2rRouter, threshold: f64) -> Self {
        R2rDelegate { router, threshold }
    }

    pub fn router(&self) -> &R2rRouter {
        &self.router
    }

    /// Router probabilities of the rows it can judge (a hidden state of the right size
    /// and a token inside the table); `None` for the others, which are never delegated.
    pub fn row_scores(&self, rows: &[RouteRow<'_>]) -> Vec<Option<f32>> {
        let (d, vocab, k) = (self.router.hidden_size(), self.router.vocab_size(), self.router.top_k());
        let mut judged = Vec::with_capacity(rows.len());
        let mut inputs = Vec::with_capacity(rows.len());
        for (i, row) in rows.iter().enumerate() {
            let Some(hidden) = row.hidden.filter(|h| h.len() == d) else { continue };
            if (row.sampled as usize) < vocab {
                judged.push(i);
                inputs.push(R2rInput { hidden, token: row.sampled, top_logits: top_k_desc(row.logits, k) });
            }
        }
        let mut scores = vec![None; rows.len()];
        if inputs.is_empty() {
            return scores;
        }
        // Inputs are validated above, so a failed forward is not data-dependent; it
        // keeps every row on the small model rather than failing the step.
        if let Ok(batch) = self.router.scores(&inputs) {
            for (&i, score) in judged.iter().zip(batch) {
                scores[i] = Some(score);
            }
        }
        scores
    }
}

impl DelegatePolicy for R2rDelegate {
    fn name(&self) -> &str {
        "r2r"
    }

    fn delegate(&self, rows: &mut [RouteRow<'_>]) -> Vec<bool> {
        self.row_scores(rows).into_iter().map(|s| s.is_some_and(|s| s as f64 >= self.threshold)).collect()
    }

    fn needs_hidden(&self) -> bool {
        true
    }
}

#[cfg(test)]
#[path = "r2r_tests.rs"]
mod tests;
