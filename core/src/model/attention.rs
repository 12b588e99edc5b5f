//! Paged KV storage and the attention that reads it in place.
//!
//! Storage per layer is one flat buffer laid out `[block][kv_head][slot][head_dim]`,
//! so one head's keys inside a block are contiguous. Attention walks each row's block
//! table; nothing is gathered or copied per step.

use std::sync::Arc;

use rayon::prelude::*;

use super::config::ModelConfig;
use super::kv::BlockPool;
use super::kv_arena::{KvArena, KvGeometry};
use super::rope::{rotate, Rope};

/// Largest block size the attention kernel's per-block score buffer holds.
pub const MAX_BLOCK_SIZE: usize = 128;

/// One model's view of paged K/V storage: its blocks' pages in a [`KvArena`] (its own
/// or shared with colocated models), and where each (layer, K or V, head) segment of a
/// block lies in them. One head's keys inside a block are contiguous.
pub struct PagedKvStore {
    block_size: usize,
    kv_heads: usize,
    head_dim: usize,
    arena: Arc<KvArena>,
    pool: BlockPool,
    pages_per_block: usize,
    segments_per_page: usize,
    segment_floats: usize,
    /// `pages_per_block` page ids per block id, as the pool last gave them.
    pages: Vec<u32>,
}

impl PagedKvStore {
    /// A store on `pool`'s pages of `arena`: the pool decides which blocks hold which
    /// pages, and the store follows (see [`sync`](Self::sync)).
    pub fn new(config: &ModelConfig, block_size: usize, arena: Arc<KvArena>, pool: BlockPool) -> Self {
        assert!(block_size > 0 && block_size <= MAX_BLOCK_SIZE);
        let geometry = KvGeometry::new(config, block_size);
        let pages_per_block = geometry.pages_per_block(arena.page_floats());
        assert_eq!(pages_per_block, pool.pages_per_block(), "the pool was planned for another page size");
        let blocks = pool.capacity().total_blocks;
        PagedKvStore {
            block_size,
            kv_heads: config.num_kv_heads,
            head_dim: config.head_dim,
            segments_per_page: arena.page_floats() / geometry.segment_floats(),
            segment_floats: geometry.segment_floats(),
            pages_per_block,
            pages: vec![0; blocks * pages_per_block],
            arena,
            pool,
        }
    }

    /// A store with an arena of its own: `num_blocks` blocks of one page each.
    pub fn alone(config: &ModelConfig, num_blocks: usize, block_size: usize, prefix_cache: bool) -> Self {
        let geometry = KvGeometry::new(config, block_size);
        let arena = Arc::new(KvArena::new(num_blocks, geometry.block_floats()));
        Self::new(config, block_size, arena, BlockPool::paged(num_blocks, block_size, prefix_cache))
    }

    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// Takes in the pages the pool gave blocks since the last step.
    pub fn sync(&mut self) {
        self.pool.sync_pages(&mut self.pages);
    }

    /// Makes the whole arena resident now (see [`KvArena::commit_pages`]).
    pub fn commit_pages(&self) {
        self.arena.commit_pages();
    }

    /// Where `slot` of the (layer, K or V, head) segment of `block` starts in the arena.
    fn offset(&self, block: u32, layer: usize, value: bool, kv_head: usize, slot: usize) -> usize {
        let segment = (layer * 2 + usize::from(value)) * self.kv_heads + kv_head;
        let page = self.pages[block as usize * self.pages_per_block + segment / self.segments_per_page] as usize;
        page * self.arena.page_floats()
            + (segment % self.segments_per_page) * self.segment_floats
            + slot * self.head_dim
    }
}

/// Where every token of a packed batch sits: its row, position, KV slot and RoPE angles.
pub struct TokenLayout {
    /// Per token: index of its row.
    pub row: Vec<usize>,
    /// Per token: absolute position in its sequence.
    pub position: Vec<usize>,
    /// Per token: (block, slot) where its K/V go.
    pub slot: Vec<(u32, usize)>,
    /// Per row: its block table.
    pub row_blocks: Vec<Vec<u32>>,
    cos: Vec<f32>,
    sin: Vec<f32>,
    half: usize,
}

impl TokenLayout {
    pub fn new(
        rope: &Rope,
        row: Vec<usize>,
        position: Vec<usize>,
        slot: Vec<(u32, usize)>,
        row_blocks: Vec<Vec<u32>>,
    ) -> Self {
        let half = rope.half_dim();
        let mut cos = vec![0.0; position.len() * half];
        let mut sin = vec![0.0; position.len() * half];
        for (t, &p) in position.iter().enumerate() {
            rope.cos_sin(p, &mut cos[t * half..(t + 1) * half], &mut sin[t * half..(t + 1) * half]);
        }
        TokenLayout { row, position, slot, row_blocks, cos, sin, half }
    }

