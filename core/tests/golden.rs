//! The runtime against Hugging Face transformers: logits of tiny random checkpoints
//! (made by scripts/make_golden_fixtures.py, committed under tests/fixtures/golden).

mod kernel_paths;

use std::path::PathBuf;

use serde::Deserialize;
use tokenrouter_core::model::{Backend, CandleBackend, KvDtype, LoadOptions, RowInput, WeightDtype};

#[derive(Deserialize)]
struct Golden {
    tolerance: f32,
    sequences: Vec<Case>,
    incremental: Incremental,
}

#[derive(Deserialize)]
struct Case {
    input_ids: Vec<u32>,
    logits: Vec<Vec<f32>>,
}

#[derive(Deserialize)]
struct Incremental {
    prefill_len: usize,
    step_logits: Vec<Vec<f32>>,
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/golden").join(name)
}

fn load(name: &str) -> (CandleBackend, Golden) {
    load_with(name, &LoadOptions { block_size: 4, ..LoadOptions::default() })
}

fn load_with(name: &str, options: &LoadOptions) -> (CandleBackend, Golden) {
    let dir = fixture(name);
    let golden: Golden = serde_json::from_str(&std::fs::read_to_string(dir.join("golden.json")).unwrap()).unwrap();
    (CandleBackend::load(&dir, options).unwrap(), golden)
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// Feeds each case one token at a time: every position's logits come from the KV path.
fn check_every_position(name: &str) {
    let (mut backend, golden) = load(name);
    let worst = worst_at_every_position(&mut backend, &golden);
    assert!(worst < golden.tolerance, "{name}: max |Δlogit| {worst}");
}

/// The largest |Δlogit| over every position of every case, fed one token at a time.
fn worst_at_every_position(backend: &mut CandleBackend, golden: &Golden) -> f32 {
    let mut worst = 0f32;
    for case in &golden.sequences {
        let mut kv = backend.new_sequence();
        for (pos, token) in case.input_ids.iter().enumerate() {
            let tokens = [*token];
            let out = backend.forward(&mut [RowInput { kv: &mut kv, tokens: &tokens, start: pos }], false).unwrap();
            worst = worst.max(max_diff(out.row_logits(0), &case.logits[pos]));
        }
    }
    worst
}

/// All cases as prefills in one varlen batch: each row's last logits.
fn check_prefills_in_one_batch(name: &str) {
    let (mut backend, golden) = load(name);
    let mut kvs: Vec<_> = golden.sequences.iter().map(|_| backend.new_sequence()).collect();
    let mut rows: Vec<RowInput> = kvs
        .iter_mut()
        .zip(&golden.sequences)
        .map(|(kv, case)| RowInput { kv, tokens: &case.input_ids, start: 0 })
        .collect();
    let out = backend.forward(&mut rows, false).unwrap();
    for (r, case) in golden.sequences.iter().enumerate() {
        let diff = max_diff(out.row_logits(r), case.logits.last().unwrap());
        assert!(diff < golden.tolerance, "{name}: row {r}: max |Δlogit| {diff}");
    }
}

/// HF's own KV-cache run: a prefill of `prefill_len`, then one token per step.
fn check_incremental(name: &str) {
    let (mut backend, golden) = load(name);
    let ids = &golden.sequences[0].input_ids;
    let inc = &golden.incremental;
    let mut kv = backend.new_sequence();
    let out =
        backend.forward(&mut [RowInput { kv: &mut kv, tokens: &ids[..inc.prefill_len], start: 0 }], false).unwrap();
    assert!(max_diff(out.row_logits(0), &inc.step_logits[0]) < golden.tolerance);
    for (step, want) in inc.step_logits.iter().enumerate().skip(1) {
        let pos = inc.prefill_len + step - 1;
        let out =
            backend.forward(&mut [RowInput { kv: &mut kv, tokens: &ids[pos..pos + 1], start: pos }], false).unwrap();
        let diff = max_diff(out.row_logits(0), want);
        assert!(diff < golden.tolerance, "{name}: step {step}: max |Δlogit| {diff}");
    }
}

#[test]
fn qwen3_matches_transformers_at_every_position() {
    check_every_position("qwen3");
}

#[test]
fn llama_bf16_with_llama3_rope_matches_transformers_at_every_position() {
    check_every_position("llama");
}

#[test]
fn qwen2_sharded_with_bias_matches_transformers_at_every_position() {
    check_every_position("qwen2");
}

#[test]
fn prefills_in_one_varlen_batch_match_transformers() {
    for name in ["qwen3", "llama", "qwen2"] {
        check_prefills_in_one_batch(name);
    }
}

#[test]
fn kv_cache_steps_match_transformers_cache() {
    for name in ["qwen3", "llama", "qwen2"] {
        check_incremental(name);
    }
}

/// f16 weights (activations and sums stay f32) against transformers' f32 logits, at the
/// last position of every case: the rounding of the weights alone (docs/backends.md
/// states the bound).
const F16_TOLERANCE: f32 = 1e-2;

#[test]
fn f16_weights_stay_within_the_stated_tolerance_of_transformers() {
    for name in ["qwen3", "llama", "qwen2"] {
        let worst = worst_at_last_positions(name, WeightDtype::F16);
        eprintln!("{name}: f16 weights, max |Δlogit| {worst} against transformers (f32)");
        assert!(worst < F16_TOLERANCE, "{name}: {worst}");
    }
}

/// bf16 weights keep f32's range with 8 bits of mantissa (f16 has 11): rounding an f32
/// checkpoint to them costs more than f16 does (docs/backends.md states the bound).
const BF16_TOLERANCE: f32 = 0.1;

#[test]
fn bf16_weights_stay_within_the_stated_tolerance_of_transformers() {
    for name in ["qwen3", "qwen2"] {
        let worst = worst_at_last_positions(name, WeightDtype::Bf16);
        eprintln!("{name}: bf16 weights, max |Δlogit| {worst} against transformers (f32)");
        assert!(worst < BF16_TOLERANCE, "{name}: {worst}");
    }
}

/// A bf16 checkpoint loaded as bf16 keeps its exact weights: every position within the
/// f32 tolerance.
#[test]
fn a_bf16_checkpoint_in_bf16_matches_transformers_at_every_position() {
    let options = LoadOptions { block_size: 4, dtype: WeightDtype::Bf16, ..LoadOptions::default() };
    let (mut backend, golden) = load_with("llama", &options);
    let worst = worst_at_every_position(&mut backend, &golden);
    eprintln!("llama (a bf16 checkpoint): bf16 weights, max |Δlogit| {worst} against transformers");
    assert!(worst < golden.tolerance, "{worst}");
}

/// The largest |Δlogit| at the last position of every case, each case one prefill, with
/// weights in `dtype`.
fn worst_at_last_positions(name: &str, dtype: WeightDtype) -> f32 {
    let options = LoadOptions { block_size: 4, dtype, ..LoadOptions::default() };
    let (mut backend, golden) = load_with(name, &options);
    let mut worst = 0f32;
    for case in &golden.sequences {
        let mut kv = backend.new_sequence();
        let out = backend.forward(&mut [RowInput { kv: &mut kv, tokens: &case.input_ids, start: 0 }], false).unwrap();
        worst = worst.max(max_diff(out.row_logits(0), case.logits.last().unwrap()));
    }
    worst
}

/// f16 K/V under f32 weights against transformers' f32 logits, every position fed one
/// token at a time so each logit reads the rounded cache (docs/backends.md states the
/// bound).
const F16_KV_TOLERANCE: f32 = 1e-2;

#[test]
fn f16_kv_stays_within_the_stated_tolerance_of_transformers() {
    for name in ["qwen3", "llama", "qwen2"] {
        let options = LoadOptions { block_size: 4, kv_dtype: KvDtype::F16, ..LoadOptions::default() };
        let (mut backend, golden) = load_with(name, &options);
        let worst = worst_at_every_position(&mut backend, &golden);
        eprintln!("{name}: f16 KV, max |Δlogit| {worst} against transformers (f32)");
        assert!(worst < F16_KV_TOLERANCE, "{name}: {worst}");
    }
}

/// The golden comparisons on the portable and every other compiled instruction set.
#[test]
fn golden_logits_hold_on_every_kernel_path() {
    kernel_paths::rerun_on_other_kernel_paths(&[
        "qwen3_matches_transformers_at_every_position",
        "llama_bf16_with_llama3_rope_matches_transformers_at_every_position",
        "qwen2_sharded_with_bias_matches_transformers_at_every_position",
        "prefills_in_one_varlen_batch_match_transformers",
        "kv_cache_steps_match_transformers_cache",
        "f16_weights_stay_within_the_stated_tolerance_of_transformers",
        "bf16_weights_stay_within_the_stated_tolerance_of_transformers",
        "a_bf16_checkpoint_in_bf16_matches_transformers_at_every_position",
        "f16_kv_stays_within_the_stated_tolerance_of_transformers",
    ]);
}
