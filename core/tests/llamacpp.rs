//! The llama.cpp backend against the candle backend on the same random weights:
//! logits and hidden states agree within what llama.cpp's f16 KV cache allows, rows in
//! one multi-sequence decode equal rows alone, evicted sequences re-admit beside running
//! decodes, and ended sequences give their cells back. On SmolLM2's GGUF (submodules):
//! our rebuilt tokenizer encodes as llama.cpp's, and llama.cpp's logits agree with
//! candle's on the f32 import and on the quantized file.
#![cfg(feature = "llamacpp")]

use std::path::Path;

use tempfile::TempDir;
use tokenrouter_core::model::gguf::{write_gguf, GgufType};
use tokenrouter_core::model::init::{copy_tokenizer, write_random_model, InitOptions};
use tokenrouter_core::model::presets::qwen3_shaped;
use tokenrouter_core::model::{
    load_backend, read_model_config, Backend, BackendKind, KvSeq, LoadOptions, ModelError, RowInput, WeightDtype,
};

mod support;
use support::{argmax, run};

// SmolLM2's GGUF on llama.cpp against our rebuilt tokenizer and against candle.
#[path = "llamacpp/smollm2_logits.rs"]
mod smollm2_logits;
#[path = "llamacpp/tokenizer.rs"]
mod tokenizer;

/// Relative tolerance of llama.cpp vs candle logits: llama.cpp stores K/V in f16
/// (11-bit mantissa, ~5e-4 relative per value) and sums in a different order; over two
/// layers that stays under 1% of the logits' range.
const LOGIT_TOLERANCE: f32 = 0.01;

/// A tiny Qwen3 with the real tokenizer (llama.cpp needs a vocabulary), or None.
fn tiny_qwen3(seed: u64) -> Option<TempDir> {
    let tokenizer = tokenrouter_core::assets::tokenizer_dir("qwen3")?;
    let dir = TempDir::new().unwrap();
    let config = qwen3_shaped(128, 2, 4, 2, 256, 151_936);
    write_random_model(&config, &InitOptions { seed, std: 0.08 }, dir.path()).unwrap();
    copy_tokenizer(&tokenizer, dir.path()).unwrap();
    Some(dir)
}

fn options(backend: BackendKind, kv_tokens: usize) -> LoadOptions {
    let config = qwen3_shaped(128, 2, 4, 2, 256, 151_936);
    let bytes = if backend == BackendKind::Llamacpp { 2 } else { 4 };
    LoadOptions {
        kv_budget_bytes: kv_tokens * config.kv_bytes_per_token(bytes),
        block_size: 16,
        backend,
        threads: Some(2),
        ..LoadOptions::default()
    }
}

fn load(path: &Path, backend: BackendKind, kv_tokens: usize) -> Box<dyn Backend> {
    load_backend(path, &options(backend, kv_tokens)).unwrap()
}

fn tokens(seed: u32, n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 7919 + seed * 104_729 + 13) % 151_000).collect()
}

/// Largest difference relative to the reference's range.
fn relative_diff(got: &[f32], want: &[f32]) -> f32 {
    let range = want.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    got.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max) / range
}

/// Greedy steps from a prompt; the logits of every step.
fn greedy(b: &mut dyn Backend, prompt: &[u32], steps: usize) -> Vec<Vec<f32>> {
    let mut kv = b.new_sequence();
    let mut out = vec![run(b, &mut kv, prompt, 0)];
    let mut len = prompt.len();
    for _ in 0..steps {
        let next = argmax(out.last().unwrap());
        out.push(run(b, &mut kv, &[next], len));
        len += 1;
    }
    out
}

macro_rules! model_or_skip {
    ($seed:expr) => {
        match tiny_qwen3($seed) {
            Some(dir) => dir,
            None => {
                eprintln!("skipped: the Qwen3 tokenizer is not fetched (run .ci/run)");
                return;
            }
        }
    };
}

