//! `y = x · Wᵀ` for many rows of `x` (prefill chunks, large decode batches): an
//! outer-product register tile over `x` transposed once per call.
//!
//! The few-row kernel in [`matmul`](super::matmul) takes dot products along `k`, which
//! costs a horizontal sum per output and, for half-precision weights, one widening of
//! every weight vector per 4-row tile of `x`. Here `x` is packed into blocks of `LANES`
//! rows laid out `[k][LANES]`, so one vector holds one column of `LANES` rows. A tile
//! then broadcasts one weight at a time against two such vectors: no horizontal sums, and
//! each weight is loaded (and widened) once per panel of rows instead of once per four.
//!
//! Tested through [`matmul_xwt_on`](super::matmul::matmul_xwt_on), which hands it 12 rows
//! and more, on every kernel path.

use rayon::prelude::*;

use super::matmul::SharedOut;
use super::simd::{with_active_simd, Elem, Simd, CACHE_LINE_BYTES};

/// Blocks of `LANES` rows per tile: each broadcast weight feeds this many FMAs.
const ROW_BLOCKS: usize = 2;
/// Weight rows per tile with 32 vector registers (AVX-512's encoding): 2 × 12
/// accumulators, two `x` vectors and a broadcast fit the register file.
const WIDE_COLS: usize = 12;
/// Weight rows per tile on 16-register paths.
const NARROW_COLS: usize = 6;
/// Floats of packed `x` per panel (384 KiB): the panel stays in L2 while every weight
/// group of a task passes over it, so `W` is read from memory once per panel.
const PANEL_FLOATS: usize = 96 * 1024;
/// How far ahead (in floats, 64 KiB) a tile prefetches the weights it streams from
/// memory. A tile's weight rows lie next to each other, and so does the next tile's
/// group, so the tile walks that memory linearly, as far ahead as the L2 holds well:
/// the next group arrives while this one is multiplied, where prefetching 512 floats
/// down each row left every group's first lines to be missed on (a `medium` 32-row
/// decode step's matrices, `MATMUL_STACK_ROWS=32 examples/matmul_bench`, 10 interleaved
/// old/new pairs: median ratio 0.86, medians 91 → 78 ms).
const PREFETCH_AHEAD: usize = 16 * 1024;
/// How far down each row (in floats) a tile prefetches weights widened into a buffer:
/// they sit in L2, 12 rows of `k` floats apart.
const ROW_PREFETCH_AHEAD: usize = 512;
/// Floats per cache line.
const LINE_FLOATS: usize = CACHE_LINE_BYTES / 4;

/// [`matmul_xwt_packed`] on the active [`KernelPath`](super::simd::KernelPath).
pub fn matmul_xwt_many<W: Elem>(x: &[f32], w: &[W], y: &mut [f32], m: usize, k: usize, n: usize) {
    with_active_simd!(S => matmul_xwt_packed::<S, W>(x, w, y, m, k, n))
}

/// `y[m][n] = Σ_k x[m][k] · w[n][k]` with `x: (m, k)`, `w: (n, k)`, `y: (m, n)`, all
/// row-major and contiguous, on the instruction set `S`.
pub fn matmul_xwt_packed<S: Simd, W: Elem>(x: &[f32], w: &[W], y: &mut [f32], m: usize, k: usize, n: usize) {
    assert_eq!(x.len(), m * k);
    assert_eq!(w.len(), n * k);
    assert_eq!(y.len(), m * n);
    if k == 0 {
        y.fill(0.0);
    }
    if m == 0 || n == 0 || k == 0 {
        return;
    }
    let packed = pack_rows::<S>(x, m, k);
    let cols = cols_per_tile::<S>();
    let threads = rayon::current_num_threads().max(1);
    // Several tasks per thread balance uneven progress; keep them whole tiles wide.
    let per_task = (n.div_ceil(threads * 4)).div_ceil(cols).max(1) * cols;
    let out = SharedOut(y.as_mut_ptr());
    let shape = Shape { m, k, n };
    (0..n.div_ceil(per_task)).into_par_iter().for_each(|task| {
        let n0 = task * per_task;
        let columns = n0..(n0 + per_task).min(n);
        compute_columns::<S, W>(&packed, w, &out, shape, columns);
    });
}

