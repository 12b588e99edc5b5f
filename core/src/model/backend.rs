//! The seam between the engine and whatever runs the model: a varlen forward over
//! rows that each bring their own KV handle.

//!
//! This module is a leaf of the model runtime: it names what every backend implements
//! and is given, and imports no backend. Building one is `load`'s; the candle backend
//! lives in `candle_backend`, llama.cpp's in `llamacpp`, CUDA's in `cuda`.

use candle_core::DType;

use super::config::ModelConfig;
use super::device::DeviceSpec;
use super::error::{ModelError, Result};
use super::gguf::GgufType;
use super::kv::{BlockPool, KvCapacity, KvSeq};
use super::kv_arena::{KvDtype, SharedKv};

/// One row of a varlen batch: a request's KV handle and the tokens to feed at
/// positions `start..start + tokens.len()`. A prefill starts at 0, a decode feeds one
/// token at `kv.len()`, an extend feeds several (a request returning from a peer).
/// `start < kv.len()` rewinds: K/V from `start` on are recomputed.
pub struct RowInput<'a> {
    pub kv: &'a mut KvSeq,
    pub tokens: &'a [u32],
    pub start: usize,
}

/// Logits (and, when asked, final hidden states) at the output positions of a forward:
/// by default each row's last fed position; rows in order, each row's positions in order.
#[derive(Debug, Clone)]
pub struct ForwardOutput {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub logits: Vec<f32>,
    pub hidden: Option<Vec<f32>>,
}

impl ForwardOutput {
    pub fn rows(&self) -> usize {
        self.logits.len() / self.vocab_size
    }

    pub fn row_logits(&self, row: usize) -> &[f32] {
        &self.logits[row * self.vocab_size..(row + 1) * self.vocab_size]
    }

    pub fn row_hidden(&self, row: usize) -> Option<&[f32]> {
        self.hidden.as_ref().map(|h| &h[row * self.hidden_size..(row + 1) * self.hidden_size])
    }
}

/// A model runtime. The scheduler, policies and actors see only this.
pub trait Backend: Send {
    fn config(&self) -> &ModelConfig;

    /// The pool the backend's KV handles draw from: new sequences and capacity.
    fn kv_pool(&self) -> &BlockPool;

    fn new_sequence(&self) -> KvSeq {
        self.kv_pool().new_sequence()
    }

    fn kv_capacity(&self) -> KvCapacity {
        self.kv_pool().capacity()
    }

    /// Whether positions may be marked computed without a forward, as profiling does to
    /// reach long contexts cheaply: true where attention reads slots whatever they hold,
    /// false where the backend tracks which positions it has seen (llama.cpp).
    fn accepts_uncomputed_context(&self) -> bool {
        true
    }

    /// One forward over all rows, with outputs at each row's last fed position. Fails
    /// without side effects when the rows are malformed or their KV does not fit.
    fn forward(&mut self, rows: &mut [RowInput<'_>], want_hidden: bool) -> Result<ForwardOutput> {
        let outputs = vec![1; rows.len()];
        self.forward_at(rows, &outputs, want_hidden)
    }

    /// As [`forward`](Self::forward), with outputs at the last `outputs[i]` fed positions
    /// of row `i` (at least one, at most all it feeds): a verify step of speculative
    /// decoding reads the target's logits after every drafted token.
    fn forward_at(&mut self, rows: &mut [RowInput<'_>], outputs: &[usize], want_hidden: bool) -> Result<ForwardOutput>;
}

/// Weight precision at run time; checkpoints in bf16/f16/f32 convert on load. Quantizing
/// a folder at load runs on the llama.cpp backend only; a GGUF file keeps its own types
/// on either backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WeightDtype {
    F32,
    F16,
    /// f32's range with 8 bits of mantissa: a bf16 checkpoint keeps its exact weights
    /// at half of f32's bytes.
    Bf16,
    #[serde(rename = "q8_0")]
    Q8_0,
    #[serde(rename = "q4_k")]
    Q4K,
}

impl WeightDtype {
    pub fn candle(self) -> Result<DType> {
        match self {
            WeightDtype::F32 => Ok(DType::F32),
            WeightDtype::F16 => Ok(DType::F16),
            WeightDtype::Bf16 => Ok(DType::BF16),
            quantized => Err(ModelError::Unsupported(format!(
                "dtype {} runs on the llama.cpp backend only (backend: llamacpp)",
                quantized.as_str()
            ))),
        }
    }

    pub fn gguf(self) -> GgufType {
        match self {
            WeightDtype::F32 => GgufType::F32,
            WeightDtype::F16 => GgufType::F16,
            WeightDtype::Bf16 => GgufType::Bf16,
            WeightDtype::Q8_0 => GgufType::Q8_0,
            WeightDtype::Q4K => GgufType::Q4K,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            WeightDtype::F32 => "f32",
            WeightDtype::F16 => "f16",
            WeightDtype::Bf16 => "bf16",
            WeightDtype::Q8_0 => "q8_0",
            WeightDtype::Q4K => "q4_k",
        }
    }

    /// Bytes a weight takes, including quantization scales.
    pub fn bytes_per_weight(self) -> f64 {
        match self {
            WeightDtype::F32 => 4.0,
            WeightDtype::F16 | WeightDtype::Bf16 => 2.0,
            WeightDtype::Q8_0 => 34.0 / 32.0,
            WeightDtype::Q4K => 144.0 / 256.0,
        }
    }
}

impl std::str::FromStr for WeightDtype {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "f32" | "float32" => Ok(WeightDtype::F32),
            "f16" | "float16" => Ok(WeightDtype::F16),
            "bf16" | "bfloat16" => Ok(WeightDtype::Bf16),
            "q8_0" => Ok(WeightDtype::Q8_0),
            "q4_k" => Ok(WeightDtype::Q4K),
            other => Err(format!(
                "dtype {other:?} is not supported: use f32, f16 or bf16 (checkpoints in any of them convert on load), \
                 or q8_0/q4_k with the llama.cpp backend"
            )),
        }
    }
}