#[test]
fn logits_and_hidden_states_agree_with_candle() {
    let dir = model_or_skip!(1);
    let mut candle = load(dir.path(), BackendKind::Candle, 1024);
    let mut llama = load(dir.path(), BackendKind::Llamacpp, 1024);
    let prompt = tokens(1, 40);
    let want = greedy(candle.as_mut(), &prompt, 12);
    let got = greedy(llama.as_mut(), &prompt, 12);
    for (step, (g, w)) in got.iter().zip(&want).enumerate() {
        let d = relative_diff(g, w);
        assert!(d < LOGIT_TOLERANCE, "step {step}: logits differ by {d} of their range");
        assert_eq!(argmax(g), argmax(w), "step {step}: greedy token differs");
    }
    let (mut kc, mut kl) = (candle.new_sequence(), llama.new_sequence());
    let hc = candle.forward(&mut [RowInput { kv: &mut kc, tokens: &prompt, start: 0 }], true).unwrap();
    let hl = llama.forward(&mut [RowInput { kv: &mut kl, tokens: &prompt, start: 0 }], true).unwrap();
    let d = relative_diff(hl.row_hidden(0).unwrap(), hc.row_hidden(0).unwrap());
    assert!(d < LOGIT_TOLERANCE, "hidden states differ by {d} of their range");
}

#[test]
fn rows_in_one_decode_equal_rows_alone_and_evicted_rows_readmit() {
    let dir = model_or_skip!(2);
    let mut b = load(dir.path(), BackendKind::Llamacpp, 2048);
    let (p1, p2, p3) = (tokens(3, 30), tokens(4, 17), tokens(5, 44));
    let alone: Vec<Vec<Vec<f32>>> = [&p1, &p2, &p3].iter().map(|p| greedy(b.as_mut(), p, 6)).collect();

    // All three together: prefills, then decodes; the second is evicted after two
    // steps and comes back as one prefill of everything it had, beside the others.
    let prompts = [&p1, &p2, &p3];
    let mut seqs: Vec<Vec<u32>> = prompts.iter().map(|p| p.to_vec()).collect();
    let mut kvs: Vec<KvSeq> = (0..3).map(|_| b.new_sequence()).collect();
    let mut fed = [0usize; 3];
    for step in 0..=6 {
        if step == 3 {
            kvs[1].clear();
            fed[1] = 0;
        }
        let mut rows: Vec<RowInput> = kvs
            .iter_mut()
            .zip(&seqs)
            .zip(fed)
            .map(|((kv, seq), from)| RowInput { kv, tokens: &seq[from..], start: from })
            .collect();
        let out = b.forward(&mut rows, false).unwrap();
        for r in 0..3 {
            // ggml picks kernels by batch shape, so sums run in another order: not
            // bit-equal as on candle, but as close as the f16 cache allows.
            let d = relative_diff(out.row_logits(r), &alone[r][step]);
            assert!(d < LOGIT_TOLERANCE, "step {step} row {r}: {d}");
            assert_eq!(argmax(out.row_logits(r)), argmax(&alone[r][step]), "step {step} row {r}");
            fed[r] = seqs[r].len();
            seqs[r].push(argmax(out.row_logits(r)));
        }
    }
}

#[test]
fn ended_and_rewound_sequences_free_their_cells() {
    let dir = model_or_skip!(3);
    // Room for ~4 sequences of 100 tokens at a time; 30 come and go.
    let mut b = load(dir.path(), BackendKind::Llamacpp, 400);
    let total = b.kv_capacity().total_blocks;
    for i in 0..30 {
        let mut kv = b.new_sequence();
        run(b.as_mut(), &mut kv, &tokens(i, 90), 0);
        // Rewinding recomputes the tail instead of stacking cells on top of it.
        let again = run(b.as_mut(), &mut kv, &tokens(i, 90)[60..], 60);
        let once = run(b.as_mut(), &mut kv, &tokens(i, 90)[89..], 89);
        assert!(relative_diff(&again, &once) < 1e-3);
    }
    assert_eq!(b.kv_capacity().free_blocks, total);
    // Over capacity: refused without side effects.
    let mut big = b.new_sequence();
    let err = b.forward(&mut [RowInput { kv: &mut big, tokens: &tokens(9, 500), start: 0 }], false).unwrap_err();
    assert!(matches!(err, ModelError::OutOfBlocks { .. }), "{err}");
    assert!(big.is_empty());
    assert_eq!(b.kv_capacity().free_blocks, total);
}

