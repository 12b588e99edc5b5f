//! `y = x · Wᵀ` for any number of rows of `x` (decode steps, prefill chunks): `x` in
//! f32, `W` in f32, f16 or bf16, stored as [`Panels`] of 16 rows each. Half-precision
//! weights are widened to f32 in registers (F16C or AVX-512 conversions), so a half-size
//! model streams half the bytes; sums stay f32.
//!
//! Every row count uses one scheme: a micro-kernel broadcasts one value of each of up to
//! [`rows_per_tile`] rows of `x` against the 16 weights of a panel at that position of
//! `k`, into 16-wide accumulators (one or two rows take several panels side by side, the
//! same way). Every output is therefore one chain of fused multiply-adds from zero in the
//! order of `k`, whatever rows it shares a step with: a row's result
//! is bit-equal alone, in a decode batch of 3 or in a prefill chunk of 2,000 rows, on
//! every kernel path. That is what makes `n` choices equal their `n = 1` runs, and a
//! request's output independent of the traffic around it.
//!
//! candle's GEMM packs both operands on every call; here the weights are packed once at
//! load, each thread streams its own panels exactly once per block of rows, and `x` is
//! read where it lies: a tile's rows are separate streams, one value of each per
//! position. (Regrouping `x` into tiles first, `[k][rows]`, cost more than it saved:
//! a `small` f16 prompt of 128 tokens took 0.97-0.98 of the time without it, paired in
//! one process by `examples/decode_bench`; a 2048 × 1536 × 512 product in
//! `examples/matmul_bench` went from 35.9 to 27.1 ms, run after run.)

use rayon::prelude::*;

use super::simd::{with_active_simd, Elem, Simd};

/// Rows of `W` per panel: two AVX2 vectors, one AVX-512 vector.
pub const PANEL: usize = 16;
/// Parallel tasks per thread: several balance uneven progress.
const TASKS_PER_THREAD: usize = 4;
/// Positions of `k` per slice when several tiles share a panel: the slice (16 KiB in f32)
/// sits in L1 while every tile of a block of rows meets it (a whole panel, 64-256 KiB,
/// would be read from L2 by each: 32-256 rows ran at ~100 against ~160 GFLOP/s).
const DEPTH_BLOCK: usize = 256;
/// Floats of `x` per block of rows in the sliced order (192 KiB): it stays in L2 while
/// every panel of a task passes over it, so `W` is read once per block.
const ROW_BLOCK_FLOATS: usize = 48 * 1024;
/// Positions of `k` per round of prefetches.
const CHUNK: usize = 16;
/// How far ahead (in bytes) a tile that streams a panel from memory prefetches it.
const STREAM_AHEAD_BYTES: usize = 4096;

/// A `(n, k)` matrix stored as panels: panel `j` holds rows `16j..16j + 16` laid out
/// `[k][16]`, so the 16 weights of one position of `k` lie together. Rows past `n` are
/// zero. [`PanelMatrix`](super::panels::PanelMatrix) owns one.
#[derive(Debug, Clone, Copy)]
pub struct Panels<'a, W> {
    data: &'a [W],
    n: usize,
    k: usize,
}

impl<'a, W: Copy> Panels<'a, W> {
    /// `data` in the panel layout of a `(n, k)` matrix ([`panel_len`] elements).
    pub fn new(data: &'a [W], n: usize, k: usize) -> Self {
        assert_eq!(data.len(), panel_len(n, k), "({n}, {k}) panels");
        Panels { data, n, k }
    }

    pub fn rows(&self) -> usize {
        self.n
    }

    pub fn cols(&self) -> usize {
        self.k
    }

    fn panel(&self, j: usize) -> &'a [W] {
        &self.data[j * self.k * PANEL..(j + 1) * self.k * PANEL]
    }

    /// Element `(row, col)`.
    pub fn at(&self, row: usize, col: usize) -> W {
        self.data[(row / PANEL * self.k + col) * PANEL + row % PANEL]
    }
}

