//! The seam between the engine and whatever runs the model: a varlen forward over
//! rows that each bring their own KV handle.

use std::path::Path;

use candle_core::DType;

use super::attention::{PagedKvStore, TokenLayout, MAX_BLOCK_SIZE};
use super::config::ModelConfig;
use super::device::DeviceSpec;
use super::error::{ModelError, Result};
use super::gguf::GgufType;
use super::gguf_read::{is_gguf_file, read_gguf_config};
use super::kv::{BlockPool, KvCapacity, KvSeq};
use super::kv_arena::{KvDtype, KvGeometry, SharedKv};
use super::quantized::load_gguf_transformer;
use super::transformer::Transformer;
use super::warmup;
use super::weights::Checkpoint;

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

/// The pure-Rust backend: candle matmuls, our paged attention.
pub struct CandleBackend {
    model: Transformer,
    /// The K/V storage and the pool that hands out its blocks.
    store: PagedKvStore,
}

impl CandleBackend {
    /// Loads an HF folder in `options.dtype`, or a llama GGUF file with its matrices kept
    /// in the file's own (quantized) types, where `options.dtype` does not apply.
    pub fn load(dir: &Path, options: &LoadOptions) -> Result<Self> {
        if is_gguf_file(dir) {
            return Self::with_model(load_gguf_transformer(dir)?, options);
        }
        let config = folder_config(dir)?;
        let dtype = options.dtype.candle()?;
        let ckpt = Checkpoint::open(dir, dtype)?;
        let model = Transformer::load(config, &ckpt)?;
        Self::with_model(model, options)
    }

    fn with_model(model: Transformer, options: &LoadOptions) -> Result<Self> {
        if options.kv_dtype == KvDtype::Bf16 {
            return Err(ModelError::Unsupported(
                "kv_dtype bf16 runs on a CUDA device only (device: cuda:N); use f32 or f16 on the CPU".into(),
            ));
        }
        if options.block_size == 0 || options.block_size > MAX_BLOCK_SIZE {
            return Err(ModelError::BadBatch(format!(
                "block size {} must be in 1..={MAX_BLOCK_SIZE}",
                options.block_size
            )));
        }
        let geometry = KvGeometry::new(model.config(), options.block_size, options.kv_dtype);
        let store = match &options.shared_kv {
            Some(shared) => PagedKvStore::new(geometry, shared.arena.clone(), shared.pool.clone()),
            None => {
                let block_bytes = options.block_size * model.config().kv_bytes_per_token(options.kv_dtype.bytes());
                let blocks = options.kv_budget_bytes / block_bytes;
                PagedKvStore::alone(geometry, blocks, options.prefix_cache)
            }
        };
        let mut backend = CandleBackend { model, store };
        if let Some(shape) = warmup::enabled_shape() {
            backend.store.commit_pages();
            warmup::run(&mut backend, shape)?;
        }
        Ok(backend)
    }

    pub fn dtype(&self) -> DType {
        self.model.dtype()
    }

    fn layout(&self, rows: &[RowInput<'_>], outputs: &[usize]) -> (Vec<u32>, TokenLayout, Vec<u32>) {
        let total: usize = rows.iter().map(|r| r.tokens.len()).sum();
        let mut tokens = Vec::with_capacity(total);
        let mut row_of = Vec::with_capacity(total);
        let mut position = Vec::with_capacity(total);
        let mut slot = Vec::with_capacity(total);
        let mut last = Vec::with_capacity(outputs.iter().sum());
        for (r, row) in rows.iter().enumerate() {
            for (i, &t) in row.tokens.iter().enumerate() {
                tokens.push(t);
                row_of.push(r);
                position.push(row.start + i);
                slot.push(row.kv.slot(row.start + i));
            }
            let end = tokens.len() as u32;
            last.extend(end - outputs[r] as u32..end);
        }
        let row_blocks = rows.iter().map(|r| r.kv.blocks().to_vec()).collect();
        (tokens, TokenLayout::new(self.model.rope(), row_of, position, slot, row_blocks), last)
    }
}

impl Backend for CandleBackend {
    fn config(&self) -> &ModelConfig {
        self.model.config()
    }

    fn kv_pool(&self) -> &BlockPool {
        self.store.pool()
    }

