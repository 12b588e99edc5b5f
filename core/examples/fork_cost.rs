//! What one parallel loop costs beyond its work, inside a step's `rayon::scope` (as the
//! candle backend runs a step): an empty 8-task loop after a serial gap of 0-50 µs (a
//! norm, a copy) between loops. A `small` batch-1 step runs ~60 such loops (7 per layer, the head); this bounds
//! what one parallel region per layer (barriers instead of fork-joins) could save.
//! `cargo run --release -p tokenrouter-core --example fork_cost`

use std::time::Instant;

use rayon::prelude::*;

fn spin(micros: u64) {
    let t = Instant::now();
    while t.elapsed().as_nanos() < u128::from(micros) * 1000 {
        std::hint::spin_loop();
    }
}

fn main() {
    let threads = tokenrouter_core::model::threads::configure(None);
    println!("{threads} threads");
    rayon::scope(|_| {
        for gap in [0u64, 2, 10, 50] {
            let loops = 20_000;
            let t = Instant::now();
            for _ in 0..loops {
                spin(gap);
                (0..8usize).into_par_iter().for_each(|i| {
                    std::hint::black_box(i);
                });
            }
            let per_loop = t.elapsed().as_secs_f64() / loops as f64 * 1e6 - gap as f64;
            println!("{gap:>3} µs serial between loops: {per_loop:.2} µs per loop beyond it");
        }
    });
}