/// Elements of a `(n, k)` matrix in the panel layout, padding included.
pub fn panel_len(n: usize, k: usize) -> usize {
    n.div_ceil(PANEL) * k * PANEL
}

/// Writes the row-major `(n, k)` matrix `rows` into `dst` in the panel layout; the
/// padding rows of `dst` are left as they are (zero, for a fresh buffer).
pub fn pack_panels<W: Copy + Send + Sync>(rows: &[W], n: usize, k: usize, dst: &mut [W]) {
    assert_eq!(rows.len(), n * k);
    assert_eq!(dst.len(), panel_len(n, k));
    if k == 0 {
        return;
    }
    dst.par_chunks_mut(k * PANEL).enumerate().for_each(|(j, panel)| {
        for lane in 0..PANEL.min(n - j * PANEL) {
            let row = &rows[(j * PANEL + lane) * k..][..k];
            for (p, v) in row.iter().enumerate() {
                panel[p * PANEL + lane] = *v;
            }
        }
    });
}

/// `y[m][n] = Σ_k x[m][k] · w[n][k]` with `x: (m, k)` and `y: (m, n)` row-major. Runs on
/// the active [`KernelPath`](super::simd::KernelPath).
pub fn matmul_xwt<W: Elem>(x: &[f32], w: Panels<W>, y: &mut [f32], m: usize) {
    with_active_simd!(S => matmul_xwt_on::<S, W>(x, w, y, m))
}

/// [`matmul_xwt`] into a new vector. The kernel writes every output, so the vector is
/// never zeroed first (zeroing the outputs of a 512-token prefill was ~3% of it).
pub fn matmul_xwt_to_vec<W: Elem>(x: &[f32], w: Panels<W>, m: usize) -> Vec<f32> {
    // Safety: `write_xwt` writes each of the `m · n` floats.
    unsafe { written_whole(m * w.n, |y| with_active_simd!(S => write_xwt::<S, W>(x, w, y, m))) }
}

/// A new vector of `len` floats that `write` fills through a raw pointer, never zeroed
/// first.
///
/// # Safety
/// `write` writes every one of the `len` floats at the pointer it is given.
pub(crate) unsafe fn written_whole(len: usize, write: impl FnOnce(*mut f32)) -> Vec<f32> {
    let mut out = Vec::with_capacity(len);
    write(out.as_mut_ptr());
    // Safety: the room was reserved above, and `write` initialized it (the caller's promise).
    unsafe { out.set_len(len) };
    out
}

/// [`matmul_xwt`] on the instruction set `S`.
pub fn matmul_xwt_on<S: Simd, W: Elem>(x: &[f32], w: Panels<W>, y: &mut [f32], m: usize) {
    assert_eq!(y.len(), m * w.n);
    // Safety: `y` holds `m · n` floats.
    unsafe { write_xwt::<S, W>(x, w, y.as_mut_ptr(), m) }
}

/// Writes all `m · n` outputs to `y` (read back only after being written: a later slice
/// of `k` continues the sums of the first).
///
/// # Safety
/// `y` is valid for writes of `m · n` floats, and nothing else accesses them meanwhile.
unsafe fn write_xwt<S: Simd, W: Elem>(x: &[f32], w: Panels<W>, y: *mut f32, m: usize) {
    let (n, k) = (w.n, w.k);
    assert_eq!(x.len(), m * k);
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        // Safety: the caller vouches for m · n floats at y.
        unsafe { std::ptr::write_bytes(y, 0, m * n) };
        return;
    }
    let plan = Plan::new::<S>(m, k, n);
    // A last panel that is partly padding writes a padded copy of y.
    let mut padded = if plan.width == n { Vec::new() } else { vec![0f32; m * plan.width] };
    let out = SharedOut(if plan.width == n { y } else { padded.as_mut_ptr() });
    let panels = n.div_ceil(PANEL);
    let threads = rayon::current_num_threads().max(1);
    let per_task = panels.div_ceil(threads * TASKS_PER_THREAD).max(1);
    (0..panels.div_ceil(per_task)).into_par_iter().for_each(|task| {
        let first = task * per_task;
        compute_panels::<S, W>(&x, w, &out, &plan, first..(first + per_task).min(panels));
    });
    if plan.width != n {
        for (r, src) in padded.chunks_exact(plan.width).enumerate() {
            // Safety: row r of y is n floats inside the caller's m · n.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), y.add(r * n), n) };
        }
    }
}

