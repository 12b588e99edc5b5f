//! The arithmetic of paged attention for one tile: several query heads that read the
//! same KV head of the same sequence (a GQA group, for one or more consecutive tokens),
//! against that sequence's blocks, with an online softmax rescaled once per block.
//!
//! Keys are stored transposed inside a block (`[head_dim][slot]`), so one vector load
//! holds one dimension of `LANES` keys and a register tile of queries × keys fills by
//! broadcast-and-FMA, with no horizontal sum per (query, key). Values stay
//! `[slot][head_dim]`: the weighted sum over keys is then broadcast-and-FMA too. Every
//! tile row's arithmetic is the same whoever shares the tile, so a sequence's result does
//! not depend on how the batch was packed.

use super::simd::{exp_scalar, Elem, Simd};

/// Floats per tile row in the score buffer: the largest block, a multiple of every
/// vector width.
pub const SCORE_STRIDE: usize = 128;
/// Value vectors per weighted-sum micro-kernel call.
const VALUE_VECTORS: usize = 4;

/// Query rows per score micro-kernel call: with two vectors of keys, 8 × 2
/// accumulators where AVX-512's 32 registers are named, 6 × 2 in 16, so that the
/// tile is not spilled to the stack on every key dimension (`examples/attention_bench`
/// on AVX2, a 2,048-token prefill of one `small` layer, with the weighted sum below:
/// 79 → 42 ms; 4 rows here was slower than 6).
fn score_rows<S: Simd>() -> usize {
    if S::REGISTERS >= 32 {
        8
    } else {
        6
    }
}

/// Query rows per weighted-sum micro-kernel call, against [`VALUE_VECTORS`] vectors:
/// 4 × 4 accumulators in 32 registers, 2 × 4 in 16 (3 × 4 spilled: 51 against 42 ms
/// in the measurement above).
fn value_rows<S: Simd>() -> usize {
    if S::REGISTERS >= 32 {
        4
    } else {
        2
    }
}

/// One tile's queries: `context.len()` query vectors of `head_dim` floats, row-major in
/// `q`, and how many positions (from 0) each may see.
pub struct QueryTile<'a> {
    pub q: &'a [f32],
    pub context: &'a [usize],
    pub head_dim: usize,
}

/// One block's transposed keys (`head_dim × block_size`) and values (`block_size ×
/// head_dim`), stored as `E` (f32, or f16 for half the bytes) and widened as they load.
pub struct KvBlock<'c, E> {
    pub keys_t: &'c [E],
    pub values: &'c [E],
}

