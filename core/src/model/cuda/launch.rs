//! Launch shapes of the kernels in `kernels.cu`, and the model shapes they can take. Pure
//! arithmetic, so that it is tested where no card is.

use crate::model::config::ModelConfig;

/// Threads of a block that walks one row (embedding, RMSNorm, logit statistics).
pub const ROW_THREADS: u32 = 256;
/// `ATTN_WARPS` of `kernels.cu` warps.
pub const ATTENTION_THREADS: u32 = 4 * 32;
/// head_dim at most `MAX_DIMS_PER_LANE` of `kernels.cu` per lane of a warp.
pub const MAX_HEAD_DIM: usize = 8 * 32;
/// Threads of a grid-stride loop's block, and the most blocks one launches (enough to
/// fill any card several times over; each thread then takes several elements).
pub const STRIDE_THREADS: u32 = 256;
pub const MAX_STRIDE_BLOCKS: u32 = 1 << 16;
/// The largest grid.y (attention and q/k/v preparation put heads there).
pub const MAX_GRID_Y: usize = 65_535;
/// The largest grid.x (rows and tokens go there).
pub const MAX_GRID_X: usize = i32::MAX as usize;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
    pub shared_bytes: u32,
}

impl Shape {
    /// Threads launched in all.
    pub fn threads(&self) -> u64 {
        let (g, b) = (self.grid, self.block);
        g.0 as u64 * g.1 as u64 * g.2 as u64 * b.0 as u64 * b.1 as u64 * b.2 as u64
    }
}

/// One block per row.
pub fn per_row(rows: usize) -> Shape {
    assert!(rows > 0 && rows <= MAX_GRID_X, "{rows} rows");
    Shape { grid: (rows as u32, 1, 1), block: (ROW_THREADS, 1, 1), shared_bytes: 0 }
}

/// A grid-stride loop over `n` elements.
pub fn grid_stride(n: usize) -> Shape {
    assert!(n > 0, "an empty grid-stride launch");
    let blocks = n.div_ceil(STRIDE_THREADS as usize).min(MAX_STRIDE_BLOCKS as usize);
    Shape { grid: (blocks as u32, 1, 1), block: (STRIDE_THREADS, 1, 1), shared_bytes: 0 }
}

/// q/k norm, rotation and the K/V store: one block per (token, head of q, k or v); the
/// head's values are staged in shared memory.
pub fn qkv_prepare(tokens: usize, config: &ModelConfig) -> Shape {
    let heads = config.num_heads + 2 * config.num_kv_heads;
    assert!(tokens > 0 && tokens <= MAX_GRID_X && heads <= MAX_GRID_Y);
    // Each thread takes one rotation pair; a warp at least.
    let threads = (config.head_dim / 2).next_multiple_of(32).clamp(32, 128) as u32;
    Shape {
        grid: (tokens as u32, heads as u32, 1),
        block: (threads, 1, 1),
        shared_bytes: (config.head_dim * std::mem::size_of::<f32>()) as u32,
    }
}

/// Attention: one block per (token, query head).
pub fn attention(tokens: usize, config: &ModelConfig) -> Shape {
    assert!(tokens > 0 && tokens <= MAX_GRID_X && config.num_heads <= MAX_GRID_Y);
    Shape { grid: (tokens as u32, config.num_heads as u32, 1), block: (ATTENTION_THREADS, 1, 1), shared_bytes: 0 }
}

/// Why the kernels cannot run a model of this shape, if they cannot.
pub fn unsupported_shape(config: &ModelConfig) -> Option<String> {
    let c = config;
    if c.head_dim == 0 || c.head_dim % 2 == 1 || c.head_dim > MAX_HEAD_DIM {
        return Some(format!("head_dim {} is not an even number up to {MAX_HEAD_DIM}", c.head_dim));
    }
    if c.num_kv_heads == 0 || c.num_heads % c.num_kv_heads != 0 {
        return Some(format!("{} query heads do not split into {} KV-head groups", c.num_heads, c.num_kv_heads));
    }
    if c.num_heads + 2 * c.num_kv_heads > MAX_GRID_Y {
        return Some(format!("{} heads exceed one grid dimension", c.num_heads + 2 * c.num_kv_heads));
    }
    if c.vocab_size > i32::MAX as usize || c.intermediate_size * 2 > i32::MAX as usize {
        return Some("a dimension exceeds 2^31".into());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::presets::{preset, qwen3_shaped};

    #[test]
    fn grid_stride_launches_cover_every_element_within_the_limits() {
        for n in [1, 31, 256, 257, 100_000, 151_936 * 64, 1 << 34] {
            let s = grid_stride(n);
            assert!(s.grid.0 >= 1 && s.grid.0 <= MAX_STRIDE_BLOCKS && s.block.0 % 32 == 0);
            // One pass covers n, or the loop's stride takes each thread over several.
            let passes = (n as u64).div_ceil(s.threads());
            assert!(passes * s.threads() >= n as u64);
            if n <= (MAX_STRIDE_BLOCKS * STRIDE_THREADS) as usize {
                assert_eq!(passes, 1, "{n}: small enough for one pass");
                assert!(s.threads() < n as u64 + STRIDE_THREADS as u64, "{n}: no idle block");
            }
        }
    }

    #[test]
    fn head_launches_cover_each_head_once_with_whole_warps() {
        let shapes =
            [preset("tiny").unwrap(), preset("medium").unwrap(), qwen3_shaped(4096, 36, 32, 8, 12288, 151_936)];
        for c in &shapes {
            assert_eq!(unsupported_shape(c), None);
            for tokens in [1, 7, 8192] {
                let q = qkv_prepare(tokens, c);
                assert_eq!(q.grid, (tokens as u32, (c.num_heads + 2 * c.num_kv_heads) as u32, 1));
                assert!(q.block.0 % 32 == 0 && q.block.0 <= 1024);
                assert!(q.block.0 as usize * 2 >= c.head_dim.min(256), "one pass over the pairs or a loop");
                assert_eq!(q.shared_bytes as usize, c.head_dim * 4);
                let a = attention(tokens, c);
                assert_eq!(a.grid, (tokens as u32, c.num_heads as u32, 1));
                assert_eq!(a.block.0, ATTENTION_THREADS);
            }
        }
    }

    #[test]
    fn shapes_the_kernels_cannot_take_are_named() {
        let mut c = preset("tiny").unwrap();
        c.head_dim = 320;
        assert!(unsupported_shape(&c).unwrap().contains("head_dim 320"));
        c.head_dim = 15;
        assert!(unsupported_shape(&c).is_some());
        let mut c = preset("tiny").unwrap();
        c.num_kv_heads = 3;
        assert!(unsupported_shape(&c).unwrap().contains("KV-head groups"));
    }
}
