//! `y = x · Wᵀ` for few rows of `x` (decode and extend steps): `x` in f32, `W` in f32,
//! f16 or bf16. Half-precision weights are widened to f32 in registers (F16C or
//! AVX-512 conversions), so a half-size model streams half the bytes; sums stay f32.
//!
//! candle's GEMM packs both operands, which pays off for large `x` but leaves batch-1
//! decode well under the memory-bandwidth limit and batch-8 decode at a fraction of
//! the FLOP rate. Here each thread streams its own slice of `W` exactly once and
//! multiplies every row of `x` against it with a register-blocked micro-kernel, so
//! small batches are bandwidth-bound and larger ones run near the FMA rate. From
//! [`PACKED_MIN_ROWS`] rows on, [`matmul_packed`](super::matmul_packed)'s outer-product
//! tile takes over.

use rayon::prelude::*;

use super::matmul_packed::matmul_xwt_packed;
use super::simd::{with_active_simd, Elem, Simd};

/// From this many rows of `x` on, the outer-product kernel over packed rows wins (1.3-1.9×
/// at 32-2,048 rows in `examples/matmul_bench.rs`; below 12 rows its 16-row vectors
/// are mostly padding).
const PACKED_MIN_ROWS: usize = 12;
/// Rows of `x` per micro-kernel.
const MR: usize = 4;
/// Rows of `W` per micro-kernel, at most.
const NR: usize = 4;
/// How far ahead (in floats) a tile prefetches each weight row: one row's tile streams
/// W fastest with a short lead, multi-row tiles (which read each W vector for 4-8
/// rows of x) with a long one (`MATMUL_STACK_ROWS=1,2,4,8 examples/matmul_bench`, a
/// `medium` decode step's matrices: 8 rows 70-78 → 56-57 ms with 4,096 instead of 1,024).
fn prefetch_ahead(w_rows: usize) -> usize {
    if w_rows == 1 {
        1024
    } else {
        4096
    }
}

/// `y[m][n] = Σ_k x[m][k] · w[n][k]` with `x: (m, k)`, `w: (n, k)`, `y: (m, n)`, all
/// row-major and contiguous. Runs on the active [`KernelPath`](super::simd::KernelPath).
pub fn matmul_xwt<W: Elem>(x: &[f32], w: &[W], y: &mut [f32], m: usize, k: usize, n: usize) {
    with_active_simd!(S => matmul_xwt_on::<S, W>(x, w, y, m, k, n))
}

/// [`matmul_xwt`] on the instruction set `S`.
pub fn matmul_xwt_on<S: Simd, W: Elem>(x: &[f32], w: &[W], y: &mut [f32], m: usize, k: usize, n: usize) {
    if m >= PACKED_MIN_ROWS {
        return matmul_xwt_packed::<S, W>(x, w, y, m, k, n);
    }
    assert_eq!(x.len(), m * k);
    assert_eq!(w.len(), n * k);
    assert_eq!(y.len(), m * n);
    let threads = rayon::current_num_threads().max(1);
    // Several tasks per thread balance uneven progress; keep W slices a multiple of NR.
    let per_task = (n.div_ceil(threads * 4)).div_ceil(NR) * NR;
    let per_task = per_task.max(NR);
    let out = SharedOut(y.as_mut_ptr());
    (0..n.div_ceil(per_task)).into_par_iter().for_each(|task| {
        let n0 = task * per_task;
        let n1 = (n0 + per_task).min(n);
        let out = &out;
        compute_columns::<S, W>(x, w, out, m, k, n, n0, n1);
    });
}

/// An output buffer shared by parallel tasks that each write their own disjoint part
/// (matmul: column ranges; attention: (token, head) ranges).
pub(crate) struct SharedOut(pub(crate) *mut f32);
// SAFETY: the tasks that share it write disjoint elements, and the buffer outlives them.
unsafe impl Sync for SharedOut {}

#[allow(clippy::too_many_arguments)]
fn compute_columns<S: Simd, W: Elem>(
    x: &[f32],
    w: &[W],
    out: &SharedOut,
    m: usize,
    k: usize,
    n: usize,
    n0: usize,
    n1: usize,
) {
    // Under PACKED_MIN_ROWS rows, all of x stays in cache while each W row meets it.
    let (x_step, w_step) = tile_shape(m, chains::<S, W>());
    let mut j = n0;
    while j < n1 {
        let nr = w_step.min(n1 - j);
        let mut i = 0;
        while i < m {
            let mr = x_step.min(m - i);
            let mut acc = [[0f32; NR]; MR];
            tile::<S, W>(x, w, k, i, j, mr, nr, &mut acc);
            for (a, row) in acc.iter().enumerate().take(mr) {
                for (b, v) in row.iter().enumerate().take(nr) {
                    // Safety: (i + a, j + b) lies in this task's columns [n0, n1), which
                    // no other task writes, and inside y's m × n bounds.
                    unsafe { *out.0.add((i + a) * n + j + b) = *v };
                }
            }
            i += mr;
        }
        j += nr;
    }
}

