//! Paged KV storage and the attention that reads it in place.
//!
//! Each block holds, per (layer, K or V, KV head), one contiguous segment: values as
//! `[slot][head_dim]`, keys transposed as `[head_dim][slot]` (so the kernel vectorizes
//! across keys). Attention walks each row's block table; nothing is gathered or copied
//! per step. The arithmetic is in [`attention_kernel`](super::attention_kernel).

use std::sync::Arc;

use rayon::prelude::*;

use super::attention_kernel::{attend_tile, KvBlock, QueryTile, SCORE_STRIDE};
use super::kv::BlockPool;
use super::kv_arena::{KvArena, KvDtype, KvGeometry};
use super::matmul::{written_whole, SharedOut};
use super::rope::{rotate, Rope};
use super::simd::{with_active_simd, Elem, Simd};

/// Largest block size the attention kernel's per-block score buffer holds.
pub const MAX_BLOCK_SIZE: usize = SCORE_STRIDE;

/// One model's view of paged K/V storage: its blocks' pages in a [`KvArena`] (its own
/// or shared with colocated models), and where each (layer, K or V, head) segment of a
/// block lies in them. One head's keys inside a block are contiguous.
pub struct PagedKvStore {
    block_size: usize,
    kv_heads: usize,
    dtype: KvDtype,
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
    pub fn new(geometry: KvGeometry, arena: Arc<KvArena>, pool: BlockPool) -> Self {
        let block_size = geometry.block_size;
        assert!(block_size > 0 && block_size <= MAX_BLOCK_SIZE);
        let pages_per_block = geometry.pages_per_block(arena.page_floats());
        assert_eq!(pages_per_block, pool.pages_per_block(), "the pool was planned for another page size");
        assert!(arena.host_backed(), "a device arena's pages are not in this process's memory");
        let blocks = pool.capacity().total_blocks;
        PagedKvStore {
            block_size,
            kv_heads: geometry.kv_heads,
            dtype: geometry.dtype,
            segments_per_page: arena.page_floats() / geometry.segment_floats(),
            segment_floats: geometry.segment_floats(),
            pages_per_block,
            pages: vec![0; blocks * pages_per_block],
            arena,
            pool,
        }
    }

