//! Batch-1 decode on one GGUF file in a loop, for profilers (`perf record`): nothing
//! else runs, so the profile is the decode step alone.
//!
//! `cargo run --release -p tokenrouter-core --example decode_loop -- FILE.gguf [STEPS]`

use std::path::PathBuf;
use std::time::Instant;

use tokenrouter_core::model::{Backend, CandleBackend, LoadOptions, RowInput};

fn main() {
    let threads = tokenrouter_core::model::threads::configure(None);
    let args: Vec<String> = std::env::args().collect();
    let path = PathBuf::from(args.get(1).expect("a GGUF file"));
    let steps: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(500);
    let options = LoadOptions { kv_budget_bytes: 1 << 30, ..LoadOptions::default() };
    let mut model = CandleBackend::load(&path, &options).expect("the GGUF loads");
    let vocab = model.config().vocab_size;
    let mut kv = model.new_sequence();
    let prompt: Vec<u32> = (0..64).map(|i| ((i * 104_729 + 13) % vocab) as u32).collect();
    model.forward(&mut [RowInput { kv: &mut kv, tokens: &prompt, start: 0 }], false).expect("prefill");
    let mut decoding = std::time::Duration::ZERO;
    for step in 0..steps {
        // Contexts of 64..128 tokens, near llama-bench's `-n 64` from an empty context.
        if kv.len() >= 128 {
            kv = model.new_sequence();
            model.forward(&mut [RowInput { kv: &mut kv, tokens: &prompt, start: 0 }], false).expect("prefill");
        }
        let token = [(step * 13 % vocab) as u32];
        let start = kv.len();
        let started = Instant::now();
        model.forward(&mut [RowInput { kv: &mut kv, tokens: &token, start }], false).expect("decode");
        decoding += started.elapsed();
    }
    println!("{threads} threads: {steps} steps, {:.1} tok/s", steps as f64 / decoding.as_secs_f64());
}