    pub fn num_tokens(&self) -> usize {
        self.position.len()
    }

    fn angles(&self, t: usize) -> (&[f32], &[f32]) {
        let r = t * self.half..(t + 1) * self.half;
        (&self.cos[r.clone()], &self.sin[r])
    }
}

/// Shapes and per-layer constants of one attention layer.
pub struct AttentionSpec<'a> {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    /// Per-head RMSNorm weights for q and k (Qwen3), with eps.
    pub qk_norm: Option<(&'a [f32], &'a [f32], f32)>,
}

/// One layer's attention over a packed batch: normalizes and rotates q/k in `qkv`
/// (laid out per token as `[q heads | k heads | v heads]`), stores k/v in the paged
/// cache, and writes each token's attention output into `out` (`num_heads * head_dim`
/// per token). Token t attends to positions `0..=position[t]` of its row.
pub fn paged_attention(
    store: &mut PagedKvStore,
    layer: usize,
    spec: &AttentionSpec,
    layout: &TokenLayout,
    qkv: &mut [f32],
    out: &mut [f32],
) {
    let hd = spec.head_dim;
    let width = (spec.num_heads + 2 * spec.num_kv_heads) * hd;
    qkv.par_chunks_mut(width).enumerate().for_each(|(t, token)| {
        prepare_token(spec, layout, t, token);
    });
    write_kv(store, layer, spec, layout, qkv, width);
    attend(store, layer, spec, layout, qkv, width, out);
}

fn prepare_token(spec: &AttentionSpec, layout: &TokenLayout, t: usize, token: &mut [f32]) {
    let hd = spec.head_dim;
    let (cos, sin) = layout.angles(t);
    let q_len = spec.num_heads * hd;
    let k_len = spec.num_kv_heads * hd;
    let (q, rest) = token.split_at_mut(q_len);
    let k = &mut rest[..k_len];
    for head in q.chunks_exact_mut(hd) {
        if let Some((qn, _, eps)) = spec.qk_norm {
            rms_norm_in_place(head, qn, eps);
        }
        rotate(head, cos, sin);
    }
    for head in k.chunks_exact_mut(hd) {
        if let Some((_, kn, eps)) = spec.qk_norm {
            rms_norm_in_place(head, kn, eps);
        }
        rotate(head, cos, sin);
    }
}

fn write_kv(
    store: &mut PagedKvStore,
    layer: usize,
    spec: &AttentionSpec,
    layout: &TokenLayout,
    qkv: &[f32],
    width: usize,
) {
    let hd = spec.head_dim;
    let k_start = spec.num_heads * hd;
    let v_start = k_start + spec.num_kv_heads * hd;
    for (t, token) in qkv.chunks_exact(width).enumerate() {
        let (block, slot) = layout.slot[t];
        for g in 0..spec.num_kv_heads {
            let k_at = store.offset(block, layer, false, g, slot);
            let v_at = store.offset(block, layer, true, g, slot);
            // SAFETY: the slot's block is held by this step's row (`&mut store`: this
            // model's compute thread, nothing else reading this layer now).
            unsafe {
                store.arena.slice_mut(k_at, hd).copy_from_slice(&token[k_start + g * hd..k_start + (g + 1) * hd]);
                store.arena.slice_mut(v_at, hd).copy_from_slice(&token[v_start + g * hd..v_start + (g + 1) * hd]);
            }
        }
    }
}

fn attend(
    store: &PagedKvStore,
    layer: usize,
    spec: &AttentionSpec,
    layout: &TokenLayout,
    qkv: &[f32],
    width: usize,
    out: &mut [f32],
) {
    let hd = spec.head_dim;
    let group = spec.num_heads / spec.num_kv_heads;
    let scale = 1.0 / (hd as f32).sqrt();
    let len = store.block_size * hd;
    out.par_chunks_mut(hd).enumerate().for_each(|(i, o)| {
        let (t, h) = (i / spec.num_heads, i % spec.num_heads);
        let q = &qkv[t * width + h * hd..t * width + (h + 1) * hd];
        let blocks = &layout.row_blocks[layout.row[t]];
        let keys = |b: u32| {
            let (k_at, v_at) =
                (store.offset(b, layer, false, h / group, 0), store.offset(b, layer, true, h / group, 0));
            // SAFETY: the row holds block `b`; this layer's K/V were all written
            // before the attention started, and only reads run now.
            unsafe { (store.arena.slice(k_at, len), store.arena.slice(v_at, len)) }
        };
        attend_one(q, layout.position[t] + 1, blocks, store.block_size, scale, keys, o);
    });
}

