//! Statistics of a logit row that policies read: normalized entropy and the top-k values.
//!
//! Both run once per row per step over the whole vocabulary (151,936 for Qwen3), so they
//! are written to vectorize: fixed-width lanes, no branches in the inner loops, and an
//! exp that the compiler can keep in SIMD registers instead of calling libm per element.

/// Lanes per inner iteration; 16 f32 fill one AVX-512 register or two AVX2 ones.
const LANES: usize = 16;
/// Elements summed in f32 before the partial sums move to f64 (bounds rounding error).
const BLOCK: usize = 1024;
/// `exp(-87)` is near f32's smallest normal; anything lower contributes nothing.
const EXP_FLOOR: f32 = -87.0;

/// Normalized entropy `H = −Σ p ln p / ln |V|` of `softmax(logits)`, in [0, 1].
///
/// Computed as `ln Z − Σ e^{x−m}(x−m) / Z` with `m` the max logit, so no probability is
/// materialized and nothing overflows. Masked (−∞) logits count as probability zero.
/// Rows with fewer than two entries, or no finite maximum, have entropy 0.
pub fn normalized_entropy(logits: &[f32]) -> f64 {
    if logits.len() < 2 {
        return 0.0;
    }
    let max = max_value(logits);
    if !max.is_finite() {
        return 0.0;
    }
    let (z, weighted) = exp_moments(logits, max);
    let entropy = z.ln() - weighted / z;
    (entropy / (logits.len() as f64).ln()).clamp(0.0, 1.0)
}

fn max_value(values: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = values.chunks_exact(LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (lane, &v) in lanes.iter_mut().zip(chunk) {
            // `if` rather than f32::max: compiles to one SIMD max and skips NaN alike.
            if v > *lane {
                *lane = v;
            }
        }
    }
    lanes.iter().chain(tail).copied().fold(f32::NEG_INFINITY, f32::max)
}

/// `(Σ e^{d}, Σ e^{d}·d)` with `d = x − max`, accumulated in f64 per block.
fn exp_moments(values: &[f32], max: f32) -> (f64, f64) {
    let (mut z, mut weighted) = (0f64, 0f64);
    for block in values.chunks(BLOCK) {
        let mut z_lanes = [0f32; LANES];
        let mut w_lanes = [0f32; LANES];
        let chunks = block.chunks_exact(LANES);
        let tail = chunks.remainder();
        for chunk in chunks {
            for i in 0..LANES {
                let d = (chunk[i] - max).max(EXP_FLOOR);
                let e = exp_nonpositive(d);
                z_lanes[i] += e;
                w_lanes[i] += e * d;
            }
        }
        for &v in tail {
            let d = (v - max).max(EXP_FLOOR);
            let e = exp_nonpositive(d);
            z_lanes[0] += e;
            w_lanes[0] += e * d;
        }
        z += z_lanes.iter().map(|&v| v as f64).sum::<f64>();
        weighted += w_lanes.iter().map(|&v| v as f64).sum::<f64>();
    }
    (z, weighted)
}

/// `e^x` for x in [−87, 0], relative error ~2e-7: x = n·ln2 + r, |r| ≤ ln2/2, a degree-6
/// polynomial for e^r and 2^n built directly in the exponent bits. Branch-free so the
/// loops above vectorize.
#[inline(always)]
fn exp_nonpositive(x: f32) -> f32 {
    // Adding 1.5·2^23 rounds to the nearest integer and leaves it in the low mantissa bits.
    const ROUND: f32 = 12_582_912.0;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    let shifted = x * std::f32::consts::LOG2_E + ROUND;
    let n = shifted - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = 1.0 + r * (1.0 + r * (0.5 + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    let n_int = shifted.to_bits() as i32 - ROUND.to_bits() as i32;
    let scale = f32::from_bits(((n_int + 127) << 23) as u32);
    p * scale
}

/// The `k` largest values in descending order (NaN ignored). When the row has fewer
/// than `k` values the result is padded with its smallest one (0 for an empty row), so
/// a fixed-width consumer (R2R's top-100 projection) always gets `k` numbers.
pub fn top_k_desc(values: &[f32], k: usize) -> Vec<f32> {
    if k == 0 {
        return Vec::new();
    }
    let mut top: Vec<f32> = Vec::with_capacity(k + 1);
    let chunks = values.chunks_exact(LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        // Once the list is full almost every chunk lies wholly below its minimum; a
        // vectorized chunk max skips those without a per-element branch.
        if top.len() == k && chunk_max(chunk) <= top[k - 1] {
            continue;
        }
        chunk.iter().for_each(|&v| offer(&mut top, k, v));
    }
    tail.iter().for_each(|&v| offer(&mut top, k, v));
    let pad = top.last().copied().unwrap_or(0.0);
    top.resize(k, pad);
    top
}

fn chunk_max(chunk: &[f32]) -> f32 {
    chunk.iter().fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m })
}