#[derive(Clone, Copy)]
struct Shape {
    m: usize,
    k: usize,
    n: usize,
}

fn cols_per_tile<S: Simd>() -> usize {
    if S::REGISTERS >= 32 {
        WIDE_COLS
    } else {
        NARROW_COLS
    }
}

/// `x` as blocks of `LANES` rows, each `[k][LANES]`; rows past `m` are zero.
fn pack_rows<S: Simd>(x: &[f32], m: usize, k: usize) -> Vec<f32> {
    let lanes = S::LANES;
    let mut packed = vec![0f32; m.div_ceil(lanes) * k * lanes];
    let pack_block = |(block, dst): (usize, &mut [f32])| {
        for lane in 0..lanes.min(m - block * lanes) {
            let row = &x[(block * lanes + lane) * k..][..k];
            for (p, v) in row.iter().enumerate() {
                dst[p * lanes + lane] = *v;
            }
        }
    };
    let chunks = packed.chunks_mut(k * lanes).enumerate();
    if m * k >= 1 << 18 {
        chunks.par_bridge().for_each(pack_block);
    } else {
        chunks.for_each(pack_block);
    }
    packed
}

fn compute_columns<S: Simd, W: Elem>(
    packed: &[f32],
    w: &[W],
    out: &SharedOut,
    shape: Shape,
    columns: std::ops::Range<usize>,
) {
    let Shape { m, k, .. } = shape;
    let lanes = S::LANES;
    let blocks = m.div_ceil(lanes);
    let cols = cols_per_tile::<S>();
    let panel_blocks = (PANEL_FLOATS / (k * lanes)).max(ROW_BLOCKS) / ROW_BLOCKS * ROW_BLOCKS;
    // Half-precision weights are widened once per panel into this buffer.
    let mut widened = if W::IS_F32 { Vec::new() } else { vec![0f32; cols * k] };
    let mut tile = vec![0f32; ROW_BLOCKS * cols * lanes];
    for b0 in (0..blocks).step_by(panel_blocks) {
        let b1 = (b0 + panel_blocks).min(blocks);
        for j in columns.clone().step_by(cols) {
            let nc = cols.min(columns.end - j);
            let rows = &w[j * k..(j + nc) * k];
            let weights: &[f32] = if W::IS_F32 {
                // Safety: IS_F32 is true only for f32 itself.
                unsafe { std::slice::from_raw_parts(rows.as_ptr() as *const f32, rows.len()) }
            } else {
                widen::<S, W>(rows, &mut widened[..nc * k]);
                &widened[..nc * k]
            };
            for b in (b0..b1).step_by(ROW_BLOCKS) {
                let rb = ROW_BLOCKS.min(b1 - b);
                let xs = &packed[b * k * lanes..(b + rb) * k * lanes];
                let prefetch = prefetch_plan::<W>(rows, nc, b == b0);
                outer_tile::<S>(xs, weights, k, rb, nc, prefetch, &mut tile);
                scatter(&tile, out, shape, b * lanes, j, rb * lanes, nc, lanes);
            }
        }
    }
}

/// What a tile asks the memory system for while it multiplies.
#[derive(Clone, Copy)]
struct Prefetch {
    /// Memory to walk linearly, `bytes` per step of `LINE_FLOATS` positions along `k`,
    /// from `from`: where the weights come from memory.
    linear: Option<(*const u8, usize)>,
    /// The tile's weight rows themselves, `ROW_PREFETCH_AHEAD` down each: where they
    /// sit widened in L2.
    rows: bool,
}

/// f32 weights stream from memory: walk them `PREFETCH_AHEAD` ahead, into the next
/// group. Widened weights sit in L2 (prefetched down each row); on the first row
/// blocks of a panel, the next group's half-precision source is walked too, at the pace
/// that brings it all in by the end of this tile, so `widen` finds it in cache.
fn prefetch_plan<W: Elem>(rows: &[W], nc: usize, first_blocks: bool) -> Prefetch {
    let bytes_per_step = nc * LINE_FLOATS * std::mem::size_of::<W>();
    if W::IS_F32 {
        let from = rows.as_ptr().wrapping_add(PREFETCH_AHEAD) as *const u8;
        return Prefetch { linear: Some((from, bytes_per_step)), rows: false };
    }
    let next_group = rows.as_ptr().wrapping_add(rows.len()) as *const u8;
    Prefetch { linear: first_blocks.then_some((next_group, bytes_per_step)), rows: true }
}