/// Softmax attention of one query head over `context` positions spread over blocks,
/// with an online softmax rescaled once per block.
fn attend_one<'c>(
    q: &[f32],
    context: usize,
    blocks: &[u32],
    block_size: usize,
    scale: f32,
    keys: impl Fn(u32) -> (&'c [f32], &'c [f32]),
    out: &mut [f32],
) {
    let hd = q.len();
    let mut scores = [0f32; MAX_BLOCK_SIZE];
    let mut running_max = f32::NEG_INFINITY;
    let mut denom = 0f32;
    out.fill(0.0);
    for (bi, &block) in blocks.iter().enumerate() {
        let start = bi * block_size;
        if start >= context {
            break;
        }
        let n = block_size.min(context - start);
        let (k, v) = keys(block);
        let mut block_max = f32::NEG_INFINITY;
        for j in 0..n {
            let s = dot(q, &k[j * hd..(j + 1) * hd]) * scale;
            scores[j] = s;
            block_max = block_max.max(s);
        }
        let new_max = running_max.max(block_max);
        let correction = (running_max - new_max).exp();
        denom *= correction;
        for x in out.iter_mut() {
            *x *= correction;
        }
        for j in 0..n {
            let w = (scores[j] - new_max).exp();
            denom += w;
            axpy(out, w, &v[j * hd..(j + 1) * hd]);
        }
        running_max = new_max;
    }
    let inv = 1.0 / denom;
    for x in out.iter_mut() {
        *x *= inv;
    }
}

/// Dot product with independent accumulators so the compiler can vectorize it.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    const LANES: usize = 16;
    let mut acc = [0f32; LANES];
    let split = a.len() / LANES * LANES;
    for (ca, cb) in a[..split].chunks_exact(LANES).zip(b[..split].chunks_exact(LANES)) {
        for l in 0..LANES {
            acc[l] += ca[l] * cb[l];
        }
    }
    let mut sum: f32 = acc.iter().sum();
    for i in split..a.len() {
        sum += a[i] * b[i];
    }
    sum
}

#[inline]
fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += a * xi;
    }
}

fn rms_norm_in_place(x: &mut [f32], weight: &[f32], eps: f32) {
    let mean_sq = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let inv = 1.0 / (mean_sq + eps).sqrt();
    for (v, w) in x.iter_mut().zip(weight) {
        *v = *v * inv * w;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Plain softmax attention over contiguous keys, the definition the kernel must meet.
    fn reference(q: &[f32], k: &[Vec<f32>], v: &[Vec<f32>], scale: f32) -> Vec<f32> {
        let s: Vec<f32> = k.iter().map(|kj| dot(q, kj) * scale).collect();
        let m = s.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let w: Vec<f32> = s.iter().map(|x| (x - m).exp()).collect();
        let z: f32 = w.iter().sum();
        (0..q.len()).map(|d| w.iter().zip(v).map(|(wj, vj)| wj * vj[d]).sum::<f32>() / z).collect()
    }

    #[test]
    fn blockwise_online_softmax_matches_plain_softmax() {
        let hd = 8;
        let bs = 4;
        let context = 11;
        let val = |i: usize, d: usize, salt: f32| ((i * 31 + d * 7) as f32 * 0.13 + salt).sin() * 3.0;
        let k: Vec<Vec<f32>> = (0..context).map(|i| (0..hd).map(|d| val(i, d, 0.5)).collect()).collect();
        let v: Vec<Vec<f32>> = (0..context).map(|i| (0..hd).map(|d| val(i, d, 1.5)).collect()).collect();
        // Scatter positions over non-contiguous blocks 5, 2, 7.
        let blocks = [5u32, 2, 7];
        let mut kbuf = vec![0.0; 8 * bs * hd];
        let mut vbuf = vec![0.0; 8 * bs * hd];
        for i in 0..context {
            let at = (blocks[i / bs] as usize * bs + i % bs) * hd;
            kbuf[at..at + hd].copy_from_slice(&k[i]);
            vbuf[at..at + hd].copy_from_slice(&v[i]);
        }
        let q: Vec<f32> = (0..hd).map(|d| val(99, d, 2.0)).collect();
        let mut out = vec![0.0; hd];
        let keys = |b: u32| {
            let at = b as usize * bs * hd;
            (&kbuf[at..at + bs * hd], &vbuf[at..at + bs * hd])
        };
        attend_one(&q, context, &blocks, bs, 0.35, keys, &mut out);
        let want = reference(&q, &k, &v, 0.35);
        for (a, b) in out.iter().zip(&want) {
            assert!((a - b).abs() < 1e-5, "{out:?} vs {want:?}");
        }
    }

    #[test]
    fn dot_handles_tails() {
        let a: Vec<f32> = (0..37).map(|i| i as f32).collect();
        let b = vec![2.0; 37];
        assert_eq!(dot(&a, &b), 2.0 * (36.0 * 37.0 / 2.0));
    }
}