/// An output buffer shared by parallel tasks that each write their own disjoint part
/// (matmul: panels of columns; attention: (token, head) ranges).
pub(crate) struct SharedOut(pub(crate) *mut f32);
// SAFETY: the tasks that share it write disjoint elements, and the buffer outlives them.
unsafe impl Sync for SharedOut {}

impl SharedOut {
    /// The buffer (a method, so closures capture the whole `SharedOut`, not its pointer).
    pub(crate) fn ptr(&self) -> *mut f32 {
        self.0
    }
}

/// How one call walks `x` and `W`.
#[derive(Clone, Copy)]
struct Plan {
    m: usize,
    k: usize,
    /// Columns of the (possibly padded) output: whole panels.
    width: usize,
    /// Rows of `x` per micro-kernel.
    tile_rows: usize,
    /// Positions of `k` per slice.
    depth: usize,
    /// Rows of `x` per block (a multiple of `tile_rows`).
    block_rows: usize,
}

impl Plan {
    /// Up to two tiles of rows (decode batches) stream each panel whole: one pass over
    /// `W`, in memory order, and y written once (sliced, a `medium` f16 step at 8 rows
    /// took 2× as long: the LM head's 4.8 MB of y went back and forth per slice, and
    /// its panels were walked 4 times). More rows slice `k` and block the rows.
    fn new<S: Simd>(m: usize, k: usize, n: usize) -> Plan {
        let tile_rows = rows_per_tile::<S>();
        let width = n.div_ceil(PANEL) * PANEL;
        if m <= 2 * tile_rows {
            return Plan { m, k, width, tile_rows, depth: k, block_rows: m };
        }
        let depth = DEPTH_BLOCK.min(k);
        let block_rows = (ROW_BLOCK_FLOATS / depth / tile_rows).max(1) * tile_rows;
        Plan { m, k, width, tile_rows, depth, block_rows }
    }
}

/// Rows of `x` per micro-kernel: their accumulators (a panel's vectors per row), a
/// panel's weights and a broadcast must fit the register file.
const fn rows_per_tile<S: Simd>() -> usize {
    let per_row = PANEL / S::LANES;
    let rows = (S::REGISTERS - per_row - 2) / per_row;
    if rows > MAX_TILE_ROWS {
        MAX_TILE_ROWS
    } else {
        rows
    }
}

/// The most rows a micro-kernel takes (32 registers, one vector per panel).
const MAX_TILE_ROWS: usize = 12;

/// The tiles of rows `rows`: as few as `tile_rows` allows, of near-equal heights (32
/// rows at 6 per tile are 6, 6, 5, 5, 5, 5, not five 6s and a 2), as `(first row, rows)`.
fn tiles(rows: std::ops::Range<usize>, tile_rows: usize) -> impl Iterator<Item = (usize, usize)> {
    let count = rows.len().div_ceil(tile_rows).max(1);
    let (base, taller) = (rows.len() / count, rows.len() % count);
    (0..count).scan(rows.start, move |start, t| {
        let height = base + usize::from(t < taller);
        let tile = (*start, height);
        *start += height;
        Some(tile)
    })
}

