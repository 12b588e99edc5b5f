//! `model::qmatmul` alone on SmolLM2-135M's matrix shapes (30 layers of Q4_1 q/k/v,
//! o, gate/up, down and a Q8_0 49152-row head, ~110 MB, more than the caches hold):
//! weight GB/s at batch 1 and at more rows, beside a plain read of the same bytes (the
//! ceiling for a kernel that streams its weights once).
//!
//! `cargo run --release -p tokenrouter-core --example qmatmul_bench -- [ROUNDS]`

use tokenrouter_core::model::qmatmul::{matmul, Format};

/// (rows, cols, format) per layer, then the head.
const LAYER: [(usize, usize); 4] = [(960, 576), (576, 576), (3072, 576), (576, 1536)];
const LAYERS: usize = 30;
const HEAD: (usize, usize) = (49152, 576);

struct Matrix {
    format: Format,
    n: usize,
    k: usize,
    bytes: Vec<u8>,
}

fn main() {
    tokenrouter_core::model::threads::configure(None);
    let rounds: usize = std::env::args().nth(1).and_then(|r| r.parse().ok()).unwrap_or(10);
    let mut seed = 1u64;
    let mut matrices: Vec<Matrix> = Vec::new();
    for _ in 0..LAYERS {
        for &(n, k) in &LAYER {
            matrices.push(random_matrix(Format::Q4_1, n, k, &mut seed));
        }
    }
    matrices.push(random_matrix(Format::Q8_0, HEAD.0, HEAD.1, &mut seed));
    let total: usize = matrices.iter().map(|m| m.bytes.len()).sum();
    println!("{} MB of weights, {} threads", total / 1_000_000, rayon::current_num_threads());
    // Best of `rounds` passes: on a shared machine the fastest pass is the one least
    // disturbed by other work.
    let best = |f: &mut dyn FnMut()| tokenrouter_core::model::machine::best_seconds(rounds, f);
    let seconds = best(&mut || {
        let sink = matrices.iter().fold(0u64, |s, m| s ^ plain_read(&m.bytes));
        std::hint::black_box(sink);
    });
    let mut line = format!("plain read {:.1} GB/s", total as f64 / seconds / 1e9);
    for rows in [1, 4, 8, 32, 128] {
        let x: Vec<f32> = (0..rows * 1536).map(|i| ((i * 7919 % 2001) as f32 - 1000.0) / 1000.0).collect();
        let seconds = best(&mut || {
            for m in &matrices {
                std::hint::black_box(matmul(m.format, &m.bytes, m.n, m.k, &x[..rows * m.k], rows).unwrap());
            }
        });
        line += &format!(", m={rows}: {:.1} GB/s ({:.2} ms)", total as f64 / seconds / 1e9, seconds * 1e3);
    }
    println!("{line}");
}

/// Blocks with random values and small finite scales.
fn random_matrix(format: Format, n: usize, k: usize, seed: &mut u64) -> Matrix {
    let (block, scales) = match format {
        Format::Q4_1 => (20, 2),
        Format::Q8_0 => (34, 1),
    };
    let mut bytes = vec![0u8; n * k / 32 * block];
    for b in bytes.chunks_exact_mut(block) {
        for v in b.iter_mut() {
            *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            *v = (*seed >> 56) as u8;
        }
        for s in 0..scales {
            b[2 * s..2 * s + 2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
        }
    }
    Matrix { format, n, k, bytes }
}

/// Sums the bytes as u64 words: the compiler vectorizes it, so it runs at read bandwidth.
fn plain_read(bytes: &[u8]) -> u64 {
    bytes.chunks_exact(8).fold(0u64, |s, w| s ^ u64::from_le_bytes(w.try_into().unwrap()))
}