/// Rows of `x` and of `W` per tile. With few rows of `x` the kernel is a weight
/// stream, and the memory system serves a single sequential stream best (measured: one
/// row at a time reaches the read bandwidth, four interleaved rows ~75% of it). With
/// more rows, reuse of each loaded vector across a 4 × 4 register block matters more,
/// where the registers allow it. Two chains per dot product leave AVX2 room for 12
/// accumulators: one W row against up to 4 rows of `x`, then 3 × 2, which reads `x`
/// half as often (`MATMUL_STACK_F16=1 MATMUL_STACK_ROWS=8`, `medium`: 98 → 70 ms).
fn tile_shape(x_rows: usize, chains: usize) -> (usize, usize) {
    match (x_rows, chains) {
        (1, _) => (1, 1),
        (2..=4, 2) => (MR, 1),
        (_, 2) => (3, 2),
        (2..=8, _) => (MR, 2),
        _ => (MR, NR),
    }
}

/// Independent FMA chains per dot product. Half-precision weights on 8-lane paths sum
/// the vectors at even and odd positions of `k` apart: one chain there waits on FMA
/// latency at ≈ 4 B/cycle/core, too close to two cores' share of the read bandwidth
/// (`MATMUL_STACK_SMALL=1 MATMUL_STACK_F16=1 MATMUL_STACK_ROWS=1,2`, 8 interleaved
/// runs: 12.8 → 11.0 ms at 1 row, 16.8 → 12.4 at 2). f32 weights and AVX-512's
/// 64-byte vectors outrun memory with one. Every tile shape uses the same chains, so
/// a row's result does not depend on the rows batched with it.
const fn chains<S: Simd, W: Elem>() -> usize {
    if S::LANES == 8 && !W::IS_F32 {
        2
    } else {
        1
    }
}

#[allow(clippy::too_many_arguments)]
#[inline]
fn tile<S: Simd, W: Elem>(
    x: &[f32],
    w: &[W],
    k: usize,
    i: usize,
    j: usize,
    mr: usize,
    nr: usize,
    acc: &mut [[f32; NR]; MR],
) {
    macro_rules! dispatch {
        ($($a:literal $b:literal),*) => {
            match (mr, nr) {
                $(($a, $b) => if chains::<S, W>() == 2 {
                    micro::<$a, $b, 2, S, W>(x, w, k, i, j, acc)
                } else {
                    micro::<$a, $b, 1, S, W>(x, w, k, i, j, acc)
                },)*
                _ => unreachable!("tile sizes are at most MR × NR"),
            }
        };
    }
    dispatch!(4 4, 4 3, 4 2, 4 1, 3 4, 3 3, 3 2, 3 1, 2 4, 2 3, 2 2, 2 1,
        1 4, 1 3, 1 2, 1 1);
}