/// Every output of panels `panels`: block of rows by block, and within a block panel by
/// panel, slice of `k` by slice. `W` is then read in memory order, once per block, and a
/// panel's outputs for the block (at most 12 KiB) stay in L1 across its slices (sliced
/// first, the LM head's y at 32 rows, 19 MB, went to memory and back once per slice: a
/// `medium` stack of matmuls at 32 and 128 rows took 0.88-0.92 of the time this way,
/// paired in one process by `examples/matmul_bench`).
///
/// Half-precision weights are widened in each tile's registers, not once per slice into
/// a buffer the tiles share: paired the same way, the `medium` f16 stack took 0.90 of
/// the time at 32 rows and 0.96 at 128, and the `small` one 0.98-0.99 at 512 and 2048.
fn compute_panels<S: Simd, W: Elem>(
    x: &[f32],
    w: Panels<W>,
    out: &SharedOut,
    plan: &Plan,
    panels: std::ops::Range<usize>,
) {
    let Plan { m, k, depth, block_rows, .. } = *plan;
    if m <= GROUP_ROWS && depth == k {
        return stream_panel_groups::<S, W>(x, w, out, plan, panels);
    }
    for r0 in (0..m).step_by(block_rows) {
        let rows = r0..(r0 + block_rows).min(m);
        for j in panels.clone() {
            for p0 in (0..k).step_by(depth) {
                let p1 = (p0 + depth).min(k);
                let slice = &w.panel(j)[p0 * PANEL..p1 * PANEL];
                // The next slice in memory: this panel's next, or the next panel's first.
                let next = slice.as_ptr_range().end as *const u8;
                row_tiles::<S, W>(x, slice, plan, rows.clone(), Spot { p0, p1, j, next }, out);
            }
        }
    }
}

/// The most rows [`stream_panel_groups`] takes.
const GROUP_ROWS: usize = 2;

/// Panels side by side per micro-kernel for one row (two rows take half as many).
const GROUP: usize = 4;

/// One or two rows against panels `panels`, [`GROUP`] (or `GROUP / 2`) panels at a time:
/// one row against one panel is two chains of fused multiply-adds, each waiting on its
/// last (4 cycles); side by side, the panels' chains overlap. Each output is still one
/// chain over k in order. (Paired in one process by `examples/matmul_bench`, a `medium`
/// stack at 1-2 rows took a median 0.86-0.97 of the time of one panel at a time.)
///
/// The panels stream in memory order and the hardware prefetcher follows them alone:
/// a software prefetch per cache line made batch-1 steps slower (paired in one process
/// by `examples/decode_bench`, steps alternately with and without it: without took
/// 0.82-0.86 of the time at one row on `small`/`medium` f32 and f16, 0.83-0.96 at two).
fn stream_panel_groups<S: Simd, W: Elem>(
    x: &[f32],
    w: Panels<W>,
    out: &SharedOut,
    plan: &Plan,
    panels: std::ops::Range<usize>,
) {
    let group = if plan.m == 1 { GROUP } else { GROUP / 2 };
    let (k, end) = (plan.k, panels.end);
    for j in panels.step_by(group) {
        let count = group.min(end - j);
        let ws = &w.data[j * k * PANEL..(j + count) * k * PANEL];
        // Safety: panels j..j + count lie inside the output's width, written by this task alone.
        let y = unsafe { out.0.add(j * PANEL) };
        let at = TileAt {
            xs: x,
            x_stride: k,
            positions: k,
            ws,
            panel_stride: k * PANEL,
            y,
            y_stride: plan.width,
            accumulate: false,
            prefetch: Prefetch::NONE,
        };
        macro_rules! dispatch {
            ($(($r:literal, $g:literal))*) => {
                match (plan.m, count) {
                    $(($r, $g) => micro::<S, W, $r, $g>(at),)*
                    _ => unreachable!("one or two rows, at most GROUP panels"),
                }
            };
        }
        dispatch!((1, 1)(1, 2)(1, 3)(1, 4)(2, 1)(2, 2));
    }
}

/// Where a group of tiles works: positions `p0..p1` of `k`, panel `j`.
#[derive(Clone, Copy)]
struct Spot {
    p0: usize,
    p1: usize,
    j: usize,
    /// The slice the tiles' prefetches bring in: the next one the task walks.
    next: *const u8,
}

/// What a micro-kernel asks the memory system for as it goes: from `from`, `step` bytes
/// further per position of `k`.
#[derive(Clone, Copy)]
struct Prefetch {
    from: *const u8,
    step: usize,
}

