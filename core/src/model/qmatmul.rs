//! `y = x · Wᵀ` with `W` in GGUF's Q4_1 or Q8_0 blocks, read in place from a `QTensor`.
//!
//! candle 0.11 multiplies Q4_1 with its scalar reference loop, re-reads every weight
//! block once per input row, and runs on its own worker pool rather than the model's
//! rayon pool. Here the input rows are quantized once per call to 8-bit blocks (a scale
//! per 32 values, plus the block's sum for Q4_1's offset term), weight blocks are dotted
//! against them with integer SIMD, each decoded weight block is used for up to
//! [`R_MAX`] input rows while it sits in registers ([`TILE_ROWS`] with AVX-512 VNNI, in
//! `qmatmul_avx512.rs`), and the work is split over the
//! current rayon pool, so a model's own pool runs its matmuls: by weight rows at a few
//! input rows (decode), by runs of input rows at many (a prompt), where each task's
//! activations stay in cache and its outputs land in place.
//!
//! Error against the f32 product comes from quantizing the activations to 8 bits, as in
//! ggml; the SIMD and scalar paths compute the same integer sums and differ only in the
//! order of f32 additions. The SIMD paths (AVX2, AVX-VNNI, AVX-512 VNNI) add in the same
//! order, so a row's result is bit for bit the same on any of them and in any batch.

use candle_core::quantized::GgmlDType;
use half::f16;
use rayon::prelude::*;

use super::error::{ModelError, Result};
#[cfg(target_arch = "x86_64")]
use super::simd::KernelPath;

/// Values per block, for both weight formats and the quantized activations.
const QK: usize = 32;
/// Input rows that share one decoded weight block.
const R_MAX: usize = 4;
/// Weight rows per micro-kernel at several input rows.
const C_MAX: usize = 2;
/// Input rows a tile may hold: the AVX-512 kernel takes two groups of [`R_MAX`] at
/// once (its 32 registers hold twice the accumulators, and each decoded weight block
/// then serves twice the rows).
const TILE_ROWS: usize = 2 * R_MAX;
/// One tile's outputs, `[input row][weight row]`.
type Tile = [[f32; C_MAX]; TILE_ROWS];
/// Input rows per pass over the weights (a multiple of [`TILE_ROWS`]): 64 rows of 8-bit
/// activations at the widest matrix (1,536 or more columns) still sit in L2.
const ROW_CHUNK: usize = 16;
/// Weight rows the batch-1 kernel streams side by side (independent chains to hide the
/// latency of each block's loads); tasks split the rows in whole groups.
const ROW_GROUP: usize = 4;

/// The weight block formats this kernel multiplies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `d: f16, m: f16, 16 bytes of nibbles`: value `d·q + m`, `q` in 0..16; byte `j`
    /// holds value `j` in its low nibble and value `j + 16` in its high one.
    Q4_1,
    /// `d: f16, 32 × i8`: value `d·q`.
    Q8_0,
}

impl Format {
    pub fn of(dtype: GgmlDType) -> Option<Format> {
        match dtype {
            GgmlDType::Q4_1 => Some(Format::Q4_1),
            GgmlDType::Q8_0 => Some(Format::Q8_0),
            _ => None,
        }
    }

    fn block_bytes(self) -> usize {
        match self {
            Format::Q4_1 => 4 + QK / 2,
            Format::Q8_0 => 2 + QK,
        }
    }
}

/// Which dot-product code runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kernel {
    Scalar,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// AVX2 with AVX-VNNI's byte dot product (`vpdpbusd`) in the batch-1 path.
    #[cfg(target_arch = "x86_64")]
    AvxVnni,
    /// AVX-512 VNNI in the tiled path (two weight rows per register); the batch-1 path
    /// is AVX-VNNI's where the CPU has it (`avx_vnni`), else AVX2's.
    #[cfg(target_arch = "x86_64")]
    Avx512Vnni {
        avx_vnni: bool,
    },
}

impl Kernel {
    /// Input rows per tile: a multiple of [`R_MAX`], at most [`TILE_ROWS`].
    fn tile_rows(self) -> usize {
        match self {
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512Vnni { .. } => TILE_ROWS,
            _ => R_MAX,
        }
    }

