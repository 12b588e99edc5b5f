//! The machine's own limits, measured the way the runtime uses it: memory bandwidth
//! (a STREAM-style triad on all compute threads) and the f32 GEMM rate, the faster of
//! candle's GEMM and our own matmul kernel.
//! Profiles report model speed as a fraction of these.

use std::time::Instant;

use candle_core::{Device, Tensor};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::stats::Samples;

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct MachineLimits {
    /// Read-only bandwidth, GB/s (10^9 bytes): what streaming weights can reach, the
    /// limit of batch-1 decode.
    pub read_gbps: f64,
    /// STREAM triad bandwidth, GB/s, counting two reads and one write per element.
    pub triad_gbps: f64,
    /// f32 GEMM rate at 2048³, GFLOP/s: the faster of candle's GEMM and ours.
    pub gemm_gflops: f64,
    /// candle's GEMM alone (the rate profiles measured against before ours overtook it).
    #[serde(default)]
    pub candle_gemm_gflops: f64,
    pub threads: usize,
}

pub fn measure() -> MachineLimits {
    let candle = measure_candle_gemm().unwrap_or(f64::NAN);
    let own = measure_own_gemm();
    MachineLimits {
        read_gbps: measure_read_bandwidth(),
        triad_gbps: measure_triad_bandwidth(),
        gemm_gflops: own.max(candle),
        candle_gemm_gflops: candle,
        threads: rayon::current_num_threads(),
    }
}

/// Best of several vectorized sums over an array far larger than any cache.
pub fn measure_read_bandwidth() -> f64 {
    let probe = ReadProbe::new();
    (0..6).map(|_| probe.sample_gbps()).fold(0.0, f64::max)
}

/// An array far larger than any cache, summed once per sample: the read bandwidth of
/// the moment. A profile samples it between its batch-1 steps: on a shared host the
/// bandwidth drifts by a third within minutes, so only a sample taken beside a step
/// says what fraction of the limit that step reached.
pub struct ReadProbe {
    data: Vec<f32>,
}

impl ReadProbe {
    const FLOATS: usize = 64 << 20; // 256 MiB

    pub fn new() -> Self {
        ReadProbe { data: vec![1.0f32; Self::FLOATS] }
    }

    /// One pass over the array, in GB/s (10^9 bytes).
    pub fn sample_gbps(&self) -> f64 {
        let chunk = self.data.len() / (rayon::current_num_threads() * 8).max(1);
        let t = Instant::now();
        let total: f32 = self.data.par_chunks(chunk).map(sum_lanes).sum();
        std::hint::black_box(total);
        std::mem::size_of_val(&self.data[..]) as f64 / t.elapsed().as_secs_f64() / 1e9
    }
}

impl Default for ReadProbe {
    fn default() -> Self {
        Self::new()
    }
}

/// Sums with independent lanes, which the compiler turns into vector adds.
fn sum_lanes(values: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    for v in values.chunks_exact(16) {
        for l in 0..16 {
            acc[l] += v[l];
        }
    }
    acc.iter().sum()
}

/// Best of several triads over arrays far larger than any cache.
pub fn measure_triad_bandwidth() -> f64 {
    const N: usize = 32 << 20; // 128 MiB per array
    let b = vec![1.0f32; N];
    let c = vec![2.0f32; N];
    let mut a = vec![0.0f32; N];
    let chunk = N / (rayon::current_num_threads() * 4).max(1);
    let mut best = f64::INFINITY;
    for _ in 0..6 {
        let t = Instant::now();
        a.par_chunks_mut(chunk).zip(b.par_chunks(chunk)).zip(c.par_chunks(chunk)).for_each(|((a, b), c)| {
            for i in 0..a.len() {
                a[i] = b[i] + 0.5 * c[i];
            }
        });
        best = best.min(t.elapsed().as_secs_f64());
    }
    std::hint::black_box(&a);
    (3 * N * 4) as f64 / best / 1e9
}

const GEMM_N: usize = 2048;

fn gflops(seconds: f64) -> f64 {
    2.0 * (GEMM_N * GEMM_N * GEMM_N) as f64 / seconds / 1e9
}

/// The fastest of `runs` timed calls of `f`, in seconds (benchmarks share it).
pub fn best_seconds(runs: usize, mut f: impl FnMut()) -> f64 {
    (0..runs)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

/// The median of `samples` (the middle pair's mean for an even count, see
/// [`Samples::median`]); profiles and benchmarks share it. Needs at least one sample.
pub fn median(samples: &[f64]) -> f64 {
    Samples::from(samples.to_vec()).median().expect("the median of no samples")
}

/// candle's GEMM. [`MachineLimits::gemm_gflops`] takes the faster of it and ours: a
/// step's fraction of that says how near it comes to what this machine has been seen to
/// do, not to what one library does.
pub fn measure_candle_gemm() -> candle_core::Result<f64> {
    let x = Tensor::ones((GEMM_N, GEMM_N), candle_core::DType::F32, &Device::Cpu)?;
    let y = Tensor::ones((GEMM_N, GEMM_N), candle_core::DType::F32, &Device::Cpu)?;
    // A first call to warm up, and to surface the error the same inputs would repeat.
    x.matmul(&y)?;
    Ok(gflops(best_seconds(4, || drop(std::hint::black_box(x.matmul(&y))))))
}

/// `y = x · Wᵀ` through the kernel the model's linear layers use.
pub fn measure_own_gemm() -> f64 {
    let mut probe = GemmProbe::new();
    (0..4).map(|_| probe.sample_gflops()).fold(0.0, f64::max)
}

/// Operands of a 2048³ product through our kernel, multiplied once per sample: the GEMM
/// rate of the moment, sampled between batched steps as [`ReadProbe`] is between
/// batch-1 steps.
pub struct GemmProbe {
    x: Vec<f32>,
    w: Vec<f32>,
    y: Vec<f32>,
}

impl GemmProbe {
    pub fn new() -> Self {
        use super::matmul::panel_len;
        GemmProbe {
            x: vec![1.0f32; GEMM_N * GEMM_N],
            w: vec![1.0f32; panel_len(GEMM_N, GEMM_N)],
            y: vec![0f32; GEMM_N * GEMM_N],
        }
    }

    /// One product, in GFLOP/s.
    pub fn sample_gflops(&mut self) -> f64 {
        use super::matmul::{matmul_xwt, Panels};
        let t = Instant::now();
        matmul_xwt(&self.x, Panels::new(&self.w, GEMM_N, GEMM_N), &mut self.y, GEMM_N);
        gflops(t.elapsed().as_secs_f64())
    }
}

impl Default for GemmProbe {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn median_is_the_middle_sample_or_the_middle_pairs_mean() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&[7.0]), 7.0);
    }
}
