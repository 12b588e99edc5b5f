//! What proves a card works (`tokenrouter check-device`): each kernel against the CPU
//! reference on random inputs, a model's logits against the f32 CPU backend (batched and
//! row by row), and the step speed against the card's own copy bandwidth and GEMM rate
//! measured beside it.

use std::path::Path;
use std::time::Instant;

use cudarc::driver::CudaSlice;
use half::{bf16, f16};

use super::backend::CudaBackend;
use super::gpu::{launch, raw, Gpu, HalfKind, Matrix};
use super::launch::{grid_stride, per_row};
use super::reference::{self, HalfFloat};
use crate::model::backend::{Backend, LoadOptions, RowInput, WeightDtype};
use crate::model::candle_backend::CandleBackend;
use crate::model::config::ModelConfig;
use crate::model::error::Result;
use crate::model::kv::KvSeq;
use crate::rng::SplitMix64;

/// One comparison: the largest error seen against what it may be.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Check {
    pub name: String,
    pub max_error: f64,
    pub tolerance: f64,
    pub passed: bool,
}

impl Check {
    fn new(name: impl Into<String>, max_error: f64, tolerance: f64) -> Self {
        Check { name: name.into(), max_error, tolerance, passed: max_error <= tolerance }
    }
}

fn noise(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut rng = SplitMix64(seed);
    (0..n).map(|_| (rng.open_unit() as f32 * 2.0 - 1.0) * scale).collect()
}

/// Largest |a - b| relative to |b| + `floor`.
fn relative_error(a: impl IntoIterator<Item = f32>, b: impl IntoIterator<Item = f32>, floor: f32) -> f64 {
    a.into_iter().zip(b).map(|(x, y)| ((x - y).abs() / (y.abs() + floor)) as f64).fold(0.0, f64::max)
}

/// Every kernel but the two that need a model's K/V (covered by [`check_model`]),
/// against [`reference`], in both 2-byte types.
pub fn check_kernels(ordinal: usize) -> Result<Vec<Check>> {
    let mut checks = check_kernels_as::<bf16>(ordinal, HalfKind::Bf16)?;
    checks.extend(check_kernels_as::<f16>(ordinal, HalfKind::F16)?);
    Ok(checks)
}