/// Which implementation runs a model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// candle matmuls and our paged attention, pure Rust.
    #[default]
    Candle,
    /// llama.cpp's kernels (cargo feature `llamacpp`).
    Llamacpp,
}

impl BackendKind {
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::Candle => "candle",
            BackendKind::Llamacpp => "llamacpp",
        }
    }
}

impl std::str::FromStr for BackendKind {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "candle" => Ok(BackendKind::Candle),
            "llamacpp" | "llama.cpp" => Ok(BackendKind::Llamacpp),
            other => Err(format!("backend {other:?} is not known: use candle or llamacpp")),
        }
    }
}

/// Where the planner's start-up step cost of a model comes from.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum StepCostSource {
    /// Nowhere: the planner learns from served steps only.
    #[default]
    None,
    /// [`step_cost_points`](super::profile::step_cost_points) on the model's own threads before it serves, up to these sizes.
    Measure { max_rows: usize, max_tokens: usize },
    /// Saved (tokens fed, milliseconds) points, e.g. from a `tokenrouter profile` JSON.
    Saved(Vec<(usize, f64)>),
}

#[derive(Debug, Clone)]
pub struct LoadOptions {
    pub dtype: WeightDtype,
    /// Bytes of KV storage for this model (K and V, all layers, f32 values on candle,
    /// f16 on llama.cpp).
    pub kv_budget_bytes: usize,
    /// Token slots per KV block.
    pub block_size: usize,
    /// How the candle backend stores K/V (llama.cpp keeps f16).
    pub kv_dtype: KvDtype,
    pub backend: BackendKind,
    /// This model's compute threads: its own rayon pool in the engine (candle), or its
    /// llama.cpp context's. `None`: the process pool, or the process's count (see
    /// [`threads`](super::threads)). On a small CPU, pinning models to disjoint thread
    /// sets stops their steps from time-slicing each other.
    pub threads: Option<usize>,
    /// Keep full KV blocks for reuse by later requests with the same prefix.
    pub prefix_cache: bool,
    /// K/V pages shared with colocated models (candle): this model's pool in the group,
    /// which replaces `kv_budget_bytes` and `prefix_cache` (see [`share_kv`](super::kv_arena::share_kv)).
    pub shared_kv: Option<SharedKv>,
    /// Where the model runs: the CPU, or a CUDA card (cargo feature `cuda`).
    pub device: DeviceSpec,
    /// Where the planner's start-up step cost comes from (the engine measures it on the
    /// model's compute thread, after loading).
    pub step_cost: StepCostSource,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            dtype: WeightDtype::F32,
            kv_budget_bytes: 256 << 20,
            block_size: 16,
            kv_dtype: KvDtype::F32,
            backend: BackendKind::Candle,
            threads: None,
            prefix_cache: true,
            shared_kv: None,
            device: DeviceSpec::Cpu,
            step_cost: StepCostSource::None,
        }
    }
}

/// Refuses malformed rows before anything changes.
pub(crate) fn check_rows(c: &ModelConfig, pool: &BlockPool, rows: &[RowInput<'_>], outputs: &[usize]) -> Result<()> {
    if rows.is_empty() {
        return Err(ModelError::BadBatch("no rows".into()));
    }
    if outputs.len() != rows.len() {
        return Err(ModelError::BadBatch(format!("{} output counts for {} rows", outputs.len(), rows.len())));
    }
    for (i, row) in rows.iter().enumerate() {
        if outputs[i] == 0 || outputs[i] > row.tokens.len() {
            return Err(ModelError::BadBatch(format!(
                "row {i}: {} outputs asked of {} fed tokens",
                outputs[i],
                row.tokens.len()
            )));
        }
        if !row.kv.pool().same_pool(pool) {
            return Err(ModelError::BadBatch(format!("row {i}: KV handle belongs to another model")));
        }
        if row.tokens.is_empty() {
            return Err(ModelError::BadBatch(format!("row {i}: no tokens")));
        }
        if row.start > row.kv.len() {
            return Err(ModelError::BadBatch(format!(
                "row {i}: starts at {} but only {} positions are computed",
                row.start,
                row.kv.len()
            )));
        }
        if let Some(&token) = row.tokens.iter().find(|&&t| t as usize >= c.vocab_size) {
            return Err(ModelError::TokenOutOfVocab { token, vocab: c.vocab_size });
        }
        let end = row.start + row.tokens.len();
        if end > c.max_position_embeddings {
            return Err(ModelError::ContextOverflow { position: end, max: c.max_position_embeddings });
        }
    }
    Ok(())
}

/// Takes every block the batch needs, or none; rows that rewind forget K/V from their start.
pub(crate) fn reserve_rows(pool: &BlockPool, rows: &mut [RowInput<'_>]) -> Result<()> {
    let needed: usize = rows.iter().map(|r| r.kv.blocks_missing_for(r.start + r.tokens.len())).sum();
    let free = pool.capacity().free_blocks;
    if needed > free {
        return Err(ModelError::OutOfBlocks { needed, free, block_size: pool.block_size() });
    }
    for row in rows.iter_mut() {
        row.kv.truncate(row.start);
        row.kv.reserve(row.start + row.tokens.len())?;
    }
    Ok(())
}
