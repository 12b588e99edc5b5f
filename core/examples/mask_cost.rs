//! What structured outputs cost per step: building the compiler (once per engine),
//! compiling a schema (once per request, part of its time to first token), and the
//! token mask per step along real JSON outputs, for one request and for 16 at once
//! (the subserver computes a batch's masks in parallel).
//!
//! `cargo run --release -p tokenrouter-core --example mask_cost -- [TOKENIZER_FOLDER] [STEPS]`
//! (default: the Qwen3 test asset, 64 steps; threads from `TOKENROUTER_THREADS`, else
//! `RAYON_NUM_THREADS`, else all cores).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use rayon::prelude::*;
use serde_json::json;
use tokenrouter_core::constrain::{GrammarCompiler, GrammarSpec, Next, TokenConstraint};
use tokenrouter_core::rng::SplitMix64;
use tokenrouter_core::tokenize::TextTokenizer;

const BATCH: usize = 16;

fn main() {
    let threads = tokenrouter_core::model::threads::configure(None);
    let args: Vec<String> = std::env::args().collect();
    let folder = match args.get(1) {
        Some(path) => PathBuf::from(path),
        None => match tokenrouter_core::assets::tokenizer_dir("qwen3") {
            Some(path) => path,
            None => return,
        },
    };
    let steps: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(64);
    let tokenizer = TextTokenizer::from_folder(&folder).expect("a tokenizer folder");
    let vocab = tokenizer.vocab_size();
    let started = Instant::now();
    let compiler = GrammarCompiler::new(&tokenizer, vocab).expect("the vocabulary reads as bytes");
    println!("{threads} threads, vocabulary {vocab}: compiler built in {:.0} ms", ms(started.elapsed()));
    let spec = GrammarSpec::JsonSchema { schema: schema(), strict: true };
    let started = Instant::now();
    let constraints: Vec<TokenConstraint> = (0..BATCH).map(|_| compiler.compile(&spec, &[]).unwrap()).collect();
    println!("schema compiled in {:.2} ms per request", ms(started.elapsed()) / BATCH as f64);
    let outputs: Vec<Vec<u32>> = (0..BATCH as u64).map(|seed| walk(&compiler, &spec, seed, steps)).collect();
    let one = per_step(&outputs[..1], &constraints[..1], |work| work.iter().for_each(|f| f()));
    let serial = per_step(&outputs, &constraints, |work| work.iter().for_each(|f| f()));
    let parallel = per_step(&outputs, &constraints, |work| work.par_iter().for_each(|f| f()));
    println!("mask per step, 1 request:              {:.3} ms", one);
    println!("masks per step, {BATCH} requests serially:  {:.3} ms", serial);
    println!("masks per step, {BATCH} requests parallel:  {:.3} ms", parallel);
}

/// Nested objects, arrays, enums, bounded numbers and strings: a typical agent schema.
fn schema() -> serde_json::Value {
    json!({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 8},
        "address": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 30}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["city", "zip"], "additionalProperties": false},
        "scores": {"type": "array", "items": {"type": "number", "minimum": 0, "maximum": 1}, "maxItems": 20}},
        "required": ["name", "age", "address"], "additionalProperties": false})
}

/// An output of up to `steps` tokens drawn uniformly among the allowed ones.
fn walk(compiler: &GrammarCompiler, spec: &GrammarSpec, seed: u64, steps: usize) -> Vec<u32> {
    let constraint = compiler.compile(spec, &[]).unwrap();
    let mut rng = SplitMix64(seed);
    let mut output = Vec::new();
    while output.len() < steps {
        let Next::Allowed(mask) = constraint.next(&output) else { break };
        let pick = (rng.next_u64() % mask.allowed_count() as u64) as usize;
        let token = (0u32..).filter(|&t| mask.allows(t)).nth(pick).unwrap();
        output.push(token);
    }
    output
}

/// Mean wall time per step of computing every request's next mask, as `run` schedules
/// the per-request work.
fn per_step(outputs: &[Vec<u32>], constraints: &[TokenConstraint], run: impl Fn(&[Box<dyn Fn() + Sync + '_>])) -> f64 {
    let steps = outputs.iter().map(Vec::len).min().unwrap_or(0);
    let started = Instant::now();
    for step in 0..steps {
        let work: Vec<Box<dyn Fn() + Sync>> = outputs
            .iter()
            .zip(constraints)
            .map(|(output, constraint)| {
                Box::new(move || {
                    std::hint::black_box(constraint.next(&output[..step]));
                }) as Box<dyn Fn() + Sync>
            })
            .collect();
        run(&work);
    }
    ms(started.elapsed()) / steps.max(1) as f64
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
