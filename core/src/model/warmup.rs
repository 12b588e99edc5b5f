//! A start-up step at the largest shape the scheduler runs, so a server's resident
//! memory reaches its working size before it serves (vLLM's profile run does the same)
//! instead of climbing over its first minutes of load.
//!
//! Without it, a soak of the demo grew ~200 MiB in its first minute: KV pages committed
//! on first write, and per-step buffers (activations per token, logits per row) reaching
//! their largest batch. Off unless [`enable`] is called, which `tokenrouter serve` does:
//! tests and tools that build many backends skip it.

use std::sync::OnceLock;

use super::backend::{Backend, RowInput};
use super::error::{ModelError, Result};
use super::kv::KvSeq;

/// The largest step the scheduler takes: up to `rows` rows feeding `tokens` tokens in all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WarmUpShape {
    pub rows: usize,
    pub tokens: usize,
}

static SHAPE: OnceLock<WarmUpShape> = OnceLock::new();

/// Backends loaded from now on in this process warm up at `shape` (first call wins).
pub fn enable(shape: WarmUpShape) {
    let _ = SHAPE.set(shape);
}

/// The shape to warm up at, if [`enable`] was called.
pub fn enabled_shape() -> Option<WarmUpShape> {
    SHAPE.get().copied()
}

/// Tokens per row of the warm-up step: `shape.tokens` spread over `shape.rows` rows, so
/// both the per-row buffers (logits) and the per-token ones (activations) are at their
/// largest in one step. Fewer rows when the model's context or KV cannot hold them.
pub fn row_lengths(shape: WarmUpShape, max_context: usize, free_tokens: usize, block_size: usize) -> Vec<usize> {
    let rows = shape.rows.max(1);
    let tokens = shape.tokens.max(rows).min(rows * max_context.max(1));
    let mut lengths: Vec<usize> = (0..rows).map(|r| tokens / rows + usize::from(r < tokens % rows)).collect();
    // Each row rounds up to whole blocks: drop rows until the KV holds them.
    while !lengths.is_empty()
        && lengths.iter().map(|n| n.div_ceil(block_size) * block_size).sum::<usize>() > free_tokens
    {
        lengths.pop();
    }
    lengths
}

/// One forward at `shape` over scratch sequences, which are dropped after it (their
/// blocks go back to the pool). Leaves the backend as it found it, apart from memory.
pub fn run(backend: &mut dyn Backend, shape: WarmUpShape) -> Result<()> {
    let capacity = backend.kv_capacity();
    let free_tokens = capacity.free_blocks * capacity.block_size;
    let max_context = backend.config().max_position_embeddings;
    let lengths = row_lengths(shape, max_context, free_tokens, capacity.block_size);
    if lengths.is_empty() {
        return Ok(());
    }
    let tokens: Vec<Vec<u32>> = lengths.iter().map(|&n| vec![0; n]).collect();
    let mut sequences: Vec<KvSeq> = lengths.iter().map(|_| backend.new_sequence()).collect();
    let mut rows: Vec<RowInput<'_>> =
        sequences.iter_mut().zip(&tokens).map(|(kv, tokens)| RowInput { kv, tokens, start: 0 }).collect();
    match backend.forward(&mut rows, false) {
        // Models that share a K/V budget warm up at once: one may find the pages it
        // counted taken by another. The warm-up is worth having, not worth failing for.
        Err(ModelError::OutOfBlocks { .. }) => Ok(()),
        other => other.map(drop),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tokens_spread_over_all_rows() {
        let lengths = row_lengths(WarmUpShape { rows: 64, tokens: 1024 }, 32_768, 1 << 20, 16);
        assert_eq!((lengths.len(), lengths.iter().sum::<usize>()), (64, 1024));
        let uneven = row_lengths(WarmUpShape { rows: 3, tokens: 10 }, 32_768, 1 << 20, 16);
        assert_eq!(uneven, vec![4, 3, 3]);
    }

    #[test]
    fn rows_shrink_to_what_the_kv_and_context_hold() {
        assert_eq!(row_lengths(WarmUpShape { rows: 4, tokens: 4 }, 32_768, 32, 16), vec![1, 1]);
        assert_eq!(row_lengths(WarmUpShape { rows: 2, tokens: 100 }, 8, 1 << 20, 4), vec![8, 8]);
        assert!(row_lengths(WarmUpShape { rows: 1, tokens: 1 }, 32_768, 0, 16).is_empty());
    }
}
