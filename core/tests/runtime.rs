//! Behaviour of the runtime on random models: varlen batches, pending requests that
//! resume by extend, KV accounting, and refusals.

mod kernel_paths;
mod support;

use tempfile::TempDir;
use tokenrouter_core::model::init::{write_random_model, InitOptions};
use tokenrouter_core::model::presets::qwen3_shaped;
use tokenrouter_core::model::{Backend, CandleBackend, KvDtype, KvSeq, LoadOptions, ModelError, RowInput, WeightDtype};

fn random_model(seed: u64) -> TempDir {
    let dir = TempDir::new().unwrap();
    let config = qwen3_shaped(64, 2, 4, 2, 128, 300);
    write_random_model(&config, &InitOptions { seed, std: 0.15 }, dir.path()).unwrap();
    dir
}

fn backend(dir: &TempDir, blocks: usize) -> CandleBackend {
    backend_with_kv(dir, blocks, KvDtype::F32)
}

fn backend_with_kv(dir: &TempDir, blocks: usize, kv_dtype: KvDtype) -> CandleBackend {
    let config = qwen3_shaped(64, 2, 4, 2, 128, 300);
    let block_size = 4;
    let options = LoadOptions {
        dtype: WeightDtype::F32,
        kv_budget_bytes: blocks * block_size * config.kv_bytes_per_token(kv_dtype.bytes()),
        block_size,
        kv_dtype,
        ..LoadOptions::default()
    };
    CandleBackend::load(dir.path(), &options).unwrap()
}

fn tokens(seed: u32, n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 37 + seed * 101 + 7) % 300).collect()
}