/// Inserts `v` into the descending list `top` if it belongs among the `k` largest.
fn offer(top: &mut Vec<f32>, k: usize, v: f32) {
    if v.is_nan() || (top.len() == k && v <= top[k - 1]) {
        return;
    }
    let at = top.partition_point(|&t| t >= v);
    top.insert(at, v);
    top.truncate(k);
}

/// Logistic function in f64, saturating cleanly for large |x|.
pub fn sigmoid(x: f64) -> f64 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Straightforward reference: softmax in f64, then −Σ p ln p / ln |V|.
    fn reference_entropy(logits: &[f32]) -> f64 {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let exps: Vec<f64> = logits.iter().map(|&x| (x as f64 - max).exp()).collect();
        let z: f64 = exps.iter().sum();
        let h: f64 = exps.iter().map(|e| e / z).filter(|&p| p > 0.0).map(|p| -p * p.ln()).sum();
        h / (logits.len() as f64).ln()
    }

    fn pseudo_random_logits(n: usize, scale: f32, seed: u64) -> Vec<f32> {
        (0..n).map(|i| (crate::policy::policy_uniform(seed, i, 7) as f32 - 0.5) * scale).collect()
    }

    #[test]
    fn fast_exp_matches_std_over_its_range() {
        let mut worst = 0f32;
        for i in 0..=87_000 {
            let x = -(i as f32) / 1000.0;
            let (fast, exact) = (exp_nonpositive(x), x.exp());
            worst = worst.max(((fast - exact) / exact).abs());
        }
        assert!(worst < 1e-6, "worst relative error {worst}");
    }

    #[test]
    fn flat_logits_have_entropy_one_and_a_peak_has_entropy_zero() {
        assert!((normalized_entropy(&vec![3.5; 1000]) - 1.0).abs() < 1e-6);
        let mut peaked = vec![0.0f32; 1000];
        peaked[17] = 100.0;
        assert!(normalized_entropy(&peaked) < 1e-6);
    }

    #[test]
    fn entropy_matches_the_reference_on_realistic_rows() {
        for (n, scale) in [(151_936, 20.0), (1000, 5.0), (37, 1.0), (2, 0.3)] {
            let logits = pseudo_random_logits(n, scale, n as u64);
            let (fast, exact) = (normalized_entropy(&logits), reference_entropy(&logits));
            assert!((fast - exact).abs() < 1e-5, "n={n}: {fast} vs {exact}");
        }
    }

    #[test]
    fn two_equal_candidates_among_masked_logits() {
        // Two tokens share all the mass: H = ln 2 / ln |V|, whatever the masked rest is.
        let mut logits = vec![f32::NEG_INFINITY; 64];
        logits[3] = 1.0;
        logits[40] = 1.0;
        let expected = 2f64.ln() / 64f64.ln();
        assert!((normalized_entropy(&logits) - expected).abs() < 1e-6);
    }

    #[test]
    fn degenerate_rows_have_zero_entropy() {
        assert_eq!(normalized_entropy(&[]), 0.0);
        assert_eq!(normalized_entropy(&[4.0]), 0.0);
        assert_eq!(normalized_entropy(&[f32::NEG_INFINITY; 8]), 0.0);
    }

    #[test]
    fn top_k_is_sorted_descending_and_exact() {
        let values = pseudo_random_logits(5000, 10.0, 3);
        let mut sorted = values.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        assert_eq!(top_k_desc(&values, 100), sorted[..100].to_vec());
    }

    #[test]
    fn top_k_pads_short_rows_and_skips_nan() {
        assert_eq!(top_k_desc(&[1.0, f32::NAN, 3.0], 4), vec![3.0, 1.0, 1.0, 1.0]);
        assert_eq!(top_k_desc(&[], 2), vec![0.0, 0.0]);
        assert_eq!(top_k_desc(&[2.0, 2.0, 1.0], 2), vec![2.0, 2.0]);
    }

    /// `cargo test --release -p tokenrouter-core --lib policy::logits -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn bench_entropy_151936_logits_32_rows() {
        let rows: Vec<Vec<f32>> = (0..32).map(|i| pseudo_random_logits(151_936, 20.0, i)).collect();
        let run = || rows.iter().map(|r| normalized_entropy(r)).sum::<f64>();
        std::hint::black_box(run());
        let reps = 50;
        let start = std::time::Instant::now();
        for _ in 0..reps {
            std::hint::black_box(run());
        }
        let per_step = start.elapsed().as_secs_f64() / reps as f64;
        println!("rstitch entropy, 32 rows x 151,936 logits: {:.3} ms per step", per_step * 1e3);
    }

    #[test]
    fn sigmoid_is_symmetric_and_saturates() {
        assert_eq!(sigmoid(0.0), 0.5);
        assert!((sigmoid(2.0) + sigmoid(-2.0) - 1.0).abs() < 1e-15);
        assert_eq!(sigmoid(1000.0), 1.0);
        assert_eq!(sigmoid(-1000.0), 0.0);
    }
}