fn check_kernels_as<T: HalfFloat>(ordinal: usize, half: HalfKind) -> Result<Vec<Check>> {
    let gpu = Gpu::open(ordinal, half)?;
    let s = &gpu.stream;
    let k = &gpu.kernels;
    // One rounding of the 2-byte type, relative.
    let ulp = if half == HalfKind::Bf16 { 1.0 / 128.0 } else { 1.0 / 1024.0 };
    let mut checks = Vec::new();
    let read_half = |d: &CudaSlice<u16>, n: usize| -> Result<Vec<f32>> {
        let mut bits = vec![0u16; n];
        gpu.read(d, &mut bits)?;
        Ok(bits.into_iter().map(|b| T::from_bits(b).to_f32()).collect())
    };

    let (vocab, hidden, ids) = (300, 72, vec![5u32, 0, 299, 17, 5]);
    let table: Vec<T> = noise(vocab * hidden, 1, 1.0).into_iter().map(T::from_f32).collect();
    let table_d = gpu.upload(&table.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "test")?;
    let ids_d = gpu.upload(&ids, "test")?;
    let x_d = gpu.zeros::<f32>(ids.len() * hidden, "test")?;
    launch!(gpu, k.embed, per_row(ids.len()), [raw(&table_d, s), raw(&ids_d, s), raw(&x_d, s), hidden as i32])?;
    let mut x = vec![0.0f32; ids.len() * hidden];
    gpu.read(&x_d, &mut x)?;
    checks.push(Check::new(
        format!("embed {}", T::NAME),
        relative_error(x, reference::embed(&table, &ids, hidden), 0.0),
        0.0,
    ));

    let (rows, width, eps) = (6, 1000, 1e-6f32);
    let x = noise(rows * width, 2, 3.0);
    let weight = noise(width, 3, 1.0);
    let gather = [4u32, 0, 5];
    let (x_d, w_d, rows_d) = (gpu.upload(&x, "test")?, gpu.upload(&weight, "test")?, gpu.upload(&gather, "test")?);
    let (out_d, out32_d) = (gpu.zeros::<u16>(rows * width, "test")?, gpu.zeros::<f32>(rows * width, "test")?);
    launch!(
        gpu,
        k.rms_norm,
        per_row(gather.len()),
        [raw(&x_d, s), raw(&rows_d, s), raw(&w_d, s), raw(&out_d, s), raw(&out32_d, s), width as i32, eps,]
    )?;
    let (expected_half, expected) = reference::rms_norm::<T>(&x, Some(&gather), &weight, eps);
    let mut got32 = vec![0.0f32; gather.len() * width];
    gpu.read(&out32_d, &mut got32)?;
    let got_half = read_half(&out_d, gather.len() * width)?;
    checks.push(Check::new(format!("rms_norm f32 {}", T::NAME), relative_error(got32, expected, 1e-3), 1e-5));
    let expected_half: Vec<f32> = expected_half.iter().map(|v| v.to_f32()).collect();
    checks.push(Check::new(format!("rms_norm stored {}", T::NAME), relative_error(got_half, expected_half, 1e-2), ulp));

    let (tokens, inter) = (5, 700);
    let gate_up = noise(tokens * 2 * inter, 4, 6.0);
    let (gu_d, act_d) = (gpu.upload(&gate_up, "test")?, gpu.zeros::<u16>(tokens * inter, "test")?);
    let n = tokens * inter;
    launch!(gpu, k.silu_mul, grid_stride(n), [raw(&gu_d, s), raw(&act_d, s), inter as i32, n as i64])?;
    let expected: Vec<f32> = reference::silu_mul::<T>(&gate_up, inter).iter().map(|v| v.to_f32()).collect();
    checks.push(Check::new(
        format!("silu_mul {}", T::NAME),
        relative_error(read_half(&act_d, n)?, expected, 1e-2),
        2.0 * ulp,
    ));

    let (rows, vocab) = (3, 151_936);
    let mut logits = noise(rows * vocab, 5, 8.0);
    logits[vocab + 1234] = 20.0;
    logits[2 * vocab + 7] = f32::NEG_INFINITY;
    let (l_d, stats_d) = (gpu.upload(&logits, "test")?, gpu.zeros::<f32>(rows * 3, "test")?);
    launch!(gpu, k.logit_stats, per_row(rows), [raw(&l_d, s), vocab as i32, raw(&stats_d, s)])?;
    let mut stats = vec![0.0f32; rows * 3];
    gpu.read(&stats_d, &mut stats)?;
    let (mut argmax_misses, mut worst) = (0.0, 0.0f64);
    for r in 0..rows {
        let (argmax, top_p, entropy) = reference::logit_stats(&logits[r * vocab..(r + 1) * vocab]);
        argmax_misses += f64::from(stats[r * 3].to_bits() != argmax);
        worst = worst.max(((stats[r * 3 + 1] - top_p).abs() / top_p) as f64);
        worst = worst.max(((stats[r * 3 + 2] - entropy).abs() / entropy.max(1e-3)) as f64);
    }
    checks.push(Check::new("logit_stats argmax", argmax_misses, 0.0));
    checks.push(Check::new("logit_stats probability and entropy", worst, 1e-4));
    Ok(checks)
}

/// Feeds each row's prompt, then its decode tokens one step at a time, all rows in one
/// varlen batch (`together`) or each alone; returns every step's logits, rows in order.
fn run_rows(
    backend: &mut dyn Backend,
    prompts: &[Vec<u32>],
    decode: &[Vec<u32>],
    together: bool,
) -> Result<Vec<Vec<f32>>> {
    let mut seqs: Vec<KvSeq> = prompts.iter().map(|_| backend.new_sequence()).collect();
    let groups: Vec<Vec<usize>> =
        if together { vec![(0..prompts.len()).collect()] } else { (0..prompts.len()).map(|r| vec![r]).collect() };
    let mut all = Vec::new();
    for step in 0..=decode[0].len() {
        let mut step_logits = Vec::new();
        for group in &groups {
            let mut rows: Vec<RowInput<'_>> = Vec::new();
            for (r, seq) in seqs.iter_mut().enumerate().filter(|(r, _)| group.contains(r)) {
                let (tokens, start) = if step == 0 {
                    (&prompts[r][..], 0)
                } else {
                    (&decode[r][step - 1..step], prompts[r].len() + step - 1)
                };
                rows.push(RowInput { kv: seq, tokens, start });
            }
            step_logits.extend(backend.forward(&mut rows, false)?.logits);
        }
        all.push(step_logits);
    }
    Ok(all)
}

