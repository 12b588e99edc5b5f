//! The elementwise steps of a decoder layer (RMSNorm, SiLU-gated product, residual add)
//! on row-major f32 buffers. They run on rayon next to our matmul and attention, so a
//! layer's step touches one thread pool, not candle's second one too. Also the view of
//! a CPU tensor's data that our kernels read without a copy.

use std::mem::MaybeUninit;

use candle_core::{Storage, Tensor};
use rayon::prelude::*;

use super::simd::{exp_scalar, with_active_simd, Simd};

/// Below this many floats a step runs on the calling thread: forking costs more.
const PARALLEL_FLOATS: usize = 1 << 16;

/// A new buffer of `len` floats: `f` runs on each `width`-float row of it together with
/// the same row of `input` (`input` rows are `in_width` floats), in parallel when the
/// buffer is large. Never zeroed first (zeroing a prefill's activations is a pass over
/// memory for nothing).
///
/// # Safety
/// `f` writes every element of each row it is given.
unsafe fn new_rows(
    len: usize,
    width: usize,
    input: &[f32],
    in_width: usize,
    f: impl Fn(&mut [MaybeUninit<f32>], &[f32]) + Sync + Send,
) -> Vec<f32> {
    let mut out = Vec::with_capacity(len);
    let rows = &mut out.spare_capacity_mut()[..len];
    if len < PARALLEL_FLOATS {
        rows.chunks_exact_mut(width).zip(input.chunks_exact(in_width)).for_each(|(o, i)| f(o, i));
    } else {
        rows.par_chunks_mut(width).zip(input.par_chunks(in_width)).for_each(|(o, i)| f(o, i));
    }
    // Safety: f wrote all `len` elements (the caller's promise).
    unsafe { out.set_len(len) };
    out
}

/// `x / rms(x) · weight` per row of `width` floats.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32) -> Vec<f32> {
    let width = weight.len();
    assert_eq!(x.len() % width, 0);
    let normalize = |o: &mut [MaybeUninit<f32>], row: &[f32]| {
        let mean_sq = row.iter().map(|v| v * v).sum::<f32>() / width as f32;
        let inv = 1.0 / (mean_sq + eps).sqrt();
        for ((o, v), w) in o.iter_mut().zip(row).zip(weight) {
            o.write(v * inv * w);
        }
    };
    // Safety: `normalize` writes each of the row's `width` outputs.
    unsafe { new_rows(x.len(), width, x, width, normalize) }
}

/// `silu(gate) · up` per row, from rows laid out `[gate (width) | up (width)]`.
pub fn silu_mul(gate_up: &[f32], width: usize) -> Vec<f32> {
    assert_eq!(gate_up.len() % (2 * width), 0);
    let len = gate_up.len() / 2;
    // Safety: `silu_mul_row` writes each of the row's `width` outputs.
    with_active_simd!(S => unsafe { new_rows(len, width, gate_up, 2 * width, |o, row| silu_mul_row::<S>(o, row, width)) })
}

/// Writes every element of `out` (`width` floats).
fn silu_mul_row<S: Simd>(out: &mut [MaybeUninit<f32>], row: &[f32], width: usize) {
    let (gate, up) = row.split_at(width);
    assert!(out.len() == width && gate.len() == width && up.len() == width);
    let full = width / S::LANES * S::LANES;
    let dst = out.as_mut_ptr() as *mut f32;
    for c in (0..full).step_by(S::LANES) {
        // SAFETY: c + LANES <= full <= width, the length of out, gate and up. The lanes
        // round as the scalar tail does: gate / (1 + e^-gate), then · up.
        unsafe {
            let g = S::load(gate.as_ptr().add(c));
            let e = S::exp(S::sub(S::zero(), g));
            let silu = S::div(g, S::add(S::splat(1.0), e));
            S::store(dst.add(c), S::mul(silu, S::load(up.as_ptr().add(c))));
        }
    }
    for i in full..width {
        out[i].write(gate[i] / (1.0 + exp_scalar(-gate[i])) * up[i]);
    }
}

/// `x += y`.
pub fn add_in_place(x: &mut [f32], y: &[f32]) {
    assert_eq!(x.len(), y.len());
    if x.len() < PARALLEL_FLOATS {
        x.iter_mut().zip(y).for_each(|(a, b)| *a += b);
    } else {
        x.par_chunks_mut(4096)
            .zip(y.par_chunks(4096))
            .for_each(|(a, b)| a.iter_mut().zip(b).for_each(|(a, b)| *a += b));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_elementwise_steps_match_their_definitions_small_and_large() {
        for rows in [1usize, 3, 300] {
            let width = 37 * 8;
            let x: Vec<f32> = (0..rows * width).map(|i| ((i * 13 % 29) as f32 - 14.0) * 0.7).collect();
            let weight: Vec<f32> = (0..width).map(|i| 0.5 + (i % 5) as f32 * 0.1).collect();
            let normed = rms_norm(&x, &weight, 1e-6);
            for r in 0..rows {
                let row = &x[r * width..(r + 1) * width];
                let rms = (row.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / width as f64 + 1e-6).sqrt();
                for i in 0..width {
                    let want = row[i] as f64 / rms * weight[i] as f64;
                    assert!((normed[r * width + i] as f64 - want).abs() < 1e-5, "rms_norm row {r} [{i}]");
                }
            }
            let gate_up: Vec<f32> = (0..rows * width * 2).map(|i| ((i * 7 % 41) as f32 - 20.0) * 0.5).collect();
            let act = silu_mul(&gate_up, width);
            for r in 0..rows {
                for i in 0..width {
                    let (g, u) = (gate_up[r * 2 * width + i] as f64, gate_up[r * 2 * width + width + i] as f64);
                    let want = g / (1.0 + (-g).exp()) * u;
                    assert!(
                        (act[r * width + i] as f64 - want).abs() < 1e-5 * want.abs().max(1.0),
                        "silu row {r} [{i}]"
                    );
                }
            }
            let mut sum = x.clone();
            add_in_place(&mut sum, &normed);
            assert!(sum.iter().zip(x.iter().zip(&normed)).all(|(s, (a, b))| *s == a + b));
        }
    }
}

/// Runs `f` on the data of a contiguous CPU tensor of element type `T`, without copying it.
pub(crate) fn with_slice<T: candle_core::WithDType, R>(
    t: &Tensor,
    f: impl FnOnce(&[T]) -> R,
) -> candle_core::Result<R> {
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cpu(cpu) = &*storage else { candle_core::bail!("our matmul runs on CPU tensors only") };
    let Some((start, end)) = layout.contiguous_offsets() else { candle_core::bail!("tensor is not contiguous") };
    Ok(f(&cpu.as_slice::<T>()?[start..end]))
}
