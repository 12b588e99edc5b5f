//! The CPU reference each CUDA kernel is held to: the same arithmetic on plain slices,
//! rounding to the kernel's 2-byte type where the kernel stores one. The tests here hold
//! this reference to the CPU backend itself (its norms, rotation, activation and paged
//! attention), so a kernel that matches it matches the engine's CPU path.

use half::{bf16, f16};

/// The 2-byte types the kernels store (weights, GEMM inputs, K/V).
pub trait HalfFloat: Copy + Send + Sync + 'static {
    const NAME: &'static str;
    fn from_f32(v: f32) -> Self;
    fn to_f32(self) -> f32;
    fn to_bits(self) -> u16;
    fn from_bits(bits: u16) -> Self;
}

impl HalfFloat for bf16 {
    const NAME: &'static str = "bf16";
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    fn to_bits(self) -> u16 {
        bf16::to_bits(self)
    }
    fn from_bits(bits: u16) -> Self {
        bf16::from_bits(bits)
    }
}

impl HalfFloat for f16 {
    const NAME: &'static str = "f16";
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    fn to_bits(self) -> u16 {
        f16::to_bits(self)
    }
    fn from_bits(bits: u16) -> Self {
        f16::from_bits(bits)
    }
}

/// `embed`: each id's table row, widened.
pub fn embed<T: HalfFloat>(table: &[T], ids: &[u32], hidden: usize) -> Vec<f32> {
    ids.iter()
        .flat_map(|&id| table[id as usize * hidden..(id as usize + 1) * hidden].iter().map(|v| v.to_f32()))
        .collect()
}

/// `rms_norm`: rows `src_rows` (all, when `None`) of `x`, normalized and scaled; the
/// stored 2-byte values and the f32 ones.
pub fn rms_norm<T: HalfFloat>(x: &[f32], src_rows: Option<&[u32]>, weight: &[f32], eps: f32) -> (Vec<T>, Vec<f32>) {
    let width = weight.len();
    let all: Vec<u32> = (0..(x.len() / width) as u32).collect();
    let mut out = Vec::new();
    for &r in src_rows.unwrap_or(&all) {
        let row = &x[r as usize * width..(r as usize + 1) * width];
        let inv = 1.0 / (row.iter().map(|v| v * v).sum::<f32>() / width as f32 + eps).sqrt();
        out.extend(row.iter().zip(weight).map(|(v, w)| v * inv * w));
    }
    (out.iter().map(|&v| T::from_f32(v)).collect(), out)
}

/// `qkv_prepare` on one q or k head: the optional per-head RMSNorm, then the rotation
/// at `position` ("rotate half", angles rounded to f32 as HF does).
pub fn prepare_head(head: &mut [f32], norm: Option<(&[f32], f32)>, inv_freq: &[f32], position: usize) {
    if let Some((weight, eps)) = norm {
        let inv = 1.0 / (head.iter().map(|v| v * v).sum::<f32>() / head.len() as f32 + eps).sqrt();
        head.iter_mut().zip(weight).for_each(|(v, w)| *v = *v * inv * w);
    }
    let half = head.len() / 2;
    for (i, &f) in inv_freq.iter().enumerate().take(half) {
        let angle = (position as f32 * f) as f64;
        let (c, s) = (angle.cos() as f32, angle.sin() as f32);
        let (x1, x2) = (head[i], head[i + half]);
        head[i] = x1 * c - x2 * s;
        head[i + half] = x2 * c + x1 * s;
    }
}

/// `attention` for one query head of one token over `keys`/`values` (the visible ones,
/// as stored), softmax(q·k · scale) · v.
pub fn attention<T: HalfFloat>(q: &[f32], keys: &[&[T]], values: &[&[T]], scale: f32) -> Vec<f32> {
    let scores: Vec<f32> =
        keys.iter().map(|k| q.iter().zip(k.iter()).map(|(a, b)| a * scale * b.to_f32()).sum()).collect();
    let top = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let weights: Vec<f32> = scores.iter().map(|s| (s - top).exp()).collect();
    let total: f32 = weights.iter().sum();
    let mut out = vec![0.0; q.len()];
    for (w, v) in weights.iter().zip(values) {
        out.iter_mut().zip(v.iter()).for_each(|(o, x)| *o += w * x.to_f32());
    }
    out.iter_mut().for_each(|o| *o /= total);
    out
}

/// `silu_mul`: silu(gate) · up per token of `gate_up` (`[gate | up]`, `width` each).
pub fn silu_mul<T: HalfFloat>(gate_up: &[f32], width: usize) -> Vec<T> {
    gate_up
        .chunks_exact(2 * width)
        .flat_map(|row| {
            let (gate, up) = row.split_at(width);
            gate.iter().zip(up).map(|(&g, &u)| T::from_f32(g / (1.0 + (-g).exp()) * u))
        })
        .collect()
}

/// `logit_stats`: the argmax (lowest index on ties), the largest probability and the
/// entropy (natural log) of softmax(logits); masked (−∞) logits have probability 0.
pub fn logit_stats(logits: &[f32]) -> (u32, f32, f32) {
    let (mut at, mut best) = (0, f32::NEG_INFINITY);
    for (i, &v) in logits.iter().enumerate() {
        if v > best {
            (at, best) = (i, v);
        }
    }
    let (mut z, mut zx) = (0.0f64, 0.0f64);
    for &v in logits.iter().filter(|v| **v > f32::NEG_INFINITY) {
        let e = ((v - best) as f64).exp();
        z += e;
        zx += e * (v - best) as f64;
    }
    (at as u32, (1.0 / z) as f32, (z.ln() - zx / z) as f32)
}

#[cfg(test)]
mod tests;