    /// The widest kernel the CPU runs within the process's [`KernelPath`]
    /// (`TOKENROUTER_KERNEL=avx2` keeps AVX-512 out, `portable` takes the scalar one).
    fn best() -> Kernel {
        #[cfg(target_arch = "x86_64")]
        {
            let path = KernelPath::active();
            let avx2 =
                is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c");
            if path != KernelPath::Portable && avx2 {
                let avx_vnni = is_x86_feature_detected!("avxvnni");
                let avx512_vnni = path == KernelPath::Avx512
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vnni");
                return match (avx512_vnni, avx_vnni) {
                    (true, _) => Kernel::Avx512Vnni { avx_vnni },
                    (false, true) => Kernel::AvxVnni,
                    (false, false) => Kernel::Avx2,
                };
            }
        }
        Kernel::Scalar
    }
}

/// Rows of `x` quantized to 8 bits per block of [`QK`]: `x ≈ d · q`, with `s = d · Σq`
/// per block (what Q4_1's offset `m` multiplies).
struct QuantizedRows {
    qs: Vec<i8>,
    d: Vec<f32>,
    s: Vec<f32>,
    /// `d` and `s` again, block-major within each group of [`R_MAX`] rows
    /// (`[group][block][row in group]`, zero past the last row), so that a tile reads one
    /// block's scales for all its rows with one vector load.
    d_by_block: Vec<f32>,
    s_by_block: Vec<f32>,
    cols: usize,
}

impl QuantizedRows {
    fn new(kernel: Kernel, x: &[f32], cols: usize) -> QuantizedRows {
        let blocks = x.len() / QK;
        let mut rows = QuantizedRows {
            qs: vec![0; x.len()],
            d: vec![0.0; blocks],
            s: vec![0.0; blocks],
            d_by_block: Vec::new(),
            s_by_block: Vec::new(),
            cols,
        };
        let parts = x.chunks_exact(QK).zip(rows.qs.chunks_exact_mut(QK)).zip(rows.d.iter_mut().zip(&mut rows.s));
        for ((values, qs), (d, s)) in parts {
            // Per element this costs as much as a few hundred integer MACs of the dot
            // products do, so at prefill a scalar version took ~15% of the time.
            let (scale, sum) = match kernel {
                Kernel::Scalar => quantize_block(values, qs),
                // SAFETY: both are only chosen after detecting AVX2 and FMA.
                #[cfg(target_arch = "x86_64")]
                Kernel::Avx2 | Kernel::AvxVnni | Kernel::Avx512Vnni { .. } => unsafe {
                    avx2::quantize_block(values, qs)
                },
            };
            // Kept at f16 precision, as ggml stores them.
            *d = f16::from_f32(scale).to_f32();
            *s = f16::from_f32(scale * sum as f32).to_f32();
        }
        if x.len() > cols {
            rows.d_by_block = by_block_in_groups(&rows.d, cols / QK);
            rows.s_by_block = by_block_in_groups(&rows.s, cols / QK);
        }
        rows
    }

    fn row_qs(&self, row: usize) -> &[i8] {
        &self.qs[row * self.cols..(row + 1) * self.cols]
    }

    fn row_d(&self, row: usize) -> &[f32] {
        let blocks = self.cols / QK;
        &self.d[row * blocks..(row + 1) * blocks]
    }

    fn row_s(&self, row: usize) -> &[f32] {
        let blocks = self.cols / QK;
        &self.s[row * blocks..(row + 1) * blocks]
    }

    /// The group-major `d` and `s` of the [`R_MAX`] rows from `row` (a multiple of it).
    fn group_scales(&self, row: usize) -> (&[f32], &[f32]) {
        let len = self.cols / QK * R_MAX;
        let at = row / R_MAX * len;
        (&self.d_by_block[at..at + len], &self.s_by_block[at..at + len])
    }
}

/// Per-row, per-block values (`rows × blocks`) regrouped as `[group][block][row in group]`
/// for groups of [`R_MAX`] rows, the last group padded with zeros.
fn by_block_in_groups(values: &[f32], blocks: usize) -> Vec<f32> {
    let rows = values.len() / blocks;
    let mut out = vec![0f32; rows.div_ceil(R_MAX) * R_MAX * blocks];
    for (row, row_values) in values.chunks_exact(blocks).enumerate() {
        let (group, lane) = (row / R_MAX, row % R_MAX);
        for (blk, v) in row_values.iter().enumerate() {
            out[(group * blocks + blk) * R_MAX + lane] = *v;
        }
    }
    out
}