    fn forward_at(&mut self, rows: &mut [RowInput<'_>], outputs: &[usize], want_hidden: bool) -> Result<ForwardOutput> {
        check_rows(self.model.config(), self.store.pool(), rows, outputs)?;
        reserve_rows(self.store.pool(), rows)?;
        self.store.sync();
        let (tokens, layout, last) = self.layout(rows, outputs);
        let (model, store) = (&self.model, &mut self.store);
        // The whole step runs on a worker of the current rayon pool. Called from outside
        // the pool (the bench, a compute thread without a pool of its own), each of a
        // step's ~200 parallel loops would otherwise be handed to a worker and waited
        // for through the OS: at batch 1 that cost more than the attention did.
        let out = match rayon::scope(|_| model.forward(store, &tokens, &layout, &last, want_hidden)) {
            Ok(out) => out,
            Err(e) => {
                // K/V of the fed positions may be half written: forget them.
                rows.iter_mut().for_each(|r| r.kv.truncate(r.start));
                return Err(e);
            }
        };
        for row in rows.iter_mut() {
            row.kv.set_computed(row.start + row.tokens.len());
        }
        let c = self.model.config();
        Ok(ForwardOutput {
            vocab_size: c.vocab_size,
            hidden_size: c.hidden_size,
            logits: out.logits,
            hidden: out.hidden,
        })
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

/// The backend `options` ask for, loaded from an HF folder or a GGUF file.
pub fn load_backend(path: &Path, options: &LoadOptions) -> Result<Box<dyn Backend>> {
    if let DeviceSpec::Cuda(ordinal) = options.device {
        return load_cuda(path, options, ordinal);
    }
    match options.backend {
        BackendKind::Candle => Ok(Box::new(CandleBackend::load(path, options)?)),
        BackendKind::Llamacpp => load_llamacpp(path, options),
    }
}

#[cfg(feature = "llamacpp")]
fn load_llamacpp(path: &Path, options: &LoadOptions) -> Result<Box<dyn Backend>> {
    Ok(Box::new(super::llamacpp::LlamaCppBackend::load(path, options)?))
}

#[cfg(not(feature = "llamacpp"))]
fn load_llamacpp(_: &Path, _: &LoadOptions) -> Result<Box<dyn Backend>> {
    Err(ModelError::Unsupported(
        "this build has no llama.cpp backend: build with `--features llamacpp` (see README)".into(),
    ))
}

#[cfg(feature = "cuda")]
fn load_cuda(path: &Path, options: &LoadOptions, ordinal: usize) -> Result<Box<dyn Backend>> {
    if options.backend != BackendKind::Candle {
        return Err(ModelError::Unsupported(format!(
            "backend {} runs on the CPU; a model on cuda:{ordinal} runs on the CUDA backend (leave `backend` unset)",
            options.backend.as_str()
        )));
    }
    Ok(Box::new(super::cuda::CudaBackend::load(path, options, ordinal)?))
}

#[cfg(not(feature = "cuda"))]
fn load_cuda(_: &Path, _: &LoadOptions, ordinal: usize) -> Result<Box<dyn Backend>> {
    Err(ModelError::Unsupported(format!(
        "this build has no CUDA backend for cuda:{ordinal}: build with `--features cuda` (see docs/backends.md)"
    )))
}

/// The K/V type a model's store uses: on a card the weights' 2-byte type (see
/// [`kv_dtype_on_cuda`](super::cuda::kv_dtype_on_cuda)), else what was asked.
pub fn effective_kv_dtype(options: &LoadOptions) -> Result<KvDtype> {
    if options.device.is_cuda() {
        super::cuda::kv_dtype_on_cuda(options.dtype, options.kv_dtype)
    } else {
        Ok(options.kv_dtype)
    }
}

/// A model's hyper-parameters: `config.json` of an HF folder, or a GGUF file's metadata.
pub fn read_model_config(path: &Path) -> Result<ModelConfig> {
    if is_gguf_file(path) {
        return read_gguf_config(path);
    }
    folder_config(path)
}

/// An HF folder's config.json; a path that is no folder says so.
fn folder_config(dir: &Path) -> Result<ModelConfig> {
    ModelConfig::from_file(&dir.join("config.json")).map_err(|e| match e {
        ModelError::MissingFile(_) if !dir.is_dir() => ModelError::MissingFolder(dir.to_path_buf()),
        other => other,
    })
}
