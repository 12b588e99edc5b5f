//! The tiled kernel of [`super`] with AVX-512 VNNI: two weight rows side by side in one
//! 512-bit register (row `b` in lanes 0-7, row `b + 1` in lanes 8-15), so that one
//! `vpdpbusd` forms a block's byte products for both against one input row, and up to
//! [`TILE_ROWS`] input rows per decoded pair of weight blocks.
//!
//! Each lane computes what a lane of the AVX2 kernel computes: the same four-byte
//! integer sums, the same `d · x_d` scale, the same fused multiply-add into the same
//! accumulator, the same horizontal sum at the end. So the results are bit for bit
//! those of the batch-1 kernel, and a row's output still does not depend on its batch.

use std::arch::x86_64::*;

use super::avx2::{horizontal_sum, q4_offsets, PREFETCH_BYTES};
use super::{Format, QuantizedRows, Tile, C_MAX, QK, R_MAX, TILE_ROWS};

/// An `r × c` tile: pairs of weight rows take the 512-bit kernel, a single one the AVX2
/// one (in groups of [`R_MAX`] input rows).
///
/// # Safety
/// The CPU must support AVX-512 F, BW and VNNI, AVX2, FMA and F16C; `i` is a multiple of
/// [`R_MAX`], `r` at most [`TILE_ROWS`].
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub unsafe fn tile(
    format: Format,
    ws: &[u8],
    row_bytes: usize,
    xq: &QuantizedRows,
    i: usize,
    r: usize,
    out: &mut Tile,
) {
    if ws.len() / row_bytes != 2 {
        super::avx2::tile(format, ws, row_bytes, xq, i, r.min(R_MAX), out);
        if r > R_MAX {
            let mut rest = [[0f32; C_MAX]; TILE_ROWS];
            super::avx2::tile(format, ws, row_bytes, xq, i + R_MAX, r - R_MAX, &mut rest);
            out[R_MAX..r].copy_from_slice(&rest[..r - R_MAX]);
        }
        return;
    }
    macro_rules! dispatch {
        ($($r:literal),*) => {
            match (r, format) {
                $(
                    ($r, Format::Q4_1) => pair::<$r, true>(ws, row_bytes, xq, i, out),
                    ($r, Format::Q8_0) => pair::<$r, false>(ws, row_bytes, xq, i, out),
                )*
                _ => unreachable!("tiles have at most TILE_ROWS rows"),
            }
        };
    }
    dispatch!(1, 2, 3, 4, 5, 6, 7, 8);
}