    /// A store with an arena of its own: `num_blocks` blocks of one page each.
    pub fn alone(geometry: KvGeometry, num_blocks: usize, prefix_cache: bool) -> Self {
        let arena = Arc::new(KvArena::new(num_blocks, geometry.block_floats()));
        Self::new(geometry, arena, BlockPool::paged(num_blocks, geometry.block_size, prefix_cache))
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

    /// Where the (layer, K or V, head) segment of `block` starts in the arena.
    fn segment(&self, block: u32, layer: usize, value: bool, kv_head: usize) -> usize {
        let segment = (layer * 2 + usize::from(value)) * self.kv_heads + kv_head;
        let page = self.pages[block as usize * self.pages_per_block + segment / self.segments_per_page] as usize;
        page * self.arena.page_floats() + (segment % self.segments_per_page) * self.segment_floats
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
/// cache, and returns each token's attention output (`num_heads * head_dim` per token,
/// row-major). Token t attends to positions `0..=position[t]` of its row.
pub fn paged_attention(
    store: &mut PagedKvStore,
    layer: usize,
    spec: &AttentionSpec,
    layout: &TokenLayout,
    qkv: &mut [f32],
) -> Vec<f32> {
    let width = store_kv(store, layer, spec, layout, qkv);
    // Never zeroed first (1-2 MB per layer at 512 tokens): the tasks write every output.
    let len = layout.num_tokens() * spec.num_heads * spec.head_dim;
    // Safety: `attend`'s tasks write each of the `len` floats once: every token lies in
    // one task per KV head, which writes all of that head's query heads for it.
    unsafe { written_whole(len, |out| attend(store, layer, spec, layout, qkv, width, &SharedOut(out))) }
}

/// Normalizes and rotates q/k in `qkv`, and stores k/v in the paged cache; returns the
/// floats per token of `qkv`.
fn store_kv(
    store: &mut PagedKvStore,
    layer: usize,
    spec: &AttentionSpec,
    layout: &TokenLayout,
    qkv: &mut [f32],
) -> usize {
    let width = (spec.num_heads + 2 * spec.num_kv_heads) * spec.head_dim;
    qkv.par_chunks_mut(width).enumerate().for_each(|(t, token)| {
        prepare_token(spec, layout, t, token);
    });
    write_kv(store, layer, spec, layout, qkv, width);
    width
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

/// Stores each token's k (transposed: one dimension of a block's keys is contiguous,
/// see [`attention_kernel`](super::attention_kernel)) and v in its slot.
fn write_kv(
    store: &mut PagedKvStore,
    layer: usize,
    spec: &AttentionSpec,
    layout: &TokenLayout,
    qkv: &[f32],
    width: usize,
) {
    match store.dtype {
        KvDtype::F32 => write_kv_as::<f32>(store, layer, spec, layout, qkv, width),
        KvDtype::F16 => write_kv_as::<half::f16>(store, layer, spec, layout, qkv, width),
        KvDtype::Bf16 => unreachable!("the CPU backend refuses bf16 K/V at load"),
    }
}

fn write_kv_as<E: Elem>(
    store: &mut PagedKvStore,
    layer: usize,
    spec: &AttentionSpec,
    layout: &TokenLayout,
    qkv: &[f32],
    width: usize,
) {
    let hd = spec.head_dim;
    let bs = store.block_size;
    let k_start = spec.num_heads * hd;
    let v_start = k_start + spec.num_kv_heads * hd;
    for (t, token) in qkv.chunks_exact(width).enumerate() {
        let (block, slot) = layout.slot[t];
        for g in 0..spec.num_kv_heads {
            let k_at = store.segment(block, layer, false, g);
            let v_at = store.segment(block, layer, true, g);
            // SAFETY: the slot's block is held by this step's row (`&mut store`: this
            // model's compute thread, nothing else reading this layer now).
            unsafe {
                let keys_t = store.arena.slice_mut::<E>(k_at, hd * bs);
                for (d, &k) in token[k_start + g * hd..k_start + (g + 1) * hd].iter().enumerate() {
                    keys_t[d * bs + slot] = E::from_f32(k);
                }
                let values = store.arena.slice_mut::<E>(v_at, bs * hd);
                for (d, &v) in token[v_start + g * hd..v_start + (g + 1) * hd].iter().enumerate() {
                    values[slot * hd + d] = E::from_f32(v);
                }
            }
        }
    }
}

/// Query rows per attention task at most: a GQA group's heads for several consecutive
/// tokens of one sequence, so each K/V block read serves them all.
const TILE_ROWS: usize = 32;

/// One attention task: tokens `tokens` (packed indices, one sequence) and the query
/// heads of KV head `kv_head`.
struct Task {
    tokens: std::ops::Range<usize>,
    kv_head: usize,
}

/// Splits the batch into tasks: each sequence's consecutive tokens in runs that fill
/// about [`TILE_ROWS`] query rows, times its KV heads.
fn plan_tasks(layout: &TokenLayout, spec: &AttentionSpec) -> Vec<Task> {
    let group = spec.num_heads / spec.num_kv_heads;
    let per_task = (TILE_ROWS / group).max(1);
    let mut tasks = Vec::new();
    let mut t = 0;
    while t < layout.num_tokens() {
        let row = layout.row[t];
        let end = (t..layout.num_tokens()).find(|&u| layout.row[u] != row).unwrap_or(layout.num_tokens());
        for t0 in (t..end).step_by(per_task) {
            for kv_head in 0..spec.num_kv_heads {
                tasks.push(Task { tokens: t0..(t0 + per_task).min(end), kv_head });
            }
        }
        t = end;
    }
    tasks
}

/// Writes every token's attention output to `out`.
///
/// # Safety
/// `out` is valid for writes of `tokens × num_heads × head_dim` floats, and nothing else
/// accesses them meanwhile.
unsafe fn attend(
    store: &PagedKvStore,
    layer: usize,
    spec: &AttentionSpec,
    layout: &TokenLayout,
    qkv: &[f32],
    width: usize,
    out: &SharedOut,
) {
    // Safety: the caller's promise about `out` is `attend_on`'s.
    unsafe {
        match store.dtype {
            KvDtype::F32 => with_active_simd!(S => attend_on::<S, f32>(store, layer, spec, layout, qkv, width, out)),
            KvDtype::F16 => {
                with_active_simd!(S => attend_on::<S, half::f16>(store, layer, spec, layout, qkv, width, out))
            }
            KvDtype::Bf16 => unreachable!("the CPU backend refuses bf16 K/V at load"),
        }
    }
}

/// [`attend`] on the instruction set `S`.
///
/// # Safety
/// As [`attend`].
unsafe fn attend_on<S: Simd, E: Elem>(
    store: &PagedKvStore,
    layer: usize,
    spec: &AttentionSpec,
    layout: &TokenLayout,
    qkv: &[f32],
    width: usize,
    out: &SharedOut,
) {
    let hd = spec.head_dim;
    let group = spec.num_heads / spec.num_kv_heads;
    let scale = 1.0 / (hd as f32).sqrt();
    let bs = store.block_size;
    plan_tasks(layout, spec).par_iter().for_each(|task| {
        let g = task.kv_head;
        let heads = g * group..(g + 1) * group;
        let mut q = Vec::with_capacity(task.tokens.len() * group * hd);
        let mut context = Vec::with_capacity(task.tokens.len() * group);
        for t in task.tokens.clone() {
            q.extend_from_slice(&qkv[t * width + heads.start * hd..t * width + heads.end * hd]);
            context.extend(std::iter::repeat_n(layout.position[t] + 1, group));
        }
        let mut tile_out = vec![0f32; q.len()];
        let blocks = &layout.row_blocks[layout.row[task.tokens.start]];
        let block = |b: u32| {
            let (k_at, v_at) = (store.segment(b, layer, false, g), store.segment(b, layer, true, g));
            // SAFETY: the row holds block `b`; this layer's K/V were all written
            // before the attention started, and only reads run now.
            unsafe {
                KvBlock { keys_t: store.arena.slice::<E>(k_at, bs * hd), values: store.arena.slice::<E>(v_at, bs * hd) }
            }
        };
        let tile = QueryTile { q: &q, context: &context, head_dim: hd };
        attend_tile::<S, E>(&tile, blocks, bs, scale, block, &mut tile_out);
        let token_width = spec.num_heads * hd;
        for (i, t) in task.tokens.clone().enumerate() {
            let src = &tile_out[i * group * hd..(i + 1) * group * hd];
            // SAFETY: token t's heads of group g are written by this task only, and lie
            // inside `out` (tokens × token_width floats, as the caller vouches).
            unsafe {
                let dst = out.ptr().add(t * token_width + heads.start * hd);
                std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len());
            }
        }
    });
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
    use crate::model::presets::qwen3_shaped;

    /// The attention output of two rows (one prefilling 9 tokens, one decoding 1 after
    /// 20), 4 query heads over 2 KV heads, blocks of 4 slots, written over a buffer of `fill`.
    fn attention_output(fill: f32) -> Vec<f32> {
        let config = qwen3_shaped(64, 1, 4, 2, 64, 50);
        let (bs, hd) = (4, config.head_dim);
        let mut store = PagedKvStore::alone(KvGeometry::new(&config, bs, KvDtype::F32), 16, false);
        let mut seqs: Vec<_> = [9, 21]
            .iter()
            .map(|&n| {
                let mut seq = store.pool().new_sequence();
                seq.reserve(n).unwrap();
                seq
            })
            .collect();
        store.sync();
        let row_blocks: Vec<Vec<u32>> = seqs.iter().map(|s| s.blocks().to_vec()).collect();
        let (mut row, mut position, mut slot) = (Vec::new(), Vec::new(), Vec::new());
        for (r, positions) in [(0, 0..9), (1, 20..21)] {
            for p in positions {
                row.push(r);
                position.push(p);
                slot.push((row_blocks[r][p / bs], p % bs));
            }
        }
        let layout = TokenLayout::new(&Rope::new(&config), row, position, slot, row_blocks);
        let spec = AttentionSpec { num_heads: 4, num_kv_heads: 2, head_dim: hd, qk_norm: None };
        let mut qkv: Vec<f32> =
            (0..layout.num_tokens() * 8 * hd).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.01).collect();
        let width = store_kv(&mut store, 0, &spec, &layout, &mut qkv);
        // An output the tasks did not write would keep the buffer's value.
        let mut out = vec![fill; layout.num_tokens() * 4 * hd];
        // Safety: `out` holds tokens × heads × head_dim floats.
        unsafe { attend(&store, 0, &spec, &layout, &qkv, width, &SharedOut(out.as_mut_ptr())) };
        seqs.iter_mut().for_each(|s| s.clear());
        out
    }

    #[test]
    fn every_output_is_written_whatever_the_memory_held() {
        let over_nan = attention_output(f32::NAN);
        let over_zero = attention_output(0.0);
        assert!(over_nan.iter().all(|v| v.is_finite()), "an output kept the buffer's NaN");
        assert_eq!(
            over_nan.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            over_zero.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        assert!(over_nan.iter().any(|&v| v != 0.0));
    }
}
