//! Our matmul against candle's GEMM, on the shapes of the model presets.
//! `cargo run --release -p tokenrouter-core --example matmul_bench`

use candle_core::{Device, Tensor};
use tokenrouter_core::model::matmul::{matmul_xwt, pack_panels, panel_len, Panels};

/// A row-major `(n, k)` matrix in the panel layout our kernel reads.
fn panels_of<W: Copy + Send + Sync>(rows: &[W], n: usize, k: usize) -> Vec<W> {
    let mut dst = vec![rows[0]; panel_len(n, k)];
    pack_panels(rows, n, k, &mut dst);
    dst
}

/// One untimed warm-up call, then the best of `runs`.
fn best_of(runs: usize, mut f: impl FnMut()) -> f64 {
    f();
    tokenrouter_core::model::machine::best_seconds(runs, f)
}

fn main() -> candle_core::Result<()> {
    tokenrouter_core::model::threads::configure(None);
    {
        use rayon::prelude::*;
        let data = vec![1.0f32; 80 << 20];
        for chunk in [1usize << 16, 1 << 20, 10 << 20] {
            let t = best_of(5, || {
                let s: f32 = data
                    .par_chunks(chunk)
                    .map(|c| {
                        let mut acc = [0f32; 16];
                        for v in c.chunks_exact(16) {
                            for l in 0..16 {
                                acc[l] += v[l];
                            }
                        }
                        acc.iter().sum::<f32>()
                    })
                    .sum();
                std::hint::black_box(s);
            });
            println!("read-only sum, chunk {chunk}: {:.1} GB/s", (data.len() * 4) as f64 / t / 1e9);
        }
        println!("triad: {:.1} GB/s", tokenrouter_core::model::machine::measure_triad_bandwidth());
        for huge in [false, true] {
            let (k, n) = (512usize, 151_936usize);
            let mut w: Vec<f32> = Vec::with_capacity(n * k);
            if huge {
                unsafe {
                    let p = w.as_mut_ptr() as usize;
                    let start = (p + (2 << 20) - 1) & !((2 << 20) - 1);
                    let end = (p + n * k * 4) & !((2 << 20) - 1);
                    let r = libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
                    println!("madvise -> {r}");
                }
            }
            w.resize(panel_len(n, k), 0.5);
            let x = vec![1.0f32; k];
            let mut y = vec![0f32; n];
            let t = best_of(5, || matmul_xwt(&x, Panels::new(&w, n, k), &mut y, 1));
            println!("lm_head m=1 huge={huge}: {:.2} ms, {:.1} GB/s", t * 1e3, (n * k * 4) as f64 / t / 1e9);
        }
    }
    if let Ok(rows) = std::env::var("MATMUL_STACK_ROWS") {
        for m in rows.split(',').filter_map(|r| r.trim().parse::<usize>().ok()) {
            stack(m);
        }
        return Ok(());
    }
    // MATMUL_ROWS=1,8,128 times other row counts.
    let rows: Vec<usize> = std::env::var("MATMUL_ROWS")
        .map(|v| v.split(',').filter_map(|r| r.trim().parse().ok()).collect())
        .unwrap_or_else(|_| vec![1, 8, 32, 64]);
    // MATMUL_SHAPES=k:n,k:n times other (k, n) weight shapes.
    let shapes: Vec<(usize, usize)> = std::env::var("MATMUL_SHAPES")
        .map(|v| {
            v.split(',')
                .filter_map(|s| s.split_once(':'))
                .filter_map(|(k, n)| Some((k.trim().parse().ok()?, n.trim().parse().ok()?)))
                .collect()
        })
        .unwrap_or_else(|_| vec![(512, 3072), (1536, 512), (512, 151_936), (1024, 6144), (3072, 1024), (1024, 2048)]);
    println!("{:>5} {:>6} {:>7} {:>11} {:>11} {:>8} {:>9}", "m", "k", "n", "candle ms", "ours ms", "GB/s", "GFLOP/s");
    println!("(then: f16 ours ms)");
    for &(k, n) in &shapes {
        let w = Tensor::randn(0f32, 1.0, (n, k), &Device::Cpu)?;
        let w_rows: Vec<f32> = w.flatten_all()?.to_vec1()?;
        let wv = panels_of(&w_rows, n, k);
        let wh = panels_of(&w_rows.iter().map(|&v| half::f16::from_f32(v)).collect::<Vec<_>>(), n, k);
        for &m in &rows {
            let x = Tensor::randn(0f32, 1.0, (m, k), &Device::Cpu)?;
            let xv: Vec<f32> = x.flatten_all()?.to_vec1()?;
            let wt = w.t()?;
            let c = best_of(5, || {
                std::hint::black_box(x.matmul(&wt).unwrap());
            });
            let mut y = vec![0f32; m * n];
            let o = best_of(5, || matmul_xwt(&xv, Panels::new(&wv, n, k), &mut y, m));
            let o16 = best_of(5, || matmul_xwt(&xv, Panels::new(&wh, n, k), &mut y, m));
            let gbs = (n * k * 4) as f64 / o / 1e9;
            let gflops = 2.0 * (m * n * k) as f64 / o / 1e9;
            println!(
                "{m:>5} {k:>6} {n:>7} {:>11.3} {:>11.3} {gbs:>8.1} {gflops:>9.1} {:>9.3}",
                c * 1e3,
                o * 1e3,
                o16 * 1e3
            );
        }
    }
    Ok(())
}

