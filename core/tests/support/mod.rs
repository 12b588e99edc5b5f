//! What the SmolLM2 comparisons share (`quantized.rs` and `llamacpp.rs`): the GGUF asset,
//! a chat prompt, greedy steps fed identically to two backends, and the rule by which
//! their logits and greedy tokens must agree.

// Each test binary that includes this module uses only part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use tempfile::TempDir;
use tokenrouter_core::model::gguf_import::import_gguf;
pub use tokenrouter_core::model::ModelError;
use tokenrouter_core::model::{load_backend, Backend, BackendKind, KvSeq, LoadOptions, RowInput, WeightDtype};
use tokenrouter_core::tokenize::{ChatMessage, ChatTemplate, RenderOptions, TextTokenizer};

/// The GGUF file, or None (having said why) when it is not fetched and not required.
pub fn smollm2() -> Option<PathBuf> {
    tokenrouter_core::assets::smollm2_gguf()
}

/// The GGUF imported as an f32 HF folder (tokenizer and chat template included).
pub fn f32_import(gguf: &Path) -> TempDir {
    let folder = TempDir::new().unwrap();
    import_gguf(gguf, folder.path(), WeightDtype::F32).unwrap();
    folder
}

pub fn options() -> LoadOptions {
    LoadOptions { kv_budget_bytes: 64 << 20, threads: Some(2), ..LoadOptions::default() }
}

/// `path` on the candle backend.
pub fn load(path: &Path) -> Box<dyn Backend> {
    load_on(path, BackendKind::Candle)
}

pub fn load_on(path: &Path, backend: BackendKind) -> Box<dyn Backend> {
    load_backend(path, &LoadOptions { backend, ..options() }).unwrap()
}

pub fn run(b: &mut dyn Backend, kv: &mut KvSeq, tokens: &[u32], start: usize) -> Vec<f32> {
    b.forward(&mut [RowInput { kv, tokens, start }], false).unwrap().row_logits(0).to_vec()
}

pub fn argmax(v: &[f32]) -> u32 {
    v.iter().enumerate().fold((0, f32::MIN), |m, (i, &x)| if x > m.1 { (i, x) } else { m }).0 as u32
}