/// `y[i][j] = Σ_p x[i][p] · W[j][p]` for `x: (m, k)` f32 and `W: (n, k)` stored as
/// `format` blocks in `w`; `y` is `(m, n)`, row-major.
pub fn matmul(format: Format, w: &[u8], n: usize, k: usize, x: &[f32], m: usize) -> Result<Vec<f32>> {
    matmul_with(Kernel::best(), format, w, n, k, x, m)
}

fn matmul_with(kernel: Kernel, format: Format, w: &[u8], n: usize, k: usize, x: &[f32], m: usize) -> Result<Vec<f32>> {
    if !k.is_multiple_of(QK) {
        return Err(ModelError::Unsupported(format!("a quantized matrix with {k} columns (not whole blocks)")));
    }
    let row_bytes = k / QK * format.block_bytes();
    if w.len() != n * row_bytes || x.len() != m * k {
        return Err(ModelError::Unsupported(format!(
            "a {format:?} matmul of ({m}, {k}) inputs by a ({n}, {k}) matrix given {} input values and {} weight bytes",
            x.len(),
            w.len()
        )));
    }
    if m == 0 || n == 0 {
        return Ok(vec![0.0; m * n]);
    }
    let xq = QuantizedRows::new(kernel, x, k);
    let threads = rayon::current_num_threads().max(1);
    if m >= threads * 2 * R_MAX {
        return Ok(by_input_rows(kernel, format, w, n, row_bytes, &xq, m, threads));
    }
    // Few input rows: the weight rows are split over tasks instead. Outputs are computed
    // transposed, `(n, m)`, so that each task owns one contiguous slice (its weight rows
    // × all input rows); one transpose at the end restores `(m, n)`.
    // Several tasks per thread even out uneven progress; whole micro-kernels per task.
    let per_task = n.div_ceil(threads * 4).div_ceil(ROW_GROUP).max(1) * ROW_GROUP;
    let mut yt = vec![0f32; n * m];
    let task = |(task, out): (usize, &mut [f32])| {
        let j0 = task * per_task;
        let rows = out.len() / m;
        let w = &w[j0 * row_bytes..(j0 + rows) * row_bytes];
        weight_rows(kernel, format, w, row_bytes, &xq, m, out);
    };
    // One task per thread is a plain loop: no fork-join for a pool of one.
    match threads {
        1 => yt.chunks_mut(per_task * m).enumerate().for_each(task),
        _ => yt.par_chunks_mut(per_task * m).enumerate().for_each(task),
    }
    if m == 1 {
        return Ok(yt);
    }
    let mut y = vec![0f32; m * n];
    for (j, column) in yt.chunks_exact(m).enumerate() {
        for (i, v) in column.iter().enumerate() {
            y[i * n + j] = *v;
        }
    }
    Ok(y)
}

/// Many input rows (a prompt): tasks own runs of whole output rows, each task meeting
/// every weight row, so outputs land in place (no transpose, which at prefill took as
/// long as a third of the arithmetic) and a task's activations stay in cache.
#[allow(clippy::too_many_arguments)]
fn by_input_rows(
    kernel: Kernel,
    format: Format,
    w: &[u8],
    n: usize,
    row_bytes: usize,
    xq: &QuantizedRows,
    m: usize,
    threads: usize,
) -> Vec<f32> {
    // At least two tasks per thread, in whole tiles, at most ROW_CHUNK rows each.
    let tile_rows = kernel.tile_rows();
    let rows_per_task = m.div_ceil(threads * 2).div_ceil(tile_rows).clamp(1, ROW_CHUNK / tile_rows) * tile_rows;
    let mut y = vec![0f32; m * n];
    let task = |(task, out): (usize, &mut [f32])| {
        let first = task * rows_per_task;
        input_rows(kernel, format, w, row_bytes, xq, first..first + out.len() / n, out);
    };
    match threads {
        1 => y.chunks_mut(rows_per_task * n).enumerate().for_each(task),
        _ => y.par_chunks_mut(rows_per_task * n).enumerate().for_each(task),
    }
    y
}

