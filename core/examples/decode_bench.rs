//! Times decode steps of one model at one batch size, nothing else (for perf).
//! `cargo run --release -p tokenrouter-core --example decode_bench -- DIR BATCH STEPS`

use std::time::Instant;

use tokenrouter_core::model::{Backend, CandleBackend, LoadOptions, RowInput};

fn main() {
    tokenrouter_core::model::threads::configure(None);
    let args: Vec<String> = std::env::args().collect();
    let dir = std::path::PathBuf::from(&args[1]);
    let batch: usize = args[2].parse().unwrap();
    let steps: usize = args[3].parse().unwrap();
    let mut b = CandleBackend::load(&dir, &LoadOptions { kv_budget_bytes: 1 << 30, ..LoadOptions::default() }).unwrap();
    let mut seqs: Vec<_> = (0..batch).map(|_| b.new_sequence()).collect();
    let prompts: Vec<Vec<u32>> = (0..batch).map(|r| (0..128).map(|i| (r * 131 + i * 7) as u32).collect()).collect();
    let mut rows: Vec<RowInput> =
        seqs.iter_mut().zip(&prompts).map(|(kv, t)| RowInput { kv, tokens: t, start: 0 }).collect();
    b.forward(&mut rows, false).unwrap();
    let t = Instant::now();
    for step in 0..steps {
        let tok = [(step * 13) as u32];
        let mut rows: Vec<RowInput> = seqs
            .iter_mut()
            .map(|kv| {
                let start = kv.len();
                RowInput { kv, tokens: &tok, start }
            })
            .collect();
        b.forward(&mut rows, false).unwrap();
    }
    let per = t.elapsed().as_secs_f64() / steps as f64;
    println!("batch {batch}: {:.2} ms/step, {:.0} tok/s", per * 1e3, batch as f64 / per);
}