impl Prefetch {
    /// No prefetches: the hardware's own suffice.
    const NONE: Prefetch = Prefetch { from: std::ptr::null(), step: 0 };
}

/// The tiles of rows `rows` against one panel slice. The next slice the task walks (in
/// memory order: the panel's next slice, or the next panel's first) is brought in while
/// they work, a share of it per tile, so the memory stream never pauses while tiles
/// reuse the slice from cache; a lone tile (a few rows) walks its own panel
/// [`STREAM_AHEAD_BYTES`] ahead instead, which reaches the next panel in time.
fn row_tiles<S: Simd, W: Elem>(
    x: &[f32],
    slice: &[W],
    plan: &Plan,
    rows: std::ops::Range<usize>,
    spot: Spot,
    out: &SharedOut,
) {
    let Spot { p0, p1, j, next } = spot;
    let k = plan.k;
    let count = rows.len().div_ceil(plan.tile_rows);
    // Bytes of the slice per position.
    let step = PANEL * std::mem::size_of::<W>();
    for (t, (r, h)) in tiles(rows, plan.tile_rows).enumerate() {
        let prefetch = if count == 1 {
            let from = (slice.as_ptr() as *const u8).wrapping_add(STREAM_AHEAD_BYTES);
            Prefetch { from, step }
        } else {
            // Tile t walks its share of the next slice, at 1/count of the pace.
            let share = std::mem::size_of_val(slice) / count;
            Prefetch { from: next.wrapping_add(t * share), step: step.div_ceil(count) }
        };
        let xs = &x[r * k + p0..(r + h - 1) * k + p1];
        // Safety: rows r..r + h and the 16 columns of panel j lie inside the m × width
        // output, and no other task writes panel j.
        let y = unsafe { out.0.add(r * plan.width + j * PANEL) };
        let tile_at = TileAt {
            xs,
            x_stride: k,
            positions: p1 - p0,
            ws: slice,
            panel_stride: slice.len(),
            y,
            y_stride: plan.width,
            accumulate: p0 > 0,
            prefetch,
        };
        dispatch_tile::<S, W>(h, tile_at);
    }
}

/// One micro-kernel's operands.
#[derive(Clone, Copy)]
struct TileAt<'a, V> {
    /// The tile's rows of `x` from its first position on, `x_stride` apart.
    xs: &'a [f32],
    x_stride: usize,
    /// Positions of `k` the kernel walks.
    positions: usize,
    /// The kernel's panel slices, `[positions][16]` each, `panel_stride` elements apart.
    ws: &'a [V],
    panel_stride: usize,
    /// The tile's first output; rows `y_stride` apart.
    y: *mut f32,
    y_stride: usize,
    /// Continue the sums already in `y` (a later slice of `k`) instead of starting at 0.
    accumulate: bool,
    prefetch: Prefetch,
}

fn dispatch_tile<S: Simd, V: Elem>(rows: usize, at: TileAt<V>) {
    macro_rules! dispatch {
        ($($r:literal)*) => {
            match rows {
                $($r => micro::<S, V, $r, 1>(at),)*
                _ => unreachable!("tiles are at most MAX_TILE_ROWS rows"),
            }
        };
    }
    dispatch!(1 2 3 4 5 6 7 8 9 10 11 12);
}