/// Input rows `rows` (starting at a multiple of [`R_MAX`]) against every weight row,
/// into `out` (`(rows, n)`, row-major).
fn input_rows(
    kernel: Kernel,
    format: Format,
    w: &[u8],
    row_bytes: usize,
    xq: &QuantizedRows,
    rows: std::ops::Range<usize>,
    out: &mut [f32],
) {
    let n = w.len() / row_bytes;
    let mut j = 0;
    while j < n {
        let c = C_MAX.min(n - j);
        let ws = &w[j * row_bytes..(j + c) * row_bytes];
        let mut i = rows.start;
        while i < rows.end {
            let r = kernel.tile_rows().min(rows.end - i);
            let mut tile = [[0f32; C_MAX]; TILE_ROWS];
            run_tile(kernel, format, ws, row_bytes, xq, i, r, &mut tile);
            for (a, tile_row) in tile.iter().enumerate().take(r) {
                let at = (i - rows.start + a) * n + j;
                out[at..at + c].copy_from_slice(&tile_row[..c]);
            }
            i += r;
        }
        j += c;
    }
}

/// One `r × c` tile (`c` = the weight rows in `ws`) with the best kernel there is.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn run_tile(
    kernel: Kernel,
    format: Format,
    ws: &[u8],
    row_bytes: usize,
    xq: &QuantizedRows,
    i: usize,
    r: usize,
    tile: &mut Tile,
) {
    match kernel {
        Kernel::Scalar => scalar_tile(format, ws, row_bytes, xq, i, r, tile),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: both are only chosen after detecting AVX2, FMA and F16C.
        Kernel::Avx2 | Kernel::AvxVnni => unsafe { avx2::tile(format, ws, row_bytes, xq, i, r, tile) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: only chosen after detecting AVX-512 F, BW and VNNI beside AVX2, FMA and F16C.
        Kernel::Avx512Vnni { .. } => unsafe { avx512::tile(format, ws, row_bytes, xq, i, r, tile) },
    }
}

/// Every input row against the weight rows in `w`, into `out` (`(rows of w, m)`).
fn weight_rows(
    kernel: Kernel,
    format: Format,
    w: &[u8],
    row_bytes: usize,
    xq: &QuantizedRows,
    m: usize,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if m == 1 && kernel != Kernel::Scalar {
        // SAFETY: both SIMD kernels are only chosen after detecting AVX2 and FMA, and
        // `AvxVnni` after detecting AVX-VNNI.
        unsafe {
            match kernel {
                Kernel::AvxVnni | Kernel::Avx512Vnni { avx_vnni: true } => {
                    avx2::gemv_vnni(format, w, row_bytes, xq, out)
                }
                _ => avx2::gemv_avx2(format, w, row_bytes, xq, out),
            }
        }
        return;
    }
    let n = w.len() / row_bytes;
    // Every pair of weight rows meets every input row; in chunks of input rows that stay
    // in L2 (at 512 prompt rows a whole input is larger than it), the weights are re-read
    // once per chunk instead.
    for chunk in (0..m).step_by(ROW_CHUNK) {
        let chunk_end = (chunk + ROW_CHUNK).min(m);
        let mut j = 0;
        while j < n {
            let c = C_MAX.min(n - j);
            let ws = &w[j * row_bytes..(j + c) * row_bytes];
            let mut i = chunk;
            while i < chunk_end {
                let r = kernel.tile_rows().min(chunk_end - i);
                let mut tile = [[0f32; C_MAX]; TILE_ROWS];
                run_tile(kernel, format, ws, row_bytes, xq, i, r, &mut tile);
                for (b, w_row) in out[j * m..(j + c) * m].chunks_exact_mut(m).enumerate() {
                    for a in 0..r {
                        w_row[i + a] = tile[a][b];
                    }
                }
                i += r;
            }
            j += c;
        }
    }
}

/// The portable reference: one dot product per (input row, weight row).
fn scalar_tile(format: Format, ws: &[u8], row_bytes: usize, xq: &QuantizedRows, i: usize, r: usize, tile: &mut Tile) {
    for (b, w_row) in ws.chunks_exact(row_bytes).enumerate() {
        for (a, slot) in tile.iter_mut().enumerate().take(r) {
            slot[b] = scalar_dot(format, w_row, xq, i + a);
        }
    }
}

fn scalar_dot(format: Format, w_row: &[u8], xq: &QuantizedRows, row: usize) -> f32 {
    let (qs, ds, ss) = (xq.row_qs(row), xq.row_d(row), xq.row_s(row));
    let mut total = 0f32;
    for (b, block) in w_row.chunks_exact(format.block_bytes()).enumerate() {
        let x = &qs[b * QK..(b + 1) * QK];
        let d = f16_at(block, 0);
        let dot: i32 = match format {
            Format::Q4_1 => {
                let nibbles = &block[4..4 + QK / 2];
                let (lo, hi) = x.split_at(QK / 2);
                nibbles
                    .iter()
                    .zip(lo.iter().zip(hi))
                    .map(|(&q, (&a, &b))| (q & 0x0F) as i32 * a as i32 + (q >> 4) as i32 * b as i32)
                    .sum()
            }
            Format::Q8_0 => block[2..2 + QK].iter().zip(x).map(|(&q, &a)| q as i8 as i32 * a as i32).sum(),
        };
        total += d * ds[b] * dot as f32;
        if format == Format::Q4_1 {
            total += f16_at(block, 2) * ss[b];
        }
    }
    total
}

/// `values ≈ d · qs` with `d = max |v| / 127`, rounding half to even (as the SIMD
/// conversion does); returns `d` and `Σ qs`.
fn quantize_block(values: &[f32], qs: &mut [i8]) -> (f32, i32) {
    let amax = values.iter().fold(0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let inverse = if d > 0.0 { 1.0 / d } else { 0.0 };
    let mut sum = 0i32;
    for (q, v) in qs.iter_mut().zip(values) {
        // `as` saturates (and maps NaN to 0), so odd inputs cannot overflow.
        *q = (v * inverse).round_ties_even() as i8;
        sum += *q as i32;
    }
    (d, sum)
}

/// The little-endian f16 at `block[at..at + 2]`, as f32.
#[inline(always)]
fn f16_at(block: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([block[at], block[at + 1]]).to_f32()
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{Format, QuantizedRows, Tile, QK, ROW_GROUP, R_MAX};

    /// How far ahead of the block being read the weights are prefetched.
    pub(super) const PREFETCH_BYTES: usize = 4096;

    /// Dispatches an `r × c` tile to the micro-kernel compiled for that shape.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C; `i` is a multiple of [`R_MAX`], `r` at most it.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn tile(
        format: Format,
        ws: &[u8],
        row_bytes: usize,
        xq: &QuantizedRows,
        i: usize,
        r: usize,
        out: &mut Tile,
    ) {
        let c = ws.len() / row_bytes;
        macro_rules! dispatch {
            ($($a:literal $b:literal),*) => {
                match (r, c, format) {
                    $(
                        ($a, $b, Format::Q4_1) => micro::<$a, $b, true>(ws, row_bytes, xq, i, out),
                        ($a, $b, Format::Q8_0) => micro::<$a, $b, false>(ws, row_bytes, xq, i, out),
                    )*
                    _ => unreachable!("tiles are at most R_MAX × C_MAX"),
                }
            };
        }
        dispatch!(1 1, 1 2, 2 1, 2 2, 3 1, 3 2, 4 1, 4 2);
    }

    /// `R` input rows (from row `i`) against `C` weight rows, block by block: each weight
    /// block is loaded and widened once and multiplied against all `R` rows.
    /// `Q4`: Q4_1 weights (unsigned nibbles plus an offset), else Q8_0 (signed bytes).
    ///
    /// The arithmetic per output is the batch-1 kernel's, operation for operation (so a
    /// row's result does not depend on its batch); what is shared is the work around it:
    /// one block's scale products for all `R` rows come from one vector multiply (read
    /// back by broadcast loads, which cost no arithmetic slot), and Q4_1's offset sums run
    /// four rows to a vector.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn micro<const R: usize, const C: usize, const Q4: bool>(
        ws: &[u8],
        row_bytes: usize,
        xq: &QuantizedRows,
        i: usize,
        out: &mut Tile,
    ) {
        let block_bytes = if Q4 { 4 + QK / 2 } else { 2 + QK };
        let blocks = row_bytes / block_bytes;
        assert!(ws.len() >= C * row_bytes && i.is_multiple_of(R_MAX) && i + R <= xq.qs.len() / xq.cols);
        let (x_d, _) = xq.group_scales(i);
        let w_base = ws.as_ptr();
        let x_base = xq.qs.as_ptr().add(i * xq.cols);
        let nibbles = _mm_set1_epi8(0x0F);
        let ones = _mm256_set1_epi16(1);
        let mut acc = [[_mm256_setzero_ps(); C]; R];
        let mut scales = [[0f32; R_MAX]; C];
        for blk in 0..blocks {
            // SAFETY (all loads below): `ws` holds C rows of `blocks` whole blocks, and
            // the group's scales and rows `i..i + R` of the activations hold `blocks`
            // blocks each (asserted above); unaligned loads need no alignment.
            let x_scale = _mm_loadu_ps(x_d.as_ptr().add(blk * R_MAX));
            let mut wv = [_mm256_setzero_si256(); C];
            for b in 0..C {
                let block = w_base.add(b * row_bytes + blk * block_bytes);
                // At few input rows this loop waits on memory: without a hint well ahead
                // of the stream, batch-1 decode ran at a quarter of the read bandwidth.
                // Past the end of the matrix the hint is dropped, not faulted.
                _mm_prefetch::<_MM_HINT_T0>(block.wrapping_add(PREFETCH_BYTES) as *const i8);
                // d and (Q4_1) m, the block's first four bytes, as f32: lanes 0 and 1.
                let dm = _mm_cvtph_ps(_mm_cvtsi32_si128((block as *const i32).read_unaligned()));
                _mm_storeu_ps(scales[b].as_mut_ptr(), _mm_mul_ps(_mm_broadcastss_ps(dm), x_scale));
                wv[b] = if Q4 {
                    let packed = _mm_loadu_si128(block.add(4) as *const __m128i);
                    let lo = _mm_and_si128(packed, nibbles);
                    let hi = _mm_and_si128(_mm_srli_epi16::<4>(packed), nibbles);
                    _mm256_set_m128i(hi, lo)
                } else {
                    _mm256_loadu_si256(block.add(2) as *const __m256i)
                };
            }
            for a in 0..R {
                let xv = _mm256_loadu_si256(x_base.add(a * xq.cols + blk * QK) as *const __m256i);
                for b in 0..C {
                    // maddubs multiplies unsigned by signed bytes: Q4_1's nibbles are
                    // already unsigned; for Q8_0 the sign of each weight moves onto its
                    // activation. Pair sums stay within i16 (2 · 128 · 127 < 2^15).
                    let pairs = if Q4 {
                        _mm256_maddubs_epi16(wv[b], xv)
                    } else {
                        _mm256_maddubs_epi16(_mm256_sign_epi8(wv[b], wv[b]), _mm256_sign_epi8(xv, wv[b]))
                    };
                    let sums = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones));
                    acc[a][b] = _mm256_fmadd_ps(_mm256_broadcast_ss(&scales[b][a]), sums, acc[a][b]);
                }
            }
        }
        // Q4_1's offset term, Σ m · s over the blocks, in a pass of its own: inside the
        // loop above its running sums did not fit in registers beside the tile's.
        let offsets = if Q4 { q4_offsets::<C>(ws, row_bytes, xq, i, blocks) } else { [[0.0; R_MAX]; C] };
        for b in 0..C {
            for a in 0..R {
                out[a][b] = horizontal_sum(acc[a][b]) + offsets[b][a];
            }
        }
    }

    /// Q4_1's offset term `Σ m · s` over the blocks of the first `C` weight rows of `ws`,
    /// for the [`R_MAX`] input rows from row `i` (`[weight row][input row]`).
    ///
    /// # Safety
    /// The CPU must support AVX2 and F16C; `ws` holds `C` rows of `blocks` Q4_1 blocks.
    #[inline(always)]
    pub(super) unsafe fn q4_offsets<const C: usize>(
        ws: &[u8],
        row_bytes: usize,
        xq: &QuantizedRows,
        i: usize,
        blocks: usize,
    ) -> [[f32; R_MAX]; C] {
        let block_bytes = 4 + QK / 2;
        assert!(ws.len() >= C * row_bytes && row_bytes >= blocks * block_bytes);
        let (_, x_s) = xq.group_scales(i);
        let mut offsets = [_mm_setzero_ps(); C];
        for blk in 0..blocks {
            // SAFETY: the group's sums hold `blocks` blocks of R_MAX rows; the weight rows
            // hold `blocks` blocks (asserted above).
            let x_sum = _mm_loadu_ps(x_s.as_ptr().add(blk * R_MAX));
            for (b, offset) in offsets.iter_mut().enumerate() {
                let block = ws.as_ptr().add(b * row_bytes + blk * block_bytes);
                let m = _mm_cvtph_ps(_mm_set1_epi16((block.add(2) as *const i16).read_unaligned()));
                *offset = _mm_add_ps(*offset, _mm_mul_ps(m, x_sum));
            }
        }
        std::array::from_fn(|b| {
            let mut sums = [0f32; R_MAX];
            _mm_storeu_ps(sums.as_mut_ptr(), offsets[b]);
            sums
        })
    }

    /// Batch 1 with AVX2's byte multiply-adds.
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn gemv_avx2(format: Format, w: &[u8], row_bytes: usize, xq: &QuantizedRows, out: &mut [f32]) {
        gemv::<false>(format, w, row_bytes, xq, out)
    }

    /// Batch 1 with AVX-VNNI's `vpdpbusd` (one instruction for a block's byte products).
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and AVX-VNNI.
    #[target_feature(enable = "avx2,fma,avxvnni")]
    pub unsafe fn gemv_vnni(format: Format, w: &[u8], row_bytes: usize, xq: &QuantizedRows, out: &mut [f32]) {
        gemv::<true>(format, w, row_bytes, xq, out)
    }

    /// One input row against every weight row of `w`, into `out`: [`ROW_GROUP`] rows at
    /// a time, block by block, so that the loads of four blocks are in flight together.
    /// The weights are read once and never reused, so nothing is tiled: what matters is
    /// keeping the stream of loads ahead of the arithmetic.
    #[inline(always)]
    unsafe fn gemv<const VNNI: bool>(format: Format, w: &[u8], row_bytes: usize, xq: &QuantizedRows, out: &mut [f32]) {
        let n = w.len() / row_bytes;
        let full = n / ROW_GROUP * ROW_GROUP;
        for j in (0..full).step_by(ROW_GROUP) {
            let rows = &w[j * row_bytes..(j + ROW_GROUP) * row_bytes];
            let sums = match format {
                Format::Q4_1 => row_group::<ROW_GROUP, true, VNNI>(rows, row_bytes, xq),
                Format::Q8_0 => row_group::<ROW_GROUP, false, VNNI>(rows, row_bytes, xq),
            };
            out[j..j + ROW_GROUP].copy_from_slice(&sums);
        }
        for j in full..n {
            let row = &w[j * row_bytes..(j + 1) * row_bytes];
            out[j] = match format {
                Format::Q4_1 => row_group::<1, true, VNNI>(row, row_bytes, xq)[0],
                Format::Q8_0 => row_group::<1, false, VNNI>(row, row_bytes, xq)[0],
            };
        }
    }

    /// `G` consecutive weight rows (`rows`, `G · row_bytes` bytes) dotted with input row 0.
    #[inline(always)]
    unsafe fn row_group<const G: usize, const Q4: bool, const VNNI: bool>(
        rows: &[u8],
        row_bytes: usize,
        xq: &QuantizedRows,
    ) -> [f32; G] {
        let block_bytes = if Q4 { 4 + QK / 2 } else { 2 + QK };
        let blocks = row_bytes / block_bytes;
        let (x_qs, x_d, x_s) = (xq.row_qs(0), xq.row_d(0), xq.row_s(0));
        assert!(rows.len() == G * row_bytes && x_qs.len() == blocks * QK && x_d.len() == blocks);
        let base = rows.as_ptr();
        let low_nibbles = _mm_set1_epi8(0x0F);
        let mut acc = [_mm256_setzero_ps(); G];
        let mut offsets = [0f32; G];
        for blk in 0..blocks {
            // The group is one contiguous stretch of memory read at G blocks per step:
            // one hint per step, a fixed distance ahead, covers it line by line.
            _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(PREFETCH_BYTES + blk * G * block_bytes) as *const i8);
            // SAFETY: block `blk` of the input row is QK bytes inside `x_qs`.
            let xv = _mm256_loadu_si256(x_qs.as_ptr().add(blk * QK) as *const __m256i);
            let xd = *x_d.get_unchecked(blk);
            for g in 0..G {
                // SAFETY: row `g` holds `blocks` whole blocks (asserted above).
                let block = base.add(g * row_bytes + blk * block_bytes);
                let d = f16_ptr(block);
                let products = if Q4 {
                    offsets[g] += f16_ptr(block.add(2)) * *x_s.get_unchecked(blk);
                    let packed = _mm_loadu_si128(block.add(4) as *const __m128i);
                    let lo = _mm_and_si128(packed, low_nibbles);
                    let hi = _mm_and_si128(_mm_srli_epi16::<4>(packed), low_nibbles);
                    byte_dot::<VNNI>(_mm256_set_m128i(hi, lo), xv)
                } else {
                    // Signed weights: their signs move onto the activations (see `micro`).
                    let wv = _mm256_loadu_si256(block.add(2) as *const __m256i);
                    byte_dot::<VNNI>(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv))
                };
                acc[g] = _mm256_fmadd_ps(_mm256_set1_ps(d * xd), _mm256_cvtepi32_ps(products), acc[g]);
            }
        }
        std::array::from_fn(|g| horizontal_sum(acc[g]) + offsets[g])
    }

    /// Sums of four adjacent products of unsigned `w` and signed `x` bytes, as 8 i32.
    #[inline(always)]
    unsafe fn byte_dot<const VNNI: bool>(w: __m256i, x: __m256i) -> __m256i {
        if VNNI {
            _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), w, x)
        } else {
            // Pair sums stay within i16 (2 · 128 · 127 < 2^15).
            _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1))
        }
    }

    /// The little-endian f16 at `p`, as f32.
    #[inline(always)]
    unsafe fn f16_ptr(p: *const u8) -> f32 {
        half::f16::from_bits(u16::from_le_bytes([*p, *p.add(1)])).to_f32()
    }

    /// [`super::quantize_block`] with AVX2 (equal results for finite inputs).
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn quantize_block(values: &[f32], qs: &mut [i8]) -> (f32, i32) {
        assert!(values.len() == QK && qs.len() == QK);
        // SAFETY: both slices hold QK = 32 elements, as asserted.
        let v: [__m256; 4] = std::array::from_fn(|i| _mm256_loadu_ps(values.as_ptr().add(8 * i)));
        let sign = _mm256_set1_ps(-0.0);
        let abs = |x| _mm256_andnot_ps(sign, x);
        let max = _mm256_max_ps(_mm256_max_ps(abs(v[0]), abs(v[1])), _mm256_max_ps(abs(v[2]), abs(v[3])));
        let quad = _mm_max_ps(_mm256_castps256_ps128(max), _mm256_extractf128_ps::<1>(max));
        let pair = _mm_max_ps(quad, _mm_movehl_ps(quad, quad));
        let amax = _mm_cvtss_f32(_mm_max_ss(pair, _mm_shuffle_ps::<1>(pair, pair)));
        let d = amax / 127.0;
        let inverse = _mm256_set1_ps(if d > 0.0 { 1.0 / d } else { 0.0 });
        // The default rounding mode is to nearest, ties to even.
        let q: [__m256i; 4] = std::array::from_fn(|i| _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inverse)));
        let total = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        let quad = _mm_add_epi32(_mm256_castsi256_si128(total), _mm256_extracti128_si256::<1>(total));
        let pair = _mm_add_epi32(quad, _mm_unpackhi_epi64(quad, quad));
        let sum = _mm_cvtsi128_si32(_mm_add_epi32(pair, _mm_shuffle_epi32::<1>(pair)));
        // Packing works within 128-bit lanes, which leaves the 4-value groups in the
        // order 0 2 4 6 1 3 5 7; the permute puts them back.
        let words = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        let bytes = _mm256_permutevar8x32_epi32(words, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(qs.as_mut_ptr() as *mut __m256i, bytes);
        (d, sum)
    }

    #[inline(always)]
    pub(super) unsafe fn horizontal_sum(v: __m256) -> f32 {
        let quad = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let pair = _mm_add_ps(quad, _mm_movehl_ps(quad, quad));
        let one = _mm_add_ss(pair, _mm_shuffle_ps::<1>(pair, pair));
        _mm_cvtss_f32(one)
    }
}

#[cfg(target_arch = "x86_64")]
#[path = "qmatmul_avx512.rs"]
mod avx512;

#[cfg(test)]
#[path = "qmatmul_tests.rs"]
mod tests;
