//! The llama.cpp backend: the engine's varlen batch as one multi-sequence
//! `llama_decode`, llama.cpp's kernels (and its quantized types) underneath.
//!
//! Each resident request gets a llama.cpp sequence id on its first forward. K/V lives in
//! one unified llama.cpp cache of `n_ctx` cells; the engine's [`BlockPool`] accounts for
//! it in blocks, so a batch that fits the pool fits the cache. The pool records every
//! rewind and drop of a sequence and what enters and leaves its prefix cache
//! ([`KvEvent`](super::kv::KvEvent)), and the backend replays them on llama.cpp's cache
//! before the next decode ([`SequenceMap`]): a request that ends or is evicted frees its
//! cells wherever its handle is dropped, and a request that reuses a cached prefix shares
//! the cells that hold it, as on the candle backend.

mod ffi;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::backend::{check_rows, reserve_rows, Backend, ForwardOutput, LoadOptions, RowInput};
use super::config::ModelConfig;
use super::error::{ModelError, Result};
use super::gguf::write_gguf;
use super::gguf_read::is_gguf_file;
use super::kv::BlockPool;
use super::model_files::read_model_config;
use super::sequence_map::{SequenceCells, SequenceMap};
use super::warmup::{self, WarmUpShape};
use ffi::{Batch, Context, ContextSpec, DecodeFailure, Model};

/// llama.cpp's sequence ids are below this (LLAMA_MAX_SEQ).
pub const MAX_SEQUENCES: usize = 256;

/// Bytes per K or V element in llama.cpp's default (f16) cache.
const KV_ELEMENT_BYTES: usize = 2;

pub struct LlamaCppBackend {
    config: ModelConfig,
    pool: BlockPool,
    context: Context,
    batch: Batch,
    /// Engine sequences, and cached blocks, to llama.cpp sequence ids.
    sequences: SequenceMap,
    llama_vocab: usize,
}

impl LlamaCppBackend {
    /// Loads a GGUF file, or an HF folder written to GGUF in `options.dtype` first.
    pub fn load(path: &Path, options: &LoadOptions) -> Result<Self> {
        let config = read_model_config(path)?;
        let model = if is_gguf_file(path) { Model::load(path)? } else { load_converted(path, options)? };
        let llama_vocab = model.vocab_size();
        if llama_vocab < config.vocab_size || model.hidden_size() != config.hidden_size {
            return Err(ModelError::LlamaCpp(format!(
                "{}: llama.cpp sees vocabulary {llama_vocab} and hidden size {}, the config says {} and {}",
                path.display(),
                model.hidden_size(),
                config.vocab_size,
                config.hidden_size
            )));
        }
        Self::with_model(config, Arc::new(model), llama_vocab, options)
    }

    fn with_model(config: ModelConfig, model: Arc<Model>, llama_vocab: usize, options: &LoadOptions) -> Result<Self> {
        let block_size = options.block_size;
        if block_size == 0 {
            return Err(ModelError::BadBatch("block size must be positive".into()));
        }
        let tokens = options.kv_budget_bytes / config.kv_bytes_per_token(KV_ELEMENT_BYTES);
        let blocks = tokens / block_size;
        let n_ctx = (blocks * block_size).max(block_size) as u32;
        let spec = ContextSpec {
            n_ctx,
            n_batch: n_ctx,
            n_seq_max: MAX_SEQUENCES as u32,
            threads: super::threads::llama_threads(options.threads) as i32,
        };
        let context = Context::new(model, &spec)?;
        let mut backend = LlamaCppBackend {
            config,
            pool: BlockPool::recording_events(blocks, block_size, options.prefix_cache),
            context,
            batch: Batch::with_capacity(256),
            sequences: SequenceMap::new(MAX_SEQUENCES, block_size),
            llama_vocab,
        };
        // As the candle backend: one step at the largest shape, so llama.cpp's compute
        // buffers and our batch reach their working size before serving. (Its K/V cache
        // is allocated and cleared by llama.cpp itself, so it is resident already.)
        if let Some(shape) = warmup::enabled_shape() {
            let rows = shape.rows.min(MAX_SEQUENCES);
            warmup::run(&mut backend, WarmUpShape { rows, ..shape })?;
        }
        Ok(backend)
    }