/// `R` rows × `G` panels over the slices' positions, in `R · G · PANEL / LANES` vector
/// accumulators: per position, one fused multiply-add per output, in order. Never
/// inlined: merged into one large caller, LLVM spilled accumulators across the loop
/// (a store and a reload on every position's chain; f16 at one row ran at half speed).
#[inline(never)]
fn micro<S: Simd, V: Elem, const R: usize, const G: usize>(at: TileAt<V>) {
    let per_row = PANEL / S::LANES;
    let (positions, stride) = (at.positions, at.panel_stride);
    assert!(per_row <= 2 && at.xs.len() >= (R - 1) * at.x_stride + positions && positions * PANEL <= stride);
    assert!(at.ws.len() == (G - 1) * stride + positions * PANEL);
    let ws = at.ws.as_ptr();
    let rows: [*const f32; R] = std::array::from_fn(|a| at.xs.as_ptr().wrapping_add(a * at.x_stride));
    // Safety: the assert bounds every x and weight load; the caller vouches for the R
    // rows × G panels of y; prefetches may point anywhere, they never fault.
    unsafe {
        let mut acc = [[[S::zero(); 2]; G]; R];
        if at.accumulate {
            for (a, row) in acc.iter_mut().enumerate() {
                for (g, panel) in row.iter_mut().enumerate() {
                    for (v, lanes) in panel.iter_mut().enumerate().take(per_row) {
                        *lanes = S::load(at.y.add(a * at.y_stride + g * PANEL + v * S::LANES));
                    }
                }
            }
        }
        let Prefetch { from, step } = at.prefetch;
        let mut p0 = 0;
        while p0 < positions {
            let p1 = (p0 + CHUNK).min(positions);
            S::prefetch_bytes(from.wrapping_add(p0 * step), (p1 - p0) * step);
            for p in p0..p1 {
                for g in 0..G {
                    let w: [S::V; 2] = std::array::from_fn(|v| {
                        if v < per_row {
                            V::load::<S>(ws.add(g * stride + p * PANEL + v * S::LANES))
                        } else {
                            S::zero()
                        }
                    });
                    for a in 0..R {
                        let xv = S::splat(*rows[a].add(p));
                        for v in 0..per_row {
                            acc[a][g][v] = S::fma(xv, w[v], acc[a][g][v]);
                        }
                    }
                }
            }
            p0 = p1;
        }
        for (a, row) in acc.iter().enumerate() {
            for (g, panel) in row.iter().enumerate() {
                for (v, lanes) in panel.iter().enumerate().take(per_row) {
                    S::store(at.y.add(a * at.y_stride + g * PANEL + v * S::LANES), *lanes);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::simd::for_each_simd;

    fn reference(x: &[f32], w: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
        let mut y = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                y[i * n + j] = (0..k).map(|p| x[i * k + p] as f64 * w[j * k + p] as f64).sum::<f64>() as f32;
            }
        }
        y
    }

    fn values(len: usize, mul: usize, modulo: usize) -> Vec<f32> {
        (0..len).map(|i| ((i * mul % modulo) as f32 - (modulo / 2) as f32) * 0.1).collect()
    }

    fn panels_of<W: Copy + Send + Sync + Default>(rows: &[W], n: usize, k: usize) -> Vec<W> {
        let mut dst = vec![W::default(); panel_len(n, k)];
        pack_panels(rows, n, k, &mut dst);
        dst
    }

    fn run<S: Simd, W: Elem + Default>(x: &[f32], w: &[W], m: usize, k: usize, n: usize) -> Vec<f32> {
        let packed = panels_of(w, n, k);
        let mut y = vec![f32::NAN; m * n];
        matmul_xwt_on::<S, W>(x, Panels::new(&packed, n, k), &mut y, m);
        y
    }

    /// Every row count 1..=40 (every tile height and its remainders), widths that are not
    /// a multiple of the panel, deep rows cut into slices (several blocks of rows), and
    /// k = 0, for each weight type against the f64 definition over the same (rounded)
    /// weights, on every path.
    #[test]
    fn every_weight_type_matches_the_definition_on_odd_shapes_on_every_path() {
        for_each_simd!(S => { odd_shapes_match::<S>() });
    }

    fn odd_shapes_match<S: Simd>() {
        let small = (1..=40).flat_map(|m| [(m, 19, 7), (m, 33, 10), (m, 44, 16), (m, 70, 75)]);
        let sliced = [(33, 1100, 25), (17, 3000, 13), (200, 1000, 30), (47, 5, 1), (20, 0, 3), (5, 0, 3)];
        for (m, k, n) in small.chain(sliced) {
            let x = values(m * k, 7, 23);
            let w = values(n * k, 5, 19);
            let w16: Vec<half::f16> = w.iter().map(|&v| half::f16::from_f32(v)).collect();
            let wb16: Vec<half::bf16> = w.iter().map(|&v| half::bf16::from_f32(v)).collect();
            let check = |y: &[f32], rounded: Vec<f32>, what: &str| {
                let want = reference(&x, &rounded, m, k, n);
                for (a, b) in y.iter().zip(&want) {
                    assert!((a - b).abs() < 1e-3 * (1.0 + b.abs()), "{what} {m}x{k}x{n}: {a} vs {b}");
                }
            };
            check(&run::<S, _>(&x, &w16, m, k, n), w16.iter().map(|v| v.to_f32()).collect(), "f16");
            check(&run::<S, _>(&x, &wb16, m, k, n), wb16.iter().map(|v| v.to_f32()).collect(), "bf16");
            check(&run::<S, _>(&x, &w, m, k, n), w.clone(), "f32");
        }
    }

    /// The engine's reference property and seeded sampling rest on this: a row of `y` is
    /// bit-equal whichever rows it is batched with, at every row count (whole panels and
    /// sliced depth alike), for every weight type on every path.
    #[test]
    fn rows_are_bit_equal_alone_and_in_any_batch_on_every_path() {
        for_each_simd!(S => {
            rows_alone_match_batched::<S, f32>();
            rows_alone_match_batched::<S, half::f16>();
            rows_alone_match_batched::<S, half::bf16>();
        });
    }

    fn rows_alone_match_batched<S: Simd, W: Elem + Default>() {
        const ROWS: usize = 40;
        // One or two rows stream groups of panels (75 columns: groups of 4 and 1, and of
        // 2), up to 12 whole panels, more take the sliced order.
        for &(k, n) in &[(44usize, 75usize), (512, 33), (1500, 20)] {
            let x = values(ROWS * k, 7, 23);
            let w: Vec<W> = values(n * k, 5, 19).into_iter().map(W::from_f32).collect();
            let alone: Vec<f32> = (0..ROWS).flat_map(|r| run::<S, W>(&x[r * k..(r + 1) * k], &w, 1, k, n)).collect();
            for m in 2..=ROWS {
                let y = run::<S, W>(&x[..m * k], &w, m, k, n);
                let same = y.iter().zip(&alone).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{m} rows, k {k}: a row differs from the same row alone");
            }
        }
    }

    /// The unzeroed vector comes back as the kernel's output into a NaN-filled buffer
    /// (which the definition tests show is fully written), bit for bit.
    #[test]
    fn a_new_output_vector_equals_the_output_written_in_place() {
        for (m, k, n) in [(1, 19, 7), (2, 44, 75), (13, 300, 33), (40, 600, 16), (3, 0, 5)] {
            let x = values(m * k, 7, 23);
            let w: Vec<half::f16> = values(n * k, 5, 19).into_iter().map(half::f16::from_f32).collect();
            let packed = panels_of(&w, n, k);
            let mut in_place = vec![f32::NAN; m * n];
            matmul_xwt(&x, Panels::new(&packed, n, k), &mut in_place, m);
            let new = matmul_xwt_to_vec(&x, Panels::new(&packed, n, k), m);
            assert_eq!(new.len(), m * n);
            assert!(new.iter().zip(&in_place).all(|(a, b)| a.to_bits() == b.to_bits()), "{m}x{k}x{n}");
        }
    }

    #[test]
    fn panels_hold_every_element_where_at_finds_it() {
        let (n, k) = (37, 5);
        let rows: Vec<u32> = (0..(n * k) as u32).collect();
        let packed = panels_of(&rows, n, k);
        let panels = Panels::new(&packed, n, k);
        for r in 0..n {
            for c in 0..k {
                assert_eq!(panels.at(r, c), (r * k + c) as u32);
            }
        }
        // Padding rows (37..48) are zero.
        assert_eq!(packed.iter().filter(|&&v| v == 0).count(), 1 + (48 - n) * k);
    }
}