/// A model's logits on the card (bf16) against the CPU backend in f32: prefills of
/// different lengths and decode steps in one varlen batch, then the same rows alone.
pub fn check_model(dir: &Path, ordinal: usize, dtype: WeightDtype) -> Result<Vec<Check>> {
    let cpu_options = LoadOptions { dtype: WeightDtype::F32, kv_budget_bytes: 256 << 20, ..LoadOptions::default() };
    let mut cpu = CandleBackend::load(dir, &cpu_options)?;
    let options = LoadOptions { dtype, kv_budget_bytes: 1 << 30, ..LoadOptions::default() };
    let mut gpu = CudaBackend::load(dir, &options, ordinal)?;
    let vocab = cpu.config().vocab_size as u64;
    let mut rng = SplitMix64(11);
    let mut tokens = |n: usize| -> Vec<u32> { (0..n).map(|_| rng.below(vocab) as u32).collect() };
    let prompts: Vec<Vec<u32>> = [37usize, 5, 130, 1].iter().map(|&n| tokens(n)).collect();
    let decode: Vec<Vec<u32>> = prompts.iter().map(|_| tokens(8)).collect();
    let reference = run_rows(&mut cpu, &prompts, &decode, true)?;
    let batched = run_rows(&mut gpu, &prompts, &decode, true)?;
    let alone = run_rows(&mut gpu, &prompts, &decode, false)?;
    let spread = |logits: &[f32]| logits.iter().fold(0.0f32, |m, v| m.max(v.abs())) as f64;
    let largest_gap = |x: &[f32], y: &[f32]| x.iter().zip(y).map(|(p, q)| (p - q).abs() as f64).fold(0.0, f64::max);
    let v = vocab as usize;
    let mut checks = Vec::new();
    let (mut worst, mut worst_alone, mut disagreements) = (0.0f64, 0.0f64, 0.0);
    for ((r, b), a) in reference.iter().zip(&batched).zip(&alone) {
        let scale = spread(r).max(1e-6);
        worst = worst.max(largest_gap(b, r) / scale);
        worst_alone = worst_alone.max(largest_gap(b, a) / scale);
        for row in 0..prompts.len() {
            let (cpu_row, gpu_row) = (&r[row * v..(row + 1) * v], &b[row * v..(row + 1) * v]);
            let (cpu_pick, gpu_pick) = (reference::logit_stats(cpu_row).0, reference::logit_stats(gpu_row).0);
            // A different pick counts only where the CPU's margin for its own exceeds what
            // rounding moved this row's logits by (twice, one each way).
            let margin = (cpu_row[cpu_pick as usize] - cpu_row[gpu_pick as usize]) as f64;
            disagreements += f64::from(cpu_pick != gpu_pick && margin > 2.0 * largest_gap(cpu_row, gpu_row));
        }
    }
    let name = dtype.as_str();
    // bf16 keeps 8 mantissa bits: weights and GEMM inputs rounded once each move logits
    // by a few percent of their range through a deep stack.
    let tolerance = if dtype == WeightDtype::Bf16 { 0.08 } else { 0.02 };
    checks.push(Check::new(format!("model logits {name} vs f32 CPU (max error / max |logit|)"), worst, tolerance));
    checks.push(Check::new(
        format!("model greedy token {name} vs f32 CPU (clear-margin disagreements)"),
        disagreements,
        0.0,
    ));
    // A row's GEMMs differ with the batch's size (cuBLAS picks another kernel): f32 sums
    // in another order, then one more 2-byte rounding; no more than against the CPU.
    checks.push(Check::new(format!("varlen batch vs rows alone {name}"), worst_alone, tolerance));
    Ok(checks)
}

/// Speed against the card's own limits, measured beside the steps.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Speed {
    pub device: String,
    pub copy_bytes_per_s: f64,
    pub gemm_flops_per_s: f64,
    pub weight_bytes: usize,
    pub decode_b1_s: f64,
    pub decode_b1_fraction: f64,
    pub decode_b64_tokens_per_s: f64,
    pub prefill_tokens: usize,
    pub prefill_s: f64,
    pub prefill_fraction: f64,
}