/// The matrices of one `medium` (or `small`) decode step (16 layers, then the LM head), each fresh
/// from memory as in a real step: effective GB/s of the whole stack at `m` rows.
/// `MATMUL_STACK_F16=1` stores them in f16.
fn stack(m: usize) {
    if std::env::var_os("MATMUL_STACK_F16").is_some() {
        return stack_of::<half::f16>(m);
    }
    stack_of::<f32>(m)
}

fn stack_of<W: tokenrouter_core::model::simd::Elem>(m: usize) {
    let value = W::from_f32(0.01);
    // `MATMUL_STACK_SMALL=1`: the `small` preset's step instead.
    let small = std::env::var_os("MATMUL_STACK_SMALL").is_some();
    let (hidden, layers) = if small { (512, 8) } else { (1024, 16) };
    let layer = [(hidden, 2 * hidden), (hidden, hidden), (hidden, 6 * hidden), (3 * hidden, hidden)];
    let mut mats: Vec<(usize, usize, Vec<W>)> = Vec::new();
    for _ in 0..layers {
        for &(k, n) in &layer {
            mats.push((k, n, vec![value; panel_len(n, k)]));
        }
    }
    mats.push((hidden, 151_936, vec![value; panel_len(151_936, hidden)]));
    if std::env::var_os("MATMUL_HUGE").is_some() {
        return huge_against_small_pages(m, mats);
    }
    let x = vec![1.0f32; m * 6144];
    let mut y = vec![0f32; m * 151_936];
    // `MATMUL_PARTS=1`: the layers' matrices and the head timed apart too (per-call costs
    // weigh on the small layer matrices, not on the head).
    let (layers, head) = mats.split_at(mats.len() - 1);
    let mut parts = vec![("stack", &mats[..])];
    if std::env::var_os("MATMUL_PARTS").is_some() {
        parts.extend([("layers", layers), ("head", head)]);
    }
    for (name, part) in parts {
        let bytes: usize = part.iter().map(|(k, n, _)| k * n * std::mem::size_of::<W>()).sum();
        let t = best_of(5, || {
            for (k, n, w) in part {
                matmul_xwt(&x[..m * k], Panels::new(w, *n, *k), &mut y[..m * n], m);
            }
        });
        println!("{name} m={m}: {:.2} ms, {:.1} GB/s ({} matrices)", t * 1e3, bytes as f64 / t / 1e9, part.len());
    }
}

/// `MATMUL_HUGE=1`: the same stack from 4 KiB and from 2 MiB pages, timed alternately.
/// (The copy allocated second runs a few percent faster even when both are on 4 KiB
/// pages: `examples/decode_bench` with `DECODE_HUGE_PAIRED` loads in either order.)
fn huge_against_small_pages<W: tokenrouter_core::model::simd::Elem>(m: usize, small: Vec<(usize, usize, Vec<W>)>) {
    use tokenrouter_core::model::huge_pages::prefer_huge_pages;
    use tokenrouter_core::model::machine::median as med;
    let huge: Vec<_> = small.iter().map(|(k, n, w)| (*k, *n, w.clone())).collect();
    let advised: usize = huge.iter().map(|(_, _, w)| prefer_huge_pages(w)).sum();
    println!("huge pages: {} MiB", advised >> 20);
    let x = vec![1.0f32; m * 6144];
    let mut y = vec![0f32; m * 151_936];
    let mut run = |mats: &[(usize, usize, Vec<W>)]| {
        let t = std::time::Instant::now();
        for (k, n, w) in mats {
            matmul_xwt(&x[..m * k], Panels::new(w, *n, *k), &mut y[..m * n], m);
        }
        t.elapsed().as_secs_f64() * 1e3
    };
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..12 {
        a.push(run(&small));
        b.push(run(&huge));
    }
    let ratios: Vec<f64> = a.iter().zip(&b).map(|(s, h)| h / s).collect();
    println!(
        "stack m={m}: 4K min {:.2} med {:.2} ms, 2M min {:.2} med {:.2} ms, paired 2M/4K median {:.3}",
        a.iter().cloned().fold(f64::MAX, f64::min),
        med(&a),
        b.iter().cloned().fold(f64::MAX, f64::min),
        med(&b),
        med(&ratios)
    );
}
