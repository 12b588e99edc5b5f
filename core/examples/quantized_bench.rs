//! The candle backend on a quantized GGUF file against the same file imported as an f32
//! folder, and on that folder written back as a Q8_0 GGUF (Q4_1 and Q8_0 matrices run on
//! `model::qmatmul`, other block types on candle's `QMatMul`): prefill tokens/s over one
//! long prompt and decode tokens/s at batch 1, 8 and 32, the models measured
//! alternately, round after round, so that a shared machine's drift hits all alike.
//! Medians are reported.
//!
//! `cargo run --release -p tokenrouter-core --example quantized_bench -- [FILE.gguf] [ROUNDS] [--file-only]`
//! (default: the SmolLM2 Q4_1 test asset, 3 rounds; threads from `TOKENROUTER_THREADS`,
//! else `RAYON_NUM_THREADS`, else all cores; `--file-only`: the GGUF file alone, for
//! runs interleaved with another engine's).

use std::path::PathBuf;
use std::time::Instant;

use tokenrouter_core::model::gguf::{write_gguf, GgufType};
use tokenrouter_core::model::gguf_import::import_gguf;
use tokenrouter_core::model::machine::median;
use tokenrouter_core::model::{Backend, CandleBackend, LoadOptions, RowInput, WeightDtype};

const PREFILL_TOKENS: usize = 512;
const DECODE_CONTEXT: usize = 64;
const BATCHES: [usize; 3] = [1, 8, 32];

fn main() {
    let threads = tokenrouter_core::model::threads::configure(None);
    let args: Vec<String> = std::env::args().collect();
    let gguf = match args.get(1) {
        Some(path) => PathBuf::from(path),
        None => match tokenrouter_core::assets::smollm2_gguf() {
            Some(path) => path,
            None => return,
        },
    };
    let rounds: usize = args.get(2).and_then(|r| r.parse().ok()).unwrap_or(3);
    let file_only = args.iter().any(|a| a == "--file-only");
    let options = LoadOptions { kv_budget_bytes: 1 << 30, ..LoadOptions::default() };
    let mut models: Vec<(&str, CandleBackend)> =
        vec![("candle quantized", CandleBackend::load(&gguf, &options).expect("the GGUF loads"))];
    let folder = tempfile::TempDir::new().expect("a temporary folder");
    if !file_only {
        let report = import_gguf(&gguf, folder.path(), WeightDtype::F32).expect("an importable GGUF");
        println!("source types: {:?}", report.source_types);
        let q8_0 = folder.path().join("requantized-q8_0.gguf");
        write_gguf(folder.path(), &q8_0, GgufType::Q8_0).expect("the import writes back as GGUF");
        models.push(("candle f32 folder", CandleBackend::load(folder.path(), &options).expect("the import loads")));
        models.push(("candle q8_0 file", CandleBackend::load(&q8_0, &options).expect("the Q8_0 file loads")));
    }
    println!("{}, {threads} threads, {rounds} rounds", gguf.display());
    let measures = 1 + BATCHES.len();
    let mut samples = vec![vec![Vec::new(); measures]; models.len()];
    for _ in 0..rounds {
        for (m, (_, model)) in models.iter_mut().enumerate() {
            samples[m][0].push(prefill_tokens_per_sec(model));
            for (i, &batch) in BATCHES.iter().enumerate() {
                samples[m][1 + i].push(decode_tokens_per_sec(model, batch));
            }
        }
    }
    println!("{:<18} {:>12} {:>10} {:>10} {:>10}", "tokens/s", "prefill 512", "decode b1", "b8 total", "b32 total");
    for ((name, _), measured) in models.iter().zip(&mut samples) {
        let medians: Vec<String> = measured.iter().map(|s| format!("{:.0}", median(s))).collect();
        println!("{name:<18} {:>12} {:>10} {:>10} {:>10}", medians[0], medians[1], medians[2], medians[3]);
    }
}

/// Token ids spread over the vocabulary, different per row.
fn prompt(row: usize, len: usize, vocab: usize) -> Vec<u32> {
    (0..len).map(|i| ((row * 7919 + i * 104_729 + 13) % vocab) as u32).collect()
}

fn prefill_tokens_per_sec(model: &mut CandleBackend) -> f64 {
    let tokens = prompt(0, PREFILL_TOKENS, model.config().vocab_size);
    let mut kv = model.new_sequence();
    let started = Instant::now();
    model.forward(&mut [RowInput { kv: &mut kv, tokens: &tokens, start: 0 }], false).expect("prefill");
    PREFILL_TOKENS as f64 / started.elapsed().as_secs_f64()
}

/// Decode steps of `batch` rows, each after its own `DECODE_CONTEXT`-token prompt.
fn decode_tokens_per_sec(model: &mut CandleBackend, batch: usize) -> f64 {
    let vocab = model.config().vocab_size;
    let steps = (64 / batch).clamp(8, 32);
    let mut seqs: Vec<_> = (0..batch).map(|_| model.new_sequence()).collect();
    let prompts: Vec<Vec<u32>> = (0..batch).map(|r| prompt(r + 1, DECODE_CONTEXT, vocab)).collect();
    let mut rows: Vec<RowInput> =
        seqs.iter_mut().zip(&prompts).map(|(kv, tokens)| RowInput { kv, tokens, start: 0 }).collect();
    model.forward(&mut rows, false).expect("prefill");
    let started = Instant::now();
    for step in 0..steps {
        let token = [(step * 13 % vocab) as u32];
        let mut rows: Vec<RowInput> = seqs
            .iter_mut()
            .map(|kv| {
                let start = kv.len();
                RowInput { kv, tokens: &token, start }
            })
            .collect();
        model.forward(&mut rows, false).expect("decode");
    }
    (batch * steps) as f64 / started.elapsed().as_secs_f64()
}