/// `R` input rows (from row `i`) against the two weight rows in `ws`, block by block.
/// `Q4`: Q4_1 weights (unsigned nibbles plus an offset), else Q8_0 (signed bytes).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn pair<const R: usize, const Q4: bool>(
    ws: &[u8],
    row_bytes: usize,
    xq: &QuantizedRows,
    i: usize,
    out: &mut Tile,
) {
    let block_bytes = if Q4 { 4 + QK / 2 } else { 2 + QK };
    let blocks = row_bytes / block_bytes;
    assert!(ws.len() >= 2 * row_bytes && i.is_multiple_of(R_MAX) && i + R <= xq.qs.len() / xq.cols);
    // Rows past the first R_MAX read their scales from the next group.
    let x_d = [xq.group_scales(i).0, xq.group_scales(if R > R_MAX { i + R_MAX } else { i }).0];
    let (first, second) = (ws.as_ptr(), ws.as_ptr().add(row_bytes));
    let x_base = xq.qs.as_ptr().add(i * xq.cols);
    let nibbles = _mm512_set1_epi8(0x0F);
    let zero = _mm512_setzero_si512();
    let mut acc = [_mm512_setzero_ps(); R];
    for blk in 0..blocks {
        // SAFETY (all loads below): `ws` holds two rows of `blocks` whole blocks, and the
        // group's scales and rows `i..i + R` of the activations hold `blocks` blocks each
        // (asserted above); unaligned loads need no alignment.
        let (a_block, b_block) = (first.add(blk * block_bytes), second.add(blk * block_bytes));
        _mm_prefetch::<_MM_HINT_T0>(a_block.wrapping_add(PREFETCH_BYTES) as *const i8);
        _mm_prefetch::<_MM_HINT_T0>(b_block.wrapping_add(PREFETCH_BYTES) as *const i8);
        let d_pair = lanes_of_two(scale_d(a_block), scale_d(b_block));
        let w = if Q4 {
            // [a, a, b, b] in 128-bit chunks; chunks 1 and 3 keep the high nibbles, so
            // each half is laid out as the AVX2 kernel's [low nibbles, high nibbles].
            let a = _mm_loadu_si128(a_block.add(4) as *const __m128i);
            let b = _mm_loadu_si128(b_block.add(4) as *const __m128i);
            let both = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(_mm256_set_m128i(a, a)), _mm256_set_m128i(b, b));
            let shifted = _mm512_srli_epi16::<4>(both);
            _mm512_and_si512(_mm512_mask_blend_epi64(0b1100_1100, both, shifted), nibbles)
        } else {
            let a = _mm256_loadu_si256(a_block.add(2) as *const __m256i);
            let b = _mm256_loadu_si256(b_block.add(2) as *const __m256i);
            _mm512_inserti64x4::<1>(_mm512_castsi256_si512(a), b)
        };
        // Signed weights: their signs move onto the activations, as in the AVX2 kernel
        // (AVX-512 has no byte `sign`: activations facing a negative weight are negated).
        let negative = if Q4 { 0 } else { _mm512_movepi8_mask(w) };
        let w = if Q4 { w } else { _mm512_abs_epi8(w) };
        for (a, acc) in acc.iter_mut().enumerate() {
            let x = _mm512_broadcast_i64x4(_mm256_loadu_si256(x_base.add(a * xq.cols + blk * QK) as *const __m256i));
            let x = if Q4 { x } else { _mm512_mask_sub_epi8(x, negative, zero, x) };
            let sums = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(zero, w, x));
            let x_scale = *x_d[a / R_MAX].get_unchecked(blk * R_MAX + a % R_MAX);
            let scale = _mm512_mul_ps(d_pair, _mm512_set1_ps(x_scale));
            *acc = _mm512_fmadd_ps(scale, sums, *acc);
        }
    }
    let mut offsets = [[[0f32; R_MAX]; 2]; 2];
    if Q4 {
        for (group, offsets) in offsets.iter_mut().enumerate().take(R.div_ceil(R_MAX)) {
            *offsets = q4_offsets::<2>(ws, row_bytes, xq, i + group * R_MAX, blocks);
        }
    }
    for (a, acc) in acc.iter().enumerate() {
        let offsets = &offsets[a / R_MAX];
        let second_half = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(*acc)));
        out[a][0] = horizontal_sum(_mm512_castps512_ps256(*acc)) + offsets[0][a % R_MAX];
        out[a][1] = horizontal_sum(second_half) + offsets[1][a % R_MAX];
    }
}

/// A block's scale `d` (its first two bytes, f16) as f32.
#[inline(always)]
unsafe fn scale_d(block: *const u8) -> __m128 {
    _mm_cvtph_ps(_mm_cvtsi32_si128((block as *const i32).read_unaligned()))
}

/// Lane 0 of `a` in lanes 0-7 and lane 0 of `b` in lanes 8-15.
#[inline(always)]
unsafe fn lanes_of_two(a: __m128, b: __m128) -> __m512 {
    let low = _mm256_castps_pd(_mm256_broadcastss_ps(a));
    let high = _mm256_castps_pd(_mm256_broadcastss_ps(b));
    _mm512_castpd_ps(_mm512_insertf64x4::<1>(_mm512_castpd256_pd512(low), high))
}