/// Widens a group of weight rows (which the previous tile prefetched).
fn widen<S: Simd, W: Elem>(src: &[W], dst: &mut [f32]) {
    let full = src.len() / S::LANES * S::LANES;
    // Safety: every vector load and store lies below `full` <= both lengths.
    unsafe {
        for p in (0..full).step_by(S::LANES) {
            S::store(dst.as_mut_ptr().add(p), W::load::<S>(src.as_ptr().add(p)));
        }
    }
    for p in full..src.len() {
        dst[p] = src[p].to_f32();
    }
}

/// Writes a tile (`[row block][col][lane]`) into `y`, skipping the zero rows past `m`.
#[allow(clippy::too_many_arguments)]
fn scatter(tile: &[f32], out: &SharedOut, shape: Shape, row0: usize, j: usize, rows: usize, nc: usize, lanes: usize) {
    let cols = tile.len() / (ROW_BLOCKS * lanes);
    for r in 0..rows.min(shape.m - row0) {
        let (block, lane) = (r / lanes, r % lanes);
        for c in 0..nc {
            // Safety: row0 + r < m and j + c lies in this task's columns, which no other
            // task writes.
            unsafe { *out.0.add((row0 + r) * shape.n + j + c) = tile[(block * cols + c) * lanes + lane] };
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn outer_tile<S: Simd>(xs: &[f32], w: &[f32], k: usize, rb: usize, nc: usize, prefetch: Prefetch, tile: &mut [f32]) {
    macro_rules! dispatch {
        ($($c:literal)*) => {
            match (rb, nc) {
                $((2, $c) => micro::<S, 2, $c>(xs, w, k, prefetch, tile),
                  (1, $c) => micro::<S, 1, $c>(xs, w, k, prefetch, tile),)*
                _ => unreachable!("tiles are at most ROW_BLOCKS × WIDE_COLS"),
            }
        };
    }
    dispatch!(1 2 3 4 5 6 7 8 9 10 11 12);
}

/// `RB` blocks of rows × `C` weight rows over all of `k`, accumulated in `RB · C`
/// vector registers; the result goes to `tile` as `[block][col][lane]`.
#[inline(always)]
fn micro<S: Simd, const RB: usize, const C: usize>(
    xs: &[f32],
    w: &[f32],
    k: usize,
    prefetch: Prefetch,
    tile: &mut [f32],
) {
    let lanes = S::LANES;
    let cols = tile.len() / (ROW_BLOCKS * lanes);
    assert!(xs.len() >= RB * k * lanes && w.len() >= C * k && RB <= ROW_BLOCKS && C <= cols);
    let ws: [*const f32; C] = std::array::from_fn(|c| w[c * k..].as_ptr());
    // Safety: the assert above bounds every x load (block < RB, p < k), weight read
    // (c < C, p < k) and tile store; prefetches may point past the end, which is allowed.
    unsafe {
        let mut acc = [[S::zero(); C]; RB];
        let mut p0 = 0;
        while p0 < k {
            if let Some((from, bytes)) = prefetch.linear {
                S::prefetch_bytes(from.wrapping_add(p0 / LINE_FLOATS * bytes), bytes);
            }
            if prefetch.rows {
                for wc in &ws {
                    S::prefetch(wc.wrapping_add(p0 + ROW_PREFETCH_AHEAD) as *const u8);
                }
            }
            let p1 = (p0 + LINE_FLOATS).min(k);
            for p in p0..p1 {
                let xv: [S::V; RB] = std::array::from_fn(|b| S::load(xs.as_ptr().add((b * k + p) * lanes)));
                for c in 0..C {
                    let wv = S::splat(*ws[c].add(p));
                    for b in 0..RB {
                        acc[b][c] = S::fma(xv[b], wv, acc[b][c]);
                    }
                }
            }
            p0 = p1;
        }
        for b in 0..RB {
            for c in 0..C {
                S::store(tile.as_mut_ptr().add((b * cols + c) * lanes), acc[b][c]);
            }
        }
    }
}
