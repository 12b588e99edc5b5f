//! The pure-Rust backend: candle matmuls and this crate's paged attention, over an HF
//! folder's safetensors or a llama GGUF file's (quantized) matrices.

use std::path::Path;

use candle_core::DType;

use super::attention::{PagedKvStore, TokenLayout, MAX_BLOCK_SIZE};
use super::backend::{check_rows, reserve_rows, Backend, ForwardOutput, LoadOptions, RowInput};
use super::config::ModelConfig;
use super::error::{ModelError, Result};
use super::gguf_read::is_gguf_file;
use super::kv::BlockPool;
use super::kv_arena::{KvDtype, KvGeometry};
use super::model_files::folder_config;
use super::quantized::load_gguf_transformer;
use super::transformer::Transformer;
use super::warmup;
use super::weights::Checkpoint;

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
