//! The elementwise steps of a decoder layer (RMSNorm, SiLU-gated product, residual add)
//! on row-major f32 buffers. They run on rayon next to our matmul and attention, so a
//! layer's step touches one thread pool, not candle's second one too.

use rayon::prelude::*;

use super::simd::{exp_scalar, with_active_simd, Simd};

/// Below this many floats a step runs on the calling thread: forking costs more.
const PARALLEL_FLOATS: usize = 1 << 16;

/// Runs `f` on each `width`-float row of `out` together with the same row of `input`
/// (`input` rows are `in_width` floats), in parallel when the buffers are large.
fn rows_into(
    out: &mut [f32],
    width: usize,
    input: &[f32],
    in_width: usize,
    f: impl Fn(&mut [f32], &[f32]) + Sync + Send,
) {
    if out.len() < PARALLEL_FLOATS {
        out.chunks_exact_mut(width).zip(input.chunks_exact(in_width)).for_each(|(o, i)| f(o, i));
    } else {
        out.par_chunks_mut(width).zip(input.par_chunks(in_width)).for_each(|(o, i)| f(o, i));
    }
}

/// `x / rms(x) · weight` per row of `width` floats.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32) -> Vec<f32> {
    let width = weight.len();
    assert_eq!(x.len() % width, 0);
    let mut out = vec![0f32; x.len()];
    rows_into(&mut out, width, x, width, |o, row| {
        let mean_sq = row.iter().map(|v| v * v).sum::<f32>() / width as f32;
        let inv = 1.0 / (mean_sq + eps).sqrt();
        for ((o, v), w) in o.iter_mut().zip(row).zip(weight) {
            *o = v * inv * w;
        }
    });
    out
}

/// `silu(gate) · up` per row, from rows laid out `[gate (width) | up (width)]`.
pub fn silu_mul(gate_up: &[f32], width: usize) -> Vec<f32> {
    assert_eq!(gate_up.len() % (2 * width), 0);
    let mut out = vec![0f32; gate_up.len() / 2];
    with_active_simd!(S => rows_into(&mut out, width, gate_up, 2 * width, |o, row| silu_mul_row::<S>(o, row, width)));
    out
}

fn silu_mul_row<S: Simd>(out: &mut [f32], row: &[f32], width: usize) {
    let (gate, up) = row.split_at(width);
    let full = width / S::LANES * S::LANES;
    let mut e = [0f32; 16];
    assert!(S::LANES <= e.len());
    for c in (0..full).step_by(S::LANES) {
        // SAFETY: c + LANES <= full <= width, the length of gate and e's LANES.
        unsafe { S::store(e.as_mut_ptr(), S::exp(S::sub(S::zero(), S::load(gate.as_ptr().add(c))))) };
        for l in 0..S::LANES {
            out[c + l] = gate[c + l] / (1.0 + e[l]) * up[c + l];
        }
    }
    for i in full..width {
        out[i] = gate[i] / (1.0 + exp_scalar(-gate[i])) * up[i];
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