/// Softmax attention of every tile row over its visible positions, read block by block
/// through `block` (block ids in sequence order). Writes `rows × head_dim` into `out`.
///
/// Blocks are taken in chunks of up to [`SCORE_STRIDE`] keys: one softmax step (a
/// horizontal max, one rescale, one horizontal sum) per chunk rather than per block, and
/// the weighted sum keeps its accumulators in registers across the chunk
/// (`examples/attention_bench` on AVX2 beside a build of the block-by-block kernel,
/// min of 3 interleaved runs: a 2,048-token prefill of one `small` layer 48 → 41 ms with
/// f32 K/V and 43 → 36 ms with f16; 32 decode rows at 4,096 positions 25 → 14 ms). Chunks start
/// at fixed multiples of the sequence's blocks, so a row's arithmetic does not depend on
/// its tile-mates (keys past a row's context weigh exactly 0).
pub fn attend_tile<'c, S: Simd, E: Elem>(
    tile: &QueryTile,
    blocks: &[u32],
    block_size: usize,
    scale: f32,
    block: impl Fn(u32) -> KvBlock<'c, E>,
    out: &mut [f32],
) {
    let rows = tile.context.len();
    let hd = tile.head_dim;
    assert!(block_size > 0 && block_size <= SCORE_STRIDE);
    assert_eq!(tile.q.len(), rows * hd);
    assert_eq!(out.len(), rows * hd);
    let widest = tile.context.iter().copied().max().unwrap_or(0);
    let blocks_per_chunk = SCORE_STRIDE / block_size;
    let mut scores = vec![0f32; rows * SCORE_STRIDE];
    let mut running_max = vec![f32::NEG_INFINITY; rows];
    let mut denom = vec![0f32; rows];
    let mut correction = vec![0f32; rows];
    let mut chunk_values: Vec<&[E]> = Vec::with_capacity(blocks_per_chunk);
    out.fill(0.0);
    for (ci, chunk) in blocks.chunks(blocks_per_chunk).enumerate() {
        let start = ci * blocks_per_chunk * block_size;
        if start >= widest {
            break;
        }
        let keys = (chunk.len() * block_size).min(widest - start);
        chunk_values.clear();
        for (bi, &id) in chunk.iter().enumerate().take(keys.div_ceil(block_size)) {
            let first_key = bi * block_size;
            // Blocks lie anywhere in the arena, past what the hardware prefetcher
            // guesses: ask for the next one while this one is computed.
            if let Some(&next) =
                blocks.get(ci * blocks_per_chunk + bi + 1).filter(|_| start + first_key + block_size < widest)
            {
                let kv = block(next);
                S::prefetch_bytes(kv.keys_t.as_ptr() as *const u8, std::mem::size_of_val(kv.keys_t));
                S::prefetch_bytes(kv.values.as_ptr() as *const u8, std::mem::size_of_val(kv.values));
            }
            let kv = block(id);
            debug_assert!(kv.keys_t.len() >= hd * block_size && kv.values.len() >= block_size * hd);
            let n = block_size.min(keys - first_key);
            block_scores::<S, E>(tile.q, rows, hd, kv.keys_t, block_size, n, &mut scores, first_key);
            chunk_values.push(kv.values);
        }
        for r in 0..rows {
            let visible = tile.context[r].saturating_sub(start).min(keys);
            let row = &mut scores[r * SCORE_STRIDE..(r + 1) * SCORE_STRIDE];
            correction[r] = softmax_step::<S>(row, visible, keys, scale, &mut running_max[r], &mut denom[r]);
        }
        let values = ChunkValues { blocks: &chunk_values, block_size, keys };
        weighted_values::<S, E>(&scores, rows, hd, &values, &correction, out);
    }
    for (o, d) in out.chunks_exact_mut(hd).zip(&denom) {
        let inv = 1.0 / d;
        o.iter_mut().for_each(|x| *x *= inv);
    }
}

/// One chunk's value blocks (`block_size × head_dim` each, in sequence order) holding
/// `keys` keys in all.
struct ChunkValues<'a, 'c, E> {
    blocks: &'a [&'c [E]],
    block_size: usize,
    keys: usize,
}

impl<E> ChunkValues<'_, '_, E> {
    /// Keys of block `b` in this chunk.
    fn keys_in(&self, b: usize) -> usize {
        self.block_size.min(self.keys - b * self.block_size)
    }
}

/// `scores[r][at + j] = q[r] · key[j]` for keys `0..n` of one block (`keys_t` is
/// `hd × block_size`). Whole vectors of keys may run past `n` inside the block; those
/// scores are masked later.
#[allow(clippy::too_many_arguments)]
fn block_scores<S: Simd, E: Elem>(
    q: &[f32],
    rows: usize,
    hd: usize,
    keys_t: &[E],
    bs: usize,
    n: usize,
    scores: &mut [f32],
    at: usize,
) {
    let mut j = 0;
    while j < n && j + S::LANES <= bs {
        let pair = j + 2 * S::LANES <= bs && j + S::LANES < n;
        let mut r = 0;
        while r < rows {
            let rr = score_rows::<S>().min(rows - r);
            macro_rules! dispatch {
                ($($a:literal),*) => {
                    match (rr, pair) {
                        $(($a, true) => score_micro::<S, E, $a, 2>(q, r, hd, keys_t, bs, j, &mut scores[at..]),
                          ($a, false) => score_micro::<S, E, $a, 1>(q, r, hd, keys_t, bs, j, &mut scores[at..]),)*
                        _ => unreachable!("at most 8 rows"),
                    }
                };
            }
            dispatch!(1, 2, 3, 4, 5, 6, 7, 8);
            r += rr;
        }
        j += if pair { 2 * S::LANES } else { S::LANES };
    }
    // Blocks narrower than a vector, or a ragged last vector: one key at a time.
    for key in j..n {
        for r in 0..rows {
            let qr = &q[r * hd..(r + 1) * hd];
            let s = qr.iter().enumerate().fold(0f32, |s, (d, &x)| x.mul_add(keys_t[d * bs + key].to_f32(), s));
            scores[r * SCORE_STRIDE + at + key] = s;
        }
    }
}

