//! Tests of the quantized matmul (kept apart to keep the kernel file short).

use candle_core::quantized::QTensor;
use candle_core::{Device, Tensor};

use super::*;

/// Deterministic values in [-1, 1) from a seed (no rand dependency needed).
fn values(len: usize, seed: u64) -> Vec<f32> {
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..len)
        .map(|_| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn quantized(format: Format, n: usize, k: usize, seed: u64) -> (Vec<u8>, Vec<f32>) {
    let dense = Tensor::from_vec(values(n * k, seed), (n, k), &Device::Cpu).unwrap();
    let dtype = match format {
        Format::Q4_1 => GgmlDType::Q4_1,
        Format::Q8_0 => GgmlDType::Q8_0,
    };
    let q = QTensor::quantize(&dense, dtype).unwrap();
    let back = q.dequantize(&Device::Cpu).unwrap().flatten_all().unwrap().to_vec1().unwrap();
    (q.data().unwrap().into_owned(), back)
}

fn dense_product(x: &[f32], w: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    let mut y = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            y[i * n + j] = (0..k).map(|p| x[i * k + p] as f64 * w[j * k + p] as f64).sum::<f64>() as f32;
        }
    }
    y
}

/// The largest `|a - b|` over the largest `|b|`: the error relative to the output's scale.
fn relative_error(a: &[f32], b: &[f32]) -> f32 {
    let scale = b.iter().fold(0f32, |s, v| s.max(v.abs())).max(1e-6);
    a.iter().zip(b).fold(0f32, |e, (x, y)| e.max((x - y).abs())) / scale
}

#[test]
fn simd_and_scalar_agree_and_track_the_dequantized_product() {
    let best = Kernel::best();
    for format in [Format::Q4_1, Format::Q8_0] {
        for &(m, k, n) in &[(1, 32, 1), (1, 64, 7), (3, 96, 5), (8, 576, 33), (33, 256, 64), (2, 1536, 9)] {
            let seed = (m * 1000 + k * 10 + n) as u64;
            let (w, w_dense) = quantized(format, n, k, seed);
            let x = values(m * k, seed + 1);
            let scalar = matmul_with(Kernel::Scalar, format, &w, n, k, &x, m).unwrap();
            let fast = matmul_with(best, format, &w, n, k, &x, m).unwrap();
            let exact = dense_product(&x, &w_dense, m, k, n);
            // Same integer sums, f32 additions in another order (measured: under 4e-7).
            let e = relative_error(&fast, &scalar);
            assert!(e < 1e-5, "{format:?} {m}x{k}x{n}: simd vs scalar {e}");
            // 8-bit activations: each value is off by up to half a step of amax/127
            // (0.4% of the block's largest value), errors that mostly cancel in a sum
            // (measured: 0.3-0.6% of the largest output).
            let e = relative_error(&scalar, &exact);
            assert!(e < 1e-2, "{format:?} {m}x{k}x{n}: vs dequantized f32 {e}");
        }
    }
}

/// Every kernel this CPU can run, the scalar reference first.
fn kernels() -> Vec<Kernel> {
    let mut all = vec![Kernel::Scalar];
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c") {
        all.push(Kernel::Avx2);
        let avx_vnni = is_x86_feature_detected!("avxvnni");
        if avx_vnni {
            all.push(Kernel::AvxVnni);
        }
        if is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vnni")
        {
            all.push(Kernel::Avx512Vnni { avx_vnni });
        }
    }
    all
}

#[test]
fn every_kernel_matches_the_plain_dot_product_at_odd_shapes() {
    // 1..40 weight rows cover whole groups of the batch-1 kernel and every tail;
    // batches 1-3 take the batch-1 kernel and the tiled one, 11 a tile of two groups
    // (the AVX-512 kernel's) and a ragged one.
    for format in [Format::Q4_1, Format::Q8_0] {
        for n in 1..=40 {
            for &(m, k) in &[(1, 32), (1, 96), (2, 64), (3, 160), (11, 64)] {
                let seed = (n * 100 + m * 10 + k) as u64;
                let (w, w_dense) = quantized(format, n, k, seed);
                let x = values(m * k, seed + 1);
                let exact = dense_product(&x, &w_dense, m, k, n);
                let reference = matmul_with(Kernel::Scalar, format, &w, n, k, &x, m).unwrap();
                let mut first_simd: Option<Vec<f32>> = None;
                for kernel in kernels() {
                    let got = matmul_with(kernel, format, &w, n, k, &x, m).unwrap();
                    if kernel != Kernel::Scalar {
                        // The SIMD kernels add in one order: equal bit for bit.
                        let first = first_simd.get_or_insert_with(|| got.clone());
                        assert_eq!(&got, first, "{kernel:?} {format:?} {m}x{k}x{n}: vs the first SIMD kernel");
                    }
                    let e = relative_error(&got, &reference);
                    assert!(e < 1e-5, "{kernel:?} {format:?} {m}x{k}x{n}: vs scalar {e}");
                    let e = relative_error(&got, &exact);
                    assert!(e < 2e-2, "{kernel:?} {format:?} {m}x{k}x{n}: vs dequantized f32 {e}");
                }
            }
        }
    }
}

#[test]
fn rows_are_independent_of_the_batch_they_are_in() {
    // A row's output must not depend on its neighbours, on the tile it lands in, or
    // on whether the batch splits weight rows (few rows) or input rows (a prompt:
    // 70 rows is past that switch for up to 8 threads) over the tasks.
    let (k, n) = (128, 11);
    for m in [9, 70] {
        for format in [Format::Q4_1, Format::Q8_0] {
            let (w, _) = quantized(format, n, k, 7);
            let x = values(m * k, 8);
            let all = matmul(format, &w, n, k, &x, m).unwrap();
            for i in 0..m {
                let one = matmul(format, &w, n, k, &x[i * k..(i + 1) * k], 1).unwrap();
                assert_eq!(one, all[i * n..(i + 1) * n], "{format:?} row {i} of {m}");
            }
        }
    }
}

#[test]
fn bad_shapes_are_errors_not_panics() {
    let (w, _) = quantized(Format::Q8_0, 4, 64, 1);
    assert!(matmul(Format::Q8_0, &w, 4, 64, &[0.0; 63], 1).is_err());
    assert!(matmul(Format::Q8_0, &w, 5, 64, &[0.0; 64], 1).is_err());
    assert!(matmul(Format::Q8_0, &w, 4, 48, &[0.0; 48], 1).is_err());
    assert!(matmul(Format::Q4_1, &w, 4, 64, &[0.0; 64], 1).is_err());
    assert_eq!(matmul(Format::Q8_0, &w, 4, 64, &[], 0).unwrap(), Vec::<f32>::new());
}

#[test]
fn zero_and_nan_rows_do_not_panic() {
    let (w, _) = quantized(Format::Q4_1, 3, 64, 2);
    assert_eq!(matmul(Format::Q4_1, &w, 3, 64, &[0.0; 64], 1).unwrap(), vec![0.0; 3]);
    let mut x = values(64, 3);
    x[5] = f32::NAN;
    assert_eq!(matmul(Format::Q4_1, &w, 3, 64, &x, 1).unwrap().len(), 3);
}