/// A `R × C` block of dot products, accumulated in `R · C · G` vector registers:
/// vector `v` of `k` goes to chain `v mod G`, the chains are added in order, then the
/// lanes, then the tail under one vector.
#[inline(always)]
fn micro<const R: usize, const C: usize, const G: usize, S: Simd, W: Elem>(
    x: &[f32],
    w: &[W],
    k: usize,
    i: usize,
    j: usize,
    out: &mut [[f32; NR]; MR],
) {
    let xs: [&[f32]; R] = std::array::from_fn(|a| &x[(i + a) * k..(i + a + 1) * k]);
    let ws: [&[W]; C] = std::array::from_fn(|b| &w[(j + b) * k..(j + b + 1) * k]);
    let full = k / S::LANES * S::LANES;
    let ahead = prefetch_ahead(C);
    // One vector of every x row against one vector of every W row, at q, into a chain.
    // Safety (of the calls below): q + LANES <= full <= k, inside rows of length k.
    let step = |chain: &mut [[S::V; C]; R], q: usize| unsafe {
        let wv: [S::V; C] = std::array::from_fn(|b| W::load::<S>(ws[b].as_ptr().add(q)));
        for a in 0..R {
            let xv = S::load(xs[a].as_ptr().add(q));
            for b in 0..C {
                chain[a][b] = S::fma(xv, wv[b], chain[a][b]);
            }
        }
    };
    let mut acc = [[[S::zero(); C]; R]; G];
    let mut p = 0;
    while p + G * S::LANES <= full {
        // The weights stream from memory; ask for the next lines early.
        for b in 0..C {
            S::prefetch(ws[b].as_ptr().wrapping_add(p + ahead) as *const u8);
        }
        for (g, chain) in acc.iter_mut().enumerate() {
            step(chain, p + g * S::LANES);
        }
        p += G * S::LANES;
    }
    // Fewer than G vectors left: they belong to the first chains, in order.
    for (chain, q) in acc.iter_mut().zip((p..full).step_by(S::LANES)) {
        step(chain, q);
    }
    for a in 0..R {
        for b in 0..C {
            let chained = acc[1..].iter().fold(acc[0][a][b], |t, chain| S::add(t, chain[a][b]));
            let mut s = S::sum(chained);
            for q in full..k {
                s += xs[a][q] * ws[b][q].to_f32();
            }
            out[a][b] = s;
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

    /// Every row count 1..=40 (every tile shape of both kernels and their tails), widths
    /// that are not a multiple of the vector width, and, for the packed kernel, several
    /// panels, deep rows and k = 0, for each weight type against the f64 definition over
    /// the same (rounded) weights.
    #[test]
    fn half_precision_weights_match_the_definition_on_odd_shapes_on_every_path() {
        for_each_simd!(S => { odd_shapes_match::<S>() });
    }

    fn odd_shapes_match<S: Simd>() {
        // k = 44: an odd number of 8-lane vectors, so one chain takes a vector more.
        let small = (1..=40).flat_map(|m| [(m, 19, 7), (m, 33, 10), (m, 44, 6), (m, 70, 5)]);
        let packed = [(33, 70, 25), (17, 3000, 13), (200, 1000, 30), (47, 5, 1), (20, 0, 3), (5, 0, 3)];
        for (m, k, n) in small.chain(packed) {
            let x: Vec<f32> = (0..m * k).map(|i| ((i * 7 % 23) as f32 - 11.0) * 0.1).collect();
            let w: Vec<f32> = (0..n * k).map(|i| ((i * 5 % 19) as f32 - 9.0) * 0.1).collect();
            let w16: Vec<half::f16> = w.iter().map(|&v| half::f16::from_f32(v)).collect();
            let wb16: Vec<half::bf16> = w.iter().map(|&v| half::bf16::from_f32(v)).collect();
            let check = |y: &[f32], rounded: Vec<f32>, what: &str| {
                let want = reference(&x, &rounded, m, k, n);
                for (a, b) in y.iter().zip(&want) {
                    assert!((a - b).abs() < 1e-3, "{what} {m}x{k}x{n}: {a} vs {b}");
                }
            };
            let mut y = vec![f32::NAN; m * n];
            matmul_xwt_on::<S, _>(&x, &w16, &mut y, m, k, n);
            check(&y, w16.iter().map(|v| v.to_f32()).collect(), "f16");
            matmul_xwt_on::<S, _>(&x, &wb16, &mut y, m, k, n);
            check(&y, wb16.iter().map(|v| v.to_f32()).collect(), "bf16");
            matmul_xwt_on::<S, _>(&x, &w, &mut y, m, k, n);
            check(&y, w.clone(), "f32");
        }
    }

    /// The engine's reference property rests on this: under [`PACKED_MIN_ROWS`] rows,
    /// a row of `y` is bit-equal whichever rows it is batched with (every tile shape
    /// sums in the same order), for every weight type on every path.
    #[test]
    fn few_rows_are_bit_equal_alone_and_in_a_batch_on_every_path() {
        for_each_simd!(S => {
            rows_alone_match_batched::<S, f32>();
            rows_alone_match_batched::<S, half::f16>();
            rows_alone_match_batched::<S, half::bf16>();
        });
    }

    fn rows_alone_match_batched<S: Simd, W: Elem>() {
        for &(k, n) in &[(44usize, 9usize), (512, 13), (1000, 7)] {
            let x: Vec<f32> = (0..11 * k).map(|i| ((i * 7 % 23) as f32 - 11.0) * 0.1).collect();
            let w: Vec<W> = (0..n * k).map(|i| W::from_f32(((i * 5 % 19) as f32 - 9.0) * 0.1)).collect();
            let mut alone = vec![0f32; 11 * n];
            for r in 0..11 {
                matmul_xwt_on::<S, W>(&x[r * k..(r + 1) * k], &w, &mut alone[r * n..(r + 1) * n], 1, k, n);
            }
            for m in 2..PACKED_MIN_ROWS {
                let mut y = vec![f32::NAN; m * n];
                matmul_xwt_on::<S, W>(&x[..m * k], &w, &mut y, m, k, n);
                let same = y.iter().zip(&alone).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{m} rows, k {k}: a row differs from the same row alone");
            }
        }
    }

    #[test]
    fn matches_the_definition_on_ragged_shapes() {
        // The last two: the packed kernel over deep rows, several panels of x.
        for &(m, k, n) in &[
            (1, 16, 4),
            (3, 37, 9),
            (5, 64, 131),
            (8, 100, 33),
            (13, 17, 7),
            (33, 48, 65),
            (45, 3000, 9),
            (130, 2100, 5),
        ] {
            let x: Vec<f32> = (0..m * k).map(|i| ((i * 7 % 23) as f32 - 11.0) * 0.1).collect();
            let w: Vec<f32> = (0..n * k).map(|i| ((i * 5 % 19) as f32 - 9.0) * 0.1).collect();
            let mut y = vec![f32::NAN; m * n];
            matmul_xwt(&x, &w, &mut y, m, k, n);
            let want = reference(&x, &w, m, k, n);
            for (a, b) in y.iter().zip(&want) {
                assert!((a - b).abs() < 1e-3, "{m}x{k}x{n}: {a} vs {b}");
            }
        }
    }
}