/// Scores of query rows `r0..r0 + R` against keys `j..j + C·LANES`.
#[inline(always)]
fn score_micro<S: Simd, E: Elem, const R: usize, const C: usize>(
    q: &[f32],
    r0: usize,
    hd: usize,
    keys_t: &[E],
    bs: usize,
    j: usize,
    scores: &mut [f32],
) {
    assert!(q.len() >= (r0 + R) * hd && keys_t.len() >= hd * bs && j + C * S::LANES <= bs);
    assert!(scores.len() >= (r0 + R - 1) * SCORE_STRIDE + j + C * S::LANES);
    // SAFETY: the asserts bound every read (d < hd, key < j + C·LANES <= bs) and write.
    unsafe {
        let mut acc = [[S::zero(); C]; R];
        for d in 0..hd {
            let k: [S::V; C] = std::array::from_fn(|c| E::load::<S>(keys_t.as_ptr().add(d * bs + j + c * S::LANES)));
            for a in 0..R {
                let qv = S::splat(*q.get_unchecked((r0 + a) * hd + d));
                for c in 0..C {
                    acc[a][c] = S::fma(qv, k[c], acc[a][c]);
                }
            }
        }
        for a in 0..R {
            for c in 0..C {
                S::store(scores.as_mut_ptr().add((r0 + a) * SCORE_STRIDE + j + c * S::LANES), acc[a][c]);
            }
        }
    }
}

/// Turns one row's raw scores for this block into softmax weights against the running
/// maximum, updates the row's denominator, and returns the factor its output so far
/// must be scaled by. Keys `visible..` are masked (weight exactly 0).
fn softmax_step<S: Simd>(
    row: &mut [f32],
    visible: usize,
    n: usize,
    scale: f32,
    running_max: &mut f32,
    denom: &mut f32,
) -> f32 {
    let padded = n.div_ceil(S::LANES) * S::LANES;
    row[visible..padded].fill(f32::NEG_INFINITY);
    let scale_v = S::splat(scale);
    let mut max_v = S::splat(f32::NEG_INFINITY);
    for chunk in row[..padded].chunks_exact_mut(S::LANES) {
        // SAFETY: a chunk holds LANES floats.
        unsafe {
            let s = S::mul(S::load(chunk.as_ptr()), scale_v);
            S::store(chunk.as_mut_ptr(), s);
            max_v = S::max(max_v, s);
        }
    }
    let new_max = running_max.max(S::max_lane(max_v));
    let correction = if *running_max == new_max { 1.0 } else { exp_scalar(*running_max - new_max) };
    let new_max_v = S::splat(new_max);
    let mut sum_v = S::zero();
    for chunk in row[..padded].chunks_exact_mut(S::LANES) {
        // SAFETY: a chunk holds LANES floats.
        unsafe {
            let w = S::exp(S::sub(S::load(chunk.as_ptr()), new_max_v));
            S::store(chunk.as_mut_ptr(), w);
            sum_v = S::add(sum_v, w);
        }
    }
    *denom = *denom * correction + S::sum(sum_v);
    *running_max = new_max;
    correction
}