fn run(b: &mut CandleBackend, kv: &mut KvSeq, tokens: &[u32], start: usize) -> Vec<f32> {
    b.forward(&mut [RowInput { kv, tokens, start }], false).unwrap().row_logits(0).to_vec()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

fn argmax(v: &[f32]) -> u32 {
    v.iter().enumerate().fold((0, f32::MIN), |m, (i, &x)| if x > m.1 { (i, x) } else { m }).0 as u32
}

#[test]
fn mixed_prefill_extend_decode_batch_equals_rows_alone() {
    for kv_dtype in [KvDtype::F32, KvDtype::F16] {
        mixed_batch_equals_rows_alone(kv_dtype);
    }
}

fn mixed_batch_equals_rows_alone(kv_dtype: KvDtype) {
    let dir = random_model(1);
    let mut b = backend_with_kv(&dir, 256, kv_dtype);
    assert_eq!(b.kv_capacity().total_blocks, 256, "the budget counts {kv_dtype:?} values");
    let (a_toks, b_toks, c_toks) = (tokens(1, 13), tokens(2, 15), tokens(3, 21));
    // Alone: B has 10 computed and extends by 5; C has 20 and decodes 1.
    let mut alone = |toks: &[u32], computed: usize| {
        let mut kv = b.new_sequence();
        if computed > 0 {
            run(&mut b, &mut kv, &toks[..computed], 0);
        }
        run(&mut b, &mut kv, &toks[computed..], computed)
    };
    let want = [alone(&a_toks, 0), alone(&b_toks, 10), alone(&c_toks, 20)];
    let (mut ka, mut kb, mut kc) = (b.new_sequence(), b.new_sequence(), b.new_sequence());
    run(&mut b, &mut kb, &b_toks[..10], 0);
    run(&mut b, &mut kc, &c_toks[..20], 0);
    let mut rows = [
        RowInput { kv: &mut kb, tokens: &b_toks[10..], start: 10 },
        RowInput { kv: &mut ka, tokens: &a_toks, start: 0 },
        RowInput { kv: &mut kc, tokens: &c_toks[20..], start: 20 },
    ];
    let out = b.forward(&mut rows, false).unwrap();
    let got = [out.row_logits(1), out.row_logits(0), out.row_logits(2)];
    for (row, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(max_diff(g, w) < 1e-5, "{kv_dtype:?} row {row}: {}", max_diff(g, w));
    }
    assert_eq!((ka.len(), kb.len(), kc.len()), (13, 15, 21));
}

#[test]
fn pending_request_resumes_by_extend_as_if_uninterrupted() {
    let dir = random_model(2);
    let mut b = backend(&dir, 512);
    let prompt = tokens(4, 9);
    // Uninterrupted: prompt, 20 greedy decodes, then 5 more tokens one at a time.
    let mut seq = prompt.clone();
    let mut kv = b.new_sequence();
    let mut logits = run(&mut b, &mut kv, &prompt, 0);
    for _ in 0..20 {
        let t = argmax(&logits);
        seq.push(t);
        logits = run(&mut b, &mut kv, &[t], seq.len() - 1);
    }
    let extra = tokens(9, 5);
    let mut straight = logits;
    for t in &extra {
        seq.push(*t);
        straight = run(&mut b, &mut kv, &[*t], seq.len() - 1);
    }

    // Interrupted: same 20 decodes, then idle while other requests come and go, then
    // the 5 tokens (produced meanwhile by a peer) arrive as one extend.
    let mut kv = b.new_sequence();
    run(&mut b, &mut kv, &seq[..prompt.len() + 20], 0);
    let mut still_running = Vec::new();
    for other in 0..6 {
        let mut okv = b.new_sequence();
        let toks = tokens(20 + other, 17 + other as usize * 3);
        run(&mut b, &mut okv, &toks, 0);
        // Half of them stay resident, so the resumed request's blocks sit among others'.
        if other % 2 == 0 {
            still_running.push(okv);
        }
    }
    let at = prompt.len() + 20;
    let resumed = run(&mut b, &mut kv, &seq[at..], at);
    assert!(max_diff(&resumed, &straight) < 1e-5, "{}", max_diff(&resumed, &straight));
}

#[test]
fn kv_blocks_return_to_the_pool_when_requests_end() {
    let dir = random_model(3);
    let mut b = backend(&dir, 64);
    let total = b.kv_capacity().total_blocks;
    assert_eq!(total, 64);
    {
        let mut kvs: Vec<KvSeq> = (0..5).map(|_| b.new_sequence()).collect();
        let toks: Vec<Vec<u32>> = (0..5).map(|i| tokens(i, 5 + 3 * i as usize)).collect();
        let mut rows: Vec<RowInput> =
            kvs.iter_mut().zip(&toks).map(|(kv, t)| RowInput { kv, tokens: t, start: 0 }).collect();
        b.forward(&mut rows, false).unwrap();
        let used: usize = toks.iter().map(|t| t.len().div_ceil(4)).sum();
        assert_eq!(b.kv_capacity().free_blocks, total - used);
        kvs.truncate(2);
        let left: usize = toks[..2].iter().map(|t| t.len().div_ceil(4)).sum();
        assert_eq!(b.kv_capacity().free_blocks, total - left);
    }
    assert_eq!(b.kv_capacity().free_blocks, total);
}

#[test]
fn running_out_of_blocks_is_an_error_that_changes_nothing() {
    let dir = random_model(4);
    let mut b = backend(&dir, 6);
    let mut first = b.new_sequence();
    run(&mut b, &mut first, &tokens(1, 16), 0);
    let (mut x, mut y) = (b.new_sequence(), b.new_sequence());
    let (tx, ty) = (tokens(2, 4), tokens(3, 8));
    let mut rows = [RowInput { kv: &mut x, tokens: &tx, start: 0 }, RowInput { kv: &mut y, tokens: &ty, start: 0 }];
    let err = b.forward(&mut rows, false).unwrap_err();
    assert!(matches!(err, ModelError::OutOfBlocks { needed: 3, free: 2, .. }), "{err}");
    assert_eq!((x.len(), y.len(), x.blocks().len(), y.blocks().len()), (0, 0, 0, 0));
    assert_eq!(b.kv_capacity().free_blocks, 2);
    // The request that was already there carries on.
    run(&mut b, &mut first, &[5], 16);
    assert_eq!(first.len(), 17);
}

#[test]
fn malformed_rows_are_refused() {
    let dir = random_model(5);
    let mut b = backend(&dir, 32);
    let mut kv = b.new_sequence();
    let bad = |b: &mut CandleBackend, kv: &mut KvSeq, t: &[u32], start| {
        b.forward(&mut [RowInput { kv, tokens: t, start }], false).unwrap_err()
    };
    assert!(matches!(bad(&mut b, &mut kv, &[300], 0), ModelError::TokenOutOfVocab { token: 300, .. }));
    assert!(matches!(bad(&mut b, &mut kv, &[1], 3), ModelError::BadBatch(_)));
    assert!(matches!(bad(&mut b, &mut kv, &[], 0), ModelError::BadBatch(_)));
    let other_dir = random_model(6);
    let other = backend(&other_dir, 8);
    let mut foreign = other.new_sequence();
    assert!(bad(&mut b, &mut foreign, &[1], 0).to_string().contains("another model"));
}

#[test]
fn hidden_states_come_back_on_request() {
    let dir = random_model(7);
    let mut b = backend(&dir, 32);
    let mut kv = b.new_sequence();
    let t = tokens(1, 6);
    let out = b.forward(&mut [RowInput { kv: &mut kv, tokens: &t, start: 0 }], true).unwrap();
    let hidden = out.row_hidden(0).unwrap();
    assert_eq!(hidden.len(), 64);
    assert!(hidden.iter().any(|h| h.abs() > 1e-3));
}

#[test]
fn f16_weights_track_f32() {
    let dir = random_model(8);
    let mut f32b = backend(&dir, 32);
    let opts = LoadOptions { dtype: WeightDtype::F16, ..LoadOptions::default() };
    let mut f16b = CandleBackend::load(dir.path(), &opts).unwrap();
    let t = tokens(2, 12);
    let (mut k1, mut k2) = (f32b.new_sequence(), f16b.new_sequence());
    let a = run(&mut f32b, &mut k1, &t, 0);
    let h = run(&mut f16b, &mut k2, &t, 0);
    eprintln!("f16 weights (f32 activations) vs f32: max |Δlogit| {}", max_diff(&a, &h));
    assert!(max_diff(&a, &h) < 0.05, "{}", max_diff(&a, &h));
    assert_eq!(argmax(&a), argmax(&h));
}

/// The largest |Δlogit| between a 150-token prompt prefilled at once and the same
/// prompt in chunks of 40 (other matmul tiles, attention over cached blocks).
fn whole_against_chunks(b: &mut CandleBackend, seed: u32) -> f32 {
    let prompt = tokens(seed, 150);
    let mut whole = b.new_sequence();
    let once = run(b, &mut whole, &prompt, 0);
    let mut chunked = b.new_sequence();
    let mut last = Vec::new();
    for start in (0..prompt.len()).step_by(40) {
        let end = (start + 40).min(prompt.len());
        last = run(b, &mut chunked, &prompt[start..end], start);
    }
    max_diff(&once, &last)
}

#[test]
fn f16_weights_give_the_same_logits_in_one_prefill_or_in_chunks() {
    // The GEMM gets the weights widened; the kernel widens them in registers: the same
    // numbers, summed in other orders.
    let dir = random_model(10);
    let opts =
        LoadOptions { dtype: WeightDtype::F16, kv_budget_bytes: 1 << 24, block_size: 4, ..LoadOptions::default() };
    let mut b = CandleBackend::load(dir.path(), &opts).unwrap();
    let diff = whole_against_chunks(&mut b, 6);
    assert!(diff < 1e-4, "{diff}");
}

#[test]
fn long_prefill_equals_the_same_prompt_in_chunks() {
    let dir = random_model(9);
    for kv_dtype in [KvDtype::F32, KvDtype::F16] {
        let mut b = backend_with_kv(&dir, 256, kv_dtype);
        let diff = whole_against_chunks(&mut b, 5);
        assert!(diff < 1e-4, "{kv_dtype:?}: {diff}");
    }
}

/// Varlen rows equal rows alone (and chunked prefills equal whole ones) on every path.
#[test]
fn varlen_equivalence_holds_on_every_kernel_path() {
    kernel_paths::rerun_on_other_kernel_paths(&[
        "mixed_prefill_extend_decode_batch_equals_rows_alone",
        "pending_request_resumes_by_extend_as_if_uninterrupted",
        "f16_weights_track_f32",
        "f16_weights_give_the_same_logits_in_one_prefill_or_in_chunks",
        "long_prefill_equals_the_same_prompt_in_chunks",
    ]);
}

/// A verify step's logits at every drafted position equal decoding them one by one.
#[test]
fn outputs_at_every_fed_position_equal_decoding_one_by_one() {
    let dir = random_model(9);
    let mut b = backend(&dir, 256);
    support::assert_outputs_at_every_fed_position(&mut b, &tokens(3, 13), &tokens(4, 7), 1e-3);
}