/// The gap between the best and the second-best logit.
pub fn margin(v: &[f32]) -> f32 {
    let best = argmax(v) as usize;
    let second = v.iter().enumerate().filter(|&(i, _)| i != best).fold(f32::MIN, |m, (_, &x)| m.max(x));
    v[best] - second
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// Per step, the logits of `reference` and `candidate` over `prompt` then `steps` greedy
/// tokens, both fed the reference's choices so that they see the same positions.
pub fn teacher_forced(
    reference: &mut dyn Backend,
    candidate: &mut dyn Backend,
    prompt: &[u32],
    steps: usize,
) -> Vec<(Vec<f32>, Vec<f32>)> {
    let (mut kr, mut kc) = (reference.new_sequence(), candidate.new_sequence());
    let mut out = vec![(run(reference, &mut kr, prompt, 0), run(candidate, &mut kc, prompt, 0))];
    for step in 0..steps {
        let next = argmax(&out.last().unwrap().0);
        let at = prompt.len() + step;
        out.push((run(reference, &mut kr, &[next], at), run(candidate, &mut kc, &[next], at)));
    }
    out
}

/// `question` as a user turn in the folder's chat template, ready for the answer.
pub fn chat_prompt(folder: &Path, question: &str) -> Vec<u32> {
    let tokenizer = TextTokenizer::from_folder(folder).unwrap();
    let template = ChatTemplate::from_folder(folder).unwrap();
    let options = RenderOptions { add_generation_prompt: true, ..RenderOptions::default() };
    let prompt = template.render(&[ChatMessage::new("user", question)], &options).unwrap();
    tokenizer.encode(&prompt, false).unwrap()
}

/// Q4_1 weights dequantize exactly into the f32 import, so what differs is candle's
/// quantized matmul rounding each activation row to 8 bits per block of 32 (Q8_1 for
/// Q4_1, Q8_0 for the tied Q8_0 head), as ggml does, over 30 layers: ~0.5% of a
/// matmul's largest output each time. Measured with `model::qmatmul` over a chat prompt
/// and 16 greedy steps: max |Δlogit| 1.39 for "What is the capital of France?", 1.21 for
/// "Name the capital of France.", logits spanning about ±30. With every matrix
/// dequantized to f32 (`CANDLE_DEQUANTIZE_ALL=1`) the same comparison gives 5e-5: the
/// loading (rotary rows, stacking, tied head) is exact and the rest is the kernels'
/// rounding.
pub const SMOLLM2_LOGIT_TOLERANCE: f32 = 2.0;

/// How closely a candidate followed the reference over teacher-forced steps.
#[derive(Debug, Clone, Copy)]
pub struct Agreement {
    /// The largest |Δlogit| at any step.
    pub worst: f32,
    /// Steps where the reference's choice won by more than the tolerance.
    pub clear_steps: usize,
    /// Steps where both chose the same greedy token.
    pub same_tokens: usize,
    pub steps: usize,
}

/// Asserts that every step's logits (reference, candidate) are within `tolerance`, and
/// that the greedy tokens are equal wherever the reference's choice wins by more than
/// the tolerance. Above twice the tolerance that follows from the first check; between
/// once and twice it does not, and holds unless the differences line up against the
/// winner. Thinner margins may go either way.
pub fn assert_agreement(what: &str, steps: &[(Vec<f32>, Vec<f32>)], tolerance: f32) -> Agreement {
    let mut worst = 0.0f32;
    let mut clear_steps = 0;
    for (i, (want, got)) in steps.iter().enumerate() {
        let diff = max_abs_diff(got, want);
        worst = worst.max(diff);
        assert!(diff < tolerance, "{what}, step {i}: max |Δlogit| {diff} (tolerance {tolerance})");
        if margin(want) > tolerance {
            clear_steps += 1;
            assert_eq!(argmax(got), argmax(want), "{what}, step {i}: margin {}", margin(want));
        }
    }
    let same_tokens = steps.iter().filter(|(want, got)| argmax(want) == argmax(got)).count();
    eprintln!(
        "{what}: max |Δlogit| {worst} over {} steps; greedy tokens identical at {same_tokens}, \
         {clear_steps} of them won by more than the tolerance {tolerance}",
        steps.len()
    );
    Agreement { worst, clear_steps, same_tokens, steps: steps.len() }
}

/// A verify step's outputs: one forward feeding `tokens` after `prompt` with logits at
/// every fed position, beside a plain decode row, equals feeding them one at a time;
/// and the decode row's logits equal its own forward alone.
pub fn assert_outputs_at_every_fed_position(b: &mut dyn Backend, prompt: &[u32], tokens: &[u32], tolerance: f32) {
    let (mut verify, mut one_by_one, mut beside, mut beside_alone) =
        (b.new_sequence(), b.new_sequence(), b.new_sequence(), b.new_sequence());
    for kv in [&mut verify, &mut one_by_one, &mut beside, &mut beside_alone] {
        run(b, kv, prompt, 0);
    }
    let at = prompt.len();
    let out = b
        .forward_at(
            &mut [
                RowInput { kv: &mut verify, tokens, start: at },
                RowInput { kv: &mut beside, tokens: &tokens[..1], start: at },
            ],
            &[tokens.len(), 1],
            false,
        )
        .unwrap();
    assert_eq!(out.rows(), tokens.len() + 1, "one output per verified position, one for the decode row");
    for (i, &token) in tokens.iter().enumerate() {
        let alone = run(b, &mut one_by_one, &[token], at + i);
        let diff = max_abs_diff(out.row_logits(i), &alone);
        assert!(diff <= tolerance, "position {i}: logits differ by {diff}");
        assert_eq!(argmax(out.row_logits(i)), argmax(&alone), "position {i}");
    }
    let alone = run(b, &mut beside_alone, &tokens[..1], at);
    assert!(max_abs_diff(out.row_logits(tokens.len()), &alone) <= tolerance, "the decode row beside the verify row");
    // Asking for more outputs than a row feeds is refused, and nothing changes.
    let err = b.forward_at(&mut [RowInput { kv: &mut beside, tokens: &tokens[..1], start: at + 1 }], &[2], false);
    assert!(matches!(err, Err(ModelError::BadBatch(_))), "{err:?}");
    assert_eq!(beside.len(), at + 1);
}