/// `out[r] = out[r] · correction[r] + Σ_j weight[r][j] · value[j]` over the chunk's keys.
fn weighted_values<S: Simd, E: Elem>(
    weights: &[f32],
    rows: usize,
    hd: usize,
    values: &ChunkValues<E>,
    correction: &[f32],
    out: &mut [f32],
) {
    let vector_cols = hd / S::LANES * S::LANES;
    let mut c0 = 0;
    while c0 < vector_cols {
        let cv = VALUE_VECTORS.min((vector_cols - c0) / S::LANES);
        let mut r = 0;
        while r < rows {
            let rr = value_rows::<S>().min(rows - r);
            macro_rules! dispatch {
                ($($a:literal $b:literal),*) => {
                    match (rr, cv) {
                        $(($a, $b) => value_micro::<S, E, $a, $b>(weights, r, hd, values, c0, correction, out),)*
                        _ => unreachable!("at most 4 × VALUE_VECTORS"),
                    }
                };
            }
            dispatch!(1 1, 1 2, 1 3, 1 4, 2 1, 2 2, 2 3, 2 4, 3 1, 3 2, 3 3, 3 4, 4 1, 4 2, 4 3, 4 4);
            r += rr;
        }
        c0 += cv * S::LANES;
    }
    for d in vector_cols..hd {
        for r in 0..rows {
            let w = &weights[r * SCORE_STRIDE..];
            let mut o = out[r * hd + d] * correction[r];
            for (b, block) in values.blocks.iter().enumerate() {
                for j in 0..values.keys_in(b) {
                    o = w[b * values.block_size + j].mul_add(block[j * hd + d].to_f32(), o);
                }
            }
            out[r * hd + d] = o;
        }
    }
}