/// A model of `config`'s shape with random bf16 weights made on the card: batch-1 and
/// batch-64 decode at a 128-token context, one prefill of `prefill` tokens.
pub fn measure_speed(config: ModelConfig, ordinal: usize, prefill: usize) -> Result<Speed> {
    let options = LoadOptions {
        dtype: WeightDtype::Bf16,
        kv_budget_bytes: 24 << 30,
        block_size: 16,
        prefix_cache: false,
        ..LoadOptions::default()
    };
    let mut model = CudaBackend::random(config.clone(), &options, ordinal, 7)?;
    let weight_bytes = model.streamed_weight_bytes();
    let copy = copy_bandwidth(&model)?;
    let gemm = gemm_rate(&model, prefill, config.hidden_size)?;
    let decode_b1_s = decode_seconds(&mut model, 1, 128, 20)?;
    let decode_b64_s = decode_seconds(&mut model, 64, 128, 10)?;
    let mut seq = model.new_sequence();
    let prompt: Vec<u32> = (0..prefill as u32).map(|t| t % config.vocab_size as u32).collect();
    model.forward(&mut [RowInput { kv: &mut seq, tokens: &prompt, start: 0 }], false)?;
    let start = Instant::now();
    model.forward(&mut [RowInput { kv: &mut seq, tokens: &prompt, start: 0 }], false)?;
    let prefill_s = start.elapsed().as_secs_f64();
    // The layers' matrices for every token; the head for the last one only.
    let layer_weights = (weight_bytes / 2 - config.vocab_size * config.hidden_size) as f64;
    let flops = 2.0 * layer_weights * prefill as f64;
    Ok(Speed {
        device: model.device_name(),
        copy_bytes_per_s: copy,
        gemm_flops_per_s: gemm,
        weight_bytes,
        decode_b1_s,
        decode_b1_fraction: weight_bytes as f64 / decode_b1_s / copy,
        decode_b64_tokens_per_s: 64.0 / decode_b64_s,
        prefill_tokens: prefill,
        prefill_s,
        prefill_fraction: flops / prefill_s / gemm,
    })
}

/// The median step of `steps` decode steps of `batch` rows at `context`.
fn decode_seconds(model: &mut CudaBackend, batch: usize, context: usize, steps: usize) -> Result<f64> {
    let mut seqs: Vec<KvSeq> = (0..batch).map(|_| model.new_sequence()).collect();
    let prompt: Vec<u32> = (0..context as u32).collect();
    for seq in seqs.iter_mut() {
        model.forward(&mut [RowInput { kv: seq, tokens: &prompt, start: 0 }], false)?;
    }
    let token = [1u32];
    let mut times = Vec::with_capacity(steps);
    for step in 0..steps {
        let mut rows: Vec<RowInput<'_>> =
            seqs.iter_mut().map(|kv| RowInput { kv, tokens: &token, start: context + step }).collect();
        let start = Instant::now();
        model.forward(&mut rows, false)?;
        times.push(start.elapsed().as_secs_f64());
    }
    Ok(crate::model::machine::median(&times))
}

/// Device-to-device copy of 2 GiB: bytes read per second (the best of five).
fn copy_bandwidth(model: &CudaBackend) -> Result<f64> {
    let gpu = model.gpu();
    let n = 1usize << 30;
    let src = gpu.zeros::<u16>(n, "the bandwidth probe")?;
    let mut dst = gpu.zeros::<u16>(n, "the bandwidth probe")?;
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        gpu.synchronize()?;
        let start = Instant::now();
        gpu.stream.memcpy_dtod(&src, &mut dst).map_err(super::gpu::driver_error("copying"))?;
        gpu.synchronize()?;
        best = best.min(start.elapsed().as_secs_f64());
    }
    // A copy reads and writes every byte: what a step that streams weights can reach is
    // bounded by the total traffic.
    Ok(2.0 * (n * 2) as f64 / best)
}

/// cuBLAS's bf16 rate at the prefill's shape (`tokens × hidden × 4·hidden`).
fn gemm_rate(model: &CudaBackend, tokens: usize, hidden: usize) -> Result<f64> {
    let gpu = model.gpu();
    let rows = 4 * hidden;
    let w = Matrix { data: gpu.zeros::<u16>(rows * hidden, "the GEMM probe")?, rows, cols: hidden };
    let x = gpu.zeros::<u16>(tokens * hidden, "the GEMM probe")?;
    let out = gpu.zeros::<f32>(tokens * rows, "the GEMM probe")?;
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        gpu.synchronize()?;
        let start = Instant::now();
        gpu.matmul(&w, raw(&x, &gpu.stream), tokens, raw(&out, &gpu.stream), 0.0)?;
        gpu.synchronize()?;
        best = best.min(start.elapsed().as_secs_f64());
    }
    Ok(2.0 * (tokens * rows * hidden) as f64 / best)
}