    /// `text` as llama.cpp's own tokenizer encodes it, for checking ours against it:
    /// `add_special` adds BOS/EOS where the vocabulary asks for them, `parse_special`
    /// matches control tokens (`<|im_start|>`) written in the text.
    pub fn tokenize(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>> {
        self.context.model().tokenize(text, add_special, parse_special)
    }

    /// Replays the pool's events on llama.cpp's cache.
    fn apply_events(&mut self) -> Result<()> {
        let events = self.pool.take_events();
        self.sequences.apply(events, &mut self.context, &self.pool)
    }

    fn check_sequence_room(&self, rows: &[RowInput<'_>]) -> Result<()> {
        let new = rows.iter().filter(|r| self.sequences.id_of(r.kv.id()).is_none()).count();
        let available = self.sequences.available_ids();
        if new > available {
            return Err(ModelError::BadBatch(format!(
                "{new} new sequences but only {available} of llama.cpp's {MAX_SEQUENCES} sequence ids are free"
            )));
        }
        Ok(())
    }

    fn seq_for(&mut self, sequence: u64) -> i32 {
        self.sequences.id_for(sequence, &mut self.context, &self.pool).expect("check_sequence_room ran first")
    }

    /// Lays the rows out as one batch; returns the batch index of every output position.
    fn fill_batch(&mut self, rows: &[RowInput<'_>], outputs: &[usize]) -> Vec<usize> {
        let total: usize = rows.iter().map(|r| r.tokens.len()).sum();
        if total > self.batch.capacity() {
            self.batch = Batch::with_capacity(total.next_power_of_two());
        }
        self.batch.clear();
        let mut last = Vec::with_capacity(outputs.iter().sum());
        for (row, &wanted) in rows.iter().zip(outputs) {
            let seq = self.seq_for(row.kv.id());
            let first_output = row.tokens.len() - wanted;
            for (i, &token) in row.tokens.iter().enumerate() {
                let is_output = i >= first_output;
                if is_output {
                    last.push(self.batch.len());
                }
                self.batch.push(token, row.start + i, seq, is_output);
            }
        }
        last
    }

    fn collect(&self, last: &[usize], want_hidden: bool) -> Result<ForwardOutput> {
        let vocab = self.config.vocab_size;
        let mut logits = Vec::with_capacity(last.len() * vocab);
        for &index in last {
            logits.extend_from_slice(&self.context.logits(index, self.llama_vocab)?[..vocab]);
        }
        let hidden_size = self.config.hidden_size;
        let hidden = match want_hidden {
            false => None,
            true => {
                let rows = self.context.hidden();
                if rows.len() != last.len() * hidden_size {
                    return Err(ModelError::LlamaCpp(format!(
                        "captured {} hidden values for {} rows of {hidden_size}",
                        rows.len(),
                        last.len()
                    )));
                }
                Some(rows.to_vec())
            }
        };
        Ok(ForwardOutput { vocab_size: vocab, hidden_size, logits, hidden })
    }

    /// Undoes a failed decode: the fed positions are forgotten in both ledgers.
    fn roll_back(&mut self, rows: &mut [RowInput<'_>]) {
        for row in rows.iter_mut() {
            row.kv.truncate(row.start);
            if let Some(seq) = self.sequences.id_of(row.kv.id()) {
                self.context.forget(seq, row.start);
            }
        }
        // Best effort: a failure here surfaces at the next forward.
        let _ = self.apply_events();
    }
}

/// Writes the folder as a temporary GGUF in the requested type and loads it; the file
/// is removed once llama.cpp holds the weights.
fn load_converted(dir: &Path, options: &LoadOptions) -> Result<Model> {
    let file = temporary_gguf_path(dir);
    write_gguf(dir, &file, options.dtype.gguf())?;
    let model = Model::load(&file);
    let _ = std::fs::remove_file(&file);
    model
}

fn temporary_gguf_path(dir: &Path) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    std::env::temp_dir().join(format!("tokenrouter-{}-{n}-{name}.gguf", std::process::id()))
}

impl Backend for LlamaCppBackend {
    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn kv_pool(&self) -> &BlockPool {
        &self.pool
    }

    fn accepts_uncomputed_context(&self) -> bool {
        false
    }

    fn forward_at(&mut self, rows: &mut [RowInput<'_>], outputs: &[usize], want_hidden: bool) -> Result<ForwardOutput> {
        check_rows(&self.config, &self.pool, rows, outputs)?;
        self.apply_events()?;
        self.check_sequence_room(rows)?;
        reserve_rows(&self.pool, rows)?;
        self.apply_events()?;
        let last = self.fill_batch(rows, outputs);
        if let Err(failure) = self.context.decode(&self.batch, want_hidden) {
            self.roll_back(rows);
            return Err(match failure {
                DecodeFailure::NoSlot => ModelError::OutOfBlocks {
                    needed: self.pool.blocks_for_tokens(self.batch.len()),
                    free: self.pool.capacity().free_blocks,
                    block_size: self.pool.block_size(),
                },
                DecodeFailure::Other(code) => ModelError::LlamaCpp(format!("llama_decode failed with code {code}")),
            });
        }
        for row in rows.iter_mut() {
            row.kv.set_computed(row.start + row.tokens.len());
        }
        self.collect(&last, want_hidden)
    }
}

impl SequenceCells for Context {
    fn forget(&mut self, seq: i32, from: usize, to: Option<usize>) {
        self.forget_range(seq, from, to);
    }

    fn share(&mut self, src: i32, dst: i32, from: usize, to: usize) {
        Context::share(self, src, dst, from, to);
    }
}