#[inline(always)]
fn value_micro<S: Simd, E: Elem, const R: usize, const C: usize>(
    weights: &[f32],
    r0: usize,
    hd: usize,
    values: &ChunkValues<E>,
    c0: usize,
    correction: &[f32],
    out: &mut [f32],
) {
    assert!(c0 + C * S::LANES <= hd && out.len() >= (r0 + R) * hd && values.keys <= SCORE_STRIDE);
    assert!(weights.len() >= (r0 + R) * SCORE_STRIDE && correction.len() >= r0 + R);
    // SAFETY: the asserts bound every weight read (j < keys <= SCORE_STRIDE), column
    // (< c0 + C·LANES <= hd) and write; each value read is bounded by its block's length.
    unsafe {
        let mut acc: [[S::V; C]; R] = std::array::from_fn(|a| {
            let scale = S::splat(correction[r0 + a]);
            std::array::from_fn(|c| S::mul(S::load(out.as_ptr().add((r0 + a) * hd + c0 + c * S::LANES)), scale))
        });
        for (b, block) in values.blocks.iter().enumerate() {
            let n = values.keys_in(b);
            assert!(block.len() >= n * hd);
            let first = b * values.block_size;
            for j in 0..n {
                let v: [S::V; C] =
                    std::array::from_fn(|c| E::load::<S>(block.as_ptr().add(j * hd + c0 + c * S::LANES)));
                for a in 0..R {
                    let w = S::splat(*weights.get_unchecked((r0 + a) * SCORE_STRIDE + first + j));
                    for c in 0..C {
                        acc[a][c] = S::fma(w, v[c], acc[a][c]);
                    }
                }
            }
        }
        for a in 0..R {
            for c in 0..C {
                S::store(out.as_mut_ptr().add((r0 + a) * hd + c0 + c * S::LANES), acc[a][c]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::simd::for_each_simd;

    /// Plain softmax attention over contiguous keys in f64, the definition to meet.
    fn reference(q: &[f32], k: &[Vec<f32>], v: &[Vec<f32>], scale: f32) -> Vec<f32> {
        let s: Vec<f64> = k
            .iter()
            .map(|kj| q.iter().zip(kj).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>() * scale as f64)
            .collect();
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let w: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
        let z: f64 = w.iter().sum();
        (0..q.len()).map(|d| (w.iter().zip(v).map(|(wj, vj)| wj * vj[d] as f64).sum::<f64>() / z) as f32).collect()
    }

    /// Several query rows with different causal contexts against keys scattered over
    /// non-contiguous blocks, for block sizes and head sizes on and off the vector width.
    fn tile_matches_plain_softmax<S: Simd, E: Elem>() {
        let val = |i: usize, d: usize, salt: f32| ((i * 31 + d * 7) as f32 * 0.13 + salt).sin() * 3.0;
        // (head_dim, block size, rows, context). From 122 keys on a context spans several
        // chunks of blocks; past 200 its rows end in different chunks.
        let cases = [
            (8usize, 4usize, 3usize, 14usize),
            (16, 16, 9, 50),
            (64, 16, 32, 50),
            (24, 40, 5, 122),
            (64, 128, 2, 386),
            (70, 1, 4, 5),
            (64, 16, 9, 300),
            (16, 4, 5, 270),
        ];
        for &(hd, bs, rows, context) in &cases {
            // Scattered, distinct block ids (5b + 3 stays below the arena of 7n + 4).
            let arena = 7 * context.div_ceil(bs) + 4;
            let blocks: Vec<u32> = (0..context.div_ceil(bs)).map(|b| (b * 5 + 3) as u32).collect();
            // The definition runs on the values as stored (rounded to E).
            let stored = |x: f32| E::from_f32(x).to_f32();
            let k: Vec<Vec<f32>> = (0..context).map(|i| (0..hd).map(|d| stored(val(i, d, 0.5))).collect()).collect();
            let v: Vec<Vec<f32>> = (0..context).map(|i| (0..hd).map(|d| stored(val(i, d, 1.5))).collect()).collect();
            // Unwritten slots hold NaN: the kernel must never let them reach a result.
            let mut kbuf = vec![E::from_f32(f32::NAN); arena * bs * hd];
            let mut vbuf = vec![E::from_f32(f32::NAN); arena * bs * hd];
            for i in 0..context {
                let base = blocks[i / bs] as usize * bs * hd;
                for d in 0..hd {
                    kbuf[base + d * bs + i % bs] = E::from_f32(k[i][d]);
                    vbuf[base + (i % bs) * hd + d] = E::from_f32(v[i][d]);
                }
            }
            let q: Vec<f32> = (0..rows * hd).map(|i| val(99 + i / hd, i % hd, 2.0)).collect();
            let spread = if context > 200 { 170 } else { context.min(19) };
            let ctx: Vec<usize> = (0..rows).map(|r| context - (r * 37) % spread).collect();
            let mut out = vec![0.0; rows * hd];
            let block = |b: u32| {
                let at = b as usize * bs * hd;
                KvBlock { keys_t: &kbuf[at..at + bs * hd], values: &vbuf[at..at + bs * hd] }
            };
            let tile = QueryTile { q: &q, context: &ctx, head_dim: hd };
            attend_tile::<S, E>(&tile, &blocks, bs, 0.35, block, &mut out);
            for r in 0..rows {
                let want = reference(&q[r * hd..(r + 1) * hd], &k[..ctx[r]], &v[..ctx[r]], 0.35);
                for (a, b) in out[r * hd..(r + 1) * hd].iter().zip(&want) {
                    assert!((a - b).abs() < 2e-5, "hd {hd} bs {bs} row {r}: {a} vs {b}");
                }
            }
            // A row's result does not depend on its tile-mates.
            for r in [0, rows - 1] {
                let mut alone = vec![0.0; hd];
                let tile = QueryTile { q: &q[r * hd..(r + 1) * hd], context: &ctx[r..r + 1], head_dim: hd };
                attend_tile::<S, E>(&tile, &blocks, bs, 0.35, block, &mut alone);
                assert_eq!(alone, out[r * hd..(r + 1) * hd], "hd {hd} bs {bs} row {r} alone");
            }
        }
    }

    #[test]
    fn tiles_match_plain_softmax_on_every_path_for_f32_and_f16_kv() {
        for_each_simd!(S => {
            tile_matches_plain_softmax::<S, f32>();
            tile_matches_plain_softmax::<S, half::f16>();
        });
    }
}