#[test]
fn written_gguf_files_load_with_their_config_and_quantized_types_stay_close() {
    let dir = model_or_skip!(4);
    let from_folder = read_model_config(dir.path()).unwrap();
    let prompt = tokens(6, 24);
    let mut reference = load(dir.path(), BackendKind::Llamacpp, 512);
    let want = greedy(reference.as_mut(), &prompt, 0).remove(0);
    for (ty, tolerance) in
        [(GgufType::F32, 1e-3), (GgufType::F16, 0.02), (GgufType::Bf16, 0.05), (GgufType::Q8_0, 0.05)]
    {
        let file = dir.path().join(format!("model-{ty:?}.gguf"));
        write_gguf(dir.path(), &file, ty).unwrap();
        let from_file = read_model_config(&file).unwrap();
        assert_eq!(
            (from_file.num_layers, from_file.num_kv_heads, from_file.head_dim, from_file.vocab_size),
            (from_folder.num_layers, from_folder.num_kv_heads, from_folder.head_dim, from_folder.vocab_size)
        );
        assert_eq!(from_file.tie_word_embeddings, from_folder.tie_word_embeddings);
        let mut b = load(&file, BackendKind::Llamacpp, 512);
        let got = greedy(b.as_mut(), &prompt, 0).remove(0);
        let d = relative_diff(&got, &want);
        assert!(d < tolerance, "{ty:?}: {d}");
    }
    // Candle serves llama GGUF files only (this one is a Qwen3) and does not quantize
    // folders at load: both errors name the way out.
    let file = dir.path().join("model-Q8_0.gguf");
    let err = load_backend(&file, &options(BackendKind::Candle, 64)).err().unwrap();
    assert!(err.to_string().contains("backend: llamacpp"), "{err}");
    let q8 = LoadOptions { dtype: WeightDtype::Q8_0, ..options(BackendKind::Candle, 64) };
    assert!(load_backend(dir.path(), &q8).err().unwrap().to_string().contains("llama.cpp"));
}

/// A request that reuses cached blocks shares the cells of the sequence that computed
/// them, also after that sequence ended (its id lives on for the cache), and gets the
/// logits a full prefill gives; cached blocks give way when the pool needs room.
#[test]
fn a_cached_prefix_shares_cells_and_gives_the_logits_of_a_full_prefill() {
    let dir = model_or_skip!(5);
    let mut b = load(dir.path(), BackendKind::Llamacpp, 256);
    let shared = tokens(7, 48);
    let with_tail = |seed, n| -> Vec<u32> { shared.iter().copied().chain(tokens(seed, n)).collect() };
    let first = with_tail(8, 5);
    let mut a = b.new_sequence();
    run(b.as_mut(), &mut a, &first, 0);
    a.seal_full_blocks(&first);
    let second = with_tail(9, 7);
    let want = {
        let mut plain = b.new_sequence();
        run(b.as_mut(), &mut plain, &second, 0)
    };
    let reuse = |b: &mut dyn Backend| {
        let mut kv = b.new_sequence();
        assert_eq!(kv.attach_cached_prefix(&second), 48);
        let got = run(b, &mut kv, &second[48..], 48);
        let d = relative_diff(&got, &want);
        assert!(d < 1e-3, "cached prefix: logits differ by {d} of their range");
        assert_eq!(argmax(&got), argmax(&want));
    };
    reuse(b.as_mut());
    drop(a);
    reuse(b.as_mut());
    // Fill the pool: the cached blocks are taken, and everything comes back.
    let total = b.kv_capacity().total_blocks;
    let mut big = b.new_sequence();
    run(b.as_mut(), &mut big, &tokens(10, 16 * total - 8), 0);
    drop(big);
    assert_eq!(b.kv_capacity().free_blocks, total);
    assert_eq!(b.kv_capacity().cached_blocks, 0, "the pool took the cached blocks for new K/V");
    let mut after = b.new_sequence();
    assert_eq!(after.attach_cached_prefix(&second), 0);
}

/// A verify step's logits at every drafted position equal decoding them one by one.
#[test]
fn outputs_at_every_fed_position_equal_decoding_one_by_one() {
    let dir = model_or_skip!(5);
    let mut b = load(dir.path(), BackendKind::Llamacpp, 512);
    support::assert_outputs_at_every_fed_position(b.as_mut(), &tokens(5, 20), &tokens(6, 6), 2e-2);
}
